"""Section 14 of docs/benchmarks.md: the training read (``RandomResizedCrop(224)`` + a flip,
uint8 CHW, batch 64, 2 workers): ``reduced-decode`` (the reduced-scale window decode against the
whole window decode, on 512 px storage) and ``train-stages`` (where the time of one sample goes)."""

from __future__ import annotations

import argparse
import multiprocessing
import random
import resource
import statistics
import time
from typing import Any

import cv2
import numpy as np
import torch

from tools.bench.common import Subcommand, header, name_of, row, turns, usage


def flip(image: torch.Tensor) -> torch.Tensor:
    """A random horizontal flip of a C x H x W tensor (p = 0.5), as v2.RandomHorizontalFlip."""
    return image.flip(-1) if random.random() < 0.5 else image


def steady_loader(ds: Any, workers: int, batch: int = 64, passes: int = 1) -> Any:
    """A shuffled DataLoader with packer's collate and persistent workers; with ``passes`` > 1
    each of its epochs is that many shuffled passes over ``ds`` back to back (a long epoch, as a
    large dataset's: the start and the end of an epoch, where workers wait, weigh little)."""
    from torch.utils.data import DataLoader, RandomSampler

    from packer.datasets import collate

    sampler = RandomSampler(ds, num_samples=passes * len(ds), generator=torch.Generator().manual_seed(0))
    return DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=collate, sampler=sampler,
                      persistent_workers=workers > 0)


def loader_rate(ds: Any, batch: int, workers: int, epochs: int = 1, loader: Any = None) -> float:
    """img/s of ``epochs`` shuffled epochs through ``loader`` (by default a fresh
    :func:`steady_loader`), timed from the first batch of each epoch: with the workers already
    started (a loader that has run an epoch), the rate a long training run sees."""
    if loader is None:
        loader = steady_loader(ds, workers, batch)
    seen, spent = 0, 0.0
    for _ in range(epochs):
        it = iter(loader)
        next(it)
        t0 = time.perf_counter()
        for images, _ in it:
            seen += len(images)
        spent += time.perf_counter() - t0
    return seen / spent


# -- reduced-decode -----------------------------------------------------------------------------------
def _draws(ds: Any, count: int, size: int, seed: int) -> list[tuple[int, bytes, tuple[int, int, int, int]]]:
    """(sample, payload, RandomResizedCrop(size) window) of ``count`` shuffled samples."""
    from packer.datasets.crops import RandomResizedCrop

    crop, rng = RandomResizedCrop(size), random.Random(seed)
    order = np.random.default_rng(seed).permutation(len(ds))[:count].tolist()
    out = []
    for i in order:
        rec = ds.read_record(i)
        random.seed(rng.random())
        out.append((i, bytes(rec.payload), crop.window(rec.height, rec.width)))
    return out


