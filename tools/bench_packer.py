#!/usr/bin/env python3
"""packer's own benchmark: conversion, random-access reads and memory, side by side in one run.

    python ../shared/tools/make_imagefolder.py /tmp/bench/src --classes 20 --per-class 500
    python tools/bench_packer.py --src /tmp/bench/src --work /tmp/bench/work --out /tmp/bench/packer.md

Every figure is a ratio against a baseline measured in the same run on the same machine (absolute
img/s are printed for context only); ``--help`` lists what each section compares.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

import cv2
import numpy as np

from packer.description.registry import format_names
from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize, process_image
from packer.pipeline.engine import ConvertOptions, convert_imagefolder
from packer.pipeline.scan import scan_imagefolder

RESIZE, JPEG = "shorter:256", "jpeg:90"
SECTIONS = """sections (all by default; --sections picks some):
  convert  resize shorter:256, jpeg:90: --workers 2 vs --workers 1, and vs the machine limit = (bare
           decode+resize+encode loop on one core) x cores; the bare loop with a plain full-size
           cv2.imdecode (what a hand-written converter does) and with packer's own process_image
           (which lets libjpeg decode at reduced size when the target allows)
  read     ds[i] in a loop in one process, random order, vs a bare cv2.imdecode loop over the same
           payload bytes held in memory; and raw vs jpeg:90
  memory   peak RSS (whole process tree) of a conversion of 2k vs all images
  loader   a DataLoader (2 workers, batch 64, 224 center crop) over each format, map-style
           (shuffled) and streaming (StreamingDataset), next to a bare decode loop on one core
  cache    epoch 1 vs epoch 2 with cache="decoded" (jpeg:90), next to the uncached raw rate
  scaling  conversion time, open time and per-sample read cost for 2k, 10k and 50k images
           (small 96 px images for the 50k folder), and whether opening reads payload files
"""


def open_dataset(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """packer.datasets.open_dataset, imported on first use: the conversion's spawned workers
    re-import this script, and must not pay for importing torch (the CLI's workers do not)."""
    from packer.datasets import open_dataset as real

    return real(*args, **kwargs)


def options(encode: str = JPEG, workers: int = 1) -> ConvertOptions:
    return ConvertOptions(
        processing=ProcessOptions(resize=parse_resize(RESIZE), encoding=parse_encoding(encode)),
        workers=workers, overwrite=True,
    )


def bare_convert_rate(paths: list[str], exact: bool) -> float:
    """One core: read, decode, resize shorter:256 (INTER_AREA), encode jpeg:90."""
    cv2.setNumThreads(1)
    opts = options().processing
    t0 = time.perf_counter()
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        if exact:
            bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
            h, w = bgr.shape[:2]
            s = 256 / min(h, w)
            bgr = cv2.resize(bgr, (int(w * s), int(h * s)) if s < 1 else (w, h), interpolation=cv2.INTER_AREA)
            cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 90])
        else:
            process_image(data, opts)
    return len(paths) / (time.perf_counter() - t0)


def timed_convert(src: str, dst: str, fmt: str, encode: str, workers: int) -> float:
    report = convert_imagefolder(src, dst, fmt, options(encode, workers))
    return report.rate


def read_rate(path: str, order: np.ndarray) -> float:
    ds = open_dataset(path)
    ds[int(order[0])]  # open
    t0 = time.perf_counter()
    for i in order:
        ds[int(i)]
    return len(order) / (time.perf_counter() - t0)


def bare_decode_rate(path: str, order: np.ndarray) -> float:
    ds = open_dataset(path)
    payloads = [bytes(ds.read_record(int(i)).payload) for i in order]
    t0 = time.perf_counter()
    for b in payloads:
        cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR_RGB)
    return len(payloads) / (time.perf_counter() - t0)


class Crop:
    """Center crop of a C x H x W tensor (picklable for DataLoader workers)."""

    def __init__(self, size: int = 224) -> None:
        self.size = size

    def __call__(self, x):  # noqa: ANN001, ANN204
        h, w = x.shape[-2:]
        t, left = (h - self.size) // 2, (w - self.size) // 2
        return x[:, t : t + self.size, left : left + self.size]


