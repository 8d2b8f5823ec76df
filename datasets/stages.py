"""The streaming plan's stages as arrays: rank spans and counts, the shard order, the shuffle buffer
and the worker split, each a pure function of plain integers (order 1 of :mod:`.partition`, which
materialises every stage; order 2 reuses the counts, spans and checks from here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from packer.checks import check_int

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

MAX_SEED = 2**128  # the SeedSequence pool holds 128 bits of entropy
MAX_WORD = 2**32  # each spawn-key element must be one 32-bit word


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
    seed = check_int("seed", seed, 0, MAX_SEED)
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


def as_shard_sizes(shard_sizes: Sequence[int] | NDArray[np.integer]) -> NDArray[np.int64]:
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
    epoch = check_int("epoch", epoch, 0, MAX_WORD)
    source = check_int("source", source, 0, MAX_WORD)
    if not shuffle:
        check_int("seed", seed, 0, MAX_SEED)
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
    sizes = as_shard_sizes(shard_sizes)
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


def split_sources(sizes: NDArray[np.int64], sources: Sequence[int] | None,
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
    sizes = as_shard_sizes(shard_sizes)
    world_size = check_int("world_size", world_size, 1)
    rank = check_int("rank", rank, 0)
    epoch = check_int("epoch", epoch, 0, MAX_WORD)
    parts = split_sources(sizes, sources, take)
    count = sum(t for _, _, t in parts)
    start, per_rank = rank_span(count, world_size, rank, partition)
    if per_rank == 0:
        check_int("seed", seed, 0, MAX_SEED)
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
    epoch = check_int("epoch", epoch, 0, MAX_WORD)
    rank = check_int("rank", rank, 0, MAX_WORD)
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
        check_int("seed", seed, 0, MAX_SEED)
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
    check_int("seed", seed, 0, MAX_SEED)
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


def check_history(history: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
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
    steps = check_history(history)
    refuse_exact(partition)
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


def refuse_exact(partition: object) -> None:
    if _check_partition(partition) == "exact":
        raise ValueError("an epoch with partition='exact' cannot change world size: its ranks "
                         "read different counts")


def resharded_count(num_samples: int, history: Sequence[tuple[int, int]], world_size: int,
                    partition: Partition) -> int:
    """Samples per rank of an epoch of ``num_samples`` resumed after ``history`` (see
    :func:`resharded_sequence`) on ``world_size`` ranks; ``pad``/``drop`` only."""
    refuse_exact(partition)
    per_rank = epoch_counts(num_samples, check_history(history)[0][0], partition).per_rank
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
