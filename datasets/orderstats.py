"""How close an epoch order is to a uniform shuffle, for a dataset written class by class.

:func:`order_quality` scores one epoch order (the global indices in reading order) by three
measures: the mean run of equal consecutive labels, the distinct shards per window of 1,000
positions, and |Spearman rho| between stored and epoch position. Each is also given as a
*residual order* in [0, 1]: 0 is its expectation under a uniform permutation
(:func:`uniform_expectation`), 1 its value for the stored order; ``score`` is the largest.
:func:`live_shards` is the I/O side: the shards a reader must hold open at once. Pure numpy;
the comparison of packer's shuffles with other loaders' is ``python -m tools.bench_parts
shuffle-quality`` (docs/benchmarks.md).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["WINDOW", "label_runs", "shards_per_window", "position_correlation", "uniform_expectation",
           "order_quality", "live_shards"]

#: Positions per window of the distinct-shards measure.
WINDOW = 1000


def label_runs(labels: np.ndarray) -> float:
    """Mean length of the runs of equal consecutive labels."""
    if not len(labels):
        return 0.0
    return len(labels) / (1 + int(np.count_nonzero(labels[1:] != labels[:-1])))


def shards_per_window(shards: np.ndarray, window: int = WINDOW) -> float:
    """Mean number of distinct shards among each full window of ``window`` consecutive positions."""
    full = len(shards) // window
    if not full:
        return 0.0
    blocks = np.sort(shards[:full * window].reshape(full, window), axis=1)
    return float(1 + np.count_nonzero(blocks[:, 1:] != blocks[:, :-1]) / full)


def position_correlation(order: np.ndarray) -> float:
    """Spearman's rho between each sample's stored position and its position in the epoch (both
    are ranks already when ``order`` is a permutation, so it is their Pearson correlation)."""
    n = len(order)
    if n < 2:
        return 0.0
    pos = np.arange(n, dtype=np.float64)
    stored = order.astype(np.float64)
    return float(np.corrcoef(stored, pos)[0, 1])


def uniform_expectation(n: int, classes: int, shard: int, window: int = WINDOW) -> dict[str, float]:
    """The three measures' expectations under a uniform permutation of ``n`` samples in equal
    classes and shards of ``shard`` samples (runs: 1 / (1 - P(next label equal)); shards: the
    expected distinct shards of ``window`` draws without replacement; correlation: 0)."""
    same = sum(c * (c - 1) for c in _sizes(n, classes)) / (n * (n - 1))
    miss = sum(math.exp(_log_choose(n - s, window) - _log_choose(n, window)) for s in _shard_sizes(n, shard))
    return {"runs": 1 / (1 - same), "shards": len(_shard_sizes(n, shard)) - miss, "rho": 0.0}


def _sizes(n: int, parts: int) -> list[int]:
    return [n * (c + 1) // parts - n * c // parts for c in range(parts)]


def _shard_sizes(n: int, shard: int) -> list[int]:
    return [min(shard, n - a) for a in range(0, n, shard)]


def _log_choose(a: int, b: int) -> float:
    return -math.inf if b > a else math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)


def order_quality(order: np.ndarray, classes: int, shard: int, window: int = WINDOW) -> dict[str, float]:
    """The shuffle statistic of one epoch ``order`` (global indices) of ``len(order)`` samples written
    class by class (sample ``i`` of class ``i * classes // n``) in shards of ``shard``: the mean label
    run, distinct shards per window, |Spearman rho|, each with its residual order
    ``(measured - uniform) / (stored - uniform)`` clipped to [0, 1], and ``score``, the largest."""
    n = len(order)
    order = np.asarray(order, dtype=np.int64)
    got = {"runs": label_runs(order * classes // n), "shards": shards_per_window(order // shard, window),
           "rho": abs(position_correlation(order))}
    stored = np.arange(n, dtype=np.int64)
    worst = {"runs": label_runs(stored * classes // n), "shards": shards_per_window(stored // shard, window), "rho": 1.0}
    best = uniform_expectation(n, classes, shard, window)
    for k in ("runs", "shards", "rho"):
        span = worst[k] - best[k]
        got[f"{k}_residual"] = float(np.clip((got[k] - best[k]) / span, 0, 1)) if span else 0.0
    got["score"] = max(got["runs_residual"], got["shards_residual"], got["rho_residual"])
    return got


def live_shards(order: np.ndarray, shard: int) -> int:
    """Most shards between their first and last read at once in ``order``: what a reader must keep
    open (or cached) to read each shard's samples where the order wants them."""
    shards = np.asarray(order, dtype=np.int64) // shard
    count = int(shards.max()) + 1 if len(shards) else 0
    first = np.full(count, len(shards), dtype=np.int64)
    last = np.full(count, -1, dtype=np.int64)
    pos = np.arange(len(shards), dtype=np.int64)
    np.minimum.at(first, shards, pos)
    np.maximum.at(last, shards, pos)
    used = last >= 0
    events = np.zeros(len(shards) + 1, dtype=np.int64)
    np.add.at(events, first[used], 1)
    np.add.at(events, last[used] + 1, -1)
    return int(np.cumsum(events).max()) if len(shards) else 0
