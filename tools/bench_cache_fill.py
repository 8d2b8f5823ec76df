#!/usr/bin/env python3
"""Filling the decoded cache: epoch 1 of ``cache="decoded"`` against an uncached epoch, side by side.

    python tools/bench_cache_fill.py /tmp/bench_out/lmdb /tmp/bench_out/tar --rounds 3

DataLoader as in tools/bench_getitems.py: 2 workers, batch 64, shuffled, ``transform`` = 224
center crop, ``collate_fn=packer.datasets.collate``; workers not persistent. Per round and
dataset, three epochs on fresh datasets, in an order that rotates from round to round:
``uncached`` (no cache), ``pwrite`` (epoch 1 of ``cache="decoded"``: ``SharedCache.put`` writes
with ``pwrite`` into the cache's file) and ``mapped`` (the same epoch 1 with the copy done as
stores through the mapping, as ``put`` did before). The cache is created before the epoch is
timed. Medians over rounds; the ratios are per round, then the median. Then the same three
reads in one process, batch by batch (``in_process_cost``), and ``put`` alone, both ways
(``put_cost``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from torch.utils.data import DataLoader

from packer.datasets import collate, open_dataset
from packer.datasets.cache import _EMPTY, _READY, _WRITING, SharedCache, _as_bytes
from packer.datasets.encoded import center_crop


def crop224(image: torch.Tensor) -> torch.Tensor:
    return center_crop(image, 224)


class MappedStores(SharedCache):
    """``SharedCache.put`` with the copy made through the mapping (the earlier code)."""

    def put(self, index, data):  # noqa: ANN001, ANN201
        parts = [_as_bytes(d, index) for d in data] if isinstance(data, tuple) else [_as_bytes(data, index)]
        length = sum(p.size for p in parts)
        with self._lock.hold():
            if int(self._states[index]) != _EMPTY:
                return int(self._states[index]) == _READY
            offset = self._header["ptr"]
            if offset + length > self._capacity:
                self._header["rejected"] += 1
                return False
            self._header["ptr"] = min(-(-(offset + length) // 64) * 64, self._capacity)
            self._offsets[index], self._lengths[index] = offset, length
            self._states[index] = _WRITING
        at = offset
        for part in parts:
            self._arena[at : at + part.size] = part
            at += part.size
        with self._lock.hold():
            self._states[index] = _READY
            self._header["entries"] += 1
        return True


def epoch_rate(path: str, kind: str) -> float:
    """img/s of one epoch through a fresh DataLoader over a fresh dataset."""
    ds = open_dataset(path, transform=crop224, cache=None if kind == "uncached" else "decoded")
    if kind == "mapped":
        capacity = ds.cache.capacity
        ds.cache.close()
        ds.cache = MappedStores(len(ds), capacity)
    loader = DataLoader(ds, batch_size=64, num_workers=2, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    n = sum(x.shape[0] for x, _ in loader)
    rate = n / (time.perf_counter() - t0)
    if kind != "uncached":
        assert len(ds.cache) == len(ds), f"{kind}: the epoch cached {len(ds.cache)} of {len(ds)}"
    ds.close()
    return rate


def in_process_cost(path: str, rounds: int, count: int = 1024) -> dict[str, float]:
    """Median microseconds per ``ds[i]`` in one process (no DataLoader) over ``count`` shuffled
    samples, for each kind, on fresh datasets per round; the kinds take turns batch by batch
    (64 samples), in a rotating order, so the machine's load treats them alike."""
    kinds = ["uncached", "pwrite", "mapped"]
    order = np.random.default_rng(0).permutation(5000)[:count].tolist()
    batches = [order[j : j + 64] for j in range(0, len(order), 64)]
    per: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        sets = {}
        for kind in kinds:
            ds = open_dataset(path, transform=crop224, cache=None if kind == "uncached" else "decoded")
            if kind == "mapped":
                capacity = ds.cache.capacity
                ds.cache.close()
                ds.cache = MappedStores(len(ds), capacity)
            sets[kind] = ds
        spent = dict.fromkeys(kinds, 0.0)
        for k, batch in enumerate(batches):
            for kind in np.roll(kinds, -(k + r)).tolist():
                ds = sets[kind]
                t0 = time.perf_counter()
                for i in batch:
                    ds[i]
                spent[kind] += time.perf_counter() - t0
        for kind in kinds:
            per[kind].append(spent[kind] / len(order) * 1e6)
            sets[kind].close()
    return {k: statistics.median(v) for k, v in per.items()}


