"""The shuffle statistic: the stored order scores worst, a uniform permutation near its expectation."""

from __future__ import annotations

import numpy as np
import pytest

from packer.datasets.orderstats import (
    live_shards,
    order_quality,
    shards_per_window,
    uniform_expectation,
)
from packer.datasets.partition import World, epoch_plan

N, CLASSES, SHARD = 100_000, 100, 1000


def test_stored_order_scores_worst_and_a_permutation_scores_near_uniform():
    stored = order_quality(np.arange(N), CLASSES, SHARD)
    assert stored["runs"] == N / CLASSES and stored["shards"] == 1.0 and stored["rho"] == pytest.approx(1.0)
    assert stored["score"] == 1.0 and stored["runs_residual"] == stored["shards_residual"] == 1.0
    perm = order_quality(np.random.default_rng(3).permutation(N), CLASSES, SHARD)
    best = uniform_expectation(N, CLASSES, SHARD)
    assert perm["runs"] == pytest.approx(best["runs"], rel=0.01)  # 1 / (1 - 0.0099) = 1.010
    assert perm["shards"] == pytest.approx(best["shards"], rel=0.005)  # 1,000 draws of 100 shards
    assert perm["rho"] < 4 / np.sqrt(N) and perm["score"] < 0.02
    assert live_shards(np.arange(N), SHARD) == 1 and live_shards(np.random.default_rng(3).permutation(N), SHARD) == 100


def test_uniform_expectation_matches_draws():
    """The distinct shards of 1,000 draws without replacement, against a simulation."""
    rng = np.random.default_rng(5)
    draws = [len(np.unique(rng.choice(N, 1000, replace=False) // SHARD)) for _ in range(200)]
    assert np.mean(draws) == pytest.approx(uniform_expectation(N, CLASSES, SHARD)["shards"], abs=0.3)
    assert shards_per_window(np.repeat(np.arange(10), 100), window=1000) == 10.0


def test_scores_rank_packers_windows():
    """A smaller shuffle window leaves more of the stored order: the score grows as it shrinks."""
    sizes = np.full(N // SHARD, SHARD)
    scores = [order_quality(np.asarray(epoch_plan(sizes, World(0, 1, 0, 1), seed=1, epoch=0, shuffle=True,
                                                  partition="pad", buffer_size=size, batch_size=1)),
                            CLASSES, SHARD)["score"] for size in (N, 16_384, 2_048)]
    assert scores[0] < 0.05 < scores[1] < scores[2] < 1
