"""``StreamingDataset``: one ``IterableDataset`` over every packed format, for DDP and workers.

It wraps the format's map-style reader and reads samples by global index in the order
:func:`packer.datasets.partition.plan` gives this DataLoader worker of this rank: every rank
reads the same number of samples, every sample once per epoch (plus the reported padding), in a
new order each epoch, and the DataLoader on a rank yields exactly that rank's sequence whatever
its ``num_workers``, so the progress of a rank is one number and resuming is cheap::

    ds = StreamingDataset("packed/", batch_size=64, seed=0)
    loader = DataLoader(ds, batch_size=64, num_workers=8, persistent_workers=True)
    for epoch in range(start_epoch, epochs):
        ds.set_epoch(epoch)                      # optional: epochs also advance on their own
        for step, (images, labels) in enumerate(loader):
            checkpoint["data"] = ds.state_dict(samples_consumed=(step + 1) * 64)
    ds.load_state_dict(checkpoint["data"])      # after a restart: skips what was consumed

Epochs, resume, torchdata's StatefulDataLoader and partitioning blocks: docs/datasets.md.
"""

from __future__ import annotations

import multiprocessing.context
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packer.checks import check_int
from packer.formats import shard_suffixes
from packer.storage.remote import is_url
from packer.storage.shardspec import resolve_paths
from packer.wording import plural

from .mixture import MixOptions, Mixture
from .partition import (
    LAZY_ORDER,
    ORDERS,
    EpochCounts,
    Partition,
    epoch_counts,
    epoch_plan,
    plan,
    rank_span,
    resharded_count,
)
from .readahead import ShardReadAhead
from .streamstate import (
    MAX_EPOCH,
    ORDER_VERSION,
    STATE_VERSION,
    EpochClock,
    Position,
    ResumableStream,
    iteration_key,
)
from .world import World, detect_rank_and_world_size, detect_worker

__all__ = ["StreamingDataset", "StreamOptions", "STATE_VERSION", "ORDER_VERSION"]

_MAX_SEED = 2**128
_CHUNK = 4096  # indices converted to Python ints at a time while iterating

# Padding/dropping is reported once per process and dataset layout.
_REPORTED: set[tuple[str, int, int, str]] = set()
_REPORTED_LOCK = threading.Lock()


