"""What ``StreamingDataset`` shares with its workers and saves to resume: the epoch clock (in
shared memory), the position of the iteration in a process, and ``state_dict`` /
``load_state_dict``, mixed into :class:`~packer.datasets.streaming.StreamingDataset`. The
state's fields and versions: docs/datasets.md ("StreamingDataset")."""

from __future__ import annotations

import hashlib
import json
import multiprocessing.context
import struct
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from packer.checks import check_int

from .partition import LAZY_ORDER, ORDERS
from .shm.locks import ProcessLock
from .shm.region import SharedRegion, SlotTable, int64_rows

__all__ = ["STATE_VERSION", "ORDER_VERSION", "MAX_EPOCH", "EpochClock", "Position", "iteration_key",
           "ResumableStream"]

#: Version of the dicts :meth:`StreamingDataset.state_dict` returns; others are refused.
STATE_VERSION = 1
#: Version of the reading order of new runs (partition.py's plan). A state of order 1 resumes in
#: order 1 (and the run goes on in it); other orders are refused. A state without the field
#: predates it and is of order 1, as are states without the fields added since (``subset``...),
#: which then take their defaults.
ORDER_VERSION = LAZY_ORDER
_LAYOUT_DEFAULTS: dict[str, Any] = {"order": 1, "subset": None, "mixture": None}

#: Epochs are below this.
MAX_EPOCH = 2**32


# The epoch state shared with the workers: named header fields, then one row per iteration of a
# multi-worker loader in progress (a "group", see EpochClock.begin).
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


class EpochClock:
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


def iteration_key(base_seed: int, count: int) -> int:
    """A 63-bit key for (the DataLoader iterator's base seed, this worker's iteration count)."""
    digest = hashlib.blake2b(struct.pack("<QQ", base_seed % 2**64, count), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass
class Position:
    """Where the iteration running in this process is: what ``state_dict()`` reports in a worker."""

    epoch: int
    skip: int  # rank-level samples skipped when the iteration started
    worker: int
    num_workers: int
    yielded: int  # of this worker's part of the epoch (after ``skip``)
    history: tuple[tuple[int, int], ...] = ()  # the epoch's changes of world size (elastic)


class ResumableStream:
    """The resume part of :class:`~packer.datasets.streaming.StreamingDataset` (its attributes are
    set by the dataset's constructor)."""

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
            "order": opts.order,
            **({"shuffle_shards": opts.shuffle_shards} if opts.shuffle_shards is not None else {}),
            **({"stable_shards": [opts.stable_shards, opts.node_ranks]} if opts.stable_shards is not None else {}),
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
                if epoch >= MAX_EPOCH:
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
        state = {**_LAYOUT_DEFAULTS, **state}
        order = state["order"] if state["order"] in ORDERS else self.options.order  # resume in its order
        mine = {**self._layout(), "order": order}
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
            epoch = check_int("epoch", state["epoch"], 0, MAX_EPOCH)
            saved_len = self._epoch_len(history, check_int("world_size", state["world_size"], 1))
            consumed = check_int("samples_consumed", state["samples_consumed"], 0, saved_len + 1)
        except TypeError as e:
            raise ValueError(f"invalid StreamingDataset state: {e}") from None
        if elastic and consumed:  # the rest of the epoch is split over this world's ranks
            history, consumed = [*history, (state["world_size"], consumed)], 0
        self.options = replace(self.options, order=order)
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
