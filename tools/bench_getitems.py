#!/usr/bin/env python3
"""The batched read (``__getitems__``) against one ``ds[i]`` per sample, side by side in one run.

    python tools/bench_getitems.py /tmp/bench_out/lmdb /tmp/bench_out/tar --rounds 3

DataLoader: 2 workers, batch 64, shuffled, ``transform`` = 224 center crop,
``collate_fn=packer.datasets.collate``, persistent workers. "before" is the same dataset with
``__getitems__`` hidden (the DataLoader then calls ``ds[i]`` per sample). Rounds alternate
before/after so that a change of the machine's load hits both; each figure is the better of 2
epochs, and the table gives the median over rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader

from packer.datasets import collate, open_dataset
from packer.datasets.encoded import center_crop


def crop224(image: torch.Tensor) -> torch.Tensor:
    return center_crop(image, 224)


def epoch_rate(path: str, batched: bool, epochs: int = 2) -> float:
    """The best img/s of ``epochs`` epochs through a fresh DataLoader over ``path``."""
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


def in_process_cost(path: str, rounds: int, count: int = 2048) -> tuple[float, float]:
    """Median microseconds per sample in one process (no DataLoader): ``[ds[i] for i in batch]``
    and ``ds.__getitems__(batch)`` over the same shuffled batches of 64 (each batch read both ways,
    in alternating order, so the page cache and the machine's load treat both alike)."""
    import numpy as np

    ds = open_dataset(path, transform=crop224)
    order = np.random.default_rng(0).permutation(len(ds))[:count].tolist()
    batches = [order[j : j + 64] for j in range(0, len(order), 64)]
    single, batched = [], []
    for r in range(rounds):  # batch by batch, alternating which goes first, so drift hits both
        times = {False: 0.0, True: 0.0}
        for k, b in enumerate(batches):
            for use_batched in (False, True) if (k + r) % 2 == 0 else (True, False):
                t0 = time.perf_counter()
                ds.__getitems__(b) if use_batched else [ds[i] for i in b]
                times[use_batched] += time.perf_counter() - t0
        single.append(times[False] / len(order) * 1e6)
        batched.append(times[True] / len(order) * 1e6)
    return statistics.median(single), statistics.median(batched)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="packed datasets (jpeg) to read")
    parser.add_argument("--rounds", type=int, default=3)
    a = parser.parse_args(argv)
    print("| dataset | ds[i] per sample img/s | __getitems__ img/s | after / before | rounds (after / before) |")
    print("|---|---|---|---|---|")
    for path in a.paths:
        before, after = [], []
        for r in range(a.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for batched in order:
                (after if batched else before).append(epoch_rate(path, batched))
        ratios = [x / y for x, y in zip(after, before)]
        print(f"| {os.path.basename(path.rstrip('/'))} | {statistics.median(before):.0f} | "
              f"{statistics.median(after):.0f} | {statistics.median(ratios):.3f} | "
              f"{', '.join(f'{x:.2f}' for x in ratios)} |", flush=True)
    print("\n| dataset | one process, ds[i] us/sample | __getitems__ us/sample | saved |\n|---|---|---|---|")
    for path in a.paths:
        single, batched = in_process_cost(path, a.rounds)
        print(f"| {os.path.basename(path.rstrip('/'))} | {single:.1f} | {batched:.1f} | "
              f"{(single - batched) / single:.1%} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
