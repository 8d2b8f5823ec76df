"""The benchmarks that each answer one question about one part, as subcommands of one script.

    python -m tools.bench_parts --help               # the subcommands
    python -m tools.bench_parts SUBCOMMAND --help    # what one measures, and how

Each compares side by side in one run (only the ratios travel between machines) and prints
Markdown tables; docs/benchmarks.md quotes them with the command of each figure.
"""

from __future__ import annotations

import argparse
import functools
import gc
import inspect
import io
import json
import math
import multiprocessing
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("lmdb", "hdf5", "tar", "tfrecord")


# -- shared timing and reporting ----------------------------------------------------------------------
def timed(f: Callable[[], Any]) -> tuple[float, Any]:
    """(wall seconds, result) of one call of ``f``."""
    t0 = time.perf_counter()
    out = f()
    return time.perf_counter() - t0, out


def turns(items: Sequence[Any], turn: int) -> list[Any]:
    """``items`` rotated by ``turn``: methods that take turns start in a different place each
    time, so that no method is always first or last when the machine's load drifts."""
    k = turn % len(items)
    return list(items[k:]) + list(items[:k])


def usage(who: int) -> tuple[float, int]:
    """(user + system CPU seconds, minor page faults) of ``resource.getrusage(who)``."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (a DataLoader's exited workers)."""
    return usage(resource.RUSAGE_SELF)[0] + usage(resource.RUSAGE_CHILDREN)[0]


def header(*columns: str) -> None:
    """Print a Markdown table's header row and its separator."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def row(*cells: Any) -> None:
    """Print one Markdown table row at once (long runs show their progress)."""
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def name_of(path: str) -> str:
    """A dataset's folder name, for a table's first column."""
    return os.path.basename(path.rstrip("/"))


def export(rev: str, dest: str) -> str:
    """Git revision ``rev`` laid out as the installed package under ``dest``; returns the
    PYTHONPATH root (packer/, packer/converters, packer/datasets)."""
    src = os.path.join(dest, "src")
    os.makedirs(src)
    archive = subprocess.run(["git", "-C", REPO, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    lib = os.path.join(dest, "lib")
    shutil.copytree(os.path.join(src, "packer"), os.path.join(lib, "packer"))
    for sub in ("converters", "datasets"):
        shutil.copytree(os.path.join(src, sub), os.path.join(lib, "packer", sub))
    return lib


def in_revision(lib: str, *argv: str, tools: bool = False) -> dict:
    """``python argv`` in a fresh process importing packer from ``lib`` (and this script's
    package from this tree with ``tools``), run outside the tree; the JSON it prints last."""
    env = {**os.environ, "PYTHONPATH": lib + (os.pathsep + REPO if tools else "")}
    r = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if r.returncode:
        raise SystemExit(f"{lib}: {r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def revisions(revs: list[str], work: str) -> dict[str, str]:
    """Each of ``revs`` (a git revision, or a folder laid out as the installed package) -> its
    PYTHONPATH root, exported under ``work``."""
    return {rev: rev if os.path.isdir(rev) else export(rev, os.path.join(work, str(k))) for k, rev in enumerate(revs)}


def crop224(image: torch.Tensor) -> torch.Tensor:
    """The benchmarks' 224 center crop, as a transform."""
    from packer.datasets.encoded import center_crop

    return center_crop(image, 224)


# -- window-decode ------------------------------------------------------------------------------------
Window = tuple[int, int, int, int]  # top, left, height, width


def decode_window(lib: ModuleType, payload: bytes, window: Window) -> np.ndarray | None:
    """The window's RGB pixels (a view of the decoded rows), or None where the module refuses the
    payload (damaged, CMYK, ...)."""
    import simplejpeg

    top, left, height, width = window
    w_img = simplejpeg.decode_jpeg_header(payload)[1]
    out = np.empty((height, min(w_img, width + 96), 3), np.uint8)
    shift = lib.decode_window(payload, out, top, left, width)
    return None if shift is None else out[:, shift:shift + width]


def center_window(h: int, w: int, size: int = 224) -> Window:
    """The benchmarks' 224 center crop (rounded as torchvision's CenterCrop)."""
    return int(round((h - size) / 2.0)), int(round((w - size) / 2.0)), size, size


def random_window(h: int, w: int, rng: random.Random, size: int = 224) -> Window:
    """``RandomCrop(size)``'s window."""
    return rng.randint(0, h - size), rng.randint(0, w - size), size, size


def resized_crop_window(h: int, w: int, rng: random.Random, scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> Window:
    """A window drawn as ``RandomResizedCrop`` draws one (10 tries, then the central square)."""
    area = h * w
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw
    side = min(h, w)
    return (h - side) // 2, (w - side) // 2, side, side


def jpeg_payloads(path: str, count: int) -> list[bytes]:
    """Up to ``count`` stored JPEG payloads of the packed dataset at ``path``, spread over it."""
    from packer.datasets import open_dataset

    with open_dataset(path) as ds:
        step = max(1, len(ds) // count)
        out = [bytes(ds.read_record(i).payload) for i in range(0, len(ds), step)][:count]
    return [p for p in out if p[:2] == b"\xff\xd8"]


def window_check(lib: ModuleType, data: list[bytes], per_image: int = 3, seed: int = 0) -> dict[str, int]:
    """Windows of random size and place against full decodes: the counts of windows checked,
    of those that differ from simplejpeg's and from OpenCV's pixels, and of refused payloads."""
    import simplejpeg

    rng = random.Random(seed)
    counts = {"windows": 0, "differ_simplejpeg": 0, "differ_opencv": 0, "refused": 0}
    for payload in data:
        full = simplejpeg.decode_jpeg(payload, colorspace="rgb")
        ocv = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR_RGB)
        h, w = full.shape[:2]
        for _ in range(per_image):
            wh, ww = rng.randint(1, h), rng.randint(1, w)
            window = (rng.randint(0, h - wh), rng.randint(0, w - ww), wh, ww)
            got = decode_window(lib, payload, window)
            counts["windows"] += 1
            if got is None:
                counts["refused"] += 1
                continue
            t, left = window[0], window[1]
            counts["differ_simplejpeg"] += not np.array_equal(got, full[t:t + wh, left:left + ww])
            counts["differ_opencv"] += not np.array_equal(got, ocv[t:t + wh, left:left + ww])
    return counts


def _decode_methods(lib: ModuleType, data: list[bytes], windows: dict[str, list[Window]]) -> dict[str, Callable]:
    """One pass over ``data`` per method: each window set through the module, then simplejpeg's and
    OpenCV's full decodes."""
    import simplejpeg

    def windowed(ws: list[Window]) -> Callable[[], None]:
        def run() -> None:
            for p, w in zip(data, ws):
                decode_window(lib, p, w)  # each result dropped at once, as a reader's batch is
        return run

    def simple() -> None:
        for p in data:
            simplejpeg.decode_jpeg(p, colorspace="rgb", strict=True)

    def opencv() -> None:
        for p in data:
            cv2.imdecode(np.frombuffer(p, np.uint8), cv2.IMREAD_COLOR_RGB)

    methods: dict[str, Callable[[], None]] = {name: windowed(ws) for name, ws in windows.items()}
    methods["full, simplejpeg (the readers')"] = simple
    methods["full, cv2.imdecode to RGB"] = opencv
    return methods


def window_timings(lib: ModuleType, data: list[bytes], rounds: int, seed: int = 0) -> dict[str, float]:
    """Median over ``rounds`` of each method's mean microseconds per payload in one pass over all
    payloads; the methods take turns pass by pass, in an order that rotates each round."""
    import simplejpeg

    rng = random.Random(seed)
    sizes = [simplejpeg.decode_jpeg_header(p)[:2] for p in data]
    windows = {
        "full, packer.images._jpegwindow": [(0, 0, h, w) for h, w in sizes],
        "224 center crop window": [center_window(h, w) for h, w in sizes],
        "RandomCrop(224) window": [random_window(h, w, rng) for h, w in sizes],
        "RandomResizedCrop window": [resized_crop_window(h, w, rng) for h, w in sizes],
    }
    methods = _decode_methods(lib, data, windows)
    passes: dict[str, list[float]] = {name: [] for name in methods}
    for r in range(rounds):
        for name in turns(list(methods), r):
            passes[name].append(timed(methods[name])[0] / len(data) * 1e6)
    out = {name: statistics.median(v) for name, v in passes.items()}
    out["RandomResizedCrop mean area"] = statistics.fmean(
        hh * ww / (h * w) for (_, _, hh, ww), (h, w) in zip(windows["RandomResizedCrop window"], sizes))
    return out


def window_decode(a: argparse.Namespace) -> int:
    """Would decoding only the crop window make the JPEG read cheaper? Measured, not assumed.

    libjpeg-turbo's libjpeg API can leave out part of a decode: ``jpeg_skip_scanlines`` skips rows
    (still entropy-decoded, but no inverse DCT, upsampling or colour conversion),
    ``jpeg_crop_scanline`` narrows every row to a column range (rounded out to iMCU columns), and
    a decode can stop after the last row it needs. packer's C module ``packer.images._jpegwindow`` does
    this (built at install where a C compiler and libjpeg-turbo's headers are there), and the
    readers' ``crop=`` uses it. Measured on the stored payloads of a packed JPEG dataset:

    - the pixel check: windows of random size and place, each against the same rectangle of a
      full decode by simplejpeg (the readers' decoder) and by ``cv2.imdecode``;
    - the time per image, in one process: each method decodes every payload once per round (a
      pass, as an epoch does), the methods taking turns pass by pass, median of ``--rounds``
      passes, with the malloc settings readers have in DataLoader workers: a full decode through
      the same module, windows as the 224 center crop, as ``RandomCrop(224)`` and as
      ``RandomResizedCrop`` (area 8-100%, aspect 3/4-4/3) take them; with simplejpeg's and
      OpenCV's full decodes for reference.
    """
    cv2.setNumThreads(1)
    from packer.datasets import worker_memory
    from packer.images import imageproc

    worker_memory._apply()  # the malloc settings of a DataLoader worker, where readers decode
    data = jpeg_payloads(a.dataset, a.images)
    if not data:
        print(f"error: {a.dataset} holds no JPEG payloads", file=sys.stderr)
        return 2
    lib = imageproc._jpegwindow
    if lib is None:
        print("error: packer was installed without its C module packer.images._jpegwindow (no C compiler or no "
              "libjpeg-turbo headers at install; see setup.py)", file=sys.stderr)
        return 2
    counts = window_check(lib, data)
    times = window_timings(lib, data, a.rounds)
    area = times.pop("RandomResizedCrop mean area")
    print(f"{len(data)} payloads of {a.dataset}; pixel check: {counts['windows']} random windows, "
          f"{counts['differ_simplejpeg']} differ from simplejpeg's full decode, {counts['differ_opencv']} from "
          f"OpenCV's, {counts['refused']} refused\n")
    base, readers = times["full, packer.images._jpegwindow"], times["full, simplejpeg (the readers')"]
    header("decode", "us/image", "/ full, same library", "/ simplejpeg's full decode")
    for name, us in times.items():
        row(name, f"{us:.0f}", f"{us / base:.2f}", f"{us / readers:.2f}")
    print(f"\nRandomResizedCrop windows cover {area:.0%} of the image on average.")
    return 0


def _window_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", help="a packed dataset of JPEG payloads")
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)


# -- cache-fill ---------------------------------------------------------------------------------------
CACHE_KINDS = ["uncached", "batched", "per sample"]


