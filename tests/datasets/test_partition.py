"""Tests for packer.datasets.partition: who reads which sample, in what order.

The pure functions are checked over a fixed-seed random sample of (world size, workers, shards,
samples, seed, epoch, policy) combinations plus the edge cases, without starting processes; one
test runs a real DataLoader with worker processes to check the round-robin claim itself.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from packer.datasets.partition import (
    EpochCounts,
    World,
    epoch_counts,
    plan,
    rank_indices,
    reading_runs,
    shard_order,
    shuffle_buffer,
    worker_indices,
)
from packer.datasets.stages import _buffer_draws  # replayed through a plain loop below

# --------------------------------------------------------------------------------------------
# Helpers: independent re-implementations of what the code under test must agree with.


def dataloader_order(worker_streams: list[np.ndarray], batch_size: int) -> np.ndarray:
    """What a DataLoader yields from IterableDataset workers: each worker batches its own stream,
    and batches are taken from the workers in turn, skipping workers that have finished."""
    batches = [
        [stream[i : i + batch_size] for i in range(0, len(stream), batch_size)]
        for stream in worker_streams
    ]
    out: list[np.ndarray] = []
    cursor = [0] * len(batches)
    active = [w for w in range(len(batches)) if batches[w]]
    while active:
        still = []
        for w in active:
            out.append(batches[w][cursor[w]])
            cursor[w] += 1
            if cursor[w] < len(batches[w]):
                still.append(w)
        active = still
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def loop_shuffle_buffer(items: list[int], buffer_size: int, *, seed: int, epoch: int,
                        rank: int) -> list[int]:
    """The textbook streaming shuffle buffer, one item at a time, fed the same random draws."""
    size = min(buffer_size, len(items))
    slots, drain = _buffer_draws(len(items), buffer_size, seed=seed, epoch=epoch, rank=rank)
    buffer = list(items[:size])
    out = []
    for step, slot in enumerate(slots.tolist()):
        out.append(buffer[slot])
        buffer[slot] = items[size + step]
    out.extend(buffer[slot] for slot in drain.tolist())
    return out


def random_shard_sizes(rng: random.Random, num_shards: int, num_samples: int) -> list[int]:
    """``num_shards`` sizes summing to ``num_samples``; some may be empty."""
    cuts = sorted(rng.randint(0, num_samples) for _ in range(num_shards - 1))
    sizes = np.diff([0, *cuts, num_samples]).tolist()
    if num_shards > 2 and rng.random() < 0.3:  # force an empty shard, keeping the total
        victim = rng.randrange(num_shards - 1)
        sizes[-1] += sizes[victim]
        sizes[victim] = 0
    return sizes


@dataclasses.dataclass(frozen=True)
class Case:
    sizes: tuple[int, ...]
    world_size: int
    workers: int  # 0 means in-process loading: num_workers=1 from the dataset's point of view
    seed: int
    epoch: int
    shuffle: bool
    partition: str
    buffer_size: int
    batch_size: int

    @property
    def num_workers(self) -> int:
        return max(self.workers, 1)

    def __str__(self) -> str:
        return (f"S{len(self.sizes)}-N{sum(self.sizes)}-W{self.world_size}-K{self.workers}-"
                f"s{self.seed}e{self.epoch}-{'shuf' if self.shuffle else 'seq'}-{self.partition}"
                f"-B{self.buffer_size}-b{self.batch_size}")


def random_cases(count: int) -> list[Case]:
    rng = random.Random(20240611)
    cases = []
    for _ in range(count):
        num_shards = rng.randint(1, 50)
        num_samples = rng.choice([rng.randint(1, 20), rng.randint(1, 1000)])
        cases.append(Case(
            sizes=tuple(random_shard_sizes(rng, num_shards, num_samples)),
            world_size=rng.randint(1, 8),
            workers=rng.randint(0, 4),
            seed=rng.choice([0, 1, 12345, 2**64 - 1]),
            epoch=rng.randint(0, 5),
            shuffle=rng.random() < 0.75,
            partition=rng.choice(["pad", "drop"]),
            buffer_size=rng.choice([0, 1, 2, 7, 64, 5000]),
            batch_size=rng.choice([1, 2, 3, 8, 32]),
        ))
    return cases


EDGE_CASES = [
    # N = 1: pad gives every rank that one sample, drop gives empty epochs.
    Case((1,), 8, 4, 0, 0, True, "pad", 16, 4),
    Case((1,), 8, 4, 0, 0, True, "drop", 16, 4),
    Case((0, 1, 0), 3, 2, 5, 1, True, "pad", 2, 1),
    # N < W.
    Case((2, 0, 3), 8, 2, 7, 3, True, "pad", 4, 2),
    Case((2, 0, 3), 8, 2, 7, 3, True, "drop", 4, 2),
    # Fewer shards than ranks x workers.
    Case((100, 37), 4, 4, 1, 0, True, "pad", 10, 3),
    Case((100, 37), 4, 4, 1, 0, False, "drop", 10, 3),
    Case((50,), 8, 4, 2, 2, True, "pad", 1, 1),
    # Fewer batches than workers, a short last batch.
    Case((10,), 1, 4, 0, 0, True, "pad", 3, 4),
    # Empty datasets.
    Case((), 2, 2, 0, 0, True, "pad", 8, 2),
    Case((0, 0, 0), 3, 1, 0, 0, True, "drop", 8, 2),
    # Exact division, so neither padding nor dropping.
    Case((30, 30), 6, 3, 9, 1, True, "pad", 7, 5),
]

CASES = random_cases(150) + EDGE_CASES


def rank_sequence(case: Case, rank: int) -> np.ndarray:
    seq = rank_indices(case.sizes, seed=case.seed, epoch=case.epoch, rank=rank,
                       world_size=case.world_size, shuffle=case.shuffle,
                       partition=case.partition)
    if case.shuffle:
        seq = shuffle_buffer(seq, buffer_size=case.buffer_size, seed=case.seed,
                             epoch=case.epoch, rank=rank)
    return seq


def plan_for(case: Case, rank: int, worker: int, skip: int = 0) -> np.ndarray:
    world = World(rank=rank, world_size=case.world_size, worker=worker,
                  num_workers=case.num_workers)
    return plan(case.sizes, world, seed=case.seed, epoch=case.epoch, shuffle=case.shuffle,
                partition=case.partition, buffer_size=case.buffer_size,
                batch_size=case.batch_size, skip=skip, order=1)


# --------------------------------------------------------------------------------------------
# The epoch contract over many combinations.


@pytest.mark.parametrize("case", CASES, ids=str)
def test_epoch_contract(case: Case) -> None:
    num_samples = sum(case.sizes)
    counts = epoch_counts(num_samples, case.world_size, case.partition)
    seen = []
    for rank in range(case.world_size):
        streams = [plan_for(case, rank, worker) for worker in range(case.num_workers)]
        for stream in streams:
            assert stream.dtype == np.int64
        delivered = dataloader_order(streams, case.batch_size)
        # The DataLoader yields the rank sequence itself, in order, whatever the worker count.
        np.testing.assert_array_equal(delivered, rank_sequence(case, rank))
        # Every rank reads the same, reported, number of samples.
        assert len(delivered) == counts.per_rank
        seen.append(delivered)
    everything = np.concatenate(seen)
    assert len(everything) == num_samples + counts.padded - counts.dropped
    if num_samples == 0 or (case.partition == "drop" and num_samples < case.world_size):
        assert len(everything) == 0  # an empty epoch, and the counts say so
        assert counts.per_rank == 0 and counts.dropped == num_samples
        return
    assert everything.min() >= 0 and everything.max() < num_samples
    times = np.bincount(everything, minlength=num_samples)
    if case.partition == "pad":
        assert counts.dropped == 0 and counts.padded < max(case.world_size, 1) * counts.per_rank
        assert times.min() >= 1  # every sample, and repeats spread as evenly as possible
        assert times.max() - times.min() <= 1
    else:
        assert counts.padded == 0 and counts.dropped < case.world_size
        assert times.max() <= 1  # no sample twice
        assert int((times == 0).sum()) == counts.dropped


@pytest.mark.parametrize("case", CASES[:40] + EDGE_CASES, ids=str)
def test_skip_resumes_the_rank_sequence(case: Case) -> None:
    for rank in {0, case.world_size - 1}:
        full = rank_sequence(case, rank)
        for skip in sorted({0, 1, len(full) // 3, len(full) - 1, len(full)}):
            if not 0 <= skip <= len(full):
                continue
            streams = [plan_for(case, rank, w, skip=skip) for w in range(case.num_workers)]
            np.testing.assert_array_equal(dataloader_order(streams, case.batch_size),
                                          full[skip:])


def test_skip_past_the_end_is_refused() -> None:
    with pytest.raises(ValueError, match="at most the 5 samples of rank 0.*got 6"):
        plan([10], World(0, 2), seed=0, epoch=0, shuffle=True, partition="pad",
             buffer_size=4, batch_size=2, skip=6)
    with pytest.raises(ValueError, match="skip"):
        plan([10], World(), seed=0, epoch=0, shuffle=True, partition="pad",
             buffer_size=4, batch_size=2, skip=-1)


def test_plan_is_deterministic_and_changes_with_epoch_and_seed() -> None:
    sizes = random_shard_sizes(random.Random(3), 20, 600)
    world = World(rank=1, world_size=3, worker=1, num_workers=2)

    def run(seed: int, epoch: int, shuffle: bool = True, buffer_size: int = 32) -> np.ndarray:
        return plan(sizes, world, seed=seed, epoch=epoch, shuffle=shuffle, partition="pad",
                    buffer_size=buffer_size, batch_size=4)

    np.testing.assert_array_equal(run(7, 2), run(7, 2))
    assert not np.array_equal(run(7, 2), run(7, 3))
    assert not np.array_equal(run(7, 2), run(8, 2))
    # Without shuffling the epoch and seed do not matter.
    np.testing.assert_array_equal(run(7, 2, shuffle=False), run(8, 5, shuffle=False))


def test_each_random_stage_alone_changes_with_the_epoch() -> None:
    # Shard order alone (buffer of 1 is no shuffle buffer).
    a, b = (rank_indices([10] * 30, seed=0, epoch=e, rank=0, world_size=1) for e in (0, 1))
    assert sorted(a.tolist()) == sorted(b.tolist()) == list(range(300))
    assert not np.array_equal(a, b)
    # Shuffle buffer alone (one shard, so the shard order is fixed).
    a, b = (shuffle_buffer(np.arange(300), buffer_size=16, seed=0, epoch=e, rank=0)
            for e in (0, 1))
    assert not np.array_equal(a, b)
    # ... and with the rank, so ranks do not shuffle in lockstep.
    c = shuffle_buffer(np.arange(300), buffer_size=16, seed=0, epoch=0, rank=1)
    assert not np.array_equal(a, c)


# --------------------------------------------------------------------------------------------
# epoch_counts, shard_order, rank_indices.


@pytest.mark.parametrize(
    ("num_samples", "world_size", "partition", "expected"),
    [
        (1, 8, "pad", (1, 7, 0)),
        (1, 8, "drop", (0, 0, 1)),
        (10, 3, "pad", (4, 2, 0)),
        (10, 3, "drop", (3, 0, 1)),
        (12, 4, "pad", (3, 0, 0)),
        (12, 4, "drop", (3, 0, 0)),
        (0, 4, "pad", (0, 0, 0)),
        (0, 4, "drop", (0, 0, 0)),
        (7, 1, "drop", (7, 0, 0)),
    ],
)
def test_epoch_counts(num_samples: int, world_size: int, partition: str,
                      expected: tuple[int, int, int]) -> None:
    counts = epoch_counts(num_samples, world_size, partition)
    assert counts == expected
    assert isinstance(counts, EpochCounts)
    per_rank, padded, dropped = counts
    assert per_rank * world_size == num_samples + padded - dropped


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((10, 2, "wrap"), ValueError, "'pad' or 'drop', got 'wrap'"),
        ((-1, 2, "pad"), ValueError, "num_samples must be >= 0, got -1"),
        ((10, 0, "pad"), ValueError, "world_size must be >= 1, got 0"),
        ((10.0, 2, "pad"), TypeError, "num_samples must be an integer"),
    ],
)
def test_epoch_counts_rejects(args: tuple, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        epoch_counts(*args)


def test_shard_order() -> None:
    np.testing.assert_array_equal(shard_order(5, 3, 9, shuffle=False), np.arange(5))
    orders = {tuple(shard_order(50, seed, epoch, shuffle=True).tolist())
              for seed in (0, 1) for epoch in (0, 1, 2)}
    assert len(orders) == 6  # every (seed, epoch) gives its own order
    for order in orders:
        assert sorted(order) == list(range(50))
    np.testing.assert_array_equal(shard_order(50, 1, 2, True), shard_order(50, 1, 2, True))
    assert shard_order(50, 1, 2, True).dtype == np.int64
    assert shard_order(0, 1, 2, True).tolist() == []


def test_rank_indices_without_shuffle_are_contiguous_blocks() -> None:
    sizes = [4, 0, 3, 3]  # N = 10
    blocks = [rank_indices(sizes, seed=0, epoch=0, rank=r, world_size=3, shuffle=False).tolist()
              for r in range(3)]
    assert blocks == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]  # padding wraps to the start
    blocks = [rank_indices(sizes, seed=0, epoch=0, rank=r, world_size=3, shuffle=False,
                           partition="drop").tolist() for r in range(3)]
    assert blocks == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_rank_indices_follow_the_shard_order() -> None:
    sizes = [5, 0, 2, 7, 1, 4]
    order = shard_order(len(sizes), 11, 4, shuffle=True)
    starts = np.cumsum(sizes) - sizes
    expected = np.concatenate([np.arange(starts[s], starts[s] + sizes[s]) for s in order])
    ranks = [rank_indices(sizes, seed=11, epoch=4, rank=r, world_size=4) for r in range(4)]
    np.testing.assert_array_equal(np.concatenate(ranks)[: sum(sizes)], expected)
    # pad with N = 19 over 4 ranks: 5 each, the one extra is the first sample of the sequence.
    assert np.concatenate(ranks)[-1] == expected[0]


def test_rank_indices_pad_with_fewer_samples_than_ranks_wraps_repeatedly() -> None:
    got = [rank_indices([2], seed=0, epoch=0, rank=r, world_size=5, shuffle=False).tolist()
           for r in range(5)]
    assert got == [[0], [1], [0], [1], [0]]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rank": 3, "world_size": 3}, ValueError, "rank=3, world_size=3"),
        ({"rank": -1}, ValueError, "rank must be >= 0, got -1"),
        ({"seed": -1}, ValueError, "seed must be in"),
        ({"seed": 2**128}, ValueError, "seed must be in"),
        ({"epoch": -2}, ValueError, "epoch must be in .*got -2"),
        ({"partition": "even"}, ValueError, "got 'even'"),
    ],
)
def test_rank_indices_rejects(kwargs: dict, error: type[Exception], match: str) -> None:
    args = {"seed": 0, "epoch": 0, "rank": 0, "world_size": 2} | kwargs
    with pytest.raises(error, match=match):
        rank_indices([3, 4], **args)


@pytest.mark.parametrize(
    ("sizes", "error", "match"),
    [
        ([3, -1, 2], ValueError, "got -1 for shard 1"),
        ([[1, 2]], ValueError, "one-dimensional"),
        ([1.5, 2.0], TypeError, "integers"),
    ],
)
def test_bad_shard_sizes(sizes: list, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        rank_indices(sizes, seed=0, epoch=0, rank=0, world_size=1)


# --------------------------------------------------------------------------------------------
# shuffle_buffer.


@pytest.mark.parametrize("num", [2, 3, 10, 100, 1000])
@pytest.mark.parametrize("buffer_size", [2, 3, 16, 999, 5000])
def test_shuffle_buffer_is_exactly_a_streaming_buffer(num: int, buffer_size: int) -> None:
    items = np.random.default_rng(num).permutation(10 * num)[:num]  # arbitrary distinct values
    got = shuffle_buffer(items, buffer_size=buffer_size, seed=5, epoch=num, rank=buffer_size)
    expected = loop_shuffle_buffer(items.tolist(), buffer_size, seed=5, epoch=num,
                                   rank=buffer_size)
    assert got.tolist() == expected


@pytest.mark.parametrize("buffer_size", [2, 5, 64, 1000, 3000])
def test_shuffle_buffer_bounds_and_memory(buffer_size: int) -> None:
    num = 2000
    out = shuffle_buffer(np.arange(num), buffer_size=buffer_size, seed=1, epoch=0, rank=0)
    assert sorted(out.tolist()) == list(range(num))  # a permutation
    assert out.tolist() != list(range(num))
    position = np.empty(num, dtype=np.int64)
    position[out] = np.arange(num)
    # No sample leaves before it could have entered the buffer.
    displacement = position - np.arange(num)
    assert displacement.min() >= -(buffer_size - 1)
    if buffer_size < num:
        assert displacement.min() <= -(buffer_size // 2)  # and the bound is not vacuous
    # A reader walking the input in order can produce the output holding buffer_size samples.
    held: set[int] = set()
    read = 0
    for sample in out.tolist():
        while read <= sample:
            held.add(read)
            read += 1
        assert len(held) <= buffer_size
        held.remove(sample)


def test_shuffle_buffer_large_buffer_is_a_uniform_permutation() -> None:
    # With buffer >= N, where sample 0 lands should be uniform over the 8 positions.
    landing = np.zeros(8, dtype=np.int64)
    for epoch in range(4000):
        out = shuffle_buffer(np.arange(8), buffer_size=8, seed=3, epoch=epoch, rank=0)
        landing[int(np.flatnonzero(out == 0)[0])] += 1
    assert landing.min() > 400 and landing.max() < 600  # expected 500, sd about 21


def test_shuffle_buffer_trivial_cases() -> None:
    items = np.array([9, 4, 7, 1], dtype=np.int32)
    for buffer_size in (0, 1):
        out = shuffle_buffer(items, buffer_size=buffer_size, seed=0, epoch=0, rank=0)
        assert out.tolist() == [9, 4, 7, 1] and out.dtype == np.int64
    assert shuffle_buffer([], buffer_size=8, seed=0, epoch=0, rank=0).tolist() == []
    assert shuffle_buffer([6], buffer_size=8, seed=0, epoch=0, rank=0).tolist() == [6]
    before = items.copy()
    shuffle_buffer(items, buffer_size=3, seed=0, epoch=0, rank=0)
    np.testing.assert_array_equal(items, before)  # input untouched
    with pytest.raises(ValueError, match="buffer_size must be >= 0, got -1"):
        shuffle_buffer(items, buffer_size=-1, seed=0, epoch=0, rank=0)
    with pytest.raises(ValueError, match="seed"):
        shuffle_buffer(items, buffer_size=0, seed=-3, epoch=0, rank=0)


# --------------------------------------------------------------------------------------------
# worker_indices and reading_runs.


def test_worker_indices_take_batch_chunks_round_robin() -> None:
    seq = np.arange(100, 110)
    parts = [worker_indices(seq, worker=w, num_workers=3, batch_size=2).tolist()
             for w in range(3)]
    assert parts == [[100, 101, 106, 107], [102, 103, 108, 109], [104, 105]]
    parts = [worker_indices(seq, worker=w, num_workers=2, batch_size=1).tolist()
             for w in range(2)]
    assert parts == [[100, 102, 104, 106, 108], [101, 103, 105, 107, 109]]
    np.testing.assert_array_equal(worker_indices(seq, worker=0, num_workers=1, batch_size=4), seq)
    # More workers than batches: the last ones get nothing.
    assert worker_indices(seq, worker=3, num_workers=4, batch_size=5).tolist() == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"worker": 2, "num_workers": 2, "batch_size": 1}, "worker=2, num_workers=2"),
        ({"worker": 0, "num_workers": 0, "batch_size": 1}, "num_workers must be >= 1, got 0"),
        ({"worker": 0, "num_workers": 1, "batch_size": 0}, "batch_size must be >= 1, got 0"),
    ],
)
def test_worker_indices_rejects(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        worker_indices(np.arange(4), **kwargs)


def test_reading_runs() -> None:
    assert reading_runs([5, 6, 7, 2, 3, 9]).tolist() == [[5, 8], [2, 4], [9, 10]]
    assert reading_runs([]).shape == (0, 2)
    assert reading_runs([4, 4]).tolist() == [[4, 5], [4, 5]]
    seq = shuffle_buffer(np.arange(500), buffer_size=4, seed=0, epoch=0, rank=0)
    runs = reading_runs(seq)
    assert np.concatenate([np.arange(a, b) for a, b in runs.tolist()]).tolist() == seq.tolist()
    assert len(runs) < len(seq)  # a small buffer leaves runs longer than one


# --------------------------------------------------------------------------------------------
# A real DataLoader with worker processes yields the rank sequence in order.


class _PlannedIndices(IterableDataset):
    def __init__(self, sizes: list[int], batch_size: int) -> None:
        self.sizes = sizes
        self.batch_size = batch_size

    def __iter__(self):
        world = World.detect()  # runs in the worker: sees RANK/WORLD_SIZE and the worker info
        indices = plan(self.sizes, world, seed=4, epoch=1, shuffle=True, partition="pad",
                       buffer_size=8, batch_size=self.batch_size, order=1)
        return iter(torch.from_numpy(indices))


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(("num_workers", "batch_size"), [(2, 3), (3, 16)])
def test_dataloader_yields_the_rank_sequence(monkeypatch: pytest.MonkeyPatch, num_workers: int,
                                             batch_size: int) -> None:
    monkeypatch.setenv("RANK", "1")  # World.detect in the workers; no process group here
    monkeypatch.setenv("WORLD_SIZE", "3")
    sizes = [13, 0, 20, 9, 7]  # 49 samples, 17 per rank, one padded
    loader = DataLoader(_PlannedIndices(sizes, batch_size), batch_size=batch_size,
                        num_workers=num_workers, multiprocessing_context="fork")
    got = torch.cat(list(loader)).tolist()
    expected = shuffle_buffer(
        rank_indices(sizes, seed=4, epoch=1, rank=1, world_size=3),
        buffer_size=8, seed=4, epoch=1, rank=1,
    )
    assert len(got) == 17
    assert got == expected.tolist()


def test_window_shuffle_keeps_each_window_of_shards_together():
    from packer.datasets.partition import window_shuffle

    sizes = [5, 7, 3, 6, 4]
    seq = np.concatenate([np.arange(21, 23), np.arange(0, 5), np.arange(12, 15), np.arange(5, 12),
                          np.arange(15, 21), np.arange(23, 25)])  # shards 4 (part), 0, 2, 1, 3, 4 (rest)
    out = window_shuffle(seq, sizes, window=2, seed=3, epoch=1, rank=0)
    assert sorted(out.tolist()) == sorted(seq.tolist())
    shard = np.searchsorted(np.cumsum(sizes), out, side="right")
    # groups of 2 shard runs in order of first appearance: {4, 0}, {2, 1}, {3, 4}
    assert set(shard[:7]) == {4, 0} and set(shard[7:17]) == {2, 1} and set(shard[17:]) == {3, 4}
    assert not np.array_equal(out[:7], seq[:7])  # shuffled inside the window
    again = window_shuffle(seq, sizes, window=2, seed=3, epoch=1, rank=0)
    assert np.array_equal(out, again) and not np.array_equal(out, window_shuffle(seq, sizes, window=2, seed=3,
                                                                                  epoch=2, rank=0))
