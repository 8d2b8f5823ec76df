"""Section 7 of docs/benchmarks.md: ``getitems`` (the batched read, the decode ceiling, worker start-up)
and ``cache-fill`` (epoch 1 of the decoded cache)."""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader

from tools.bench.common import (
    Subcommand,
    cpu_seconds,
    crop224,
    header,
    in_revision,
    name_of,
    revisions,
    row,
    turns,
    usage,
)

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
    from packer.datasets.shm.cache import SharedCache

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


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"getitems": (getitems, _getitems_args),
                                      "cache-fill": (cache_fill, _cache_fill_args)}