def _fresh(path: str, kind: str):  # noqa: ANN202
    from packer.datasets import open_dataset

    ds = open_dataset(path, transform=crop224, cache=None if kind == "uncached" else "decoded")
    if kind == "per sample":
        ds.__getitems__ = None  # the DataLoader's fetcher then reads ds[i] per sample
    return ds


def cache_epoch(path: str, kind: str) -> tuple[float, float]:
    """(img/s, CPU us per image of workers and main process) of one epoch through a fresh
    DataLoader over a fresh dataset."""
    from packer.datasets import collate

    ds = _fresh(path, kind)
    loader = DataLoader(ds, batch_size=64, num_workers=2, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(0))
    c0, t0 = cpu_seconds(), time.perf_counter()
    it = iter(loader)
    n = sum(x.shape[0] for x, _ in it)
    del it  # the workers exit: their CPU time is then in RUSAGE_CHILDREN
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    if kind != "uncached":
        assert len(ds.cache) == len(ds), f"{kind}: the epoch cached {len(ds.cache)} of {len(ds)}"
    ds.close()
    return n / wall, cpu / n * 1e6


def cache_in_process_cost(path: str, rounds: int, count: int = 1024) -> dict[str, float]:
    """Median microseconds per sample in one process (no DataLoader) over ``count`` shuffled
    samples, for each kind, on fresh datasets per round; the kinds take turns batch by batch
    (64 samples), in a rotating order, so the machine's load treats them alike."""
    from packer.datasets import open_dataset

    with open_dataset(path) as ds:
        order = np.random.default_rng(0).permutation(len(ds))[:count].tolist()
    batches = [order[j : j + 64] for j in range(0, len(order), 64)]
    per: dict[str, list[float]] = {k: [] for k in CACHE_KINDS}
    for r in range(rounds):
        sets = {kind: _fresh(path, kind) for kind in CACHE_KINDS}
        spent = dict.fromkeys(CACHE_KINDS, 0.0)
        for k, batch in enumerate(batches):
            for kind in turns(CACHE_KINDS, k + r):
                ds = sets[kind]
                t0 = time.perf_counter()
                if kind == "per sample":
                    [ds[i] for i in batch]
                else:
                    ds.__getitems__(batch)
                spent[kind] += time.perf_counter() - t0
        for kind in CACHE_KINDS:
            per[kind].append(spent[kind] / len(order) * 1e6)
            sets[kind].close()
    return {k: statistics.median(v) for k, v in per.items()}


def cache_put_cost(path: str, rounds: int, count: int = 2048) -> dict[str, float]:
    """Median microseconds per stored decoded entry of ``path``'s size (header and pixels) into
    fresh caches: ``put`` per entry against ``put_many`` per batch of 64, taking turns."""
    from packer.datasets import open_dataset
    from packer.datasets.cache import SharedCache

    ds = open_dataset(path)
    rgb = np.ascontiguousarray(ds.decode(ds.read_record(0)))
    head = b"\0" * 16
    per: dict[str, list[float]] = {"put": [], "put_many": []}
    for r in range(rounds):
        caches = {kind: SharedCache(count, count * (rgb.nbytes + 128)) for kind in per}
        spent = dict.fromkeys(caches, 0.0)
        for start in range(0, count, 64):
            span = range(start, min(start + 64, count))
            for kind in turns(["put", "put_many"], start // 64 + r):
                cache = caches[kind]
                t0 = time.perf_counter()
                if kind == "put":
                    for i in span:
                        cache.put(i, (head, rgb))
                else:
                    cache.put_many([(i, (head, rgb)) for i in span])
                spent[kind] += time.perf_counter() - t0
        for kind, cache in caches.items():
            per[kind].append(spent[kind] / count * 1e6)
            cache.close()
    return {k: statistics.median(v) for k, v in per.items()} | {"bytes": rgb.nbytes + len(head)}


def _cache_epochs_row(path: str, rounds: int) -> None:
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in CACHE_KINDS}
    for r in range(rounds):
        for kind in turns(CACHE_KINDS, r):
            got[kind].append(cache_epoch(path, kind))
    rate = {k: statistics.median(x[0] for x in v) for k, v in got.items()}
    cpu = {k: statistics.median(x[1] for x in v) for k, v in got.items()}
    ratio = {k: statistics.median(x[0] / u[0] for x, u in zip(got[k], got["uncached"])) for k in CACHE_KINDS}
    bound = {k: statistics.median(u[1] / x[1] for x, u in zip(got[k], got["uncached"])) for k in CACHE_KINDS}
    per_round = ", ".join(f"{x[0] / u[0]:.2f}" for x, u in zip(got["batched"], got["uncached"]))
    row(name_of(path), f"{rate['uncached']:.0f}", f"{rate['batched']:.0f}", f"{ratio['batched']:.2f}",
        f"{rate['per sample']:.0f}", f"{ratio['per sample']:.2f}", f"{cpu['uncached']:.0f}", f"{cpu['batched']:.0f}",
        f"{cpu['per sample']:.0f}", f"{bound['batched']:.2f}, {bound['per sample']:.2f}", per_round)


def cache_fill(a: argparse.Namespace) -> int:
    """Filling the decoded cache: epoch 1 of ``cache="decoded"`` against an uncached epoch, side by side.

    DataLoader as in ``getitems``: 2 workers, batch 64, shuffled, ``transform`` = 224 center crop,
    ``collate_fn=packer.datasets.collate``; workers not persistent. Per round and dataset, three
    epochs on fresh datasets, in an order that rotates from round to round: ``uncached`` (no
    cache), ``batched`` (epoch 1 of ``cache="decoded"``: each batch looks up and stores its
    samples with one ``get_many`` and one ``put_many``) and ``per sample`` (the same epoch 1 with
    ``__getitems__`` hidden, so every sample takes its own ``get`` and ``put``). The cache is
    created before the epoch is timed. Each epoch gives img/s and the CPU time per image of the
    workers and the main process (``getrusage``), which still compares when other jobs load the
    machine. Medians over rounds; ratios are per round, then the median. Then the same three
    reads in one process, batch by batch, and the stores alone, ``put`` per entry against
    ``put_many`` per batch.
    """
    header("dataset", "uncached img/s", "epoch 1, batched", "/ uncached", "epoch 1, per sample", "/ uncached",
           "CPU us/img uncached", "batched", "per sample", "CPU-bound batched / uncached, per sample / uncached",
           "per round (batched / uncached)")
    for path in a.paths:
        _cache_epochs_row(path, a.rounds)
    print()
    header("dataset", "one process, uncached us/sample", "epoch 1, batched", "epoch 1, per sample",
           "fill cost, batched", "fill cost, per sample")
    for path in a.paths:
        us = cache_in_process_cost(path, a.rounds)
        row(name_of(path), f"{us['uncached']:.1f}", f"{us['batched']:.1f}", f"{us['per sample']:.1f}",
            f"{us['batched'] - us['uncached']:.1f}", f"{us['per sample'] - us['uncached']:.1f}")
    print()
    header("dataset", "entry bytes", "put us/entry", "put_many us/entry", "put_many / put")
    for path in a.paths:
        us = cache_put_cost(path, a.rounds)
        row(name_of(path), us["bytes"], f"{us['put']:.1f}", f"{us['put_many']:.1f}", f"{us['put_many'] / us['put']:.2f}")
    return 0


def _cache_fill_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", help="packed datasets (jpeg) to read")
    p.add_argument("--rounds", type=int, default=3)


# -- getitems -----------------------------------------------------------------------------------------
def epoch_rate(path: str, batched: bool, epochs: int = 2) -> float:
    """The best img/s of ``epochs`` epochs through a fresh DataLoader over ``path``."""
    from packer.datasets import collate, open_dataset

    ds = open_dataset(path, transform=crop224)
    if not batched:
        ds.__getitems__ = None  # the DataLoader's fetcher then reads ds[i] per sample
    loader = DataLoader(ds, batch_size=64, num_workers=2, shuffle=True, collate_fn=collate,
                        persistent_workers=True, generator=torch.Generator().manual_seed(0))
    best = 0.0
    for _ in range(epochs):
        t0 = time.perf_counter()
        n = sum(x.shape[0] for x, _ in loader)
        best = max(best, n / (time.perf_counter() - t0))
    return best


def getitems_in_process_cost(path: str, rounds: int, count: int = 2048) -> tuple[float, float]:
    """Median microseconds per sample in one process (no DataLoader): ``[ds[i] for i in batch]``
    and ``ds.__getitems__(batch)`` over the same shuffled batches of 64 (each batch read both ways,
    in alternating order, so the page cache and the machine's load treat both alike)."""
    from packer.datasets import open_dataset

    ds = open_dataset(path, transform=crop224)
    order = np.random.default_rng(0).permutation(len(ds))[:count].tolist()
    batches = [order[j : j + 64] for j in range(0, len(order), 64)]
    single, batched = [], []
    for r in range(rounds):  # batch by batch, alternating which goes first, so drift hits both
        times = {False: 0.0, True: 0.0}
        for k, b in enumerate(batches):
            for use_batched in turns((False, True), k + r):
                t0 = time.perf_counter()
                ds.__getitems__(b) if use_batched else [ds[i] for i in b]
                times[use_batched] += time.perf_counter() - t0
        single.append(times[False] / len(order) * 1e6)
        batched.append(times[True] / len(order) * 1e6)
    return statistics.median(single), statistics.median(batched)


def _bare_decode(payloads: list[bytes], seconds: float, how: str, out: multiprocessing.Queue) -> None:
    if how == "turbo":
        import simplejpeg
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        for p in payloads:
            if how == "bgr":
                cv2.cvtColor(cv2.imdecode(np.frombuffer(p, np.uint8), cv2.IMREAD_COLOR_BGR), cv2.COLOR_BGR2RGB)
            elif how == "turbo":
                simplejpeg.decode_jpeg(p, colorspace="rgb", strict=True)
            else:
                cv2.imdecode(np.frombuffer(p, np.uint8), cv2.IMREAD_COLOR_RGB)
        n += len(payloads)
    out.put((n, time.process_time() - c0))


