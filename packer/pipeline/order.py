"""The write-time shuffle: the one order in which every source's samples are written (a
permutation seeded per conversion), and the seed the manifest records for it."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["write_order", "recorded_seed"]


def write_order(n: int, options: Any) -> list[int]:
    """The source positions ``0 .. n-1`` in the order they are written: a permutation drawn from
    ``numpy.random.default_rng(options.seed)`` when ``options.shuffle`` (the same for the same seed
    and ``n``, whatever the source), else the source's own order."""
    if not options.shuffle:
        return list(range(n))
    return np.random.default_rng(options.seed).permutation(n).tolist()


def recorded_seed(options: Any) -> int | None:
    """The ``shuffle_seed`` a manifest records for :func:`write_order`: the seed, or None unshuffled."""
    return options.seed if options.shuffle else None
