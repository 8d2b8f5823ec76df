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

import hashlib
import json
import multiprocessing.context
import os
import struct
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
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
    EpochCounts,
    Partition,
    epoch_counts,
    plan,
    rank_span,
    resharded_count,
)
from .readahead import ShardReadAhead
from .shm.locks import ProcessLock
from .shm.region import SharedRegion, SlotTable, int64_rows
from .world import World, detect_rank_and_world_size, detect_worker

__all__ = ["StreamingDataset", "StreamOptions", "STATE_VERSION", "ORDER_VERSION"]

#: Version of the dicts :meth:`StreamingDataset.state_dict` returns; others are refused.
STATE_VERSION = 1
#: Version of the reading order (partition.py's plan): a state saved under another is refused.
#: A state without the field predates it and is of order 1, as are states without the fields
#: added since (``subset``...), which then take their defaults.
ORDER_VERSION = 1
_LAYOUT_DEFAULTS: dict[str, Any] = {"order": 1, "subset": None, "mixture": None}

_MAX_SEED = 2**128
_MAX_EPOCH = 2**32
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
    """

    shuffle: bool = True
    seed: int = 0
    shuffle_buffer: int = 65536
    block_samples: int | None = 4096
    partition: Partition = "pad"
    batch_size: int = 1
    subset: float | int | None = None
    shuffle_shards: int | None = None

    def __post_init__(self) -> None:
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


# --------------------------------------------------------------------------------------------
# The epoch state shared with the workers.

# The epoch state shared with the workers: named header fields, then one row per iteration of a
# multi-worker loader in progress (a "group", see _EpochClock.begin).
_FIELDS = (
    "explicit",  # epoch given by set_epoch, -1 if none
    "next",  # epoch the next new iteration gets automatically
    "current",  # epoch of the iteration that started last (or was set or loaded last), -1: none
    "resume_epoch",  # pending resume: the epoch it applies to, -1 if none
    "resume_skip",  # pending resume: samples of the rank sequence to skip
    "ring",  # next group row to overwrite
    "current_skip",  # samples the iteration of epoch "current" skipped when it started (resumed)
)
_GROUP_FIELDS = ("key", "epoch", "members", "workers", "skip")
_GROUPS = 8
_CLOCK_SLOTS = len(_FIELDS) + _GROUPS * len(_GROUP_FIELDS)


class _EpochClock:
    """Epoch bookkeeping shared by a dataset and its copies in DataLoader workers.

    A :class:`~packer.datasets.shm.region.SlotTable` in shared memory and a
    :class:`~packer.datasets.shm.locks.ProcessLock`, both sent to spawn and forkserver workers as file
    descriptors and inherited under fork. A copy made any other way (``pickle``,
    ``copy.deepcopy``) gets its own clock, starting from the same values. The lock is held for
    microseconds and released by the kernel if its holder dies, so no wait can hang.
    """

    def __init__(self, values: list[int] | None = None) -> None:
        self._attach(SharedRegion(SlotTable.nbytes(_CLOCK_SLOTS), "packer-epoch-clock"),
                     ProcessLock("StreamingDataset"))
        if values is not None:
            self._all[:] = values
            return
        self._all[:] = -1
        for name in ("next", "ring", "resume_skip", "current_skip"):
            self._h[name] = 0

    def _attach(self, region: SharedRegion, lock: ProcessLock) -> None:
        self._region, self._lock = region, lock
        self._all = region.int64()
        self._h = SlotTable(_FIELDS, region)
        offset = SlotTable.nbytes(len(_FIELDS))
        self._groups = int64_rows(region, _GROUP_FIELDS, _GROUPS, offset)
        self._group_values = region.int64(offset)

    def __getstate__(self) -> dict[str, Any]:
        if multiprocessing.context.get_spawning_popen() is not None:
            return {"region": self._region, "lock": self._lock}
        with self._lock.hold():
            return {"values": self._all.tolist()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "values" in state:
            self.__init__(state["values"])  # type: ignore[misc]
            return
        self._attach(state["region"], state["lock"])

    def set_epoch(self, epoch: int) -> None:
        with self._lock.hold():
            self._h["explicit"] = epoch
            self._h["current"] = epoch
            self._h["current_skip"] = 0

    def current(self) -> tuple[int, int, bool]:
        """(epoch of the iteration in progress, or of the next one before any; the samples it
        skipped when it started; whether set_epoch is in use)."""
        with self._lock.hold():
            h = self._h
            explicit = h["explicit"] >= 0
            if h["current"] >= 0:
                return h["current"], h["current_skip"], explicit
            return h["explicit"] if explicit else h["next"], 0, explicit

    def load(self, epoch: int, skip: int, explicit: bool) -> None:
        """Make the next new iteration run ``epoch`` from position ``skip``."""
        with self._lock.hold():
            h = self._h
            h["next"] = h["current"] = h["resume_epoch"] = epoch
            h["current_skip"] = h["resume_skip"] = skip
            h["explicit"] = epoch if explicit else -1
            self._group_values[:] = -1
            h["ring"] = 0

    def restored(self, epoch: int, skip: int) -> None:
        """A worker resumed ``epoch`` from its own saved position: later iterations follow it."""
        with self._lock.hold():
            self._h["next"] = epoch + 1
            self._h["current"] = epoch
            self._h["current_skip"] = skip

    def begin(self, key: int | None, num_workers: int) -> tuple[int, int, int | None]:
        """Epoch and skip for an iteration starting in this process, and a stale resume's epoch.

        ``key`` identifies the DataLoader iteration among workers (``None``: a lone iteration,
        the main process or a single worker). The first worker with a key opens a group with a
        new epoch; the other ``num_workers - 1`` join it (the open group of the latest epoch).
        """
        with self._lock.hold():
            h, groups = self._h, self._groups
            if key is not None:
                open_rows = np.flatnonzero((groups["key"] == key)
                                           & (groups["workers"] == num_workers)
                                           & (groups["members"] < num_workers))
                if open_rows.size:
                    row = groups[int(open_rows[np.argmax(groups["epoch"][open_rows])])]
                    row["members"] += 1
                    return int(row["epoch"]), int(row["skip"]), None
            auto = h["next"]
            h["next"] = auto + 1
            epoch = h["explicit"] if h["explicit"] >= 0 else auto
            skip, stale = 0, None
            if h["resume_epoch"] >= 0:
                if h["resume_epoch"] == epoch:
                    skip = h["resume_skip"]
                else:
                    stale = h["resume_epoch"]
                h["resume_epoch"] = -1
                h["resume_skip"] = 0
            h["current"] = epoch
            h["current_skip"] = skip
            if key is not None:
                groups[h["ring"]] = (key, epoch, 1, num_workers, skip)
                h["ring"] = (h["ring"] + 1) % _GROUPS
            return epoch, skip, stale


def _iteration_key(base_seed: int, count: int) -> int:
    """A 63-bit key for (the DataLoader iterator's base seed, this worker's iteration count)."""
    digest = hashlib.blake2b(struct.pack("<QQ", base_seed % 2**64, count), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass
class _Position:
    """Where the iteration running in this process is: what ``state_dict()`` reports in a worker."""

    epoch: int
    skip: int  # rank-level samples skipped when the iteration started
    worker: int
    num_workers: int
    yielded: int  # of this worker's part of the epoch (after ``skip``)
    history: tuple[tuple[int, int], ...] = ()  # the epoch's changes of world size (elastic)


# --------------------------------------------------------------------------------------------


class StreamingDataset(IterableDataset):
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
                                     batch_size=batch_size, subset=subset)
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
        self._clock = _EpochClock()
        self._parent_world: tuple[int, int] | None = None
        self._position: _Position | None = None
        self._restore: dict[str, Any] | None = None
        self._elastic: tuple[int, list[tuple[int, int]]] | None = None
        self._iterations = (os.getpid(), 0)
        self._report_partition()

    def _open(self, paths: list[Any], mix: MixOptions | None, kwargs: dict[str, Any]) -> None:
        """Open the reader (or a mixture's readers) and size the partitioning blocks."""
        from .opening import open_dataset

        # Handles open lazily in the process that reads, so the readers pickle to workers.
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
        self._clock.set_epoch(check_int("epoch", epoch, 0, _MAX_EPOCH))

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
        indices = plan(self._sizes, world, seed=opts.seed, epoch=epoch, shuffle=opts.shuffle,
                       partition=opts.partition, buffer_size=opts.shuffle_buffer,
                       batch_size=opts.batch_size, skip=skip, **self._draws(),
                       history=self._history_of(epoch), window_shards=opts.shuffle_shards)
        if done > len(indices):
            raise ValueError(f"the state says this worker yielded {done} samples of epoch {epoch}, "
                             f"but it has only {len(indices)}")
        position = _Position(epoch, skip, world.worker, world.num_workers, done,
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
        return _iteration_key(info.seed - info.id, count)

    def _samples(self, indices: np.ndarray, position: _Position) -> Iterator[tuple[Any, Any]]:
        getitem = self.reader.__getitem__ if self._mix is None else self._mix.__getitem__
        ahead = None
        if (self._mix is None and self.prefetch_shards and self.reader.url is not None
                and hasattr(self.reader, "shard_paths")):
            ahead = ShardReadAhead(self.reader, indices, self.prefetch_shards)
        try:
            for start in range(0, len(indices), _CHUNK):
                for offset, index in enumerate(indices[start : start + _CHUNK].tolist()):
                    if ahead is not None:
                        ahead.at(start + offset)
                    sample = getitem(index)
                    position.yielded += 1
                    yield sample
        finally:
            if ahead is not None:
                ahead.close()

    # -- resume -------------------------------------------------------------------------------
    def _layout(self) -> dict[str, Any]:
        """What a state must agree on to resume here."""
        opts = self.options
        return {
            "dataset": (_fingerprint(self.reader) if self._mix is None
                        else self._mix.fingerprint(_fingerprint)),
            "num_samples": self.num_samples,
            "seed": opts.seed,
            "shuffle": opts.shuffle,
            "shuffle_buffer": opts.shuffle_buffer,
            "block_samples": opts.block_samples,
            "partition": opts.partition,
            "world_size": self._rank_world()[1],
            "subset": opts.subset,
            "mixture": None if self._mix is None else self._mix.takes,
            "order": ORDER_VERSION,
            **({"shuffle_shards": opts.shuffle_shards} if opts.shuffle_shards is not None else {}),
        }

    def state_dict(self, samples_consumed: int | None = None) -> dict[str, Any]:
        """A JSON-able snapshot of the reading position.

        Args:
            samples_consumed: samples the training loop has consumed on this rank since the
                current DataLoader iteration (epoch) began, e.g. ``(step + 1) * batch_size``
                (``len(ds)`` for a whole epoch). After a resume, count from the resumed start as
                usual: the samples skipped then are added here. The state then describes the
                rank: load it in a fresh process (on any rank) before creating the DataLoader
                iterator. Without it (torchdata's StatefulDataLoader, which calls this in each
                worker) the state is the position of the iteration running in this process.

        Returns:
            ``{"version", "epoch", "samples_consumed", "explicit_epoch", "rank", ...}``, where
            ``samples_consumed`` counts from the start of the epoch, plus the dataset fingerprint
            and the options the order depends on, checked on load.
        """
        state: dict[str, Any] = {"version": STATE_VERSION}
        if samples_consumed is None:
            position = self._position
            if position is None:
                raise TypeError(
                    "state_dict() needs samples_consumed (the samples this rank consumed this "
                    "epoch) unless an iteration runs in this process, as in a StatefulDataLoader "
                    "worker")
            epoch, explicit = position.epoch, self._clock.current()[2]
            state.update(epoch=epoch, samples_consumed=position.skip,
                         worker=position.worker, num_workers=position.num_workers,
                         yielded=position.yielded, batch_size=self.options.batch_size,
                         elastic=[list(step) for step in position.history])
        else:
            epoch, skipped, explicit = self._clock.current()
            history = self._history_of(epoch)
            per_rank = self._epoch_len(history)
            consumed = skipped + check_int("samples_consumed", samples_consumed, 0)
            if consumed > per_rank:
                raise ValueError(
                    f"samples_consumed must be at most the {per_rank - skipped} samples left of "
                    f"this epoch's {per_rank} on a rank when it started, got {samples_consumed}")
            if consumed == per_rank and per_rank > 0:
                epoch, consumed = epoch + 1, 0  # the epoch is done: resume at the next one
                if epoch >= _MAX_EPOCH:
                    raise ValueError(f"epoch {epoch} is out of range")
                history = ()
            state.update(epoch=epoch, samples_consumed=consumed,
                         elastic=[list(step) for step in history])
        state["explicit_epoch"] = explicit
        state["rank"] = self._rank_world()[0]
        state.update(self._layout())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration runs the saved epoch without the
        consumed samples (skipped by index, never read), later iterations the epochs after it.

        A state saved by the training loop (``state_dict(samples_consumed)``) resumes at another
        world size too (elastic): the samples of the saved epoch that no rank consumed yet are
        split over the ranks here (:func:`~packer.datasets.partition.resharded_sequence`), every
        rank reading the same count, and the next epochs are the usual ones of this world size.

        Raises ValueError when the state is of another version, dataset, seed or order option, a
        worker state (StatefulDataLoader) of another world size, or is not a state at all.
        """
        if not isinstance(state, dict):
            raise ValueError(f"a StreamingDataset state is a dict, got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unknown StreamingDataset state version {state.get('version')!r} "
                             f"(this version of packer reads version {STATE_VERSION})")
        mine = self._layout()
        state = {**_LAYOUT_DEFAULTS, **state}
        missing = [k for k in (*mine, "epoch", "samples_consumed") if k not in state]
        if missing:
            raise ValueError(f"StreamingDataset state lacks {', '.join(missing)}")
        elastic = "worker" not in state and state["world_size"] != mine["world_size"]
        diffs = [f"{k}: saved {state[k]!r}, here {v!r}" for k, v in mine.items()
                 if state[k] != v and not (elastic and k == "world_size")]
        if diffs:
            raise ValueError(f"cannot resume {self.root} from this state, it was saved with other "
                             f"settings ({'; '.join(diffs)})")
        try:
            history = _history(state.get("elastic", []))
            epoch = check_int("epoch", state["epoch"], 0, _MAX_EPOCH)
            saved_len = self._epoch_len(history, check_int("world_size", state["world_size"], 1))
            consumed = check_int("samples_consumed", state["samples_consumed"], 0, saved_len + 1)
        except TypeError as e:
            raise ValueError(f"invalid StreamingDataset state: {e}") from None
        if elastic and consumed:  # the rest of the epoch is split over this world's ranks
            history, consumed = [*history, (state["world_size"], consumed)], 0
        if history:
            self._epoch_len(history)  # refuses what cannot change world size (partition="exact")
        self._elastic = (epoch, history) if history else None
        if "worker" not in state:
            self._restore = None
            self._clock.load(epoch, consumed, bool(state.get("explicit_epoch", False)))
            return
        if state.get("batch_size") != self.options.batch_size:
            raise ValueError(f"cannot resume a worker state saved with batch_size "
                             f"{state.get('batch_size')!r} with batch_size "
                             f"{self.options.batch_size}")
        try:
            restore = {k: check_int(k, state[k], 0) for k in ("worker", "num_workers", "yielded")}
        except (KeyError, TypeError) as e:
            raise ValueError(f"invalid StreamingDataset worker state: {e}") from None
        restore.update(epoch=epoch, samples_consumed=consumed)
        self._restore = restore

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


def _fingerprint(reader: Any) -> str:
    """A short digest of the dataset's payload files (names, sample counts, checksums)."""
    files = [[f.name, f.samples, f.sha256] for f in reader.manifest.files]
    blob = json.dumps([reader.manifest.format, reader.manifest.num_samples, files]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _history(raw: Any) -> list[tuple[int, int]]:
    """The ``elastic`` field of a state: (world size, samples consumed) steps of one epoch."""
    if not isinstance(raw, list) or not all(isinstance(x, (list, tuple)) and len(x) == 2
                                            for x in raw):
        raise ValueError(f"invalid StreamingDataset state: elastic must be a list of "
                         f"[world_size, samples_consumed] pairs, got {raw!r}")
    return [(check_int("world_size", w, 1), check_int("samples_consumed", c, 1)) for w, c in raw]