def bare_decode_rate(path: str, processes: int = 2, seconds: float = 1.5, count: int = 1000,
                     how: str = "rgb") -> tuple[float, float]:
    """(img/s, CPU us per image) of ``processes`` processes decoding stored payloads in a loop:
    ``how`` = "rgb": ``cv2.imdecode`` straight to RGB; "bgr": to BGR and then ``cvtColor``;
    "turbo": TurboJPEG (simplejpeg) to RGB, the readers' JPEG decoder."""
    from packer.datasets import open_dataset

    ds = open_dataset(path)
    order = np.random.default_rng(1).permutation(len(ds))[: count * processes].tolist()
    payloads = [bytes(ds.read_record(i).payload) for i in order]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_bare_decode, args=(payloads[k::processes], seconds, how, out))
             for k in range(processes)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    done = [out.get() for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    n = sum(d[0] for d in done)
    return n / wall, sum(d[1] for d in done) / n * 1e6


def loader_epoch(path: str, worker_init_fn: Any = None, samples: int | None = None,
                 reader_crop: bool = False) -> dict | None:
    """One shuffled epoch through DataLoader(2 workers, batch 64, 224 crop, collate), workers
    started for it as by default: img/s, first batch ms, CPU us and page faults per image of the
    workers and of this process, and the threads of a worker at the end of the epoch. With
    ``samples``, the epoch draws that many samples at random with replacement (a longer epoch
    over the same data: start-up costs spread as over a large dataset). ``reader_crop``: the
    crop is the reader's ``crop=224`` instead of the transform (None where the revision read
    has no ``crop=``)."""
    from torch.utils.data import RandomSampler

    from packer.datasets import collate, open_dataset

    try:
        ds = open_dataset(path, crop=224) if reader_crop else open_dataset(path, transform=crop224)
    except TypeError:
        return None
    gen = torch.Generator().manual_seed(0)
    sampler = RandomSampler(ds, replacement=True, num_samples=samples, generator=gen) if samples else None
    loader = DataLoader(ds, batch_size=64, num_workers=2, shuffle=sampler is None, sampler=sampler,
                        collate_fn=collate, generator=gen, worker_init_fn=worker_init_fn)
    total = samples or len(ds)
    main0, kids0 = usage(resource.RUSAGE_SELF), usage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    it = iter(loader)
    n, first, threads = 0, 0.0, 0
    for x, _ in it:
        n += x.shape[0]
        if not first:
            first = time.perf_counter() - t0
        if n >= total - 64 and not threads:
            threads = max(len(os.listdir(f"/proc/{w.pid}/task")) for w in it._workers)
    del it, x  # the workers exit: their CPU time is then in RUSAGE_CHILDREN
    wall = time.perf_counter() - t0
    main1, kids1 = usage(resource.RUSAGE_SELF), usage(resource.RUSAGE_CHILDREN)
    return {"img_s": n / wall, "first_ms": first * 1e3, "worker_us": (kids1[0] - kids0[0]) / n * 1e6,
            "main_us": (main1[0] - main0[0]) / n * 1e6, "worker_faults": (kids1[1] - kids0[1]) / n,
            "threads": threads}


def ceiling_round(jpeg: str, raw: str, samples: int | None = None, turn: int = 0) -> dict:
    """One round of ``--ceiling``: the bare decode rate of 2 processes, then a JPEG and a raw
    epoch with the crop in the transform and the same with the reader's crop, in an order that
    rotates with ``turn`` (the round's number), so that no variant is always first or last."""
    bare, bare_us = bare_decode_rate(jpeg)
    bare_bgr = bare_decode_rate(jpeg, how="bgr")[0]
    bare_turbo, turbo_us = bare_decode_rate(jpeg, how="turbo")
    epochs = [("jpeg", jpeg, False), ("jpeg_crop", jpeg, True), ("raw", raw, False), ("raw_crop", raw, True)]
    out = {"bare_img_s": bare, "bare_us": bare_us, "bare_bgr_img_s": bare_bgr, "bare_turbo_img_s": bare_turbo,
           "turbo_us": turbo_us}
    for name, path, reader_crop in turns(epochs, turn):
        out[name] = loader_epoch(path, samples=samples, reader_crop=reader_crop)
    return out


def startup_round(path: str, loaders: int = 4, small: int = 128) -> dict:
    """In this fresh process: ``loaders`` DataLoaders (2 workers, the settings above) over the
    first ``small`` samples, one after the other, then one epoch of the whole dataset. Per small
    loader, the workers' CPU ms and page faults: what starting two workers costs, every epoch
    where workers are not persistent."""
    from torch.utils.data import Subset

    from packer.datasets import collate, open_dataset

    ds = open_dataset(path, transform=crop224)
    runs = []
    for _ in range(loaders):
        loader = DataLoader(Subset(ds, range(small)), batch_size=64, num_workers=2, shuffle=True, collate_fn=collate)
        k0 = usage(resource.RUSAGE_CHILDREN)
        it = iter(loader)
        for _batch in it:
            pass
        del it, _batch  # the workers exit: their CPU time is then in RUSAGE_CHILDREN
        k1 = usage(resource.RUSAGE_CHILDREN)
        runs.append(((k1[0] - k0[0]) * 1e3, k1[1] - k0[1]))
    return {"small_ms": [r[0] for r in runs], "small_faults": [r[1] for r in runs], "epoch": loader_epoch(path)}


def startup(path: str, rounds: int, revs: list[str]) -> None:
    """Print the ``--startup`` table: per revision, medians over ``rounds`` fresh processes."""
    work = tempfile.mkdtemp(prefix="packer-startup-")
    try:
        libs = revisions(revs, work)
        rows: dict[str, list[dict]] = {name: [] for name in libs}
        for r in range(rounds):
            for name in list(libs)[:: 1 if r % 2 == 0 else -1]:
                rows[name].append(in_revision(libs[name], "-m", "tools.bench_parts", "getitems", "--startup-round",
                                              path, tools=True))
                print(f"round {r + 1} {name}: {json.dumps(rows[name][-1])}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"medians of {rounds} fresh processes; DataLoader 2 workers, batch 64, shuffled, 224 crop, collate\n")
    header("revision", "workers' CPU ms, 128-image loaders 1, 2, 3, 4", "their page faults", "whole epoch img/s",
           "whole epoch CPU us/img, workers + main", "first batch ms")
    for name, got in rows.items():
        ms = [statistics.median(g["small_ms"][k] for g in got) for k in range(len(got[0]["small_ms"]))]
        faults = [statistics.median(g["small_faults"][k] for g in got) for k in range(len(got[0]["small_faults"]))]
        row(name, ", ".join(f"{x:.0f}" for x in ms), ", ".join(f"{x:.0f}" for x in faults),
            f"{statistics.median(g['epoch']['img_s'] for g in got):.0f}",
            f"{statistics.median(g['epoch']['worker_us'] for g in got):.0f} + "
            f"{statistics.median(g['epoch']['main_us'] for g in got):.1f}",
            f"{statistics.median(g['epoch']['first_ms'] for g in got):.0f}")


def _opencv_one_thread(worker_id: int) -> None:
    cv2.setNumThreads(1)


def _freeze_at_start(worker_id: int) -> None:
    gc.freeze()


#: name -> (worker_init_fn, torch threads of the main process) of ``--candidates``.
CANDIDATES: dict[str, tuple[Any, int | None]] = {
    "as is": (None, None),
    "cv2.setNumThreads(1) in workers": (_opencv_one_thread, None),
    "main process at 1 torch thread": (None, 1),
    "gc.freeze() at worker start": (_freeze_at_start, None),
}


def candidates(jpeg: str, raw: str, rounds: int) -> None:
    """Print CPU us per image (workers + main) and worker faults per image of each of
    :data:`CANDIDATES`, one epoch each per round, candidates interleaved."""
    threads = torch.get_num_threads()
    rows: dict[str, list[tuple[dict, dict]]] = {name: [] for name in CANDIDATES}
    for _ in range(rounds):
        for name, (init, main_threads) in CANDIDATES.items():
            torch.set_num_threads(main_threads or threads)
            rows[name].append((loader_epoch(jpeg, init), loader_epoch(raw, init)))
    torch.set_num_threads(threads)
    print(f"medians of {rounds} rounds; CPU us per image, workers + main; worker page faults per image\n")
    header("candidate", "JPEG CPU us/img", "JPEG faults/img", "raw CPU us/img", "raw faults/img")
    for name, got in rows.items():
        cells = []
        for k in (0, 1):
            cells.append(f"{statistics.median(g[k]['worker_us'] for g in got):.0f} + "
                         f"{statistics.median(g[k]['main_us'] for g in got):.1f}")
            cells.append(f"{statistics.median(g[k]['worker_faults'] for g in got):.1f}")
        row(name, *cells)


def _cpu(epoch: dict) -> float:
    """CPU us per image of an epoch, workers and main process together."""
    return epoch["worker_us"] + epoch["main_us"]


def ceiling(jpeg: str, raw: str, rounds: int, revs: list[str] | None, samples: int | None = None) -> None:
    """Print the ``--ceiling`` tables: medians over ``rounds``, per revision."""
    libs: dict[str, str | None] = {"this tree": None}
    work = tempfile.mkdtemp(prefix="packer-ceiling-")
    try:
        if revs:
            libs = dict(revisions(revs, work))
        rows: dict[str, list[dict]] = {name: [] for name in libs}
        for r in range(rounds):
            for name in list(libs)[:: 1 if r % 2 == 0 else -1]:
                lib = libs[name]
                more = ("--epoch-samples", str(samples)) if samples else ()
                rows[name].append(ceiling_round(jpeg, raw, samples, r) if lib is None else
                                  in_revision(lib, "-m", "tools.bench_parts", "getitems", "--ceiling-round", jpeg, raw,
                                              *more, tools=True))
                print(f"round {r + 1} {name}: {json.dumps(rows[name][-1])}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"medians of {rounds} rounds; DataLoader 2 workers, batch 64, shuffled, 224 crop, collate"
          f"{f', epochs of {samples} samples drawn with replacement' if samples else ''}\n")
    _ceiling_table(rows)
    print("\nThe same with the crop made by the reader (`open_dataset(path, crop=224)`: JPEGs decoded only in "
          "the crop's window) instead of by the transform:\n")
    _reader_crop_table(rows)


def _ceiling_table(rows: dict[str, list[dict]]) -> None:
    header("revision", "2 x bare decode img/s (RGB; BGR + cvtColor; TurboJPEG)", "JPEG read img/s",
           "JPEG / bare (RGB; BGR + cvtColor; TurboJPEG)", "raw read img/s", "raw / JPEG",
           "CPU us/img JPEG: workers + main (bare RGB; TurboJPEG)", "raw: workers + main",
           "CPU-bound JPEG / bare RGB, raw / JPEG", "worker faults/img JPEG, raw", "worker threads",
           "first batch ms JPEG, raw")
    for name, got in rows.items():
        def med(f: Callable[[dict], float], got: list[dict] = got) -> float:
            return statistics.median(f(x) for x in got)

        row(name, f"{med(lambda x: x['bare_img_s']):.0f}; {med(lambda x: x['bare_bgr_img_s']):.0f}; "
                  f"{med(lambda x: x['bare_turbo_img_s']):.0f}",
            f"{med(lambda x: x['jpeg']['img_s']):.0f}",
            f"{med(lambda x: x['jpeg']['img_s'] / x['bare_img_s']):.2f}; "
            f"{med(lambda x: x['jpeg']['img_s'] / x['bare_bgr_img_s']):.2f}; "
            f"{med(lambda x: x['jpeg']['img_s'] / x['bare_turbo_img_s']):.2f}",
            f"{med(lambda x: x['raw']['img_s']):.0f}", f"{med(lambda x: x['raw']['img_s'] / x['jpeg']['img_s']):.2f}",
            f"{med(lambda x: x['jpeg']['worker_us']):.0f} + {med(lambda x: x['jpeg']['main_us']):.1f} "
            f"({med(lambda x: x['bare_us']):.0f}; {med(lambda x: x['turbo_us']):.0f})",
            f"{med(lambda x: x['raw']['worker_us']):.0f} + {med(lambda x: x['raw']['main_us']):.1f}",
            f"{med(lambda x: x['bare_us'] / _cpu(x['jpeg'])):.2f}, {med(lambda x: _cpu(x['jpeg']) / _cpu(x['raw'])):.2f}",
            f"{med(lambda x: x['jpeg']['worker_faults']):.1f}, {med(lambda x: x['raw']['worker_faults']):.1f}",
            f"{med(lambda x: x['jpeg']['threads']):.0f}",
            f"{med(lambda x: x['jpeg']['first_ms']):.0f}, {med(lambda x: x['raw']['first_ms']):.0f}")


def _reader_crop_table(rows: dict[str, list[dict]]) -> None:
    header("revision", "JPEG read img/s", "JPEG / bare (RGB; BGR + cvtColor; TurboJPEG)", "raw read img/s",
           "raw / JPEG", "CPU us/img JPEG: workers + main", "raw: workers + main", "CPU-bound JPEG / bare RGB, raw / JPEG")
    for name, got in rows.items():
        if any(x.get("jpeg_crop") is None or x.get("raw_crop") is None for x in got):
            print(f"| {name} | (no `crop=` in this revision) |||||||")
            continue

        def med(f: Callable[[dict], float], got: list[dict] = got) -> float:
            return statistics.median(f(x) for x in got)

        row(name, f"{med(lambda x: x['jpeg_crop']['img_s']):.0f}",
            f"{med(lambda x: x['jpeg_crop']['img_s'] / x['bare_img_s']):.2f}; "
            f"{med(lambda x: x['jpeg_crop']['img_s'] / x['bare_bgr_img_s']):.2f}; "
            f"{med(lambda x: x['jpeg_crop']['img_s'] / x['bare_turbo_img_s']):.2f}",
            f"{med(lambda x: x['raw_crop']['img_s']):.0f}",
            f"{med(lambda x: x['raw_crop']['img_s'] / x['jpeg_crop']['img_s']):.2f}",
            f"{med(lambda x: x['jpeg_crop']['worker_us']):.0f} + {med(lambda x: x['jpeg_crop']['main_us']):.1f}",
            f"{med(lambda x: x['raw_crop']['worker_us']):.0f} + {med(lambda x: x['raw_crop']['main_us']):.1f}",
            f"{med(lambda x: x['bare_us'] / _cpu(x['jpeg_crop'])):.2f}, "
            f"{med(lambda x: _cpu(x['jpeg_crop']) / _cpu(x['raw_crop'])):.2f}")


def _getitems_tables(paths: list[str], rounds: int) -> None:
    header("dataset", "ds[i] per sample img/s", "__getitems__ img/s", "after / before", "rounds (after / before)")
    for path in paths:
        before, after = [], []
        for r in range(rounds):
            for batched in turns((False, True), r):
                (after if batched else before).append(epoch_rate(path, batched))
        ratios = [x / y for x, y in zip(after, before)]
        row(name_of(path), f"{statistics.median(before):.0f}", f"{statistics.median(after):.0f}",
            f"{statistics.median(ratios):.3f}", ", ".join(f"{x:.2f}" for x in ratios))
    print()
    header("dataset", "one process, ds[i] us/sample", "__getitems__ us/sample", "saved")
    for path in paths:
        single, batched = getitems_in_process_cost(path, rounds)
        row(name_of(path), f"{single:.1f}", f"{batched:.1f}", f"{(single - batched) / single:.1%}")


def getitems(a: argparse.Namespace) -> int:
    """The batched read (``__getitems__``) against one ``ds[i]`` per sample, side by side in one run.

    DataLoader: 2 workers, batch 64, shuffled, ``transform`` = 224 center crop,
    ``collate_fn=packer.datasets.collate``, persistent workers. "before" is the same dataset with
    ``__getitems__`` hidden (the DataLoader then calls ``ds[i]`` per sample). Rounds alternate
    before/after; each figure is the better of 2 epochs, and the table gives the median over rounds.

    ``--ceiling JPEG RAW`` measures the read against what the machine can decode: two processes
    decoding the stored JPEG bytes in a loop (``cv2.imdecode`` straight to RGB; to BGR then
    ``cvtColor``; TurboJPEG, the readers' decoder), then one epoch of the JPEG and one of the
    raw-pixel dataset (workers not persistent, as by default), and the same two epochs with the
    reader's ``crop=224`` instead of the transform. Each row also gives the CPU time per image
    of the workers and of the main process (``getrusage``), the workers' page faults and threads,
    and the time to the first batch. "CPU-bound" ratios divide CPU time per image. ``--revs OLD
    NEW`` runs each round under both revisions (exported as ``versions`` does), alternating;
    ``--candidates`` gives the CPU time per image of each candidate fix instead.

    ``--startup DATASET --revs OLD NEW`` measures what starting a DataLoader's two workers costs
    (their CPU time and page faults over 128 images), for four DataLoaders in a row in a fresh
    process per revision and round, then one whole epoch.
    """
    if a.ceiling_round:
        print(json.dumps(ceiling_round(*a.paths, a.epoch_samples)))
    elif a.startup_round:
        print(json.dumps(startup_round(a.paths[0])))
    elif a.startup:
        if len(a.paths) != 1 or not a.revs:
            a.error("--startup takes one dataset and --revs")
        startup(a.paths[0], a.rounds, a.revs)
    elif a.ceiling:
        if len(a.paths) != 2:
            a.error("--ceiling takes a JPEG dataset and a raw dataset")
        if a.candidates:
            candidates(a.paths[0], a.paths[1], a.rounds)
        else:
            ceiling(a.paths[0], a.paths[1], a.rounds, a.revs, a.epoch_samples)
    else:
        _getitems_tables(a.paths, a.rounds)
    return 0


def _getitems_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", help="packed datasets (jpeg) to read; with --ceiling: a JPEG and "
                   "a raw-pixel dataset of the same images")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ceiling", action="store_true", help="the read against 2 processes' bare decode rate")
    p.add_argument("--revs", nargs="+", help="with --ceiling: git revisions (or folders laid out as the "
                   "installed package) to compare, round by round")
    p.add_argument("--candidates", action="store_true", help="with --ceiling: CPU per image of each "
                   "candidate fix (worker threads, main-process threads, gc.freeze), in this process")
    p.add_argument("--startup", action="store_true", help="with --revs: what starting a DataLoader's "
                   "workers costs, in fresh processes, per revision")
    p.add_argument("--epoch-samples", type=int, help="with --ceiling: epochs of N samples drawn with "
                   "replacement instead of one pass (start-up spread as over a large dataset)")
    p.add_argument("--ceiling-round", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--startup-round", action="store_true", help=argparse.SUPPRESS)


# -- versions -----------------------------------------------------------------------------------------
VERSIONS_CONVERT = r'''
import json, sys, time
try:
    from packer.ops.engine import ConvertOptions, convert_imagefolder
except ImportError:  # revisions before packer/ops (0.1), where the engine was packer.engine
    from packer.engine import ConvertOptions, convert_imagefolder
from packer.images.imageproc import ProcessOptions, parse_resize
src, fmt, dst = sys.argv[1:4]
t = time.perf_counter()
rep = convert_imagefolder(src, dst, fmt, ConvertOptions(processing=ProcessOptions(resize=parse_resize("shorter:160")),
                                                        workers=2, progress=False))
print(json.dumps({"img_s": rep.manifest.num_samples / (time.perf_counter() - t)}))
'''

VERSIONS_READ = r'''
import json, sys, time
from packer.datasets import open_dataset
ds = open_dataset(sys.argv[1], output="numpy")
for i in range(len(ds)):
    ds.read_record(i)
rec = get = 1e9
for _ in range(3):
    t = time.perf_counter()
    for i in range(len(ds)):
        ds.read_record(i)
    rec = min(rec, time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(len(ds)):
        ds[i]
    get = min(get, time.perf_counter() - t)
import torch
loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2, collate_fn=len)
sum(loader)  # warm-up: worker start-up paths, page cache
epoch = 1e9
for _ in range(3):
    t = time.perf_counter()
    sum(loader)
    epoch = min(epoch, time.perf_counter() - t)
print(json.dumps({"rec_us": rec / len(ds) * 1e6, "get_us": get / len(ds) * 1e6, "loader_img_s": len(ds) / epoch}))
'''


def _versions_table(res: dict[tuple[str, str], list[dict]]) -> None:
    header("format", "convert img/s, old / new", "read_record us, old / new", "ds[i] us, old / new",
           "DataLoader (2 workers) img/s, old / new")
    for fmt in FORMATS:
        o, n = res[(fmt, "old")], res[(fmt, "new")]
        co, cn = max(r["img_s"] for r in o), max(r["img_s"] for r in n)
        ro, rn = min(r["rec_us"] for r in o), min(r["rec_us"] for r in n)
        go, gn = min(r["get_us"] for r in o), min(r["get_us"] for r in n)
        lo, ln = max(r["loader_img_s"] for r in o), max(r["loader_img_s"] for r in n)
        row(fmt, f"{co:.0f} / {cn:.0f} ({cn / co:.2f}x)", f"{ro:.1f} / {rn:.1f}",
            f"{go:.0f} / {gn:.0f} ({go / gn:.2f}x speed)", f"{lo:.0f} / {ln:.0f} ({ln / lo:.2f}x)")


def versions(a: argparse.Namespace) -> int:
    """Compare two revisions of packer side by side in one run: conversion speed and read speed.

    Each revision is exported with ``git archive`` into a temporary folder laid out as the
    installed package and run in subprocesses with that folder first on PYTHONPATH, so both run
    against the same Python and libraries. Conversions (ImageFolder of real photos from the
    workplace's shared photo set, ``shorter:160``, JPEG 90, 2 workers) and reads (``read_record``
    and ``ds[i]`` over every sample, and DataLoader epochs with 2 workers, best of 3) alternate
    between the revisions, round by round; the table gives the best of the rounds and the
    new/old ratio (machines drift 10-20% between runs, so only the ratio of one run means anything).
    """
    work = tempfile.mkdtemp(prefix="packer-versions-")
    try:
        libs = {v: export(rev, os.path.join(work, v)) for v, rev in (("old", a.old), ("new", a.new))}
        src = os.path.join(work, "src")
        subprocess.run([sys.executable, os.path.join(REPO, "..", "shared", "tools", "make_imagefolder.py"), src,
                        "--classes", "4", "--per-class", str(a.per_class)], check=True, capture_output=True)
        res: dict[tuple[str, str], list[dict]] = {}
        for rnd in range(a.rounds):
            for fmt in FORMATS:
                for v in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
                    dst = os.path.join(work, f"{v}-{fmt}")
                    shutil.rmtree(dst, ignore_errors=True)
                    got = in_revision(libs[v], "-c", VERSIONS_CONVERT, src, fmt, dst) | \
                        in_revision(libs[v], "-c", VERSIONS_READ, dst)
                    res.setdefault((fmt, v), []).append(got)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"old {a.old}, new {a.new}; {4 * a.per_class} images; best of {a.rounds} rounds\n")
    _versions_table(res)
    return 0


def _versions_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("old")
    p.add_argument("new", nargs="?", default="HEAD")
    p.add_argument("--per-class", type=int, default=100, help="images per class (4 classes)")
    p.add_argument("--rounds", type=int, default=2)


# -- reduced ------------------------------------------------------------------------------------------
PHOTOS = os.path.join(REPO, "..", "shared", "data", "photos")
FACTORS = (1, 2, 4, 8)
_FLAGS = {1: cv2.IMREAD_COLOR_BGR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
          8: cv2.IMREAD_REDUCED_COLOR_8}
RULES = (1.0, 1.5, 2.0, 3.0)
CAMERA_SIZES = ((4000, 3000), (3024, 4032), (3000, 2000), (2448, 3264), (4032, 3024), (2000, 3000),
                (3264, 2448), (3000, 4000))


def _jpeg(bgr: np.ndarray, quality: int) -> bytes:
    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


def load_photos(folder: str) -> list[np.ndarray]:
    """The folder's photos as BGR arrays, in name order."""
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith((".jpg", ".jpeg", ".png")))
    return [cv2.imread(os.path.join(folder, n), cv2.IMREAD_COLOR_BGR) for n in names]