def _decode_costs(path: str, size: int, rounds: int, count: int = 512) -> dict[str, Any]:
    """In one process: us per sample of the window decode + resize, reduced and whole, taking
    turns batch by batch; the scales used; PSNR of the reduced output against the whole decode of
    the same (grid-widened) window, and against the whole decode of the drawn window."""
    from packer.datasets import open_dataset
    from packer.datasets.crops import RandomResizedCrop
    from packer.images.imageproc import decode_payload, decode_payload_window

    crop = RandomResizedCrop(size)
    with open_dataset(path) as ds:
        draws = _draws(ds, count, size, 0)
        sizes = [(ds.read_record(i).height, ds.read_record(i).width) for i, _, _ in draws]
    plans = [crop.reduction(w, h, wd) for (_, _, w), (h, wd) in zip(draws, sizes)]

    def run(how: str, k: int) -> np.ndarray:
        i, payload, window = draws[k]
        h, w = sizes[k]
        if how == "image":  # the whole image decoded, then cut (a whole-decode loader, FFCV's way)
            top, left, wh, ww = window
            return crop.finish(decode_payload(payload, "jpeg")[top:top + wh, left:left + ww])
        scale, win = plans[k] if how == "reduced" else (1, window)
        return crop.finish(decode_payload_window(payload, "jpeg", h, w, lambda *_: win, scale=scale))

    hows = ("reduced", "window", "image")
    spent: dict[str, list[np.ndarray]] = {how: [] for how in hows}
    for r in range(rounds):
        each = {how: np.zeros(count) for how in hows}
        for start in range(0, count, 64):
            for how in turns(hows, start // 64 + r):
                for k in range(start, min(start + 64, count)):
                    t0 = time.perf_counter()
                    run(how, k)
                    each[how][k] = time.perf_counter() - t0
        for how in hows:
            spent[how].append(each[how])
    reducing = np.array([p[0] > 1 for p in plans])

    def us(how: str, where: np.ndarray | None = None) -> list[float]:
        """us per sample in each round, and last the mean of each sample's best round (the
        machine's load drifts: a sample's fastest round is its cost)."""
        rounds_ = [*spent[how], np.min(spent[how], axis=0)]
        return [float(e[where].mean() if where is not None else e.mean()) * 1e6 for e in rounds_]

    same, drawn = [], []
    for k in range(count):
        got = run("reduced", k)
        if plans[k][0] == 1:
            continue
        i, payload, window = draws[k]
        win = plans[k][1]
        same.append(_psnr(got, crop.finish(decode_payload_window(payload, "jpeg", *sizes[k], lambda *_, win=win: win))))
        drawn.append(_psnr(got, run("window", k)))
    scales = [p[0] for p in plans]
    per_round = [w / r for w, r in zip(us("window"), us("reduced"))]
    best = {how: us(how)[-1] for how in hows}
    return {"reduced_us": best["reduced"], "whole_us": best["window"], "image_us": best["image"],
            "per_round": per_round[:-1], "ratio": per_round[-1],
            "reducing_ratio": us("window", reducing)[-1] / us("reduced", reducing)[-1],
            "image_ratio": best["image"] / best["reduced"],
            "scales": {s: scales.count(s) / count for s in sorted(set(scales))},
            "psnr_same": _quantiles(same), "psnr_drawn": _quantiles(drawn)}


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _quantiles(values: list[float]) -> str:
    """'median (1st percentile)' of PSNR values, dB."""
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({np.percentile(values, 1):.1f})"


def _scale_costs(path: str, count: int = 40, repeats: int = 5) -> dict[int, float]:
    """us per whole-image decode at each scale by packer's window module (the whole image as the
    window), best of ``repeats`` passes over ``count`` payloads: how much of a decode the
    entropy decoding, which every scale pays, is."""
    from packer.datasets import open_dataset
    from packer.images.imageproc import decode_payload_window

    with open_dataset(path) as ds:
        recs = [ds.read_record(i) for i in range(count)]
    out = {}
    for scale in (1, 2, 4, 8):
        best = float("inf")
        for _ in range(repeats):
            t0 = time.thread_time()
            for rec in recs:
                decode_payload_window(rec.payload, "jpeg", rec.height, rec.width, lambda h, w: (0, 0, h, w),
                                      scale=scale)
            best = min(best, (time.thread_time() - t0) / count * 1e6)
        out[scale] = best
    return out


def _resize_costs(path: str, size: int, count: int = 256) -> dict[str, float]:
    """CPU us per resize of ``count`` drawn windows' whole-decode pixels to ``size`` by each of
    ``RandomResizedCrop``'s interpolations (one thread)."""
    from packer.datasets import open_dataset
    from packer.datasets.crops import RandomResizedCrop
    from packer.images.imageproc import decode_payload

    with open_dataset(path) as ds:
        windows = []
        for _, payload, (top, left, h, w) in _draws(ds, count, size, 3):
            windows.append(np.ascontiguousarray(decode_payload(payload, "jpeg")[top:top + h, left:left + w]))
    out = {}
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for how in ("area", "antialias", "linear"):
        crop = RandomResizedCrop(size, interpolation=how)
        t0 = time.thread_time()
        for pixels in windows:
            crop.finish(pixels)
        out[how] = (time.thread_time() - t0) / count * 1e6
    torch.set_num_threads(torch_threads)
    return out


def reduced_decode(a: argparse.Namespace) -> int:
    """The reduced-scale window decode (``RandomResizedCrop(reduced_decode=True)``, the default)
    against the whole window decode (``reduced_decode=False``), side by side in one run.

    Per dataset: first in one process, the decode + resize of ``--count`` shuffled samples' windows
    (``RandomResizedCrop(--size)``'s draws, the same windows both ways), taking turns batch by
    batch, each sample's cost its best of ``--rounds`` (per-round ratios in brackets), also over the windows that reduce alone, and against the
    whole image decoded, cut and resized (what a loader without a window decode does); the share of windows decoded at each scale; and the PSNR of
    the reduced output against the whole decode of the same grid-widened window (what the scaled
    IDCT changes) and against the whole decode of the drawn window (what the reader returns with
    ``reduced_decode=False``), median (1st percentile). Then, in one process (CPU time, one
    OpenCV thread), whole-image decodes at each scale (best of 5 passes over 40 payloads: the
    entropy decoding every scale pays) and the resize of the drawn windows' pixels by
    ``INTER_AREA``, torch's antialiased bilinear and ``INTER_LINEAR``. Then epochs through a DataLoader
    (``--workers`` workers, batch ``--batch``, packer's collate, a random flip in ``transform``,
    uint8 CHW), one of each per round in a rotating order; img/s medians and the per-round ratio.
    Make the data with ``make_imagefolder.py SRC --classes 4 --per-class 500 --min-side 520
    --max-side 700`` and ``python -m packer convert imagefolder lmdb SRC DST --resize shorter:512``.
    """
    from packer.datasets import open_dataset
    from packer.datasets.crops import RandomResizedCrop

    header("dataset", "whole window decode + resize, us/sample", "reduced", "whole / reduced (rounds)",
           "on the windows that reduce", "whole image decode + cut + resize, us", "/ reduced",
           "scales used (1, 2, 4, 8)", "PSNR vs the same window decoded whole, dB", "vs the drawn window")
    for path in a.datasets:
        c = _decode_costs(path, a.size, a.rounds)
        shares = " / ".join(f"{c['scales'].get(s, 0):.0%}" for s in (1, 2, 4, 8))
        row(name_of(path), f"{c['whole_us']:.0f}", f"{c['reduced_us']:.0f}",
            f"{c['ratio']:.2f} ({' '.join(f'{x:.2f}' for x in c['per_round'])})",
            f"{c['reducing_ratio']:.2f}", f"{c['image_us']:.0f}", f"{c['image_ratio']:.2f}", shares, c["psnr_same"], c["psnr_drawn"])
    print()
    header("dataset", "whole image decode us, scale 1", "1/2", "1/4", "1/8",
           "resize of the drawn windows to --size, INTER_AREA us", "torch antialiased bilinear us",
           "INTER_LINEAR us")
    for path in a.datasets:
        threads = cv2.getNumThreads()
        cv2.setNumThreads(1)
        d, r = _scale_costs(path), _resize_costs(path, a.size)
        cv2.setNumThreads(threads)
        row(name_of(path), *(f"{d[s]:.0f}" for s in (1, 2, 4, 8)), f"{r['area']:.0f}", f"{r['antialias']:.0f}", f"{r['linear']:.0f}")
    print()
    header("dataset", "whole decode img/s", "reduced img/s", "reduced / whole (rounds)")
    for path in a.datasets:
        rates: dict[bool, list[float]] = {True: [], False: []}
        for r in range(a.rounds):
            for reduced in turns((True, False), r):
                with open_dataset(path, crop=RandomResizedCrop(a.size, reduced_decode=reduced), transform=flip) as ds:
                    rates[reduced].append(loader_rate(ds, a.batch, a.workers))
        ratios = [x / y for x, y in zip(rates[True], rates[False])]
        row(name_of(path), f"{statistics.median(rates[False]):.0f}", f"{statistics.median(rates[True]):.0f}",
            f"{statistics.median(ratios):.2f} ({' '.join(f'{x:.2f}' for x in ratios)})")
    return 0


def _reduced_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("datasets", nargs="+", help="packed JPEG datasets (shorter side 512)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)


# -- train-stages -------------------------------------------------------------------------------------
STAGES = ("read", "checks", "window", "decode", "resize", "tensor + flip", "rest of ds[i]", "collate")


#: The crop= variants train-stages compares: name -> RandomResizedCrop's keyword arguments.
MODES: dict[str, dict[str, Any]] = {"whole": {"reduced_decode": False}, "reduced": {},
                                    "reduced, antialias": {"interpolation": "antialias"},
                                    "reduced, linear": {"interpolation": "linear"}}


def _stage_times(path: str, size: int, mode: str, count: int) -> dict[str, float]:
    """CPU us per sample of each stage of the crop= read in this process, over ``count`` shuffled
    samples: the stages done one by one as the reader does them, then ``ds.__getitems__`` whole
    (its excess over the stages is the rest of the per-sample work) and packer's collate."""
    from packer.datasets.crops import RandomResizedCrop

    crop = RandomResizedCrop(size, **MODES[mode])
    threads = torch.get_num_threads(), cv2.getNumThreads()
    torch.set_num_threads(1)  # as in a DataLoader worker; OpenCV too, as one worker per core has it
    cv2.setNumThreads(1)
    worker_malloc()
    try:
        return _stages(path, crop, count)
    finally:
        torch.set_num_threads(threads[0])
        cv2.setNumThreads(threads[1])


def worker_malloc() -> None:
    """glibc malloc's thresholds in this process set as packer sets them in DataLoader workers
    (``packer.datasets.shm.worker_memory``): without them every decoded window and read buffer
    over 128 kB is fresh memory, faulted in page by page, which a worker does not pay."""
    import ctypes

    from packer.datasets.shm.worker_memory import MMAP_THRESHOLD, TRIM_THRESHOLD

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
    mallopt(-1, TRIM_THRESHOLD)  # M_TRIM_THRESHOLD


def _stages(path: str, crop: Any, count: int) -> dict[str, float]:
    from packer.datasets import collate, open_dataset
    from packer.images.imageproc import decode_payload_window

    with open_dataset(path, crop=crop, transform=flip) as ds, open_dataset(path, verify=False) as unchecked:
        order = np.random.default_rng(1).permutation(len(ds))[:count].tolist()
        [ds.read_record(i) for i in order]  # the page cache warm for every stage alike
        t: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        clock = time.thread_time  # CPU time: what other jobs on the machine take is left out
        recs = []
        for k, i in enumerate(order):  # each record read both ways, in alternating order
            for checked in turns((False, True), k):
                t0 = clock()
                rec = (ds if checked else unchecked).read_record(i)
                t["checks" if checked else "read"] += clock() - t0
            recs.append(rec)
        t["checks"] -= t["read"]
        for rec in recs:
            a = clock()
            window = crop.window(rec.height, rec.width)
            scale, window = crop.reduction(window, rec.height, rec.width)
            b = clock()
            pixels = decode_payload_window(rec.payload, rec.codec, rec.height, rec.width, lambda *_, w=window: w,
                                           scale=scale)
            c = clock()
            out = crop.finish(pixels)
            d = clock()
            flip(torch.from_numpy(out).permute(2, 0, 1))
            e = clock()
            t["window"] += b - a
            t["decode"] += c - b
            t["resize"] += d - c
            t["tensor + flip"] += e - d
        batches = [order[j:j + 64] for j in range(0, len(order), 64)]
        t0 = clock()
        items = [ds.__getitems__(b) for b in batches]
        whole = clock() - t0
        t["rest of ds[i]"] = whole - sum(t[s] for s in STAGES[:-2])
        t0 = clock()
        for batch in items:
            collate(batch)
        t["collate"] = clock() - t0
    return {s: v / count * 1e6 for s, v in t.items()} | {"getitems": whole / count * 1e6}


def loader_epoch(ds: Any, workers: int) -> dict[str, float]:
    """One shuffled epoch through a fresh DataLoader (batch 64, packer's collate, workers not
    persistent): img/s, and CPU us per image of the workers and of this process (getrusage)."""
    from torch.utils.data import DataLoader

    from packer.datasets import collate

    loader = DataLoader(ds, batch_size=64, num_workers=workers, collate_fn=collate, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    main0, kids0 = usage(resource.RUSAGE_SELF)[0], usage(resource.RUSAGE_CHILDREN)[0]
    t0 = time.perf_counter()
    it = iter(loader)
    n = sum(len(images) for images, _ in it)
    del it  # the workers exit: their CPU time is then in RUSAGE_CHILDREN
    wall = time.perf_counter() - t0
    main1, kids1 = usage(resource.RUSAGE_SELF)[0], usage(resource.RUSAGE_CHILDREN)[0]
    return {"img_s": n / wall, "worker_us": (kids1 - kids0) / n * 1e6, "main_us": (main1 - main0) / n * 1e6}


def _bare_loop(payloads: list[tuple[bytes, tuple[int, int, int, int]]], size: int, seconds: float,
               out: multiprocessing.Queue) -> None:
    """The issue's bare loop in one process: TurboJPEG whole decode, the window, OpenCV resize."""
    import simplejpeg

    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for payload, (top, left, h, w) in payloads:
            rgb = simplejpeg.decode_jpeg(payload, colorspace="rgb")
            cv2.resize(rgb[top:top + h, left:left + w], (size, size), interpolation=cv2.INTER_AREA)
        n += len(payloads)
    out.put(n / (time.perf_counter() - t0))


def bare_rate(path: str, size: int, processes: int = 2, seconds: float = 3.0, count: int = 500) -> float:
    """img/s of ``processes`` processes running :func:`_bare_loop` at once."""
    from packer.datasets import open_dataset

    with open_dataset(path) as ds:
        draws = [(p, w) for _, p, w in _draws(ds, count * processes, size, 2)]
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_bare_loop, args=(draws[k::processes], size, seconds, q)) for k in range(processes)]
    for p in procs:
        p.start()
    rates = [q.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(rates)


def train_stages(a: argparse.Namespace) -> int:
    """Where the time of one sample of the crop= training read goes, stage by stage.

    Per dataset, in one process over ``--count`` shuffled samples (the page cache warm; glibc
    malloc set as in workers): the read of each record without checks (``verify=False``), the
    checks (the same reads verified, less the unchecked ones: CRC32C of the record), the crop's
    window draw, the window decode, the resize to ``--size`` (``RandomResizedCrop``'s
    ``finish``), the CHW tensor and the flip, then ``ds.__getitems__`` per batch of 64 (its
    excess over those stages: the rest of packer's per-sample work) and packer's ``collate``.
    Then epochs through a DataLoader (``--workers`` workers, batch 64, not persistent) with the
    workers' and the main process's CPU time per image (getrusage): the workers' CPU beyond the
    stages is their fetch loop, the collate into shared memory and the hand-over. ``whole`` is
    ``reduced_decode=False``, ``reduced`` the default, the others the default with that
    ``interpolation``. The loaders' img/s against the bare loop of the same number of processes
    (TurboJPEG whole decode, the window, OpenCV ``INTER_AREA``), side by side per round, twice:
    a fresh loader's epoch (the workers' start included, as the CPU columns are) and one epoch of
    ``--passes`` passes through a loader whose persistent workers have run such an epoch already
    (what a long training run sees, and what the bare loop, which starts nothing, compares with).
    """
    from packer.datasets import open_dataset
    from packer.datasets.crops import RandomResizedCrop

    for path in a.datasets:
        got = {mode: [_stage_times(path, a.size, mode, a.count) for _ in range(a.rounds)] for mode in MODES}
        sums = {m: {s: statistics.median(r[s] for r in runs) for s in (*STAGES, "getitems")} for m, runs in got.items()}
        epochs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        bare: list[float] = []
        for r in range(a.rounds):
            for mode in turns((*MODES, "bare"), r):
                if mode == "bare":
                    bare.append(bare_rate(path, a.size, a.workers))
                    continue
                crop = RandomResizedCrop(a.size, **MODES[mode])
                with open_dataset(path, crop=crop, transform=flip) as ds:
                    epochs[mode].append(loader_epoch(ds, a.workers))
                with open_dataset(path, crop=crop, transform=flip) as ds:
                    loader = steady_loader(ds, a.workers, passes=a.passes)
                    loader_rate(ds, 64, a.workers, 1, loader)  # the workers started, their first epoch
                    epochs[mode][-1]["steady_img_s"] = loader_rate(ds, 64, a.workers, 1, loader)
        cpu = {m: {k: statistics.median(e[k] for e in runs) for k in ("worker_us", "main_us")} for m, runs in epochs.items()}
        print(f"\n{name_of(path)}: us per sample; stages in one process, the loader's CPU time per image; "
              f"medians of {a.rounds} rounds\n")
        header("stage", *(c for m in MODES for c in (m, "share")))
        totals = {m: cpu[m]["worker_us"] + cpu[m]["main_us"] for m in sums}
        lines = [(s, {m: sums[m][s] for m in sums}) for s in STAGES]
        lines.append(("workers' other CPU (fetch loop, collate in shared memory, hand-over)",
                      {m: cpu[m]["worker_us"] - sum(sums[m][s] for s in STAGES) for m in sums}))
        lines.append(("main process (receive, unpickle)", {m: cpu[m]["main_us"] for m in sums}))
        for name, v in lines:
            row(name, *(c for m in MODES for c in (f"{v[m]:.1f}", f"{v[m] / totals[m]:.0%}")))
        row("**CPU per image, loader**", *(c for m in MODES for c in (f"{totals[m]:.1f}", "")))
        print()
        header("loader", "fresh epoch: img/s (median)", f"/ bare loop x{a.workers} (rounds)",
               f"started workers, {a.passes} passes: img/s (median)", f"/ bare loop x{a.workers} (rounds)")
        for mode, runs in epochs.items():
            cells = []
            for key in ("img_s", "steady_img_s"):
                got_rates = [e[key] for e in runs]
                per = [x / b for x, b in zip(got_rates, bare)]
                cells += [f"{statistics.median(got_rates):.0f}",
                          f"{statistics.median(per):.2f} ({' '.join(f'{x:.2f}' for x in per)})"]
            row(mode, *cells)
        row("bare", f"{statistics.median(bare):.0f}", "", "", "")
    return 0


def _stages_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("datasets", nargs="+", help="packed JPEG datasets (shorter side 256 or 512)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--count", type=int, default=1024)
    p.add_argument("--passes", type=int, default=5,
                   help="shuffled passes over the dataset in each epoch of the started workers' loader")


# -- area-resize --------------------------------------------------------------------------------------
def area_resize(a: argparse.Namespace) -> int:
    """packer's ``INTER_AREA`` shrink (``imageproc.shrink_area``, the C module) against OpenCV's,
    side by side: the drawn ``RandomResizedCrop`` windows of each dataset that shrink on both sides
    (views of the whole decode, as the reader resizes them), and, with ``--src``, the conversion's
    shrink of source photos to ``--resize``. One thread each, the two taking turns per round; CPU
    us per resize, best round; the bytes compared on every image."""
    from packer.datasets import open_dataset
    from packer.images.imageproc import decode_payload, parse_resize, shrink_area, target_size

    cv2.setNumThreads(1)
    sets: list[tuple[str, list[tuple[np.ndarray, int, int]]]] = []
    for path in a.datasets:
        with open_dataset(path) as ds:
            jobs = []
            for _, payload, (top, left, h, w) in _draws(ds, a.count * 4, a.size, 4):
                if h >= a.size and w >= a.size and (h, w) != (a.size, a.size):
                    jobs.append((decode_payload(payload, "jpeg")[top:top + h, left:left + w], a.size, a.size))
        sets.append((f"{name_of(path)}: RandomResizedCrop({a.size}) windows that shrink", jobs[: a.count]))
    if a.src:
        import glob

        resize = parse_resize(a.resize)
        jobs = []
        for f in sorted(glob.glob(f"{a.src}/*/*"))[: a.count]:
            bgr = cv2.imread(f, cv2.IMREAD_COLOR)
            if bgr is None:
                continue
            tw, th = target_size(bgr.shape[1], bgr.shape[0], resize)
            if tw <= bgr.shape[1] and th <= bgr.shape[0] and (tw, th) != bgr.shape[1::-1]:
                jobs.append((bgr, tw, th))
        sets.append((f"conversion: source photos to --resize {a.resize}", jobs))
    print(f"\nINTER_AREA shrink, CPU us per image (one thread, best of {a.rounds} rounds)\n")
    header("images", "count", "OpenCV", "packer", "OpenCV / packer", "bytes equal")
    for name, jobs in sets:
        same = all(np.array_equal(shrink_area(img, w, h), cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA))
                   for img, w, h in jobs)
        best = {"opencv": float("inf"), "packer": float("inf")}
        for r in range(a.rounds):
            for how in turns(("opencv", "packer"), r):
                t0 = time.thread_time()
                if how == "opencv":
                    for img, w, h in jobs:
                        cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)
                else:
                    for img, w, h in jobs:
                        shrink_area(img, w, h)
                best[how] = min(best[how], (time.thread_time() - t0) / max(len(jobs), 1) * 1e6)
        row(name, str(len(jobs)), f"{best['opencv']:.0f}", f"{best['packer']:.0f}",
            f"{best['opencv'] / best['packer']:.2f}", "yes" if same else "**no**")
    return 0


def _area_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("datasets", nargs="*", help="packed JPEG datasets whose crop windows to shrink")
    p.add_argument("--src", help="an image folder (class/image) whose photos the conversion would shrink")
    p.add_argument("--resize", default="shorter:256", help="the conversion's --resize for --src")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--count", type=int, default=400)


SUBCOMMANDS: dict[str, Subcommand] = {"reduced-decode": (reduced_decode, _reduced_args),
                                      "train-stages": (train_stages, _stages_args),
                                      "area-resize": (area_resize, _area_args)}