def put_cost(path: str, rounds: int, count: int = 2048) -> dict[str, float]:
    """Median microseconds per ``put`` alone of a decoded entry of ``path``'s size (header and
    pixels) into fresh caches, ``pwrite`` and mapped stores taking turns batch by batch."""
    ds = open_dataset(path)
    rgb = np.ascontiguousarray(ds.decode(ds.read_record(0)))
    header = b"\0" * 16
    per: dict[str, list[float]] = {"pwrite": [], "mapped": []}
    for r in range(rounds):
        caches = {"pwrite": SharedCache(count, count * (rgb.nbytes + 128)),
                  "mapped": MappedStores(count, count * (rgb.nbytes + 128))}
        spent = dict.fromkeys(caches, 0.0)
        for start in range(0, count, 64):
            for kind in (["pwrite", "mapped"] if (start // 64 + r) % 2 == 0 else ["mapped", "pwrite"]):
                cache = caches[kind]
                t0 = time.perf_counter()
                for i in range(start, min(start + 64, count)):
                    cache.put(i, (header, rgb))
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
    kinds = ["uncached", "pwrite", "mapped"]
    print("| dataset | uncached img/s | epoch 1, pwrite | / uncached | epoch 1, mapped stores | / uncached "
          "| pwrite / mapped | per round (pwrite / uncached) |")
    print("|---|---|---|---|---|---|---|---|")
    for path in a.paths:
        rates: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(a.rounds):
            for kind in np.roll(kinds, -r).tolist():
                rates[kind].append(epoch_rate(path, kind))
        med = {k: statistics.median(v) for k, v in rates.items()}
        ratio = {k: statistics.median(x / u for x, u in zip(rates[k], rates["uncached"])) for k in kinds}
        fill = statistics.median(p / m for p, m in zip(rates["pwrite"], rates["mapped"]))
        per_round = ", ".join(f"{p / u:.2f}" for p, u in zip(rates["pwrite"], rates["uncached"]))
        print(f"| {os.path.basename(path.rstrip('/'))} | {med['uncached']:.0f} | {med['pwrite']:.0f} | "
              f"{ratio['pwrite']:.2f} | {med['mapped']:.0f} | {ratio['mapped']:.2f} | {fill:.2f} | {per_round} |",
              flush=True)
    print("\n| dataset | one process, uncached us/sample | epoch 1, pwrite | epoch 1, mapped stores | "
          "fill cost, pwrite | fill cost, mapped |\n|---|---|---|---|---|---|")
    for path in a.paths:
        us = in_process_cost(path, a.rounds)
        print(f"| {os.path.basename(path.rstrip('/'))} | {us['uncached']:.1f} | {us['pwrite']:.1f} | "
              f"{us['mapped']:.1f} | {us['pwrite'] - us['uncached']:.1f} | {us['mapped'] - us['uncached']:.1f} |",
              flush=True)
    print("\n| dataset | entry bytes | put, pwrite us | put, mapped stores us | pwrite / mapped |\n|---|---|---|---|---|")
    for path in a.paths:
        us = put_cost(path, a.rounds)
        print(f"| {os.path.basename(path.rstrip('/'))} | {us['bytes']} | {us['pwrite']:.1f} | {us['mapped']:.1f} | "
              f"{us['pwrite'] / us['mapped']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
