"""``packer bench DST``: measure the data pipeline alone, over a grid of DataLoader settings.

The advice it automates: never guess ``num_workers`` or ``pin_memory``; comment the model out and
time the loader by itself. Each configuration reads the same random subset of samples (center
crop to a fixed size so batches collate); cached configurations are measured warm (the cache is
filled by one pass first), since that is their steady state from epoch 2 on. With workers, each
configuration runs with torch's ``default_collate`` and with ``packer.datasets.collate`` (batches
in reused shared memory), so the table shows what the latter buys on this machine.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

__all__ = ["BenchRow", "CenterCropPad", "run_bench", "recommend", "format_table"]


class CenterCropPad:
    """Center-crop a C x H x W tensor to ``size`` x ``size``, zero-padding images that are smaller."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        c, h, w = x.shape
        s = self.size
        if h < s or w < s:
            out = torch.zeros((c, max(h, s), max(w, s)), dtype=x.dtype)
            out[:, :h, :w] = x
            x, h, w = out, max(h, s), max(w, s)
        top, left = (h - s) // 2, (w - s) // 2
        return x[:, top : top + s, left : left + s]


@dataclass
class BenchRow:
    """One measured configuration."""

    num_workers: int
    pin_memory: bool
    batch_size: int
    cache: str
    images_per_s: float
    mb_per_s: float
    first_batch_s: float
    collate: str = "default"


def _measure(ds: Any, indices: list[int], workers: int, pin: bool, batch: int,
             collate: str = "default") -> tuple[float, float, float]:
    from packer.datasets import collate as packer_collate

    loader = DataLoader(Subset(ds, indices), batch_size=batch, num_workers=workers, pin_memory=pin,
                        persistent_workers=False, shuffle=False,
                        collate_fn=packer_collate if collate == "packer" else None)
    t0 = time.perf_counter()
    n = nbytes = 0
    first = 0.0
    for images, _ in loader:
        if n == 0:
            first = time.perf_counter() - t0
        n += images.shape[0]
        nbytes += images.numel() * images.element_size()
    dt = time.perf_counter() - t0
    return n / dt, nbytes / dt / 1e6, first


def run_bench(
    path: str,
    *,
    workers: list[int] | None = None,
    pin: list[bool] | None = None,
    batch_sizes: list[int] | None = None,
    caches: list[str] | None = None,
    collates: list[str] | None = None,
    samples: int = 2000,
    crop: int = 224,
    progress: bool = True,
) -> list[BenchRow]:
    """Measure every combination of the grid; return one row per configuration.

    ``collates`` holds ``"packer"`` and/or ``"default"`` (the DataLoader's collate_fn); with
    ``num_workers=0`` both are the same function, so only ``"default"`` is measured there.
    """
    from tqdm import tqdm

    from packer.datasets import open_dataset

    cores = os.cpu_count() or 1
    workers = workers if workers is not None else sorted({0, 1, 2, cores, min(2 * cores, 16)} - {1} | {1})
    pin = pin if pin is not None else ([False, True] if torch.cuda.is_available() else [False])
    batch_sizes = batch_sizes or [64, 256]
    caches = caches or ["none", "decoded"]
    collates = collates or ["packer", "default"]
    probe = open_dataset(path)
    n = len(probe)
    indices = np.random.default_rng(0).permutation(n)[: min(samples, n)].tolist()
    rows: list[BenchRow] = []
    grid = [(c, w, p, b, k) for c, w, p, b, k in itertools.product(caches, workers, pin, batch_sizes, collates)
            if w > 0 or k == collates[-1]]
    bar = tqdm(grid, desc="bench", unit="cfg", disable=not progress, file=sys.stderr)
    datasets: dict[str, Any] = {}
    for cache, w, p, b, k in bar:
        if cache not in datasets:
            ds = open_dataset(path, transform=CenterCropPad(crop), cache=None if cache == "none" else cache)
            if cache != "none":
                for i in indices:  # warm: the cached steady state is what epochs 2+ see
                    ds[i]
            datasets[cache] = ds
        bar.set_postfix_str(f"cache={cache} workers={w} pin={p} batch={b} collate={k}")
        ips, mbs, first = _measure(datasets[cache], indices, w, p, b, k if w > 0 else "default")
        rows.append(BenchRow(w, p, b, cache, ips, mbs, first, k if w > 0 else "default"))
    for ds in datasets.values():
        ds.close()
    return rows


def recommend(rows: list[BenchRow]) -> BenchRow:
    """The fastest row, preferring no cache, fewer workers and torch's own collate within 5% of it."""
    best = max(r.images_per_s for r in rows)
    close = [r for r in rows if r.images_per_s >= 0.95 * best]
    return min(close, key=lambda r: (r.cache != "none", r.num_workers, r.collate != "default",
                                     not r.pin_memory, -r.images_per_s))


def format_table(rows: list[BenchRow]) -> str:
    """A markdown table of the rows."""
    out = ["| cache | num_workers | pin_memory | batch_size | collate_fn | images/s | MB/s | first batch s |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.cache} | {r.num_workers} | {r.pin_memory} | {r.batch_size} | {r.collate} | "
                   f"{r.images_per_s:.0f} | {r.mb_per_s:.0f} | {r.first_batch_s:.2f} |")
    return "\n".join(out)


def to_json(rows: list[BenchRow], best: BenchRow) -> str:
    """Rows and the recommendation as JSON."""
    return json.dumps({"rows": [asdict(r) for r in rows], "recommended": asdict(best)}, indent=1)
