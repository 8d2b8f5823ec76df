#!/usr/bin/env python3
"""packer's own benchmark: conversion, random-access reads and memory, side by side in one run.

    python ../shared/tools/make_imagefolder.py /tmp/bench/src --classes 20 --per-class 500
    python tools/bench_packer.py --src /tmp/bench/src --work /tmp/bench/work --out /tmp/bench/packer.md

Every figure is a ratio against a baseline measured in the same run on the same machine (these
machines are noisy; absolute img/s are printed for context only):

* conversion (resize shorter:256, jpeg:90): ``--workers 2`` vs ``--workers 1``, and vs the machine
  limit = (bare decode+resize+encode loop on one core) x cores. The bare loop is measured twice:
  with a plain full-size ``cv2.imdecode`` (what a hand-written converter does) and with packer's own
  ``process_image`` (which lets libjpeg decode at reduced size when the target allows);
* reads: ``ds[i]`` in a loop in one process, random order, vs a bare ``cv2.imdecode`` loop over
  the same payload bytes held in memory; and ``raw`` vs ``jpeg:90``;
* memory: peak RSS (whole process tree) of a conversion of 2k vs 10k images.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time

import cv2
import numpy as np

from packer.datasets import open_dataset
from packer.engine import ConvertOptions, convert_imagefolder
from packer.imageproc import ProcessOptions, parse_encoding, parse_resize, process_image
from packer.registry import format_names
from packer.scan import scan_imagefolder

RESIZE, JPEG = "shorter:256", "jpeg:90"


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", required=True, help="ImageFolder (make_imagefolder.py --classes 20 --per-class 500)")
    ap.add_argument("--work", required=True, help="scratch directory")
    ap.add_argument("--formats", default=",".join(format_names()))
    ap.add_argument("--reads", type=int, default=3000, help="samples per read measurement")
    ap.add_argument("--bare", type=int, default=600, help="images in the bare conversion loop")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--out", default=None, help="write the markdown tables here")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    cores = os.cpu_count() or 1
    formats = [f for f in a.formats.split(",") if f]
    scan = scan_imagefolder(a.src)
    n = len(scan.samples)
    lines = [f"Source: {a.src}, {n} images, {len(scan.classes)} classes; {cores} cores; "
             f"resize {RESIZE}; python {sys.version.split()[0]}, OpenCV {cv2.__version__}", ""]

    paths = [s.path for s in scan.samples[: a.bare]]
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

    if not a.skip_memory:
        lines += ["", "### Peak memory of a conversion (lmdb, 2 workers, whole process tree)", "",
                  "| images | peak RSS MB | seconds |", "|---|---|---|"]
        for count in (2000, n):
            sub = subset_folder(a.src, os.path.join(a.work, f"sub{count}"), count) if count < n else a.src
            peak, secs = peak_rss_of([sys.executable, "-m", "packer", "convert", "imagefolder", "lmdb", sub,
                                      os.path.join(a.work, f"mem{count}"), "--resize", RESIZE, "--workers", "2",
                                      "--overwrite", "-q"])
            lines.append(f"| {count} | {peak / 1e6:.0f} | {secs:.1f} |")
            print(lines[-1], flush=True)

    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