def native_sources(folder: str, min_short: int = 320) -> list[bytes]:
    """Each photo with a shorter side >= ``min_short`` at its own resolution: JPEGs as they are,
    others encoded once as JPEG q95."""
    out = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.lower().endswith((".jpg", ".jpeg")):
            with open(path, "rb") as f:
                data = f.read()
        elif name.lower().endswith(".png"):
            data = _jpeg(cv2.imread(path, cv2.IMREAD_COLOR_BGR), 95)
        else:
            continue
        h, w = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_REDUCED_COLOR_8).shape[:2]
        if min(h, w) * 8 >= min_short:
            out.append(data)
    return out


def _mosaic(photos: list[np.ndarray], h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """An ``h`` x ``w`` canvas of native-resolution crops of ``photos``, flipped at random."""
    canvas = np.empty((h, w, 3), np.uint8)
    y = 0
    while y < h:
        rows = min(h - y, int(rng.integers(300, 900)))
        x = 0
        while x < w:
            col = min(w - x, int(rng.integers(300, 900)))
            p = photos[int(rng.integers(len(photos)))]
            if p.shape[0] < rows or p.shape[1] < col:  # a small photo: tile it
                p = np.tile(p, (-(-rows // p.shape[0]), -(-col // p.shape[1]), 1))
            py, px = int(rng.integers(p.shape[0] - rows + 1)), int(rng.integers(p.shape[1] - col + 1))
            tile = p[py:py + rows, px:px + col]
            canvas[y:y + rows, x:x + col] = tile[:, ::-1] if rng.random() < 0.5 else tile
            x += col
        y += rows
    return canvas


def camera_sources(photos: list[np.ndarray], count: int, seed: int = 0) -> list[bytes]:
    """``count`` camera-size mosaics (8-12 MP) of native-resolution crops, with sensor-like noise
    (sigma 2.5), as JPEG q92: every pixel has native detail, as a camera image has."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        w, h = CAMERA_SIZES[k % len(CAMERA_SIZES)]
        canvas = _mosaic(photos, h, w, rng)
        noisy = canvas.astype(np.float32) + rng.normal(0, 2.5, canvas.shape).astype(np.float32)
        out.append(_jpeg(np.clip(noisy, 0, 255).astype(np.uint8), 92))
    return out


def upsampled_sources(photos: list[np.ndarray], count: int, seed: int = 0) -> list[bytes]:
    """``count`` crops of one photo each, enlarged to a shorter side of 2000-3000 px, JPEG q90."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        p = photos[k % len(photos)]
        s = rng.uniform(0.35, 1.0)
        ch, cw = max(16, int(p.shape[0] * s)), min(p.shape[1], max(16, int(p.shape[1] * s)))
        y, x = int(rng.integers(p.shape[0] - ch + 1)), int(rng.integers(p.shape[1] - cw + 1))
        short = int(rng.integers(2000, 3001))
        ar = rng.uniform(0.75, 1.333)
        h, w = (short, int(short * ar)) if k % 2 else (int(short * ar), short)
        out.append(_jpeg(cv2.resize(p[y:y + ch, x:x + cw], (w, h), interpolation=cv2.INTER_LINEAR), 90))
    return out


def mad_mse(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Mean absolute difference (0-255 levels) and mean squared difference of two uint8 arrays."""
    d = a.astype(np.float64) - b.astype(np.float64)
    return float(np.mean(np.abs(d))), float(np.mean(d * d))


def psnr(mse: float) -> str:
    """PSNR in dB of a mean squared difference, or "exact"."""
    return "exact" if mse == 0 else f"{10 * np.log10(255.0**2 / mse):.1f}"


def decode_resize(data: bytes, factor: int, size: tuple[int, int]) -> np.ndarray:
    """packer's conversion path: decode at 1/``factor``, then INTER_AREA to ``size`` (w, h)."""
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), _FLAGS[factor])
    if (bgr.shape[1], bgr.shape[0]) == size:
        return bgr
    return cv2.resize(bgr, size, interpolation=cv2.INTER_AREA)


def pillow_thumbnail(data: bytes, size: tuple[int, int], reducing_gap: float | None) -> np.ndarray:
    """Pillow's ``thumbnail`` (BICUBIC; ``reducing_gap=2.0`` is its default, with draft mode) as BGR."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.thumbnail(size, reducing_gap=reducing_gap)
        return cv2.cvtColor(np.asarray(im.convert("RGB")), cv2.COLOR_RGB2BGR)


def best_time(f: Callable[[], np.ndarray], repeat: int) -> tuple[float, np.ndarray]:
    """The best of ``repeat`` calls' seconds, and the result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        seconds, out = timed(f)
        best = min(best, seconds)
    assert out is not None
    return best, out


@dataclass
class Cell:
    """Totals of one method over some images."""

    seconds: float = 0.0
    full_seconds: float = 0.0  # the full decode's time over the same images
    mad: list[float] = field(default_factory=list)
    mse: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)  # decoded shorter side / target shorter side

    def add(self, seconds: float, full: float, diff: tuple[float, float], ratio: float) -> None:
        """Count one image."""
        self.seconds += seconds
        self.full_seconds += full
        self.mad.append(diff[0])
        self.mse.append(diff[1])
        self.ratio.append(ratio)

    def row(self, label: str) -> str:
        """The table row of this method."""
        n = len(self.mad)
        return (f"| {label} | {n} | {min(self.ratio):.2f}-{max(self.ratio):.2f} | {n / self.seconds:.1f} | "
                f"{self.full_seconds / self.seconds:.2f} | {np.mean(self.mad):.2f} | {psnr(float(np.mean(self.mse)))} | "
                f"{psnr(max(self.mse))} |")


def reduced_measure(kind: str, sources: list[bytes], target: str, repeat: int) -> list[str]:
    """The table rows of one source kind and target."""
    from packer.images.imageproc import (
        REDUCED_DECODE_MARGIN,
        parse_resize,
        reduction_factor,
        target_size,
    )

    resize = parse_resize(target)
    factors = {f: Cell() for f in FACTORS}
    rules = {k: Cell() for k in RULES}
    pil, q90 = Cell(), []
    for data in sources:
        full_h, full_w = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_BGR).shape[:2]
        size = target_size(full_w, full_h, resize)
        short = min(size)
        runs = {f: best_time(lambda f=f, data=data, size=size: decode_resize(data, f, size), repeat)
                for f in FACTORS if full_w // f >= size[0] and full_h // f >= size[1]}
        t_pil, img_pil = best_time(lambda data=data, size=size: pillow_thumbnail(data, size, 2.0), repeat)
        t_fair, img_fair = best_time(lambda data=data, size=size: pillow_thumbnail(data, size, None), repeat)
        full_t, ref = runs[1]
        for f, (t, img) in runs.items():
            factors[f].add(t, full_t, mad_mse(img, ref), min(full_w, full_h) // f / short)
        for k in RULES:
            f = reduction_factor(full_w, full_h, size[0], size[1], k)
            rules[k].add(runs[f][0], full_t, mad_mse(runs[f][1], ref), min(full_w, full_h) // f / short)
        draft = max((f for f in FACTORS if full_w // f >= 2 * size[0] and full_h // f >= 2 * size[1]), default=1)
        pil.add(t_pil, t_fair, mad_mse(img_pil, img_fair), min(full_w, full_h) // draft / short)
        q90.append(mad_mse(cv2.imdecode(np.frombuffer(_jpeg(ref, 90), np.uint8), cv2.IMREAD_COLOR_BGR), ref)[1])
    rows = [f"| **{kind}, {target}** (storing the reference as JPEG q90: {psnr(float(np.mean(q90)))} dB, "
            f"worst {psnr(max(q90))}) | | | | | | | |"]
    rows += [factors[f].row("full decode" if f == 1 else f"factor {f}") for f in FACTORS if factors[f].mad]
    rows += [rules[k].row(f"rule k={k:g}" + (" (packer)" if k == REDUCED_DECODE_MARGIN else " (old default)" if k == 1 else ""))
             for k in RULES]
    rows.append(pil.row("Pillow thumbnail, draft (vs its fair resize)"))
    return rows


def reduced(a: argparse.Namespace) -> int:
    """What reduced-size JPEG decoding at conversion costs in pixels and what it saves in time.

    libjpeg can decode a JPEG at 1/2, 1/4 or 1/8 of its size (OpenCV's ``IMREAD_REDUCED_COLOR_*``);
    packer then resizes the result to the target with INTER_AREA as usual. For each source kind
    and target this prints, per reduction factor (over the images where the reduced decode still
    covers the target) and per selection rule (the largest factor that keeps the decoded image
    >= k x the target on both sides, over every image), the decode+resize speed and the
    difference to a full decode + the same resize (mean absolute difference in 0-255 levels and
    PSNR), with Pillow's ``Image.thumbnail`` (draft mode, ``reducing_gap`` 2) as the anchor,
    measured against Pillow's own fair resize without draft. The last column is what storing the
    reference as JPEG q90 loses anyway, as a yardstick.

    Source kinds, made from the workplace's photos (``--photos``): ``native`` (every photo with a
    shorter side >= 320 px at its own resolution, PNGs encoded once as JPEG q95), ``camera``
    (8-12 MP mosaics of native-resolution crops with sensor-like noise, JPEG q92) and
    ``upsampled`` (a crop of one photo enlarged to a shorter side of 2000-3000 px, JPEG q90:
    smoother than any camera image, so it understates the cost). Times are the best of
    ``--repeat`` per image and method, methods interleaved image by image, in one process.
    """
    photos = load_photos(a.photos)
    kinds = {"native": native_sources(a.photos), "camera": camera_sources(photos, a.images),
             "upsampled": upsampled_sources(photos, a.images)}
    print(f"OpenCV {cv2.__version__}; best of {a.repeat}; difference to a full decode + INTER_AREA to the same size "
          f"(Pillow: to its own thumbnail without draft); decoded / target = shorter sides\n")
    header("method", "images", "decoded / target", "img/s", "speed vs full decode", "MAD", "PSNR dB (pooled)",
           "worst image PSNR dB")
    for kind, sources in kinds.items():
        for target in a.targets:
            for line in reduced_measure(kind, sources, target, a.repeat):
                print(line, flush=True)
    return 0


def _reduced_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--photos", default=PHOTOS)
    p.add_argument("--images", type=int, default=8, help="camera and upsampled images each")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--targets", nargs="+", default=["shorter:256", "shorter:160"])


# -- remote -------------------------------------------------------------------------------------------
class LatencyProxy:
    """A TCP proxy to ``target`` that waits ``delay`` seconds before forwarding each HTTP request
    (each client chunk that starts with a method name) and counts the bytes sent back."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target, self.delay, self.down = target, delay, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.sock.accept()
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if upstream and data[:4] in (b"GET ", b"HEAD", b"PUT ", b"POST"):
                    time.sleep(self.delay)
                if not upstream:
                    self.down += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def options(self) -> dict:
        """fsspec storage options that reach the S3 server through this proxy."""
        return {"key": "x", "secret": "x", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{self.port}",
                                                              "region_name": "us-east-1"}}


def remote_epoch(ds) -> tuple[float, float]:  # noqa: ANN001
    """(images/s, CPU seconds of this process and its children) of one DataLoader epoch."""
    loader = DataLoader(ds, batch_size=64, num_workers=2, shuffle=False, collate_fn=lambda b: len(b))
    c, t = cpu_seconds(), time.perf_counter()
    n = sum(loader)
    return n / (time.perf_counter() - t), cpu_seconds() - c


def _s3_server() -> tuple[Any, int]:
    """A started moto S3 server on a free loopback port with bucket ``bench``, and its port."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    creds = {"aws_access_key_id": "x", "aws_secret_access_key": "x", "region_name": "us-east-1"}
    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", **creds).create_bucket(Bucket="bench")
    return server, port


def _remote_rows(a: argparse.Namespace, local: str, proxies: dict[str, LatencyProxy]) -> list[tuple]:
    """(read, img/s, CPU s, bytes from the server) of local, then S3 map-style and streaming reads
    through each proxy, cold then warm node cache."""
    from packer.datasets import StreamingDataset, open_dataset

    remote_epoch(open_dataset(local))  # warm-up: page cache, imports, worker start-up paths
    rows = [("local disk", *remote_epoch(open_dataset(local)), 0),
            ("local disk, streaming", *remote_epoch(StreamingDataset(local, shuffle=False, batch_size=64)), 0)]
    for label, proxy in proxies.items():
        for kind in ("map-style", "streaming"):
            cache = os.path.join(a.work, f"cache-{len(rows)}")
            for which in ("epoch 1 (cold cache)", "epoch 2 (warm cache)"):
                before = proxy.down
                if kind == "streaming":  # read-ahead of the next shards, whole shards per worker
                    ds = StreamingDataset("s3://bench/ds", storage_options=proxy.options(), cache_dir=cache,
                                          shuffle=False, batch_size=64, prefetch_shards=a.prefetch_shards)
                else:
                    ds = open_dataset("s3://bench/ds", storage_options=proxy.options(), cache_dir=cache)
                rate, cpu = remote_epoch(ds)
                rows.append((f"S3 {kind}, latency {label}, {which}", rate, cpu, proxy.down - before))
    return rows


def remote(a: argparse.Namespace) -> int:
    """Object storage against local disk, side by side in one run.

    A tar dataset read through a DataLoader from the local folder, and from a loopback S3 server
    (moto's), cold and warm node cache, with and without latency added to every request by a
    small proxy. moto runs on the same cores as the loader, so the table also gives the bytes
    moved and the CPU seconds per MB downloaded. Then the bytes one node (whole or quarter-size
    cache) and each of N simulated nodes download per epoch (``--egress-only``: only these).
    """
    from packer.datasets import open_dataset
    from packer.description.manifest import read_manifest
    from packer.ops.cli import main as cli
    from packer.storage.remote import Remote, upload_dataset

    shutil.rmtree(a.work, ignore_errors=True)
    local = os.path.join(a.work, "local.tar")
    cli(["convert", "imagefolder", "tar", a.src, local, "--resize", "shorter:160", "--shard-size", a.shard_size,
         "--workers", "2", "-q"])
    m = read_manifest(local)
    size = sum(f.bytes for f in m.files)
    server, port = _s3_server()
    proxies = {"none": LatencyProxy(("127.0.0.1", port), 0.0)}
    if not a.egress_only:
        proxies[f"{a.latency_ms:g} ms"] = LatencyProxy(("127.0.0.1", port), a.latency_ms / 1000)
    upload_dataset(local, Remote("s3://bench/ds", proxies["none"].options()), m)
    rows = [] if a.egress_only else _remote_rows(a, local, proxies)
    egress = _egress(a, proxies["none"], size)
    server.stop()
    if not a.egress_only:
        rows.append(("local disk, again", *remote_epoch(open_dataset(local)), 0))
        _print_remote(rows, m, size)
    _print_egress(egress, size)
    return 0


def _print_remote(rows: list[tuple], m: Any, size: int) -> None:
    base = max(rows[0][1], rows[-1][1])
    shards = sum(1 for f in m.files if f.samples)
    print(f"{m.num_samples} images, {size / 1e6:.1f} MB in {shards} shards; DataLoader 2 workers, "
          f"batch 64, decode to tensors, no transform\n")
    header("read", "img/s", "vs local (best of 2)", "MB from server", "x dataset", "CPU s / MB")
    for name, rate, cpu, down in rows:
        per = f"{cpu / (down / 1e6):.3f}" if down > size / 100 else "-"
        row(name, f"{rate:.0f}", f"{rate / base:.2f}", f"{down / 1e6:.1f}", f"{down / size:.2f}", per)


def _print_egress(egress: list[tuple[str, float]], size: int) -> None:
    print()
    header("bytes from the server (streaming, shuffled, DataLoader 2 workers)", "MB", "x dataset")
    for name, down in egress:
        row(name, f"{down / 1e6:.1f}", f"{down / size:.2f}")


def _egress(a: argparse.Namespace, proxy: LatencyProxy, size: int) -> list[tuple[str, float]]:
    """Bytes downloaded per epoch (mean of 2 shuffled epochs) by one node with a cache that holds
    the dataset, by one node whose cache holds a quarter of it, and by each of N simulated nodes
    (one rank each, its own cache) reading its share of the shards."""
    from packer.datasets import StreamingDataset
    from packer.datasets.world import World

    def epochs(cache: str, limit: int | None, world: World | None, window: Any = "auto") -> list[float]:
        ds = StreamingDataset("s3://bench/ds", storage_options=proxy.options(), cache_dir=cache, cache_limit=limit,
                              shuffle=True, batch_size=64, prefetch_shards=1, world=world, shuffle_shards=window)
        out = []
        for e in range(2):
            before = proxy.down
            ds.set_epoch(e)
            remote_epoch(ds)
            out.append(proxy.down - before)
        return out

    rows = []
    full = epochs(os.path.join(a.work, "eg-full"), None, None)
    rows += [("1 node, cache holds the dataset, epoch 1", full[0]), ("... epoch 2", full[1])]
    quarter = epochs(os.path.join(a.work, "eg-quarter"), size // 4, None)
    rows += [("1 node, cache holds a quarter (shard window), epoch 1", quarter[0]), ("... epoch 2", quarter[1])]
    buffered = epochs(os.path.join(a.work, "eg-buffer"), size // 4, None, None)
    rows += [("1 node, a quarter, sample buffer instead (before), epoch 1", buffered[0]), ("... epoch 2", buffered[1])]
    for n in (2, 4):
        per = [epochs(os.path.join(a.work, f"eg-{n}-{r}"), None, World(r, n))[0] for r in range(n)]
        rows.append((f"{n} nodes, epoch 1, each (mean; max {max(per) / size:.2f}x)", sum(per) / n))
    return rows


def _remote_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src", required=True, help="an image folder")
    p.add_argument("--work", default="/tmp/bench-remote")
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--shard-size", default="4MB")
    p.add_argument("--prefetch-shards", type=int, default=2)
    p.add_argument("--egress-only", action="store_true", help="only the bytes-per-node table (no timings)")


# -- scale --------------------------------------------------------------------------------------------
IMAGENET = 1_281_167
SCALE_SMALL = 100_000
BASELINE = 1_000  # samples of the dataset whose worker memory is subtracted (index-free baseline)
CLASSES = [f"n{c:08d}" for c in range(1000)]
TARGETS = {"open_s": 1.0, "index_mb": 64.0, "plan_s": 0.5, "resume_s": 1.0}


class TinyItems(Sequence):
    """``n`` items ``(jpeg bytes, class name, None)`` made on demand: five distinct 8x8 .. 16x16
    JPEGs, each item's own by a JPEG comment holding its number (so every payload differs)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.n = n
        self.bases = []
        for side in (8, 10, 12, 14, 16):
            y, x = np.mgrid[0:side, 0:side]
            img = np.stack([x * 16, y * 16, (x + y) * 8], axis=-1) + rng.integers(0, 32, (side, side, 3))
            self.bases.append(_jpeg(np.clip(img, 0, 255).astype(np.uint8), 90))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.n))]
        if not 0 <= i < self.n:
            raise IndexError(i)
        base = self.bases[i % len(self.bases)]
        comment = b"\xff\xfe\x00\x0c%010d" % i  # COM segment: length 12 = 2 + ten digits
        return base[:2] + comment + base[2:], CLASSES[(i * 7919) % len(CLASSES)], None


def scale_build(fmt: str, n: int, dst: str, workers: int) -> dict[str, Any]:
    """Child: convert ``n`` tiny items; seconds, size and the process tree's peak memory."""
    from packer.images.imageproc import Encoding, ProcessOptions
    from packer.ops.engine import ConvertOptions
    from packer.ops.items import convert_items

    opts = ConvertOptions(processing=ProcessOptions(encoding=Encoding("keep", 0)), workers=workers, overwrite=True)
    with TreeMemory(os.getpid()) as memory:
        t0 = time.perf_counter()
        report = convert_items(TinyItems(n), dst, fmt, opts, CLASSES)
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "samples": report.manifest.num_samples, "files": len(report.manifest.files),
            "bytes": sum(f.bytes for f in report.manifest.files), "tree_peak_mb": memory.peak[0] / 1024,
            "tree_anon_mb": memory.peak[1] / 1024}


def scale_open(path: str) -> dict[str, Any]:
    """Child: time to open, to read the last sample, per random read; resident memory."""
    import packer.datasets as pd

    opened, ds = timed(lambda: pd.open_dataset(path))
    first, _ = timed(lambda: ds.read_record(len(ds) - 1))
    t0 = time.perf_counter()
    for i in np.random.default_rng(0).integers(0, len(ds), 1000).tolist():
        ds.read_record(i)
    per_read = (time.perf_counter() - t0) / 1000
    return {"open_s": opened, "first_read_s": first, "read_us": per_read * 1e6, "rss_mb": _own_kb("VmRSS") / 1024}


class _Probe:
    """Reads sample i of the packed dataset and answers with this worker's PSS (kB)."""

    def __init__(self, path: str) -> None:
        import packer.datasets as pd

        self.ds = pd.open_dataset(path, output="numpy")

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[int, int]:
        self.ds[i]
        from torch.utils.data import get_worker_info

        return get_worker_info().id, _pss_kb()


def scale_pss(path: str, context: str, reads: int, workers: int) -> dict[str, Any]:
    """Child: each DataLoader worker's PSS after ``reads`` random reads."""
    probe = _Probe(path)
    order = np.random.default_rng(1).integers(0, len(probe), reads).tolist()
    loader = DataLoader(probe, batch_size=None, sampler=order, num_workers=workers, multiprocessing_context=context)
    last: dict[int, int] = {}
    t0 = time.perf_counter()
    for worker, pss in loader:
        last[int(worker)] = int(pss)
    return {"pss_mb": [last[w] / 1024 for w in sorted(last)], "seconds": time.perf_counter() - t0}


def scale_plan(path: str, world_size: int, workers: int, epochs: int) -> dict[str, Any]:
    """Child: time to construct a ``StreamingDataset`` and to plan each epoch."""
    from packer.datasets import StreamingDataset
    from packer.datasets.world import World

    build, ds = timed(lambda: StreamingDataset(path, world=World(0, world_size, 0, workers), seed=1))
    times = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        times.append(timed(lambda: iter(ds))[0])  # the plan is made when the iterator is
    return {"construct_s": build, "plan_s": sorted(times)[len(times) // 2], "plan_max_s": max(times),
            "per_worker": len(ds) // workers}


def scale_resume(path: str, at: int) -> dict[str, Any]:
    """Child: time to resume at sample ``at`` and read it, and whether it is the planned sample."""
    from packer.datasets import StreamingDataset
    from packer.datasets.partition import plan
    from packer.datasets.world import World

    world = World(0, 1, 0, 1)
    state = StreamingDataset(path, world=world, seed=1).state_dict(samples_consumed=at)
    t0 = time.perf_counter()
    ds = StreamingDataset(path, world=world, seed=1, output="numpy")
    ds.load_state_dict(state)
    image, label = next(iter(ds))
    seconds = time.perf_counter() - t0
    opts = ds.options
    want = int(plan(ds._sizes, world, seed=1, epoch=0, shuffle=True, partition=opts.partition,
                    buffer_size=opts.shuffle_buffer, batch_size=1)[at])
    rec = ds.reader.read_record(want)
    return {"resume_s": seconds, "same_sample": bool(label == rec.label and image.shape[:2] == (rec.height, rec.width))}


def _own_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _pss_kb(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _rss_kb(pid: int) -> tuple[int, int]:
    """(resident kB, of which anonymous: heap and stacks, not file pages such as an mmapped LMDB)."""
    out = {"VmRSS": 0, "RssAnon": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in out:
                    out[key] = int(line.split()[1])
    except OSError:
        pass
    return out["VmRSS"], out["RssAnon"]


class TreeMemory:
    """Peak RSS and peak anonymous RSS (kB) of a process and its descendants while the ``with``
    block runs, sampled every 20 ms by a thread (the conversion alone: not the interpreter's exit)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.done = pid, [0, 0], threading.Event()

    def _watch(self) -> None:
        while not self.done.wait(0.02):
            sizes = [_rss_kb(p) for p in _tree(self.pid)]
            self.peak[0] = max(self.peak[0], sum(r for r, _ in sizes))
            self.peak[1] = max(self.peak[1], sum(a for _, a in sizes))

    def __enter__(self) -> TreeMemory:
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


SCALE_CHILDREN: dict[str, Callable[[list[str]], dict[str, Any]]] = {
    "build": lambda r: scale_build(r[0], int(r[1]), r[2], int(r[3])),
    "open": lambda r: scale_open(r[0]),
    "pss": lambda r: scale_pss(r[0], r[1], int(r[2]), int(r[3])),
    "plan": lambda r: scale_plan(r[0], int(r[1]), int(r[2]), int(r[3])),
    "resume": lambda r: scale_resume(r[0], int(r[1])),
}


def run_child(*args: Any) -> dict[str, Any]:
    """Run ``scale --child args`` in a fresh interpreter; its JSON answer."""
    out = subprocess.run([sys.executable, "-m", "tools.bench_parts", "scale", "--child", *map(str, args)],
                         stdout=subprocess.PIPE, text=True)
    if out.returncode:
        raise SystemExit(f"child {args} failed with exit status {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _scale_dataset(root: str, fmt: str, n: int, workers: int, rebuild: bool) -> tuple[str, dict[str, Any] | None]:
    """The dataset of ``n`` samples under ``root`` (built unless kept from an earlier run)."""
    path = os.path.join(root, f"{fmt}-{n}")
    if not rebuild and os.path.exists(os.path.join(path, "manifest.json")):
        with open(os.path.join(path, "manifest.json")) as f:
            if json.load(f).get("num_samples") == n:
                return path, None
    shutil.rmtree(path, ignore_errors=True)
    built = run_child("build", fmt, n, path, workers)
    print(f"# built {path}: {built['samples']} samples, {built['files']} files, {built['bytes'] / 2**20:.0f} MiB "
          f"in {built['seconds']:.0f} s, process tree peak RSS {built['tree_peak_mb']:.0f} MB "
          f"(anonymous {built['tree_anon_mb']:.0f} MB)", file=sys.stderr)
    return path, built


def scale_measure(root: str, fmt: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one format."""
    small, small_built = _scale_dataset(root, fmt, args.small, args.workers, args.rebuild)
    big, big_built = _scale_dataset(root, fmt, args.samples, args.workers, args.rebuild)
    base, _ = _scale_dataset(root, fmt, BASELINE, args.workers, args.rebuild)
    got: dict[str, Any] = {"format": fmt}
    if small_built and big_built:
        got["convert_mb"] = (small_built["tree_peak_mb"], big_built["tree_peak_mb"])
        got["convert_anon_mb"] = (small_built["tree_anon_mb"], big_built["tree_anon_mb"])
        got["convert_rate"] = big_built["samples"] / big_built["seconds"]
    opened = run_child("open", big)
    got.update(open_s=opened["open_s"], first_read_s=opened["first_read_s"], read_us=opened["read_us"])
    for ctx in ("fork", "forkserver"):
        pss_big = run_child("pss", big, ctx, args.reads, args.loader_workers)["pss_mb"]
        pss_base = run_child("pss", base, ctx, args.reads, args.loader_workers)["pss_mb"]
        got[f"pss_{ctx}"] = (max(pss_big), max(b - a for a, b in zip(pss_base, pss_big)))
    planned = run_child("plan", big, 1, args.loader_workers, 3)
    got.update(construct_s=planned["construct_s"], plan_s=planned["plan_max_s"])
    resumed = run_child("resume", big, args.resume_at)
    if not resumed["same_sample"]:
        raise SystemExit(f"{fmt}: the resumed iteration did not start at sample {args.resume_at} of the plan")
    got["resume_s"] = resumed["resume_s"]
    print(f"# {json.dumps(got)}", file=sys.stderr)
    return got


def _pair(mb: tuple[float, float] | None) -> str:
    return f"{mb[0]:.0f} -> {mb[1]:.0f} MB" if mb else "kept from an earlier run"


def _mark(value: float, target: float) -> str:
    return "" if value < target else " (over)"


def scale_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Print the table of every format's figures, each marked where it is over its target."""
    header("format", "open_dataset", "first read", "index PSS per worker, fork (worker PSS)",
           "index PSS per worker, forkserver (worker PSS)", "StreamingDataset()", "plan per epoch per worker",
           f"resume at {args.resume_at:,}", f"conversion peak RSS {args.small // 1000}k -> {args.samples / 1e6:.2f}M",
           "of which anonymous")
    for r in rows:
        row(r["format"], f"{r['open_s'] * 1000:.0f} ms{_mark(r['open_s'], TARGETS['open_s'])}",
            f"{r['first_read_s'] * 1000:.0f} ms",
            f"{r['pss_fork'][1]:.1f} MB{_mark(r['pss_fork'][1], TARGETS['index_mb'])} ({r['pss_fork'][0]:.0f} MB)",
            f"{r['pss_forkserver'][1]:.1f} MB{_mark(r['pss_forkserver'][1], TARGETS['index_mb'])} "
            f"({r['pss_forkserver'][0]:.0f} MB)",
            f"{r['construct_s'] * 1000:.0f} ms", f"{r['plan_s'] * 1000:.0f} ms{_mark(r['plan_s'], TARGETS['plan_s'])}",
            f"{r['resume_s'] * 1000:.0f} ms{_mark(r['resume_s'], TARGETS['resume_s'])}",
            _pair(r.get("convert_mb")), _pair(r.get("convert_anon_mb")))


def scale(a: argparse.Namespace) -> int:
    """ImageNet-size metadata: what 1,281,167 samples cost to open, hold, plan and resume.

    A dataset of 1,281,167 tiny samples made through ``convert_items`` from generated bytes, and
    what its size costs to open, to hold in DataLoader workers, to plan and to resume, and what
    the conversion's memory does between 100k and 1.28M samples. Every figure is measured in a
    fresh child process (``--child``), so one measure's memory or open handles never reach the
    next. The datasets are kept under ``--root`` and reused by a later run (``--rebuild`` makes
    them again); run from the repository root (the children run ``python -m tools.bench_parts``).
    """
    if a.child:
        print(json.dumps(SCALE_CHILDREN[a.child[0]](a.child[1:])))
        return 0
    os.makedirs(a.root, exist_ok=True)
    scale_table([scale_measure(a.root, fmt, a) for fmt in a.formats], a)
    return 0


def _scale_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="/tmp/packer-scale", help="where the datasets are made and kept")
    p.add_argument("--formats", nargs="+", default=["lmdb", "tar"], choices=FORMATS)
    p.add_argument("--samples", type=int, default=IMAGENET)
    p.add_argument("--small", type=int, default=SCALE_SMALL, help="the smaller dataset of the conversion-memory check")
    p.add_argument("--workers", type=int, default=1, help="conversion worker processes")
    p.add_argument("--loader-workers", type=int, default=2, help="DataLoader workers of the memory and plan checks")
    p.add_argument("--reads", type=int, default=4000, help="random samples the DataLoader reads per memory check")
    p.add_argument("--resume-at", type=int, default=1_000_000)
    p.add_argument("--rebuild", action="store_true", help="make the datasets again")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)


# -- distributed --------------------------------------------------------------------------------------
ENV_DROP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
PROCESSING = ["--resize", "shorter:128", "--encode", "jpeg:90"]
ONE, TWO = "1 process x 2 workers", "2 ranks x 1 worker"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dist_source(root: str, images: int) -> str:
    """An image folder of ``images`` smooth 240 x 320 JPEGs in 10 classes (kept between runs)."""
    from tools.sample_images import make_folder

    src = os.path.join(root, f"src-{images}")
    if not os.path.isdir(src):
        per = images // 10
        make_folder(src + ".tmp", {f"c{c}": [(f"{c}-{i}.jpg", 240, 320) for i in range(per)] for c in range(10)})
        os.rename(src + ".tmp", src)
    return src


def timed_command(cmd: list[str]) -> float:
    """Wall seconds of ``cmd`` run outside any torchrun job this runs in."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    seconds, out = timed(lambda: subprocess.run(cmd, capture_output=True, text=True, env=env))
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return seconds


def conversions(srcs: list[str], root: str, fmt: str, repeats: int) -> dict[tuple[str, str], list[float]]:
    """Seconds of each run, per (configuration, source): one process with 2 workers, 2 torchrun
    ranks with 1 worker each, alternating."""
    dst = os.path.join(root, f"out.{fmt}")
    runs: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeats):
        for src in srcs:
            convert = ["-m", "packer", "convert", "imagefolder", fmt, src, dst, "--overwrite", "-q", *PROCESSING]
            runs.setdefault((ONE, src), []).append(
                timed_command([sys.executable, *convert, "--workers", "2", "--no-torchrun"]))
            runs.setdefault((TWO, src), []).append(
                timed_command([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                               f"--master_port={_port()}", *convert, "--workers", "1"]))
    shutil.rmtree(dst, ignore_errors=True)
    return runs


def merge_cost(root: str, fmt: str, parts: int, per_part: int, link: bool = False) -> tuple[float, float]:
    """(stored GB, seconds) of merging ``parts`` parts of ``per_part`` 256 x 256 JPEGs (~70 kB);
    ``link``: shards hard-linked, as a torchrun conversion merges."""
    from packer.images.imageproc import Encoding, ProcessOptions
    from packer.ops.engine import ConvertOptions
    from packer.ops.items import convert_items
    from packer.ops.merge import merge

    rng = np.random.default_rng(0)
    data = [_jpeg(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8), 90) for _ in range(8)]
    opts = ConvertOptions(processing=ProcessOptions(encoding=Encoding("keep", 0)), overwrite=True)
    paths = []
    for p in range(parts):
        path = os.path.join(root, f"part-{fmt}-{p}")
        items = [(data[(p + i) % len(data)], f"c{i % 10}", None) for i in range(per_part)]
        paths.append(convert_items(items, path, fmt, opts, [f"c{c}" for c in range(10)]).output)
    dst = os.path.join(root, f"merged-{fmt}")
    shutil.rmtree(dst, ignore_errors=True)
    report = merge(paths, dst, link=link)
    gb = sum(f.bytes for f in report.manifest.files) / 1e9
    for path in [*paths, dst]:
        shutil.rmtree(path)
    return gb, report.seconds


def _conversion_table(a: argparse.Namespace, runs: dict[tuple[str, str], list[float]], small: str,
                      big: str) -> dict[str, float]:
    """Print the conversion table and the per-round ratios; the rates past the fixed cost."""
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"### {a.format}: 240 x 320 JPEGs -> {' '.join(PROCESSING)}; alternating runs, median of {a.repeats}\n")
    header("configuration", f"{a.small} images: seconds", f"{a.images} images: seconds", "images/s, whole run",
           "images/s, past the fixed cost")
    rates = {}
    for conf in (ONE, TWO):
        rates[conf] = (a.images - a.small) / (med[(conf, big)] - med[(conf, small)])
        row(conf, ", ".join(f"{x:.2f}" for x in runs[(conf, small)]), ", ".join(f"{x:.2f}" for x in runs[(conf, big)]),
            f"{a.images / med[(conf, big)]:.0f}", f"{rates[conf]:.0f}")
    # Per round (the two configurations ran back to back): ratios of rates, whole run and past the
    # fixed cost; their medians are steadier than ratios of medians on a machine whose load drifts.
    past = [(b1 - s1) / (b2 - s2) for s1, b1, s2, b2 in
            zip(runs[(ONE, small)], runs[(ONE, big)], runs[(TWO, small)], runs[(TWO, big)])]
    whole = [x / y for x, y in zip(runs[(ONE, big)], runs[(TWO, big)])]
    rates["fixed"] = max(0.0, med[(TWO, small)] - a.small / rates[TWO])
    print(f"\n2 ranks x 1 worker / 1 process x 2 workers, per round: past the fixed cost "
          f"{', '.join(f'{x:.2f}' for x in past)} (median **{statistics.median(past):.2f}x**); whole "
          f"{a.images}-image run {', '.join(f'{x:.2f}' for x in whole)} (median "
          f"{statistics.median(whole):.2f}x). Fixed cost (start of torchrun, ranks and gloo; rank 0's merge): "
          f"{med[(TWO, small)] - a.small / rates[TWO]:.1f} s with torchrun, "
          f"{med[(ONE, small)] - a.small / rates[ONE]:.1f} s without\n")
    return rates


def _model_table(a: argparse.Namespace, rates: dict[str, float], merges: dict[tuple[str, bool], float]) -> None:
    """The model of docs/distributed.md for ImageNet-1k at this run's stored size per image, one
    node being this machine (2 ranks x 1 worker), the scan left out (seconds on a local disk)."""
    items = 1_281_167
    stored = 110e3  # bytes per image at shorter:256, jpeg:90: about ImageNet's mean
    per_node = rates[TWO]
    fixed_h = rates["fixed"] / 3600
    print(f"\nModel: {items:,} images of {stored / 1e3:.0f} kB stored, a node = this machine "
          f"({per_node:.0f} images/s), merge at the measured cost of a torchrun {a.format} merge\n")
    header("nodes", "convert (h)", "merge (h)", "total with the fixed cost (h)", "speed-up")
    merge_h = merges.get((a.format, True), max(merges.values())) * items * stored / 1e9 / 3600
    base = fixed_h + items / per_node / 3600 + merge_h
    for nodes in (1, 2, 4, 8, 16, 32, 64):
        conv_h = items / (nodes * per_node) / 3600
        row(nodes, f"{conv_h:.2f}", f"{merge_h:.2f}", f"{fixed_h + conv_h + merge_h:.2f}",
            f"{base / (fixed_h + conv_h + merge_h):.1f}x")


def distributed(a: argparse.Namespace) -> int:
    """Conversion across processes: 2 torchrun ranks x 1 worker against 1 process x 2 workers.

    On the same image folder, runs alternating (one process, torchrun, one process, ...) so drift
    on a shared machine hits both alike; medians and the ratio of rates. Then the cost of
    ``merge`` per GB of stored bytes, and the scaling model of docs/distributed.md filled in with
    both. Run from the repository root (it imports ``tools.sample_images``).
    """
    os.makedirs(a.root, exist_ok=True)
    small, big = dist_source(a.root, a.small), dist_source(a.root, a.images)
    rates = _conversion_table(a, conversions([small, big], a.root, a.format, a.repeats), small, big)
    merges = {}
    header("merge of 2 parts", "stored GB", "seconds", "seconds per GB")
    for fmt in a.merge_formats:
        for link in (False, True) if fmt in ("tar", "tfrecord") else (False,):
            gb, seconds = merge_cost(a.root, fmt, 2, a.merge_samples, link)
            merges[(fmt, link)] = seconds / gb
            row(f"{fmt}{', shards hard-linked (torchrun)' if link else ', copied'}", f"{gb:.3f}", f"{seconds:.2f}",
                f"{seconds / gb:.1f}")
    _model_table(a, rates, merges)
    return 0


def _distributed_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="/tmp/packer-dist")
    p.add_argument("--images", type=int, default=12000)
    p.add_argument("--small", type=int, default=600, help="the small run that gives the fixed cost")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--format", default="tar", choices=FORMATS)
    p.add_argument("--merge-formats", nargs="+", default=["tar", "lmdb"])
    p.add_argument("--merge-samples", type=int, default=3000, help="samples per part (2 parts)")


# -- fields: what reading a mask with the image costs --------------------------------------------------
def _region_mask(bgr: np.ndarray) -> np.ndarray:
    """A segmentation-like label map of a photo: large regions (blurred gray, 8 levels), 255 at the border."""
    gray = cv2.GaussianBlur(cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY), (0, 0), 6)
    mask = (gray // 32).astype(np.uint8)
    mask[:4], mask[-4:], mask[:, :4], mask[:, -4:] = 255, 255, 255, 255
    return mask


def fields_dataset(src: str, dst: str, count: int, fmt: str) -> None:
    """``count`` images of the image folder ``src`` with region masks, packed to ``dst`` (shorter:256, jpeg:90)."""
    from packer.description.manifest import FIELDS_VERSION, Manifest
    from packer.images.fields import FieldSources, process_sample
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.ops.engine import ConvertOptions, write_packed

    opts = ProcessOptions(resize=parse_resize("shorter:256"), encoding=parse_encoding("jpeg:90"))
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs)[:count]

    def items() -> Any:
        for k, path in enumerate(paths):
            with open(path, "rb") as f:
                data = f.read()
            mask = _region_mask(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR))
            png = cv2.imencode(".png", mask)[1].tobytes()
            yield os.path.relpath(path, src), k % 2, process_sample(data, opts, FieldSources(mask=png)), None

    template = Manifest(format=fmt, num_samples=0, classes=["a", "b"], processing=opts.to_json(), files=[],
                        version=FIELDS_VERSION, fields=[{"name": "mask", "kind": "mask"}])
    write_packed(dst, fmt, items(), template, ConvertOptions(processing=opts))


def _read_all(path: str, fields: tuple[str, ...]) -> float:
    """CPU seconds of this process to read every sample of ``path`` with ``fields``."""
    from packer.datasets import open_dataset

    with open_dataset(path, fields=fields) as ds:
        c0 = cpu_seconds()
        for i in range(len(ds)):
            ds[i]
        return cpu_seconds() - c0


def _stored_payloads(path: str) -> list[tuple[bytes, str, int, int, bytes]]:
    """Every sample's stored image (bytes, codec, height, width) and mask PNG."""
    from packer.datasets import open_dataset

    with open_dataset(path) as ds:
        recs = (ds.read_record(i) for i in range(len(ds)))
        return [(bytes(r.payload), r.codec, r.height, r.width, bytes(r.fields[0].payload)) for r in recs]


def _bare_decodes(payloads: list[tuple[bytes, str, int, int, bytes]], what: str) -> float:
    """CPU seconds of a bare loop over stored payloads already in memory: decode the ``mask``
    PNGs alone, the ``image`` alone (packer's decoder), or ``both``, image then mask, sample by
    sample (the work a reader of both cannot avoid, caches included)."""
    from packer.images.imageproc import decode_payload

    c0 = cpu_seconds()
    for data, codec, h, w, mask in payloads:
        if what != "mask":
            torch.from_numpy(decode_payload(data, codec, h, w)).permute(2, 0, 1)
        if what != "image":
            torch.from_numpy(cv2.imdecode(np.frombuffer(mask, np.uint8), cv2.IMREAD_UNCHANGED))
    return cpu_seconds() - c0


def fields(a: argparse.Namespace) -> int:
    """What reading a mask with the image costs: image alone, image + mask, and the mask's PNG decode alone.

    Packs ``--count`` images of ``--src`` (shorter:256, jpeg:90) with a region mask each (a
    label map of large regions, like a segmentation dataset's) into each ``--formats``, then, in
    ``--rounds`` interleaved rounds, reads every sample in this process with
    ``fields=("image", "label")`` and ``fields=("image", "mask", "label")``, and, from payloads
    already in memory, decodes the mask PNGs alone, the images alone and both, image then mask
    per sample. The target: image + mask costs at most image + mask decode (the ratio column at
    most 1). Decoding a JPEG and a PNG in turn costs more than the two apart (caches), which the
    bare loops measure; the last column is what packer adds per mask beyond that.
    """
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="bench-fields-")
    try:
        paths = {}
        for fmt in a.formats:
            paths[fmt] = os.path.join(work, f"f.{fmt}")
            fields_dataset(a.src, paths[fmt], a.count, fmt)
        header("format", "image (us/sample)", "image + mask", "mask PNG decode alone",
               "(image + mask) / (image + decode)", "bare: image, image + mask decodes", "packer's extra per mask")
        for fmt, path in paths.items():
            payloads = _stored_payloads(path)
            runs: dict[str, list[float]] = {k: [] for k in ("image", "both", "mask", "bare_image", "bare_both")}
            for turn in range(a.rounds):
                jobs = {"image": functools.partial(_read_all, path, ("image", "label")),
                        "both": functools.partial(_read_all, path, ("image", "mask", "label")),
                        "mask": functools.partial(_bare_decodes, payloads, "mask"),
                        "bare_image": functools.partial(_bare_decodes, payloads, "image"),
                        "bare_both": functools.partial(_bare_decodes, payloads, "both")}
                for name in turns(list(jobs), turn):
                    runs[name].append(jobs[name]() / a.count * 1e6)
            med = {k: statistics.median(v) for k, v in runs.items()}
            extra = (med["both"] - med["image"]) - (med["bare_both"] - med["bare_image"])
            row(fmt, f"{med['image']:.0f}", f"{med['both']:.0f}", f"{med['mask']:.0f}",
                f"{med['both'] / (med['image'] + med['mask']):.2f}", f"{med['bare_image']:.0f}, {med['bare_both']:.0f}",
                f"{extra:+.0f} us")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _fields_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src", required=True, help="an image folder of photos")
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)


# -- the command line ---------------------------------------------------------------------------------
#: subcommand -> (what it runs, what adds its arguments); the help is the first line of the docstring.
SUBCOMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], Callable[[argparse.ArgumentParser], None]]] = {
    "getitems": (getitems, _getitems_args),
    "cache-fill": (cache_fill, _cache_fill_args),
    "window-decode": (window_decode, _window_decode_args),
    "reduced": (reduced, _reduced_args),
    "remote": (remote, _remote_args),
    "scale": (scale, _scale_args),
    "distributed": (distributed, _distributed_args),
    "versions": (versions, _versions_args),
    "fields": (fields, _fields_args),
}


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per benchmark, each with the method in its ``--help``."""
    p = argparse.ArgumentParser(prog="python -m tools.bench_parts", description=__doc__.splitlines()[0])
    subs = p.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for name, (run, add_arguments) in SUBCOMMANDS.items():
        doc = inspect.cleandoc(run.__doc__ or "")
        sub = subs.add_parser(name, help=doc.splitlines()[0], description=doc,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        add_arguments(sub)
        sub.set_defaults(run=run, error=sub.error)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one benchmark; its exit status."""
    a = parser().parse_args(argv)
    return a.run(a)


if __name__ == "__main__":
    raise SystemExit(main())
