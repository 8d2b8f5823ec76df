#!/usr/bin/env python3
"""Filling the decoded cache: epoch 1 of ``cache="decoded"`` against an uncached epoch, side by side.

    python tools/bench_cache_fill.py /tmp/bench_out/lmdb /tmp/bench_out/tar --rounds 3

DataLoader as in tools/bench_getitems.py: 2 workers, batch 64, shuffled, ``transform`` = 224
center crop, ``collate_fn=packer.datasets.collate``; workers not persistent. Per round and
dataset, three epochs on fresh datasets, in an order that rotates from round to round:
``uncached`` (no cache), ``batched`` (epoch 1 of ``cache="decoded"``: each batch looks up and
stores its samples with one ``get_many`` and one ``put_many``, three holds of the cache's lock)
and ``per sample`` (the same epoch 1 with ``__getitems__`` hidden, so every sample takes its
own ``get`` and ``put``: three holds per sample, as before batching). The cache is created before
the epoch is timed. Each epoch gives img/s and the CPU time per image of the workers and the
main process (``getrusage``), which still compares when other jobs load the machine. Medians
over rounds; ratios are per round, then the median. Then the same three reads in one process,
batch by batch (``in_process_cost``), and the stores alone, ``put`` per entry against
``put_many`` per batch (``put_cost``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import numpy as np
import torch
from torch.utils.data import DataLoader

from packer.datasets import collate, open_dataset
from packer.datasets.cache import SharedCache
from packer.datasets.encoded import center_crop

KINDS = ["uncached", "batched", "per sample"]


def crop224(image: torch.Tensor) -> torch.Tensor:
    return center_crop(image, 224)


def _fresh(path: str, kind: str):  # noqa: ANN202
    ds = open_dataset(path, transform=crop224, cache=None if kind == "uncached" else "decoded")
    if kind == "per sample":
        ds.__getitems__ = None  # the DataLoader's fetcher then reads ds[i] per sample
    return ds


def _cpu() -> float:
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def epoch(path: str, kind: str) -> tuple[float, float]:
    """(img/s, CPU us per image of workers and main process) of one epoch through a fresh
    DataLoader over a fresh dataset."""
    ds = _fresh(path, kind)
    loader = DataLoader(ds, batch_size=64, num_workers=2, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(0))
    c0, t0 = _cpu(), time.perf_counter()
    it = iter(loader)
    n = sum(x.shape[0] for x, _ in it)
    del it  # the workers exit: their CPU time is then in RUSAGE_CHILDREN
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    if kind != "uncached":
        assert len(ds.cache) == len(ds), f"{kind}: the epoch cached {len(ds.cache)} of {len(ds)}"
    ds.close()
    return n / wall, cpu / n * 1e6


def in_process_cost(path: str, rounds: int, count: int = 1024) -> dict[str, float]:
    """Median microseconds per sample in one process (no DataLoader) over ``count`` shuffled
    samples, for each kind, on fresh datasets per round; the kinds take turns batch by batch
    (64 samples), in a rotating order, so the machine's load treats them alike."""
    order = np.random.default_rng(0).permutation(5000)[:count].tolist()
    batches = [order[j : j + 64] for j in range(0, len(order), 64)]
    per: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(rounds):
        sets = {kind: _fresh(path, kind) for kind in KINDS}
        spent = dict.fromkeys(KINDS, 0.0)
        for k, batch in enumerate(batches):
            for kind in np.roll(KINDS, -(k + r)).tolist():
                ds = sets[kind]
                t0 = time.perf_counter()
                if kind == "per sample":
                    [ds[i] for i in batch]
                else:
                    ds.__getitems__(batch)
                spent[kind] += time.perf_counter() - t0
        for kind in KINDS:
            per[kind].append(spent[kind] / len(order) * 1e6)
            sets[kind].close()
    return {k: statistics.median(v) for k, v in per.items()}