def loader_rate(ds, epochs: int = 1, shuffle: bool = False, collate: bool = True) -> list[float]:
    """img/s of each epoch through DataLoader(batch 64, 2 workers), persistent workers; with
    ``collate``, ``collate_fn=packer.datasets.collate``, else torch's default_collate."""
    import torch
    from torch.utils.data import DataLoader

    from packer.datasets import collate as packer_collate

    kw = {"shuffle": shuffle, "generator": torch.Generator().manual_seed(0)} if shuffle else {}
    if collate:
        kw["collate_fn"] = packer_collate
    loader = DataLoader(ds, batch_size=64, num_workers=2, persistent_workers=True, **kw)
    rates = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        n = sum(x.shape[0] for x, _ in loader)
        rates.append(n / (time.perf_counter() - t0))
    return rates


def bare_crop_rate(path: str, count: int) -> float:
    """One core: cv2.imdecode to RGB + 224 center crop to a CHW tensor, payloads in memory."""
    import torch

    ds = open_dataset(path)
    payloads = [bytes(ds.read_record(i).payload) for i in range(min(count, len(ds)))]
    crop = Crop()
    t0 = time.perf_counter()
    for b in payloads:
        crop(torch.from_numpy(cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR_RGB)).permute(2, 0, 1))
    return len(payloads) / (time.perf_counter() - t0)


def section_loader(a, formats: list[str], lines: list[str]) -> None:
    from packer.datasets import StreamingDataset

    lines += ["", "### DataLoader (2 workers, batch 64, 224 center crop), jpeg:90", "",
              "Map-style and streaming use `collate_fn=packer.datasets.collate`; the default_collate "
              "column is the same map-style read with torch's collate.", "",
              "| format | bare decode+crop, 1 core | map-style img/s | streaming img/s | streaming / map | map / bare "
              "| map-style, default_collate | collate / default_collate |",
              "|---|---|---|---|---|---|---|---|"]
    for fmt in formats:
        path = os.path.join(a.work, f"{fmt}-jpeg")
        bare = bare_crop_rate(path, a.reads)
        m = max(loader_rate(open_dataset(path, transform=Crop()), 2, shuffle=True))
        st = max(loader_rate(StreamingDataset(path, transform=Crop(), batch_size=64, shuffle_buffer=4096), 2))
        d = max(loader_rate(open_dataset(path, transform=Crop()), 2, shuffle=True, collate=False))
        lines.append(f"| {fmt} | {bare:.0f} | {m:.0f} | {st:.0f} | {st / m:.2f} | {m / bare:.2f} | {d:.0f} | {m / d:.2f} |")
        print(lines[-1], flush=True)


def section_cache(a, formats: list[str], lines: list[str]) -> None:
    lines += ["", "### Shared cache (`cache=\"decoded\"`, DataLoader 2 workers, batch 64, 224 crop, "
              "`collate_fn=packer.datasets.collate`)", "",
              "| format | jpeg epoch 1 img/s | jpeg epoch 2 img/s | epoch 2 / epoch 1 | raw uncached img/s | epoch 2 / raw |",
              "|---|---|---|---|---|---|"]
    for fmt in formats:
        ds = open_dataset(os.path.join(a.work, f"{fmt}-jpeg"), transform=Crop(), cache="decoded")
        e1, e2 = loader_rate(ds, 2)
        ds.close()
        raw = max(loader_rate(open_dataset(os.path.join(a.work, f"{fmt}-raw"), transform=Crop()), 2))
        lines.append(f"| {fmt} | {e1:.0f} | {e2:.0f} | {e2 / e1:.1f} | {raw:.0f} | {e2 / raw:.2f} |")
        print(lines[-1], flush=True)


def make_small_folder(root: str, n: int, classes: int = 50) -> str:
    """n small (96 x 128) JPEGs in ``classes`` folders, drawn procedurally (fast to make)."""
    if os.path.isdir(root) and sum(len(f) for _, _, f in os.walk(root)) == n:
        return root
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(0)
    base = [cv2.imencode(".jpg", rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) // 4 * 4)[1].tobytes()
            for _ in range(16)]
    for i in range(n):
        d = os.path.join(root, f"c{i % classes:03d}")
        if i < classes:
            os.makedirs(d)
        with open(os.path.join(d, f"{i:07d}.jpg"), "wb") as f:
            f.write(base[i % 16])
    return root


