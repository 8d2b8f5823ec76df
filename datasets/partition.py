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
whatever its number of workers, so resuming is ``rank_seq[consumed:]``. Design notes:
docs/datasets.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from packer.checks import check_int

from .permutation import derive_key, mix64, permute
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

Partition = Literal["pad", "drop", "exact"]
"""How an epoch that does not divide evenly over ranks is evened out: repeat samples or drop them,
or, for evaluation, not at all (``exact``: every sample once, ranks may differ by one)."""

_PARTITIONS = ("pad", "drop", "exact")

#: The reading order :func:`epoch_plan` computes; :func:`plan` with ``order=1`` keeps the first
#: order (every stage materialised, the shuffle buffer) for runs that started under it.
LAZY_ORDER = 2
ORDERS = (1, LAZY_ORDER)

# Domain words of the spawn key: one random stream per purpose, never shared.
_DOMAIN_SHARD_ORDER = 0
_DOMAIN_SHUFFLE_BUFFER = 1

_MAX_SEED = 2**128  # the SeedSequence pool holds 128 bits of entropy
_MAX_WORD = 2**32  # each spawn-key element must be one 32-bit word


def _check_partition(partition: object) -> Partition:
    if partition not in _PARTITIONS:
        raise ValueError(f"partition must be 'pad' or 'drop', got {partition!r} "
                         f"(or 'exact' for evaluation)")
    return partition  # type: ignore[return-value]


def _rng(seed: int, *key: int) -> np.random.Generator:
    # SeedSequence(entropy=seed, spawn_key=(domain, epoch[, rank])): with a spawn_key numpy pads
    # the entropy to its full pool, so distinct (seed, epoch, rank) can never collide the way
    # SeedSequence([1, 2]) and SeedSequence([1, 2, 0]) do; the domain word keeps the shard-order
    # and shuffle-buffer streams apart. Hence 0 <= seed < 2**128 and 0 <= epoch < 2**32.
    seed = check_int("seed", seed, 0, _MAX_SEED)
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=key))