def put_cost(path: str, rounds: int, count: int = 2048) -> dict[str, float]:
    """Median microseconds per stored decoded entry of ``path``'s size (header and pixels) into
    fresh caches: ``put`` per entry against ``put_many`` per batch of 64, taking turns."""
    ds = open_dataset(path)
    rgb = np.ascontiguousarray(ds.decode(ds.read_record(0)))
    header = b"\0" * 16
    per: dict[str, list[float]] = {"put": [], "put_many": []}
    for r in range(rounds):
        caches = {kind: SharedCache(count, count * (rgb.nbytes + 128)) for kind in per}
        spent = dict.fromkeys(caches, 0.0)
        for start in range(0, count, 64):
            span = range(start, min(start + 64, count))
            for kind in (["put", "put_many"] if (start // 64 + r) % 2 == 0 else ["put_many", "put"]):
                cache = caches[kind]
                t0 = time.perf_counter()
                if kind == "put":
                    for i in span:
                        cache.put(i, (header, rgb))
                else:
                    cache.put_many([(i, (header, rgb)) for i in span])
                spent[kind] += time.perf_counter() - t0
        for kind, cache in caches.items():
            per[kind].append(spent[kind] / count * 1e6)
            cache.close()
    return {k: statistics.median(v) for k, v in per.items()} | {"bytes": rgb.nbytes + len(header)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="packed datasets (jpeg) to read")
    parser.add_argument("--rounds", type=int, default=3)
    a = parser.parse_args(argv)
    print("| dataset | uncached img/s | epoch 1, batched | / uncached | epoch 1, per sample | / uncached "
          "| CPU us/img uncached | batched | per sample | CPU-bound batched / uncached, per sample / uncached "
          "| per round (batched / uncached) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in a.paths:
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
        for r in range(a.rounds):
            for kind in np.roll(KINDS, -r).tolist():
                got[kind].append(epoch(path, kind))
        rate = {k: statistics.median(x[0] for x in v) for k, v in got.items()}
        cpu = {k: statistics.median(x[1] for x in v) for k, v in got.items()}
        ratio = {k: statistics.median(x[0] / u[0] for x, u in zip(got[k], got["uncached"])) for k in KINDS}
        bound = {k: statistics.median(u[1] / x[1] for x, u in zip(got[k], got["uncached"])) for k in KINDS}
        per_round = ", ".join(f"{x[0] / u[0]:.2f}" for x, u in zip(got["batched"], got["uncached"]))
        print(f"| {os.path.basename(path.rstrip('/'))} | {rate['uncached']:.0f} | {rate['batched']:.0f} | "
              f"{ratio['batched']:.2f} | {rate['per sample']:.0f} | {ratio['per sample']:.2f} | "
              f"{cpu['uncached']:.0f} | {cpu['batched']:.0f} | {cpu['per sample']:.0f} | "
              f"{bound['batched']:.2f}, {bound['per sample']:.2f} | {per_round} |", flush=True)
    print("\n| dataset | one process, uncached us/sample | epoch 1, batched | epoch 1, per sample | "
          "fill cost, batched | fill cost, per sample |\n|---|---|---|---|---|---|")
    for path in a.paths:
        us = in_process_cost(path, a.rounds)
        print(f"| {os.path.basename(path.rstrip('/'))} | {us['uncached']:.1f} | {us['batched']:.1f} | "
              f"{us['per sample']:.1f} | {us['batched'] - us['uncached']:.1f} | "
              f"{us['per sample'] - us['uncached']:.1f} |", flush=True)
    print("\n| dataset | entry bytes | put us/entry | put_many us/entry | put_many / put |\n|---|---|---|---|---|")
    for path in a.paths:
        us = put_cost(path, a.rounds)
        print(f"| {os.path.basename(path.rstrip('/'))} | {us['bytes']} | {us['put']:.1f} | {us['put_many']:.1f} | "
              f"{us['put_many'] / us['put']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
