"""Who reads which sample, in what order: pure partitioning and shuffling for streaming.

Everything here is a pure function of plain integers (seed, epoch, rank, world size, worker,
workers, shard sizes), so the streaming ``IterableDataset`` stays thin and the tests can check
every (world size, workers, seed, epoch) combination without starting a process. No function
reads global random state or the clock. :func:`plan` composes one epoch on one DataLoader worker::

    shard_sizes ──shard_order──> global sequence ──pad/drop, slice──> rank_indices
        ──shuffle_buffer──> rank sequence ──[skip:]──> ──worker_indices──> this worker's indices

A dataset is a list of *shard sizes*; the *global index* of a sample is its position in the
concatenation of the shards in stored order. The *rank sequence* is what one rank reads in one
epoch, in order: the same length on every rank, yielded exactly in order by the DataLoader
whatever its number of workers, so resuming is ``rank_seq[consumed:]``. The stages live in
:mod:`.stages`; order 2, computed on demand, here. Design notes: docs/datasets.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from packer.checks import check_int

from .nodeshards import NodeOrder
from .permutation import derive_key, mix64, permute
from .stages import (
    LAZY_ORDER,
    MAX_SEED,
    MAX_WORD,
    ORDERS,
    EpochCounts,
    Partition,
    as_shard_sizes,
    check_history,
    epoch_counts,
    interleave,
    rank_indices,
    rank_span,
    reading_runs,
    refuse_exact,
    resharded_count,
    resharded_sequence,
    shard_order,
    shuffle_buffer,
    split_sources,
    stream_indices,
    window_shuffle,
    worker_indices,
)
from .world import World

__all__ = [
    "Partition",
    "World",
    "EpochCounts",
    "epoch_counts",
    "rank_span",
    "shard_order",
    "stream_indices",
    "interleave",
    "rank_indices",
    "shuffle_buffer",
    "window_shuffle",
    "worker_indices",
    "plan",
    "resharded_sequence",
    "resharded_count",
    "reading_runs",
    "EpochPlan",
    "epoch_plan",
    "LAZY_ORDER",
    "ORDERS",
]

def plan(
    shard_sizes: Sequence[int] | NDArray[np.integer],
    world: World,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    partition: Partition,
    buffer_size: int,
    batch_size: int,
    skip: int = 0,
    take: int | Sequence[int] | None = None,
    sources: Sequence[int] | None = None,
    history: Sequence[tuple[int, int]] = (),
    window_shards: int | None = None,
    order: int = LAZY_ORDER,
    stable_nodes: tuple[int, int] | None = None,
) -> NDArray[np.int64]:
    """Global sample indices that this worker of this rank reads this epoch, in order.

    ``order``: 2 (the default), :func:`epoch_plan`'s order, made into an array; 1, the first
    order, described here, which materialises every stage (a run that started under it resumes
    in it).

    :func:`rank_indices`, then :func:`shuffle_buffer` when ``shuffle`` (seeded by ``world.rank``),
    then the first ``skip`` samples of the rank sequence are dropped (resume: ``skip`` is the
    number the DataLoader on this rank has already yielded this epoch, at most the rank's
    :func:`epoch_counts` ``per_rank``), then :func:`worker_indices`. ``batch_size`` must be the
    DataLoader's. The shuffle is per rank, before the worker split, so the order a rank sees does
    not depend on the number of workers and a run resumes with another ``num_workers``.
    ``take``: samples per epoch, a subset of the dataset, or per source of a mixture whose
    sources have ``sources`` shards each (see :func:`rank_indices`). ``history``: the epoch was
    resumed after changes of world size (see :func:`resharded_sequence`). ``window_shards``:
    shuffle with :func:`window_shuffle` over that many shards instead of the sample buffer.
    ``stable_nodes``: see :func:`epoch_plan` (order 2 only).
    """
    if order == LAZY_ORDER:
        return np.asarray(epoch_plan(shard_sizes, world, seed=seed, epoch=epoch, shuffle=shuffle,
                                     partition=partition, buffer_size=buffer_size, batch_size=batch_size,
                                     skip=skip, take=take, sources=sources, history=history,
                                     window_shards=window_shards, stable_nodes=stable_nodes))
    if stable_nodes is not None:
        raise ValueError("stable node shards need order 2")
    if order != 1:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if not isinstance(world, World):
        raise TypeError(f"world must be a World, got {type(world).__name__}")

    def rank_sequence(rank: int, world_size: int) -> NDArray[np.int64]:
        seq = rank_indices(shard_sizes, seed=seed, epoch=epoch, rank=rank,
                           world_size=world_size, shuffle=shuffle, partition=partition,
                           take=take, sources=sources)
        if shuffle and window_shards is not None:
            seq = window_shuffle(seq, shard_sizes, window=window_shards, seed=seed, epoch=epoch, rank=rank)
        elif shuffle:
            seq = shuffle_buffer(seq, buffer_size=buffer_size, seed=seed, epoch=epoch, rank=rank)
        return seq

    if history:
        seq = resharded_sequence(rank_sequence, history, world.rank, world.world_size, partition)
    else:
        seq = rank_sequence(world.rank, world.world_size)
    skip = check_int("skip", skip, 0)
    if skip > len(seq):
        raise ValueError(f"skip must be at most the {len(seq)} samples of rank {world.rank} "
                         f"this epoch, got {skip}")
    return worker_indices(seq[skip:], worker=world.worker, num_workers=world.num_workers,
                          batch_size=batch_size)


# --------------------------------------------------------------------------------------------
# Order 2: the plan computed, not stored. Every stage is a map from a position to a position (or
# to a global index) that numpy evaluates on a chunk of positions, so a worker computes what it
# reads next and keeps O(shards) arrays, never the epoch.

_DOMAIN_WINDOW = 2  # key domain of order 2's window permutations
_GOLDEN = 0x9E3779B97F4A7C15


class _Passes:
    """The shard order of each (source, pass) as two arrays, cached for the last two passes:
    where each shard (in pass order) starts among the global indices and where it ends in the
    pass. O(shards) memory; it maps a stream position to its global index."""

    def __init__(self, parts: list[tuple[NDArray[np.int64], int, int]], seed: int, shuffle: bool) -> None:
        self.parts, self.seed, self.shuffle = parts, seed, shuffle
        self.totals = [int(p.sum()) for p, _, _ in parts]
        self._cache: dict[tuple[int, int], tuple[NDArray[np.int64], NDArray[np.int64]]] = {}

    def _arrays(self, source: int, pass_: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        got = self._cache.get((source, pass_))
        if got is None:
            sizes = self.parts[source][0]
            order = shard_order(len(sizes), self.seed, pass_, self.shuffle, source)
            starts = np.cumsum(sizes)
            starts -= sizes
            starts = starts[order]
            ends = np.cumsum(sizes[order])
            del order
            if len(self._cache) >= 2:  # a window may straddle two passes, no more
                self._cache.pop(next(iter(self._cache)))
            got = self._cache[(source, pass_)] = (starts, ends)
        return got

    def indices(self, source: int, stream: NDArray[np.int64]) -> NDArray[np.int64]:
        """Global indices at positions ``stream`` of source ``source``'s endless stream of passes
        (the map of :func:`stream_indices`)."""
        passes, within = np.divmod(stream, self.totals[source])
        out = np.empty(len(stream), dtype=np.int64)
        for p in np.unique(passes).tolist():
            mask = passes == p
            at = within[mask]
            starts, ends = self._arrays(source, p)
            slot = np.searchsorted(ends, at, side="right")  # steps over empty shards
            begin = np.where(slot > 0, ends[np.maximum(slot - 1, 0)], 0)  # the shard's first position
            out[mask] = self.parts[source][1] + starts[slot] + at - begin
        return out


def _interleave_at(takes: Sequence[int], k: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(source, draw)`` at positions ``k`` of a mixture's epoch, without the epoch: draw ``j``
    of source ``s`` sits at key ``(2j + 1) / (2 takes[s])``, ties by source, compared exactly in
    integers; the position of a draw is the number of draws of every source before it, so a
    bisection per source finds the draw at ``k``. O(log take x sources^2) per position."""
    t = [int(x) for x in takes]
    if max(t, default=0) >= 2**31:
        raise ValueError(f"a mixture draws at most 2**31 - 1 samples per source and epoch, got {max(t)}")
    live = [s for s, n in enumerate(t) if n]

    def position(s: int, j: NDArray[np.int64]) -> NDArray[np.int64]:
        pos = j.copy()
        for other in live:
            if other != s:
                a = (2 * j + 1) * t[other]
                before = (a // t[s] + 1) // 2 if other < s else ((a - 1) // t[s] + 1) // 2
                pos += np.minimum(before, t[other])
        return pos

    source = np.full(len(k), -1, dtype=np.int64)
    draw = np.zeros(len(k), dtype=np.int64)
    for s in live:
        lo, hi = np.zeros(len(k), dtype=np.int64), np.full(len(k), t[s], dtype=np.int64)
        while True:  # the first draw j of s whose position is >= k
            todo = lo < hi
            if not todo.any():
                break
            mid = (lo + hi) // 2
            low = todo & (position(s, np.minimum(mid, t[s] - 1)) < k)
            lo = np.where(low, mid + 1, lo)
            hi = np.where(todo & ~low, mid, hi)
        hit = (lo < t[s]) & (position(s, np.minimum(lo, t[s] - 1)) == k)
        source[hit], draw[hit] = s, lo[hit]
    return source, draw


def _window_keys(key: int, window: NDArray[np.int64]) -> NDArray[np.uint64]:
    return mix64(np.uint64(key) ^ mix64(window.astype(np.uint64) + np.uint64(_GOLDEN)))


class _RankOrder:
    """Order 2's rank sequence before shuffling: the same positions as :func:`rank_indices`."""

    def __init__(self, passes: _Passes, epoch: int, rank: int, world_size: int, partition: Partition) -> None:
        self.passes, self.epoch = passes, epoch
        self.takes = [t for _, _, t in passes.parts]
        self.count = sum(self.takes)
        self.start, self.length = rank_span(self.count, world_size, rank, partition)

    def at(self, q: NDArray[np.int64]) -> NDArray[np.int64]:
        """Global indices at rank positions ``q``."""
        pos = (self.start + q) % max(self.count, 1)
        if len(self.takes) == 1:
            return self.passes.indices(0, self.epoch * self.count + pos)
        source, draw = _interleave_at(self.takes, pos)
        out = np.empty(len(q), dtype=np.int64)
        for s, take in enumerate(self.takes):
            mask = source == s
            if mask.any():
                out[mask] = self.passes.indices(s, self.epoch * take + draw[mask])
        return out


class _Windowed:
    """A rank sequence shuffled in consecutive windows of ``size`` positions, each by its own
    keyed permutation (the last window shorter): order 2's shuffle."""

    def __init__(self, base: _RankOrder, size: int, key: int) -> None:
        self.base, self.size, self.key, self.length = base, size, key, base.length

    def at(self, q: NDArray[np.int64]) -> NDArray[np.int64]:
        window = q // self.size
        first = window * self.size
        span = np.minimum(self.size, self.length - first)
        return self.base.at(first + permute(q - first, span, _window_keys(self.key, window)))


def _rank_order2(passes: _Passes, *, seed: int, epoch: int, rank: int, world_size: int, shuffle: bool,
                 partition: Partition, buffer_size: int, window_shards: int | None,
                 stable_nodes: tuple[int, int] | None = None) -> Any:
    """Order 2's rank sequence of ``rank`` of ``world_size``: :class:`_RankOrder` (with
    ``stable_nodes``, :func:`_node_order`), shuffled in windows of ``buffer_size`` positions, or
    with ``window_shards`` in windows of that many mean shards' samples."""
    base = (_RankOrder(passes, epoch, rank, world_size, partition) if stable_nodes is None
            else _node_order(passes, seed, epoch, rank, world_size, partition, shuffle, stable_nodes))
    if not shuffle:
        return base
    size = buffer_size
    if window_shards is not None:
        sizes = np.concatenate([p for p, _, _ in passes.parts])
        nonempty = max(1, int(np.count_nonzero(sizes)))
        size = window_shards * max(1, -(-int(sizes.sum()) // nonempty))
    if size <= 1 or base.length <= 1:
        return base
    return _Windowed(base, size, derive_key(seed, _DOMAIN_WINDOW, epoch, rank))


def _node_order(passes: _Passes, seed: int, epoch: int, rank: int, world_size: int, partition: Partition,
                shuffle: bool, stable_nodes: tuple[int, int]) -> NodeOrder:
    """The rank sequence with stable node shard sets (:mod:`.nodeshards`): ``stable_nodes`` is
    ``(ranks per node, epochs between dealings; 0: one dealing)``; one whole dataset only."""
    if len(passes.parts) != 1 or passes.totals[0] != passes.parts[0][2]:
        raise ValueError("stable node shards are for one whole dataset (not a mixture or a subset)")
    node_ranks, every = stable_nodes
    return NodeOrder(passes.parts[0][0], seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                     partition=partition, shuffle=shuffle, node_ranks=node_ranks, every=every)


class _Resharded:
    """Order 2's rank sequence of an epoch resumed after changes of world size: the map of
    :func:`resharded_sequence` from a position here back to (old rank, position) of the first
    world size, evaluated per position."""

    def __init__(self, make: Callable[[int, int], Any], history: Sequence[tuple[int, int]], rank: int,
                 world_size: int, partition: Partition) -> None:
        steps = check_history(history)
        refuse_exact(partition)
        self.make, self.first_world = make, steps[0][0]
        self._ranks: dict[int, Any] = {}
        per_rank = self._rank(0).length
        self.levels: list[tuple[int, int, int, int]] = []  # (world size, per rank, consumed, rest)
        for i, (size, consumed) in enumerate(steps):
            if consumed > per_rank:
                raise ValueError(f"history step {i} consumed {consumed} samples of a rank's {per_rank}")
            rest = size * (per_rank - consumed)
            self.levels.append((size, per_rank, consumed, rest))
            if i + 1 < len(steps):
                per_rank = epoch_counts(rest, steps[i + 1][0], partition).per_rank
        self.start, self.length = rank_span(self.levels[-1][3], world_size, rank, partition)

    def _rank(self, r: int) -> Any:
        if r not in self._ranks:
            self._ranks[r] = self.make(r, self.first_world)
        return self._ranks[r]

    def at(self, q: NDArray[np.int64]) -> NDArray[np.int64]:
        p = (self.start + q) % max(self.levels[-1][3], 1)
        for i in range(len(self.levels) - 1, -1, -1):
            _, per_rank, consumed, _ = self.levels[i]
            r, p = np.divmod(p, per_rank - consumed)
            p += consumed
            if i:
                p = (r * per_rank + p) % self.levels[i - 1][3]
        out = np.empty(len(q), dtype=np.int64)
        for old in np.unique(r).tolist():
            mask = r == old
            out[mask] = self._rank(old).at(p[mask])
        return out


class EpochPlan:
    """The global sample indices this worker reads this epoch, in order, computed on demand.

    What :func:`epoch_plan` returns: ``len(plan)``, ``plan[i]``, ``plan[a:b]`` (another plan, a
    view) and :meth:`take` (an array) cost O(what is asked) in time, and the plan holds O(shards)
    memory, whatever the epoch's size. ``np.asarray(plan)`` makes the whole array.
    """

    def __init__(self, seq: Any, skip: int, worker: int, num_workers: int, batch_size: int,
                 start: int = 0, stop: int | None = None) -> None:
        self._seq, self._skip, self._worker, self._workers, self._batch = seq, skip, worker, num_workers, batch_size
        rest = seq.length - skip
        rounds, extra = divmod(rest, batch_size * num_workers)
        mine = rounds * batch_size + min(max(extra - worker * batch_size, 0), batch_size)
        self._start, self._stop = start, mine if stop is None else stop

    def __len__(self) -> int:
        return self._stop - self._start

    def rank_positions(self, start: int, stop: int) -> NDArray[np.int64]:
        """Positions in the rank sequence of this plan's items ``[start, stop)``."""
        i = self._start + np.arange(start, stop, dtype=np.int64)
        chunk, offset = np.divmod(i, self._batch)
        return self._skip + (chunk * self._workers + self._worker) * self._batch + offset

    def take(self, start: int, stop: int) -> NDArray[np.int64]:
        """Items ``[start, stop)`` of the plan as an int64 array (clipped to its length)."""
        start, stop = max(0, min(start, len(self))), max(0, min(stop, len(self)))
        if stop <= start:
            return np.zeros(0, dtype=np.int64)
        return self._seq.at(self.rank_positions(start, stop))

    def __getitem__(self, item: int | slice) -> Any:
        if isinstance(item, slice):
            start, stop, step = item.indices(len(self))
            if step != 1:
                raise ValueError(f"an EpochPlan is sliced with step 1, got {step}")
            return EpochPlan(self._seq, self._skip, self._worker, self._workers, self._batch,
                             self._start + start, self._start + max(start, stop))
        i = check_int("index", item, -len(self), len(self))
        return int(self.take(i % len(self), i % len(self) + 1)[0])

    def __array__(self, dtype: Any = None, copy: Any = None) -> NDArray[Any]:
        out = self.take(0, len(self))
        return out if dtype is None else out.astype(dtype)


def epoch_plan(
    shard_sizes: Sequence[int] | NDArray[np.integer],
    world: World,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    partition: Partition,
    buffer_size: int,
    batch_size: int,
    skip: int = 0,
    take: int | Sequence[int] | None = None,
    sources: Sequence[int] | None = None,
    history: Sequence[tuple[int, int]] = (),
    window_shards: int | None = None,
    stable_nodes: tuple[int, int] | None = None,
) -> EpochPlan:
    """This worker's indices of one epoch in order 2, as an :class:`EpochPlan` (computed on demand).

    The same arguments and guarantees as :func:`plan` (the same rank spans, padding, dropping,
    subsets, mixtures, elastic history and worker split), with one stage changed: the shuffle.
    Order 2 permutes the rank sequence in consecutive windows of ``buffer_size`` positions (with
    ``window_shards``: of that many shards' worth of samples, at the mean shard size), each window
    by a keyed Feistel permutation of ``(seed, epoch, rank, window)``, instead of running a shuffle
    buffer; ``buffer_size`` at least a rank's count is one uniform permutation of the rank's
    samples. Every stage maps a position to a position, so item ``i`` costs O(log shards) without
    the items before it and a resume at ``skip`` generates nothing skipped. Memory: the shard order
    of the epoch's passes, O(shards). ``stable_nodes``: ``(ranks per node, epochs between
    dealings)``, each node keeps its shards across epochs (:mod:`.nodeshards`).
    """
    if not isinstance(world, World):
        raise TypeError(f"world must be a World, got {type(world).__name__}")
    sizes = as_shard_sizes(shard_sizes)
    epoch = check_int("epoch", epoch, 0, MAX_WORD)
    check_int("seed", seed, 0, MAX_SEED)
    buffer_size = check_int("buffer_size", buffer_size, 0)
    batch_size = check_int("batch_size", batch_size, 1)
    if window_shards is not None:
        window_shards = check_int("window", window_shards, 1)
    if world.worker >= world.num_workers:
        raise ValueError(f"worker must be in [0, num_workers), got worker={world.worker}, "
                         f"num_workers={world.num_workers}")
    passes = _Passes(split_sources(sizes, sources, take), seed, shuffle)

    def rank_sequence(rank: int, world_size: int) -> Any:
        return _rank_order2(passes, seed=seed, epoch=epoch, rank=rank, world_size=world_size, shuffle=shuffle,
                            partition=partition, buffer_size=buffer_size, window_shards=window_shards,
                            stable_nodes=stable_nodes)

    if history:
        seq = _Resharded(rank_sequence, history, world.rank, world.world_size, partition)
    else:
        seq = rank_sequence(world.rank, world.world_size)
    skip = check_int("skip", skip, 0)
    if skip > seq.length:
        raise ValueError(f"skip must be at most the {seq.length} samples of rank {world.rank} "
                         f"this epoch, got {skip}")
    return EpochPlan(seq, skip, world.worker, world.num_workers, batch_size)