@dataclass(frozen=True)
class StreamOptions:
    """What decides the order of samples (everything a saved state must agree on, plus batch size).

    Attributes:
        shuffle: shuffle the blocks and, through a shuffle buffer, the samples of each epoch.
        seed: the seed of every shuffle, ``0 <= seed < 2**128``; the same seed, epoch and world
            give the same order on every machine.
        shuffle_buffer: samples in the shuffle window (see
            :func:`~packer.datasets.partition.shuffle_buffer`); only indices are held, never
            samples, so a large window costs no memory, it only spreads reads further apart.
        block_samples: samples per partitioning block (files are cut into blocks; ``None``: whole
            files).
        shuffle_shards: shuffle the samples within windows of this many blocks instead of through
            the sample buffer (:func:`~packer.datasets.partition.window_shuffle`), so that a
            bounded download cache downloads each shard once per epoch; ``None``: the buffer.
        partition: ``"pad"`` repeats samples, ``"drop"`` leaves samples out, so every rank gets the
            same count; the amount is reported (``padded``/``dropped`` and a warning).
            ``"exact"`` (evaluation): every sample once, nothing repeated or left out; ranks read
            counts that differ by at most one, so gather per-rank sums rather than stepping in
            lockstep (a DDP training step would hang).
        batch_size: the DataLoader's batch size (the worker split is by batches of this size).
        subset: read only part of the dataset each epoch: a fraction in ``(0, 1]`` (a float) or
            a number of samples (an int); ``None``: all of it. Consecutive epochs continue one
            pass over the dataset (:func:`~packer.datasets.partition.stream_indices`), so
            ``subset=0.1`` reads every sample once in 10 epochs, a different part each epoch.
        stable_shards: None: the shards are dealt to the nodes anew each epoch; 0: each node
            (``node_ranks`` consecutive ranks) reads the same shards every epoch, in a new order
            (:mod:`~packer.datasets.nodeshards`), so a node cache that holds the node's share
            downloads nothing after the first epoch; N >= 1: dealt anew every N epochs.
        node_ranks: ranks per node for ``stable_shards`` (``LOCAL_WORLD_SIZE``).
        order: the version of the reading order. 2 (the default): the plan computed on demand
            (:func:`~packer.datasets.partition.epoch_plan`), O(shards) memory per worker; 1: the
            first order, every stage materialised; a state saved under order 1 resumes in it.
    """

    shuffle: bool = True
    seed: int = 0
    shuffle_buffer: int = 65536
    block_samples: int | None = 4096
    partition: Partition = "pad"
    batch_size: int = 1
    subset: float | int | None = None
    shuffle_shards: int | None = None
    order: int = LAZY_ORDER
    stable_shards: int | None = None
    node_ranks: int = 1

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.stable_shards is not None:
            object.__setattr__(self, "stable_shards", check_int("stable_shards", self.stable_shards, 0))
            if self.order != LAZY_ORDER:
                raise ValueError(f"stable_shards needs order {LAZY_ORDER}")
        object.__setattr__(self, "node_ranks", check_int("node_ranks", self.node_ranks, 1))
        if self.shuffle_shards is not None:
            object.__setattr__(self, "shuffle_shards", check_int("shuffle_shards", self.shuffle_shards, 1))
        if not isinstance(self.shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {self.shuffle!r}")
        object.__setattr__(self, "seed", check_int("seed", self.seed, 0, _MAX_SEED))
        object.__setattr__(self, "shuffle_buffer",
                           check_int("shuffle_buffer", self.shuffle_buffer, 0))
        if self.block_samples is not None:
            object.__setattr__(self, "block_samples",
                               check_int("block_samples", self.block_samples, 1))
        if self.partition not in ("pad", "drop", "exact"):
            raise ValueError(f"partition must be 'pad' or 'drop', got {self.partition!r} "
                             f"(or 'exact' for evaluation)")
        object.__setattr__(self, "batch_size", check_int("batch_size", self.batch_size, 1))
        if isinstance(self.subset, float):
            if not 0.0 < self.subset <= 1.0:
                raise ValueError(f"subset as a fraction must be in (0, 1], got {self.subset!r}")
        elif self.subset is not None:
            object.__setattr__(self, "subset", check_int("subset", self.subset, 1))

    def epoch_samples(self, num_samples: int) -> int:
        """Samples an epoch reads over all ranks, for a dataset of ``num_samples``."""
        if self.subset is None or num_samples == 0:
            return num_samples
        if isinstance(self.subset, float):
            return max(1, min(num_samples, round(self.subset * num_samples)))
        if self.subset > num_samples:
            raise ValueError(f"subset={self.subset} samples is more than the {num_samples} of "
                             f"the dataset")
        return self.subset


class StreamingDataset(ResumableStream, IterableDataset):
    """Iterable dataset over any packed format, partitioned over DDP ranks and DataLoader workers.

    Yields ``(image, label)`` as the format's map-style reader does (same ``output``,
    ``transform`` and ``target_transform``). ``len(ds)`` is the number of samples this rank reads
    per epoch, the same on every rank (except with ``partition="exact"``).

    Args:
        path: the packed dataset directory or URL; a list of them: a mixture (below). A list of
            shard files or a brace pattern (``data/shard-{000000..000009}.tar``) is one dataset
            of those shards, as for :func:`~packer.datasets.open_dataset`.
        shuffle, seed, shuffle_buffer, block_samples, partition, batch_size, subset: see
            :class:`StreamOptions` (stored as ``ds.options``). ``batch_size`` must equal the
            DataLoader's for the DataLoader to yield exactly the rank's sequence (needed by
            :meth:`state_dict`); any batch size still reads each sample once per epoch.
        transform, target_transform, output: as for the map-style readers.
        as_dict: yield each sample as a dict keyed by the reader's ``fields`` (``{"image": ...,
            "label": ...}``; a mixture's ``"source"`` included) instead of a tuple.
        world: rank and world size to use instead of detecting them (``torch.distributed`` when
            initialised, else ``RANK``/``WORLD_SIZE``, else a single process). Worker and number
            of workers come from the DataLoader inside a worker, and from ``world`` outside one.
        stable_shards: ``True``: each node keeps the same shards every epoch (shuffled inside its
            share; the node's ranks are ``LOCAL_WORLD_SIZE`` consecutive ranks), so a node cache
            that holds a node's share downloads nothing after epoch 1; an int N: the shards are
            dealt to the nodes anew every N epochs; ``False`` (the default): anew every epoch.
            One whole dataset only (not a mixture or a subset).
        prefetch_shards: for a dataset at a URL, how many shards of its plan each worker
            downloads ahead of the one it reads (0: none; a mixture reads without it).
        weights, epoch_samples, return_source, classes: how the datasets of a list are mixed,
            see :class:`~packer.datasets.mixture.MixOptions`; each source is read through its
            own shuffled passes (``source_takes`` samples of each per epoch).
        **reader_kwargs: passed to the map-style reader (``verify``, ``on_error``, and for a URL
            ``storage_options``, ``cache_dir``, ``cache_limit``).

    ``block_samples="auto"`` (the default) is 4096 for a local dataset and whole files (None) for
    a dataset at a URL, so that each node downloads only the shards its ranks read.
    ``shuffle_shards="auto"`` (the default) is None, except for a dataset at a URL read with a
    ``cache_limit``: then the window that fits half the limit for every rank of the node
    (``LOCAL_WORLD_SIZE``), so a cache smaller than the dataset still downloads each shard once
    per epoch.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 65536,
        block_samples: int | None | str = "auto",
        shuffle_shards: int | None | str = "auto",
        partition: Partition = "pad",
        batch_size: int = 1,
        subset: float | int | None = None,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        output: str = "tensor",
        world: World | None = None,
        prefetch_shards: int = 2,
        stable_shards: bool | int = False,
        weights: Sequence[float] | None = None,
        epoch_samples: int | None = None,
        return_source: bool = False,
        classes: str = "source",
        **reader_kwargs: Any,
    ) -> None:
        self.prefetch_shards = check_int("prefetch_shards", prefetch_shards, 0)
        listed = resolve_paths(path, shard_suffixes())
        if listed is not None and listed.files:  # the shards of one dataset, not a mixture
            path = list(listed.files)
        elif listed is not None:  # a pattern of dataset folders: a mixture, as their list is
            path = list(listed.datasets)
        single = isinstance(path, (str, os.PathLike)) or (listed is not None and bool(listed.files))
        paths = [path] if single else list(path)
        named = list(listed.files) if listed is not None and listed.files else paths  # each a path or URL
        if block_samples == "auto":  # remote data by whole shards: a node downloads only its own
            block_samples = None if any(is_url(p) for p in named) else 4096
        self.options = StreamOptions(shuffle=shuffle, seed=seed, shuffle_buffer=shuffle_buffer,
                                     block_samples=block_samples, partition=partition,
                                     batch_size=batch_size, subset=subset, **_stable_options(stable_shards))
        if self.options.stable_shards is not None and (not single or subset is not None):
            raise ValueError("stable_shards is for one whole dataset (not a mixture or a subset)")
        if world is not None and not isinstance(world, World):
            raise TypeError(f"world must be a packer.datasets.partition.World, got "
                            f"{type(world).__name__}")
        self.world = world
        mix = None
        if not single:
            mix = MixOptions(weights=weights, epoch_samples=epoch_samples,
                             return_source=return_source, classes=classes)
        elif (weights, epoch_samples, return_source, classes) != (None, None, False, "source"):
            raise ValueError("weights, epoch_samples, return_source and classes are for a "
                             "mixture: give a list of dataset paths")
        self._open(paths, mix, dict(transform=transform, target_transform=target_transform,
                                    output=output, **reader_kwargs))
        if shuffle_shards == "auto":
            shuffle_shards = self._auto_window(named, reader_kwargs.get("cache_limit"))
        self.options = replace(self.options, shuffle_shards=shuffle_shards)
        self._clock = EpochClock()
        self._parent_world: tuple[int, int] | None = None
        self._position: Position | None = None
        self._restore: dict[str, Any] | None = None
        self._elastic: tuple[int, list[tuple[int, int]]] | None = None
        self._iterations = (os.getpid(), 0)
        self._report_partition()

    def _open(self, paths: list[Any], mix: MixOptions | None, kwargs: dict[str, Any]) -> None:
        """Open the reader (or a mixture's readers) and size the partitioning blocks."""
        from .opening import open_dataset

        # Handles open lazily in the process that reads, so the readers pickle to workers.
        kwargs.setdefault("remote", "whole")  # a URL's shards whole, never a request per sample
        if mix is None:
            if "source" in (kwargs.get("fields") or ()):
                raise ValueError("the \"source\" field is a mixture's: give a list of paths")
            self.reader = open_dataset(paths[0], **kwargs)
            self._mix: Mixture | None = None
            self._sizes = _block_sizes(self.reader.shard_sizes, self.options.block_samples)
            self._take = self.options.epoch_samples(len(self.reader))
            return
        if not paths:
            raise ValueError("a mixture needs at least one path")
        if self.options.subset is not None:
            raise ValueError("subset is for one dataset; a mixture takes weights and "
                             "epoch_samples")
        target_transform = kwargs.pop("target_transform")
        transforms = kwargs.pop("transforms", None)  # over the mixture's samples, "source" and dicts included
        as_dict = bool(kwargs.pop("as_dict", False))
        fields = kwargs.pop("fields", None)
        if fields is not None:
            if isinstance(fields, str) or mix.return_source:
                raise ValueError("give fields as a sequence, with \"source\" where the source's index goes "
                                 "(return_source=True is the same as fields=(\"image\", \"label\", \"source\"))")
            kwargs["fields"] = tuple(f for f in fields if f != "source")
        readers = [open_dataset(p, target_transform=None, **kwargs) for p in paths]
        self.reader = readers[0]
        self._mix = Mixture(readers, mix, target_transform, fields, as_dict=as_dict, transforms=transforms)
        blocks = [_block_sizes(r.shard_sizes, self.options.block_samples) for r in readers]
        self._sources = [len(b) for b in blocks]
        self._sizes = np.concatenate(blocks)
        self._take = sum(self._mix.takes)

    def _auto_window(self, paths: list[Any], cache_limit: Any) -> int | None:
        """``shuffle_shards="auto"``: for one dataset at a URL with a cache limit, the shards that
        fit half the limit for each rank of this node (the other half: shards being read ahead)."""
        from packer.sizes import parse_size

        if self._mix is not None or cache_limit is None or not is_url(paths[0]) or self.options.block_samples:
            return None
        biggest = max((f.bytes for f in self.reader.manifest.files if f.samples), default=1)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        return max(1, parse_size(cache_limit) // max(1, biggest) // (2 * max(1, local)))

    # -- what is read -------------------------------------------------------------------------
    @property
    def root(self) -> str:
        """The packed dataset directory (of a mixture: the directories joined by " + ")."""
        return self.reader.root if self._mix is None else self._mix.root

    @property
    def classes(self) -> list[str]:
        """Class names in label order (of a mixture: see ``MixOptions.classes``)."""
        return self.reader.classes if self._mix is None else self._mix.classes

    @property
    def source_classes(self) -> list[list[str]]:
        """Each source's own class list (one list for a single dataset)."""
        return [r.classes for r in (self._mix.readers if self._mix else [self.reader])]

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label."""
        return {c: i for i, c in enumerate(self.classes)}

    @property
    def num_samples(self) -> int:
        """Samples in the dataset (all ranks together, without padding; all sources)."""
        return len(self.reader) if self._mix is None else sum(map(len, self._mix.readers))

    def remote_traffic(self) -> tuple[int, int] | None:
        """``(requests, bytes)`` this node has asked of the server for the dataset at a URL, over
        every process (ranks, DataLoader workers) and epoch; None for local data or a mixture."""
        return self.reader.remote_traffic() if self._mix is None else None

    @property
    def source_takes(self) -> list[int]:
        """Samples each source gives an epoch over all ranks (one number for a single dataset)."""
        return [self._take] if self._mix is None else list(self._mix.takes)

    @property
    def samples_per_epoch(self) -> int:
        """Samples an epoch reads over all ranks, before padding or dropping (``subset``)."""
        return self._take

    def _rank_world(self) -> tuple[int, int]:
        """(rank, world size): the ``world`` given, else the one the main process handed this
        spawned worker (it cannot see a process group set up by hand), else detected."""
        if self.world is not None:
            return self.world.rank, self.world.world_size
        if self._parent_world is not None and get_worker_info() is not None:
            return self._parent_world
        return detect_rank_and_world_size()

    def current_world(self) -> World:
        """Rank, world size, worker and number of workers of the calling process."""
        rank, size = self._rank_world()
        if get_worker_info() is not None:
            return World(rank, size, *detect_worker())
        if self.world is not None:
            return self.world
        return World(rank, size)

    def _counts(self) -> EpochCounts:
        return epoch_counts(self._take, self._rank_world()[1], self.options.partition)

    def __len__(self) -> int:
        rank, size = self._rank_world()
        return rank_span(self._take, size, rank, self.options.partition)[1]

    @property
    def padded(self) -> int:
        """Repeated samples per epoch over all ranks (``partition="pad"``)."""
        return self._counts().padded

    @property
    def dropped(self) -> int:
        """Samples no rank reads per epoch (``partition="drop"``)."""
        return self._counts().dropped

    def _report_partition(self) -> None:
        if get_worker_info() is not None:
            return  # reported by the main process, not once per worker
        size = self._rank_world()[1]
        counts = epoch_counts(self._take, size, self.options.partition)
        if not counts.padded and not counts.dropped and counts.per_rank:
            return
        key = (self.root, self._take, size, self.options.partition)
        with _REPORTED_LOCK:
            if key in _REPORTED:
                return
            _REPORTED.add(key)
        if counts.padded:
            msg = (f"{plural(self._take, 'sample')} do not divide over {size} ranks: each epoch "
                   f"repeats {plural(counts.padded, 'sample')} so every rank reads {counts.per_rank} "
                   f"(partition='pad'; 'drop' leaves them out instead)")
        elif counts.per_rank:
            msg = (f"{plural(self._take, 'sample')} do not divide over {size} ranks: each epoch "
                   f"leaves out {plural(counts.dropped, 'sample')} so every rank reads {counts.per_rank} "
                   f"(partition='drop'; 'pad' repeats samples instead)")
        else:
            msg = (f"every epoch is empty: {plural(self._take, 'sample')} over {size} ranks with "
                   f"partition={self.options.partition!r}")
        warnings.warn(f"{self.root}: {msg}", UserWarning, stacklevel=3)

    # -- epochs -------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the following iterations, in this process and in every worker
        (persistent ones too), until called again. Without it epochs advance on their own."""
        self._clock.set_epoch(check_int("epoch", epoch, 0, MAX_EPOCH))

    @property
    def epoch(self) -> int:
        """The epoch of the iteration in progress (or of the next one, before any)."""
        return self._clock.current()[0]

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        # Not a generator: the epoch is taken when the DataLoader creates the iterator (in each
        # worker at its start), even if the iteration is abandoned before its first sample.
        world = self.current_world()
        restore, self._restore = self._restore, None
        if restore is not None:
            if (restore["worker"], restore["num_workers"]) != (world.worker, world.num_workers):
                raise ValueError(
                    f"this state is worker {restore['worker']} of {restore['num_workers']}, but "
                    f"it is being resumed in worker {world.worker} of {world.num_workers}")
            epoch, skip, done = restore["epoch"], restore["samples_consumed"], restore["yielded"]
            self._clock.restored(epoch, skip)
        else:
            epoch, skip, stale = self._clock.begin(self._next_key(world), world.num_workers)
            done = 0
            if stale is not None:
                warnings.warn(f"{self.root}: a state of epoch {stale} was loaded but the next "
                              f"iteration runs epoch {epoch} (set_epoch); it starts from the "
                              f"beginning", UserWarning, stacklevel=2)
        opts = self.options
        make = epoch_plan if opts.order == LAZY_ORDER else partial(plan, order=opts.order)
        indices = make(self._sizes, world, seed=opts.seed, epoch=epoch, shuffle=opts.shuffle,
                       partition=opts.partition, buffer_size=opts.shuffle_buffer,
                       batch_size=opts.batch_size, skip=skip, **self._draws(),
                       history=self._history_of(epoch), window_shards=opts.shuffle_shards,
                       **({} if opts.stable_shards is None else {"stable_nodes": (opts.node_ranks, opts.stable_shards)}))
        if done > len(indices):
            raise ValueError(f"the state says this worker yielded {done} samples of epoch {epoch}, "
                             f"but it has only {len(indices)}")
        position = Position(epoch, skip, world.worker, world.num_workers, done,
                             self._history_of(epoch))
        self._position = position
        return self._samples(indices[done:], position)

    def _history_of(self, epoch: int) -> tuple[tuple[int, int], ...]:
        """The changes of world size of ``epoch`` (an elastic resume), else ()."""
        if self._elastic is None or self._elastic[0] != epoch:
            return ()
        return tuple(self._elastic[1])

    def _epoch_len(self, history: Sequence[tuple[int, int]], world_size: int | None = None) -> int:
        """Samples per rank of an epoch with ``history`` on ``world_size`` ranks (default: here)."""
        here = self._rank_world()[1]
        size = here if world_size is None else world_size
        if history:
            return resharded_count(self._take, history, size, self.options.partition)
        if size == here:
            return len(self)
        return epoch_counts(self._take, size, self.options.partition).per_rank

    def _draws(self) -> dict[str, Any]:
        """What plan draws per epoch beyond the whole dataset: a subset, a mixture's sources."""
        if self._mix is not None:
            return {"take": self._mix.takes, "sources": self._sources}
        return {"take": None if self.options.subset is None else self._take}

    def _next_key(self, world: World) -> int | None:
        pid, count = self._iterations
        if pid != os.getpid():
            count = 0
        self._iterations = (os.getpid(), count + 1)
        info = get_worker_info()
        if info is None or world.num_workers == 1:
            return None
        return iteration_key(info.seed - info.id, count)

    def _samples(self, indices: Any, position: Position) -> Iterator[tuple[Any, Any]]:
        getitem = self.reader.__getitem__ if self._mix is None else self._mix.__getitem__
        ahead = None
        if (self._mix is None and self.prefetch_shards and self.reader.url is not None
                and hasattr(self.reader, "shard_paths")):
            ahead = ShardReadAhead(self.reader, np.asarray(indices), self.prefetch_shards)
        try:
            for start in range(0, len(indices), _CHUNK):
                for offset, index in enumerate(np.asarray(indices[start : start + _CHUNK]).tolist()):
                    if ahead is not None:
                        ahead.at(start + offset)
                    sample = getitem(index)
                    position.yielded += 1
                    yield sample
        finally:
            if ahead is not None:
                ahead.close()

    # -- pickling and display -----------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_position"] = None
        if multiprocessing.context.get_spawning_popen() is not None and self.world is None:
            # A spawned worker cannot see a process group set up by hand: give it ours.
            state["_parent_world"] = self._rank_world()
        return state

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.root!r}, format={self.reader.format!r}, "
                f"samples={self.num_samples}, options={self.options})")


def _stable_options(stable_shards: bool | int) -> dict[str, Any]:
    """StreamOptions' ``stable_shards`` and ``node_ranks`` for the dataset's ``stable_shards``."""
    if stable_shards is False:
        return {}
    if stable_shards is not True and (not isinstance(stable_shards, int) or stable_shards < 1):
        raise ValueError(f"stable_shards must be True, False or a number of epochs >= 1, got {stable_shards!r}")
    return {"stable_shards": 0 if stable_shards is True else stable_shards,
            "node_ranks": int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)}


def _block_sizes(file_sizes: list[int], block: int | None) -> np.ndarray:
    """Partitioning units: each file's samples cut into blocks of ``block`` (the last shorter)."""
    sizes = np.asarray(file_sizes, dtype=np.int64)
    if block is None:
        return sizes
    out: list[int] = []
    for n in sizes.tolist():
        full, rest = divmod(n, block)
        out.extend([block] * full)
        if rest:
            out.append(rest)
    return np.asarray(out, dtype=np.int64)