def open_and_spy(path: str):  # noqa: ANN201
    """Open a dataset while recording every file it opens; return (files, seconds, dataset)."""
    import builtins

    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, *args, **kw):  # noqa: ANN001, ANN202
        opened.append(str(file))
        return real_open(file, *args, **kw)

    def spy_os_open(file, *args, **kw):  # noqa: ANN001, ANN202
        opened.append(str(file))
        return real_os_open(file, *args, **kw)

    builtins.open, os.open = spy_open, spy_os_open
    try:
        t0 = time.perf_counter()
        ds = open_dataset(path)
        return opened, time.perf_counter() - t0, ds
    finally:
        builtins.open, os.open = real_open, real_os_open


def section_scaling(a, lines: list[str]) -> None:
    """Conversion and open time, and per-sample read cost, as the dataset grows."""
    lines += ["", "### Scaling (96 x 128 JPEGs, jpeg:90, 2 workers)", "",
              "| format | images | convert s | convert img/s | open_dataset | payload / index files it opens | first ds[i] | us per ds[i] |",
              "|---|---|---|---|---|---|---|---|"]
    for n in (2000, 10000, 50000):
        src = make_small_folder(os.path.join(a.work, f"small{n}"), n)
        for fmt in a.formats.split(","):
            dst = os.path.join(a.work, f"small{n}-{fmt}")
            t0 = time.perf_counter()
            convert_imagefolder(src, dst, fmt, ConvertOptions(workers=2, overwrite=True))
            conv = time.perf_counter() - t0
            opened, opened_s, ds = open_and_spy(dst)
            index = [f for f in opened if f.endswith((".idx", ".pkidx", ".zidx", ".table"))]
            payload = [f for f in opened if not f.endswith(("manifest.json", ".idx", ".pkidx", ".zidx", ".table"))]
            order = np.random.default_rng(1).integers(0, n, 2000)
            t0 = time.perf_counter()
            ds[0]
            first_ms = (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            for i in order:
                ds[int(i)]
            us = (time.perf_counter() - t0) / len(order) * 1e6
            lines.append(f"| {fmt} | {n} | {conv:.1f} | {n / conv:.0f} | {opened_s * 1e3:.1f} ms | {len(payload)} / {len(index)} | {first_ms:.1f} ms | {us:.0f} |")
            print(lines[-1], flush=True)
            ds.close()
            shutil.rmtree(dst)


def peak_rss_of(cmd: list[str]) -> tuple[int, float]:
    """Run ``cmd``; return (peak RSS summed over its process tree in bytes, seconds)."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    p = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            total = p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
        except psutil.Error:
            total = 0
        peak = max(peak, total)
        time.sleep(0.02)
    if proc.returncode not in (0, 3):
        raise RuntimeError(f"{cmd} failed: {proc.stderr.read().decode()[-500:]}")
    return peak, time.perf_counter() - t0


def subset_folder(src: str, dst: str, n: int) -> str:
    """Symlink the first n images (round-robin over classes) into a new ImageFolder."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    scan = scan_imagefolder(src)
    by_class: dict[int, list] = {}
    for s in scan.samples:
        by_class.setdefault(s.label, []).append(s)
    picked = 0
    k = 0
    while picked < n:
        for lst in by_class.values():
            if k < len(lst) and picked < n:
                s = lst[k]
                out = os.path.join(dst, s.relpath)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                os.symlink(s.path, out)
                picked += 1
        k += 1
    return dst


def section_convert(a, formats: list[str], paths: list[str], lines: list[str]) -> None:  # noqa: ANN001
    """The bare conversion loop on one core (always: the machine limit) and, with the convert
    section, each format's conversion with 1 and 2 workers against it."""
    cores = os.cpu_count() or 1
    bare_exact = bare_convert_rate(paths, exact=True)
    bare_ours = bare_convert_rate(paths, exact=False)
    lines += ["### Conversion (jpeg:90)", "",
              f"Bare loop, one core: full decode {bare_exact:.0f} img/s, packer's process_image {bare_ours:.0f} img/s; "
              f"machine limit = x{cores} cores: {bare_exact * cores:.0f} / {bare_ours * cores:.0f} img/s", "",
              "| format | workers 1 img/s | workers 2 img/s | w2 / w1 | w2 / limit (full decode) | w2 / limit (process_image) |",
              "|---|---|---|---|---|---|"]
    for fmt in formats:
        r1 = timed_convert(a.src, os.path.join(a.work, f"{fmt}-w1"), fmt, JPEG, 1)
        r2 = timed_convert(a.src, os.path.join(a.work, f"{fmt}-jpeg"), fmt, JPEG, 2)
        lines.append(f"| {fmt} | {r1:.0f} | {r2:.0f} | {r2 / r1:.2f} | {r2 / (bare_exact * cores):.2f} | "
                     f"{r2 / (bare_ours * cores):.2f} |")
        shutil.rmtree(os.path.join(a.work, f"{fmt}-w1"))
        print(lines[-1], flush=True)


def section_read(a, formats: list[str], n: int, lines: list[str]) -> None:  # noqa: ANN001
    """``ds[i]`` in random order, JPEG and raw, against a bare decode of the same payloads."""
    lines += ["", "### Random-access reads, one process (`ds[i]`, uint8 CHW tensor)", "",
              "| format | bare imdecode img/s | jpeg:90 ds[i] img/s | jpeg / bare | raw ds[i] img/s | raw / jpeg |",
              "|---|---|---|---|---|---|"]
    order = np.random.default_rng(0).permutation(n)[: a.reads]
    for fmt in formats:
        jpeg_dir, raw_dir = os.path.join(a.work, f"{fmt}-jpeg"), os.path.join(a.work, f"{fmt}-raw")
        timed_convert(a.src, raw_dir, fmt, "raw", 2)
        bare = bare_decode_rate(jpeg_dir, order)
        jr = read_rate(jpeg_dir, order)
        rr = read_rate(raw_dir, order)
        lines.append(f"| {fmt} | {bare:.0f} | {jr:.0f} | {jr / bare:.2f} | {rr:.0f} | {rr / jr:.1f} |")
        print(lines[-1], flush=True)


def section_memory(a, n: int, lines: list[str]) -> None:  # noqa: ANN001
    """Peak RSS of the whole process tree of an lmdb conversion of 2,000 and of all images."""
    lines += ["", "### Peak memory of a conversion (lmdb, 2 workers, whole process tree)", "",
              "| images | peak RSS MB | seconds |", "|---|---|---|"]
    for count in (2000, n):
        sub = subset_folder(a.src, os.path.join(a.work, f"sub{count}"), count) if count < n else a.src
        peak, secs = peak_rss_of([sys.executable, "-m", "packer", "convert", "imagefolder", "lmdb", sub,
                                  os.path.join(a.work, f"mem{count}"), "--resize", RESIZE, "--workers", "2",
                                  "--overwrite", "-q"])
        lines.append(f"| {count} | {peak / 1e6:.0f} | {secs:.1f} |")
        print(lines[-1], flush=True)


def main() -> None:
    """Run the chosen sections; print the Markdown tables (and write them to ``--out``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=SECTIONS,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, help="ImageFolder (make_imagefolder.py --classes 20 --per-class 500)")
    ap.add_argument("--work", required=True, help="scratch directory")
    ap.add_argument("--formats", default=",".join(format_names()))
    ap.add_argument("--reads", type=int, default=3000, help="samples per read measurement")
    ap.add_argument("--bare", type=int, default=600, help="images in the bare conversion loop")
    ap.add_argument("--sections", default="convert,read,memory,loader,cache,scaling",
                    help="comma-separated: convert, read, memory, loader, cache, scaling (read/loader/cache need convert's output)")
    ap.add_argument("--out", default=None, help="write the markdown tables here")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    formats = [f for f in a.formats.split(",") if f]
    scan = scan_imagefolder(a.src)
    n = len(scan.samples)
    lines = [f"Source: {a.src}, {n} images, {len(scan.classes)} classes; {os.cpu_count() or 1} cores; "
             f"resize {RESIZE}; python {sys.version.split()[0]}, OpenCV {cv2.__version__}", ""]
    sections = set(a.sections.split(","))
    section_convert(a, formats if "convert" in sections else [], [s.path for s in scan.samples[: a.bare]], lines)
    section_read(a, formats if "read" in sections else [], n, lines)
    if "loader" in sections:
        section_loader(a, formats, lines)
    if "cache" in sections:
        section_cache(a, formats, lines)
    if "scaling" in sections:
        section_scaling(a, lines)
    if "memory" in sections:
        section_memory(a, n, lines)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)

if __name__ == "__main__":
    main()