def _as_indices(name: str, values: ArrayLike) -> NDArray[np.int64]:
    """A 1-D int64 array from an integer sequence; TypeError/ValueError otherwise."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _as_shard_sizes(shard_sizes: Sequence[int] | NDArray[np.integer]) -> NDArray[np.int64]:
    sizes = _as_indices("shard_sizes", shard_sizes)
    if sizes.size and sizes.min() < 0:
        bad = int(np.flatnonzero(sizes < 0)[0])
        raise ValueError(f"shard_sizes must be >= 0, got {int(sizes[bad])} for shard {bad}")
    return sizes


class EpochCounts(NamedTuple):
    """How one epoch of ``num_samples`` spreads over the ranks (see :func:`epoch_counts`)."""

    per_rank: int
    """Samples every rank reads this epoch (the same on all ranks; for ``exact`` the most any
    rank reads, see :func:`rank_span`)."""
    padded: int
    """Repeated samples added over all ranks (``pad``), else 0."""
    dropped: int
    """Samples no rank reads this epoch (``drop``), else 0."""


def epoch_counts(num_samples: int, world_size: int, partition: Partition) -> EpochCounts:
    """Per-rank count and the padding or dropping that makes it equal on every rank.

    ``pad``: ``ceil(N / W)`` per rank; the ``padded`` extra samples are repeats taken by wrapping
    around to the start of the epoch's sequence (possibly several times when ``N < W``: with
    ``N = 1, W = 8`` every rank reads that one sample). ``drop``: ``floor(N / W)`` per rank and
    ``dropped`` samples are left out; with ``N < W`` that is 0 per rank, an empty epoch, which is
    allowed (the caller should report it). An empty dataset gives 0 with either policy.
    ``exact``: nothing padded or dropped; ranks read ``floor(N / W)`` or one more, and
    ``per_rank`` is the larger.
    """
    n = check_int("num_samples", num_samples, 0)
    w = check_int("world_size", world_size, 1)
    if _check_partition(partition) == "exact":
        return EpochCounts(per_rank=-(-n // w), padded=0, dropped=0)
    if partition == "pad":
        per_rank = -(-n // w)
        return EpochCounts(per_rank=per_rank, padded=per_rank * w - n, dropped=0)
    per_rank = n // w
    return EpochCounts(per_rank=per_rank, padded=0, dropped=n - per_rank * w)


def rank_span(num_samples: int, world_size: int, rank: int, partition: Partition) -> tuple[int, int]:
    """``(start, count)``: the positions ``[start, start + count)`` of an epoch's sequence of
    ``num_samples`` that ``rank`` reads (for ``pad`` they may run past the end and wrap around).

    ``pad``/``drop``: ``count`` is :func:`epoch_counts`'s ``per_rank`` and ``start = rank *
    count``. ``exact``: the first ``N % W`` ranks read ``floor(N / W) + 1``, the others
    ``floor(N / W)``, in consecutive slices, so the ranks read every position exactly once.
    """
    n = check_int("num_samples", num_samples, 0)
    w = check_int("world_size", world_size, 1)
    rank = check_int("rank", rank, 0)
    if rank >= w:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={w}")
    if _check_partition(partition) == "exact":
        base, extra = divmod(n, w)
        return rank * base + min(rank, extra), base + (rank < extra)
    per_rank = epoch_counts(n, w, partition).per_rank
    return rank * per_rank, per_rank


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool,
                source: int = 0) -> NDArray[np.int64]:
    """The order in which the shards are concatenated this epoch.

    A permutation of ``range(num_shards)`` that depends only on ``(seed, epoch)``, so every rank
    and worker computes the same one without communicating; the identity when ``shuffle`` is false.
    Each source of a mixture other than the first (``source > 0``) has its own random stream.
    """
    num_shards = check_int("num_shards", num_shards, 0)
    epoch = check_int("epoch", epoch, 0, _MAX_WORD)
    source = check_int("source", source, 0, _MAX_WORD)
    if not shuffle:
        check_int("seed", seed, 0, _MAX_SEED)
        return np.arange(num_shards, dtype=np.int64)
    key = (_DOMAIN_SHARD_ORDER, epoch) if source == 0 else (_DOMAIN_SHARD_ORDER, epoch, source)
    rng = _rng(seed, *key)
    return rng.permutation(num_shards).astype(np.int64, copy=False)


def stream_indices(
    shard_sizes: Sequence[int] | NDArray[np.integer],
    positions: ArrayLike,
    *,
    seed: int,
    shuffle: bool = True,
    source: int = 0,
) -> NDArray[np.int64]:
    """Global indices at ``positions`` of the dataset's endless stream of passes.

    Pass ``p`` is every sample once: the shards concatenated in :func:`shard_order` of
    ``(seed, p)``. The stream is pass 0, then pass 1, ...; position ``q`` is sample ``q % N`` of
    pass ``q // N``. Epoch ``e`` of the whole dataset is positions ``[e * N, (e + 1) * N)``, a
    subset of ``M`` samples per epoch is ``[e * M, (e + 1) * M)``: consecutive epochs continue
    the same pass, so no sample repeats before the pass is over and ``ceil(N / M)`` epochs read
    every sample. A source of a mixture draws its epochs from its own stream the same way
    (``source`` selects its shard orders). Cost: O(n log S) per pass touched.
    """
    sizes = _as_shard_sizes(shard_sizes)
    pos = _as_indices("positions", positions)
    total = int(sizes.sum())
    if pos.size == 0:
        return np.zeros(0, dtype=np.int64)
    if total == 0:
        raise ValueError(f"an empty dataset has no stream positions, asked for {pos.size}")
    if pos.min() < 0:
        raise ValueError(f"positions must be >= 0, got {int(pos.min())}")
    passes, within = np.divmod(pos, total)
    first, last = int(passes.min()), int(passes.max())
    if first == last:  # usually a single pass
        return _pass_indices(sizes, within, seed, first, shuffle, source)
    out = np.empty(len(pos), dtype=np.int64)
    for p in range(first, last + 1):
        mask = passes == p
        if mask.any():
            out[mask] = _pass_indices(sizes, within[mask], seed, p, shuffle, source)
    return out


def _pass_indices(sizes: NDArray[np.int64], at: NDArray[np.int64], seed: int, pass_: int,
                  shuffle: bool, source: int) -> NDArray[np.int64]:
    """Global indices at positions ``at`` (each ``< N``) of pass ``pass_``."""
    order = shard_order(len(sizes), seed, pass_, shuffle, source)
    stored_starts = np.cumsum(sizes) - sizes  # global index of each shard's first sample
    ordered_sizes = sizes[order]
    ordered_ends = np.cumsum(ordered_sizes)  # end position of each shard in the pass
    ordered_starts = ordered_ends - ordered_sizes
    # Which shard (in pass order) holds each position; side="right" steps over empty shards.
    slot = np.searchsorted(ordered_ends, at, side="right")
    return stored_starts[order[slot]] + (at - ordered_starts[slot])


def interleave(takes: Sequence[int]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """How an epoch that draws ``takes[s]`` samples from each source ``s`` mixes them.

    Returns ``(source, draw)`` for each position of the epoch's sequence (``sum(takes)`` long):
    the source, and which of that source's draws this epoch it is (0, 1, ... in order). The
    sources are spread evenly (draw ``j`` of source ``s`` sits at ``(j + 0.5) / takes[s]`` of
    the way, ties by source), so every slice of the sequence, hence every rank, holds each
    source in proportion, within one sample per source.
    """
    counts = [check_int("take", t, 0) for t in takes]
    source = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    draw = np.concatenate([np.arange(c, dtype=np.int64) for c in counts] or
                          [np.zeros(0, np.int64)])
    if len(counts) == 1:
        return source, draw
    where = (draw + 0.5) / np.repeat(np.maximum(counts, 1), counts)
    order = np.lexsort((source, where))
    return source[order], draw[order]


def _split_sources(sizes: NDArray[np.int64], sources: Sequence[int] | None,
                   take: int | Sequence[int] | None) -> list[tuple[NDArray[np.int64], int, int]]:
    """``(shard sizes, first global index, samples drawn per epoch)`` of each source."""
    counts = [len(sizes)] if sources is None else [check_int("sources", n, 0) for n in sources]
    if sum(counts) != len(sizes):
        raise ValueError(f"sources must split the {len(sizes)} shards, got {list(counts)}")
    ends = np.cumsum(counts)
    parts = [sizes[end - n : end] for n, end in zip(counts, ends.tolist())]
    totals = [int(p.sum()) for p in parts]
    if take is None:
        takes = totals
    elif isinstance(take, (Sequence, np.ndarray)):
        takes = [check_int("take", t, 0) for t in take]
    else:
        takes = [check_int("take", take, 0)]
    if len(takes) != len(parts):
        raise ValueError(f"take must give one count per source ({len(parts)}), got {len(takes)}")
    for s, (t, n) in enumerate(zip(takes, totals)):
        if t and not n:
            raise ValueError(f"source {s} is empty but {t} samples of it are asked for")
    firsts = np.cumsum([0, *totals[:-1]]).tolist()
    return list(zip(parts, firsts, takes))


def rank_indices(
    shard_sizes: Sequence[int] | NDArray[np.integer],
    *,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    shuffle: bool = True,
    partition: Partition = "pad",
    take: int | Sequence[int] | None = None,
    sources: Sequence[int] | None = None,
) -> NDArray[np.int64]:
    """Global sample indices that ``rank`` reads this epoch, in reading order (before shuffling).

    The epoch's sequence is ``M`` positions of :func:`stream_indices`, ``[e * M, (e + 1) * M)``
    for epoch ``e``, where ``M = take`` (a subset) or, by default, all ``N`` samples: then it is
    the shards concatenated in :func:`shard_order` of ``(seed, e)`` (each shard in stored order, so
    a rank reads whole runs of a shard). With ``n = epoch_counts(M, world_size,
    partition).per_rank``, rank ``r`` takes positions ``[r * n, (r + 1) * n)`` of that sequence;
    for ``pad`` the positions past the end wrap around to its start (the fewest repeats that even
    the ranks out), for ``drop`` the last ``M - n * world_size`` are read by nobody, for ``exact``
    the ranks read consecutive slices of ``floor(M / W)`` or one more (:func:`rank_span`). A
    contiguous slice keeps each rank on few shards. Cost: O(n log S) for ``n`` samples per rank
    and ``S`` shards.

    A mixture: ``sources`` gives the number of shards of each source (the shards are the
    sources' shards one source after the other, global indices likewise), ``take`` the samples
    drawn from each source per epoch. The epoch's sequence is the sources' draws spread evenly
    (:func:`interleave`); draw ``j`` of source ``s`` in epoch ``e`` is position ``e * take[s] +
    j`` of that source's :func:`stream_indices`, so a source repeats no sample before its pass
    is over, and a source drawn more than its size repeats only then.
    """
    sizes = _as_shard_sizes(shard_sizes)
    world_size = check_int("world_size", world_size, 1)
    rank = check_int("rank", rank, 0)
    epoch = check_int("epoch", epoch, 0, _MAX_WORD)
    parts = _split_sources(sizes, sources, take)
    count = sum(t for _, _, t in parts)
    start, per_rank = rank_span(count, world_size, rank, partition)
    if per_rank == 0:
        check_int("seed", seed, 0, _MAX_SEED)
        return np.zeros(0, dtype=np.int64)
    positions = (start + np.arange(per_rank, dtype=np.int64)) % count
    if take is None and len(parts) == 1:  # the whole dataset: this epoch is pass ``epoch``
        return _pass_indices(sizes, positions, seed, epoch, shuffle, 0)
    if len(parts) == 1:
        return stream_indices(sizes, epoch * count + positions, seed=seed, shuffle=shuffle)
    source, draw = interleave([t for _, _, t in parts])
    source, draw = source[positions], draw[positions]
    out = np.empty(per_rank, dtype=np.int64)
    for s, (part, first, t) in enumerate(parts):
        mask = source == s
        out[mask] = first + stream_indices(part, epoch * t + draw[mask], seed=seed,
                                           shuffle=shuffle, source=s)
    return out


def _buffer_draws(
    num_indices: int, buffer_size: int, *, seed: int, epoch: int, rank: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The random choices of :func:`shuffle_buffer`: a slot per step, then the drain order.

    Separate so that tests can replay them through a plain loop and compare.
    """
    epoch = check_int("epoch", epoch, 0, _MAX_WORD)
    rank = check_int("rank", rank, 0, _MAX_WORD)
    rng = _rng(seed, _DOMAIN_SHUFFLE_BUFFER, epoch, rank)
    size = min(buffer_size, num_indices)
    slots = rng.integers(0, size, size=num_indices - size, dtype=np.int64)
    drain = rng.permutation(size).astype(np.int64, copy=False)
    return slots, drain


def shuffle_buffer(
    indices: ArrayLike, *, buffer_size: int, seed: int, epoch: int, rank: int
) -> NDArray[np.int64]:
    """``indices`` in the order a streaming shuffle buffer of ``buffer_size`` would emit them.

    The buffer is filled with the first ``buffer_size`` items; then for each further item a
    uniformly random slot is emitted and the item takes its place; at the end the buffer is drained
    in random order. The result is a permutation of ``indices``, deterministic in
    ``(seed, epoch, rank)``, that moves no item more than ``buffer_size - 1`` places earlier (later
    is unbounded), and that a reader walking ``indices`` in order can produce while holding only
    ``buffer_size`` samples. With ``buffer_size >= len(indices)`` it is a uniform permutation;
    ``buffer_size <= 1`` returns the indices unchanged.

    Computed without a per-item Python loop: the item emitted at step ``t`` from slot ``j`` is the
    one put there at the last earlier step that drew ``j`` (or the ``j``-th initial item), found by
    a stable sort of the draws: O(n) (a radix sort) when ``buffer_size <= 65536``, else a merge
    sort; timings in docs/benchmarks.md.
    """
    items = _as_indices("indices", indices)
    buffer_size = check_int("buffer_size", buffer_size, 0)
    n = len(items)
    if buffer_size <= 1 or n <= 1:
        check_int("seed", seed, 0, _MAX_SEED)
        return items.copy()
    size = min(buffer_size, n)
    steps = n - size
    slots, drain = _buffer_draws(n, buffer_size, seed=seed, epoch=epoch, rank=rank)
    # Group the steps by slot, in step order within a slot (radix sort for small key types).
    key = slots.astype(np.uint16) if size <= 2**16 else slots
    by_slot = np.argsort(key, kind="stable")
    sorted_slots = slots[by_slot]
    first_in_slot = np.ones(steps, dtype=bool)
    first_in_slot[1:] = sorted_slots[1:] != sorted_slots[:-1]
    # Item emitted at each step: the initial content of the slot for its first draw, otherwise
    # the item that entered (index size + previous step) at the slot's previous draw.
    source = np.empty(steps, dtype=np.int64)
    source[by_slot[first_in_slot]] = sorted_slots[first_in_slot]
    later = ~first_in_slot
    source[by_slot[later]] = size + by_slot[np.flatnonzero(later) - 1]
    # What remains in each slot after the last step: its last entrant, or its initial item.
    remaining = np.arange(size, dtype=np.int64)
    last_in_slot = np.ones(steps, dtype=bool)
    last_in_slot[:-1] = sorted_slots[:-1] != sorted_slots[1:]
    remaining[sorted_slots[last_in_slot]] = size + by_slot[last_in_slot]
    return items[np.concatenate([source, remaining[drain]])]


def window_shuffle(
    indices: ArrayLike, shard_sizes: Sequence[int] | NDArray[np.integer], *, window: int, seed: int, epoch: int,
    rank: int,
) -> NDArray[np.int64]:
    """``indices`` shuffled within windows of ``window`` shards: the shards in the order
    ``indices`` first reach them are cut into groups of ``window``, and the samples of each group
    are permuted uniformly (deterministic in ``(seed, epoch, rank)``); every sample of a group
    comes before any of the next. A reader therefore needs only one group's shards (and the next
    one's, read ahead) at a time: what a bounded download cache holds, so each shard is
    downloaded once per epoch (a sample buffer lets stragglers reach back to shards long evicted).
    """
    items = _as_indices("indices", indices)
    window = check_int("window", window, 1)
    check_int("seed", seed, 0, _MAX_SEED)
    if len(items) <= 1:
        return items.copy()
    firsts = np.cumsum(np.asarray(shard_sizes, dtype=np.int64))
    shard = np.searchsorted(firsts, items, side="right")
    starts = np.ones(len(items), dtype=bool)
    starts[1:] = shard[1:] != shard[:-1]
    group = (np.cumsum(starts) - 1) // window
    rng = np.random.default_rng([seed, epoch, rank, 0x57A2D])
    order = np.lexsort((rng.random(len(items)), group))
    return items[order]


def worker_indices(
    rank_seq: ArrayLike, *, worker: int, num_workers: int, batch_size: int
) -> NDArray[np.int64]:
    """The part of the rank sequence that DataLoader worker ``worker`` of ``num_workers`` yields.

    The rank sequence is cut into chunks of ``batch_size``; worker ``w`` takes chunks ``w``,
    ``w + K``, ``w + 2K``, ... (``K = num_workers``), concatenated. Why: a DataLoader over an
    ``IterableDataset`` has each worker batch its own stream and takes one batch from each worker
    in turn (0, 1, ..., K-1, 0, ...), skipping workers that have finished. With this split
    worker ``w``'s ``i``-th batch is exactly chunk ``i*K + w`` (only the very last chunk can be
    short, and it is the last batch of its worker), and the workers that still have chunks are
    always the first ones, so the DataLoader yields exactly ``rank_seq`` in order whatever ``K``.
    Hence "samples consumed on this rank" is one number, and resuming is ``rank_seq[consumed:]``
    split again, with any number of workers. Use the DataLoader's ``batch_size`` (and
    ``drop_last=False``); ``batch_size=1`` interleaves single samples.
    """
    seq = _as_indices("rank_seq", rank_seq)
    batch_size = check_int("batch_size", batch_size, 1)
    num_workers = check_int("num_workers", num_workers, 1)
    worker = check_int("worker", worker, 0)
    if worker >= num_workers:
        raise ValueError(f"worker must be in [0, num_workers), got worker={worker}, "
                         f"num_workers={num_workers}")
    if num_workers == 1:
        return seq.copy()
    chunk = np.arange(len(seq), dtype=np.int64) // batch_size
    return seq[chunk % num_workers == worker]


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
    """
    if order == LAZY_ORDER:
        return np.asarray(epoch_plan(shard_sizes, world, seed=seed, epoch=epoch, shuffle=shuffle,
                                     partition=partition, buffer_size=buffer_size, batch_size=batch_size,
                                     skip=skip, take=take, sources=sources, history=history,
                                     window_shards=window_shards))
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


def _check_history(history: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    steps = []
    for step in history:
        if len(step) != 2:
            raise ValueError(f"history steps are (world_size, samples_consumed), got {step!r}")
        steps.append((check_int("world_size", step[0], 1),
                      check_int("samples_consumed", step[1], 1)))
    if not steps:
        raise ValueError("history must hold at least one (world_size, samples_consumed) step")
    return steps


def _rank_slice(rest: NDArray[np.int64], world_size: int, rank: int,
                partition: Partition) -> NDArray[np.int64]:
    start, count = rank_span(len(rest), world_size, rank, partition)
    if count == 0:
        return rest[:0]
    return rest[(start + np.arange(count, dtype=np.int64)) % len(rest)]


def resharded_sequence(
    rank_sequence: Callable[[int, int], NDArray[np.int64]],
    history: Sequence[tuple[int, int]],
    rank: int,
    world_size: int,
    partition: Partition,
) -> NDArray[np.int64]:
    """The rank sequence of an epoch resumed after its world size changed (elastic resume).

    ``history`` is ``[(W0, c0), (W1, c1), ...]``: the epoch started on ``W0`` ranks, whose
    sequences are ``rank_sequence(r, W0)``, and stopped after every rank consumed ``c0`` samples
    (DDP keeps ranks in step); the rest, the ranks' remaining samples one rank after the other, was
    then split over ``W1`` ranks in consecutive slices (:func:`rank_span`, so ``pad`` repeats and
    ``drop`` leaves out the few that even the ranks out), of which each consumed ``c1``; and so on.
    Returns this ``rank``'s slice of what is left for ``world_size`` ranks. What survives a change:
    the epoch and which samples it still owes, and their shuffled order; the split over ranks is
    new. The next epochs are the ordinary ones of the new world size. Cost: the whole epoch's
    plan (every rank of ``W0``), once per resume.
    """
    steps = _check_history(history)
    _refuse_exact(partition)
    seqs = [rank_sequence(r, steps[0][0]) for r in range(steps[0][0])]
    following = [size for size, _ in steps[1:]]
    for i, (_, consumed) in enumerate(steps):
        if consumed > len(seqs[0]):
            raise ValueError(f"history step {i} consumed {consumed} samples of a rank's "
                             f"{len(seqs[0])}")
        rest = np.concatenate([seq[consumed:] for seq in seqs])
        if i < len(following):
            seqs = [_rank_slice(rest, following[i], r, partition) for r in range(following[i])]
    return _rank_slice(rest, world_size, rank, partition)


def _refuse_exact(partition: object) -> None:
    if _check_partition(partition) == "exact":
        raise ValueError("an epoch with partition='exact' cannot change world size: its ranks "
                         "read different counts")


def resharded_count(num_samples: int, history: Sequence[tuple[int, int]], world_size: int,
                    partition: Partition) -> int:
    """Samples per rank of an epoch of ``num_samples`` resumed after ``history`` (see
    :func:`resharded_sequence`) on ``world_size`` ranks; ``pad``/``drop`` only."""
    _refuse_exact(partition)
    per_rank = epoch_counts(num_samples, _check_history(history)[0][0], partition).per_rank
    for i, (size, consumed) in enumerate(history):
        if consumed > per_rank:
            raise ValueError(f"history step {i} consumed {consumed} samples of a rank's "
                             f"{per_rank}")
        following = history[i + 1][0] if i + 1 < len(history) else world_size
        per_rank = epoch_counts(size * (per_rank - consumed), following, partition).per_rank
    return per_rank


def reading_runs(indices: ArrayLike) -> NDArray[np.int64]:
    """Maximal runs of consecutive ascending indices, as rows ``(start, stop)``, half-open.

    ``[5, 6, 7, 2, 3, 9]`` gives ``[[5, 8], [2, 4], [9, 10]]``: a reader can fetch each run with
    one contiguous read. Concatenating ``range(start, stop)`` over the rows gives back ``indices``.
    An array, not a list of tuples: a shuffled epoch of 1.3M samples is about 1.3M runs.
    """
    seq = _as_indices("indices", indices)
    if seq.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    breaks = np.flatnonzero(np.diff(seq) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(seq)]])
    return np.stack([seq[starts], seq[stops - 1] + 1], axis=1).astype(np.int64, copy=False)



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
                 partition: Partition, buffer_size: int, window_shards: int | None) -> _RankOrder | _Windowed:
    """Order 2's rank sequence of ``rank`` of ``world_size``: :class:`_RankOrder`, shuffled in
    windows of ``buffer_size`` positions, or with ``window_shards`` in windows of that many mean
    shards' samples."""
    base = _RankOrder(passes, epoch, rank, world_size, partition)
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


class _Resharded:
    """Order 2's rank sequence of an epoch resumed after changes of world size: the map of
    :func:`resharded_sequence` from a position here back to (old rank, position) of the first
    world size, evaluated per position."""

    def __init__(self, make: Callable[[int, int], Any], history: Sequence[tuple[int, int]], rank: int,
                 world_size: int, partition: Partition) -> None:
        steps = _check_history(history)
        _refuse_exact(partition)
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
    of the epoch's passes, O(shards).
    """
    if not isinstance(world, World):
        raise TypeError(f"world must be a World, got {type(world).__name__}")
    sizes = _as_shard_sizes(shard_sizes)
    epoch = check_int("epoch", epoch, 0, _MAX_WORD)
    check_int("seed", seed, 0, _MAX_SEED)
    buffer_size = check_int("buffer_size", buffer_size, 0)
    batch_size = check_int("batch_size", batch_size, 1)
    if window_shards is not None:
        window_shards = check_int("window", window_shards, 1)
    if world.worker >= world.num_workers:
        raise ValueError(f"worker must be in [0, num_workers), got worker={world.worker}, "
                         f"num_workers={world.num_workers}")
    passes = _Passes(_split_sources(sizes, sources, take), seed, shuffle)

    def rank_sequence(rank: int, world_size: int) -> Any:
        return _rank_order2(passes, seed=seed, epoch=epoch, rank=rank, world_size=world_size, shuffle=shuffle,
                            partition=partition, buffer_size=buffer_size, window_shards=window_shards)

    if history:
        seq = _Resharded(rank_sequence, history, world.rank, world.world_size, partition)
    else:
        seq = rank_sequence(world.rank, world.world_size)
    skip = check_int("skip", skip, 0)
    if skip > seq.length:
        raise ValueError(f"skip must be at most the {seq.length} samples of rank {world.rank} "
                         f"this epoch, got {skip}")
    return EpochPlan(seq, skip, world.worker, world.num_workers, batch_size)
