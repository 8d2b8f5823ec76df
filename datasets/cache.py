"""A byte cache shared by every DataLoader worker of one process tree, bounded in bytes.

A per-worker ``dict`` cache holds one copy of the data per worker and is lost whenever
non-persistent workers restart. :class:`SharedCache` keeps one copy in shared memory that the
main process and all workers read and write: a sample put by worker A in epoch 1 is a hit for
worker B in epoch 2 and for the main process. Nothing is left in ``/dev/shm`` after a crash.
Layout, locking, memory accounting and pickling: docs/datasets.md.
"""

from __future__ import annotations

import os
import re
import warnings
from multiprocessing import reduction

import numpy as np
import torch

from packer.checks import check_int

from .shm import ProcessLock, SharedRegion, SlotTable, int64_rows

__all__ = ["SharedCache"]

_EMPTY, _WRITING, _READY = 0, 1, 2
_ALIGN = 64

# The table: a header of named fields (8 slots), then one (offset, length, state) row per sample.
_HEADER_FIELDS = ("ptr", "hits", "misses", "entries", "rejected")
_HEADER = 8
_ENTRY_FIELDS = ("offset", "length", "state")

_SHM_DIR = "/dev/shm"
_MIN_HEADROOM = 256 * 2**20


def _shm_free_bytes(path: str = _SHM_DIR) -> int | None:
    """Bytes an unprivileged process may still allocate in ``path``; None if not a directory."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _available_memory_bytes() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo``; None where that is missing (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _usable_bytes(free: int) -> int:
    """Free space less headroom for the DataLoader's own batches: 10%, 256 MiB at least."""
    headroom = min(free // 2, max(free // 10, _MIN_HEADROOM))
    return free - headroom


def _remove_failed_segment(message: str) -> str:
    """Unlink the segment a failed torch allocation left behind; say so in the error.

    When ``fallocate`` fails (tmpfs full), torch 2.13 raises before unlinking the name it
    created, leaving ``/dev/shm/torch_<pid>_<random>_<n>`` (sparse, but a stale entry). Only a
    segment of this process, named in torch's message, is removed.
    """
    match = re.search(r"</?(torch_(\d+)_\d+_\d+)>", message)
    if match is None or int(match.group(2)) != os.getpid():
        return ""
    path = os.path.join(_SHM_DIR, match.group(1))
    try:
        os.unlink(path)
    except OSError:
        return ""
    return f" (removed the stale {path} torch left behind)"


def _new_shared_tensor(nbytes: int, dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled 1-D shared-memory tensor of ``nbytes`` bytes, without an extra copy.

    ``torch.empty(n).share_memory_()`` would allocate private memory and then copy all of it
    into shared memory; ``UntypedStorage._new_shared`` (what DataLoader's collate uses for its
    output batches) allocates shared memory directly.
    """
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # pragma: no cover - very old or very new torch
        return torch.zeros(nbytes // torch.empty((), dtype=dtype).element_size(), dtype=dtype)
    storage = new_shared(nbytes)
    tensor = torch.empty(0, dtype=dtype)
    tensor.set_(storage, 0, (nbytes // tensor.element_size(),), (1,))
    return tensor


class SharedCache:
    """A bounded byte cache, indexed by sample number, shared by a process and its workers.

    Create it in the main process before the DataLoader starts its workers, keep it on the
    dataset, and use ``get`` / ``put`` in ``__getitem__``::

        cached = self.cache.get(index)
        data = bytes(cached) if cached is not None else self._read(index)  # or decode the view
        if cached is None:
            self.cache.put(index, data)

    Args:
        num_items: number of samples (valid indices are ``0 .. num_items - 1``).
        capacity_bytes: the bound on cached bytes (an int; convert sizes like "8GB" with
            ``packer.sizes.parse_size``). Committed in RAM at construction (docs/datasets.md);
            clamped, with a warning, to what ``/dev/shm`` and the available RAM can hold.

    Raises:
        TypeError, ValueError: for arguments that are not non-negative ints.
        RuntimeError: when shared memory cannot be allocated.
    """

    def __init__(self, num_items: int, capacity_bytes: int) -> None:
        num_items = _check_count("num_items", num_items)
        requested = _check_count("capacity_bytes", capacity_bytes)
        capacity = requested
        table_bytes = (_HEADER + 3 * num_items) * 8
        limits = {
            "free in " + _SHM_DIR: _shm_free_bytes(),
            "RAM available": _available_memory_bytes(),
        }
        known = {name: value for name, value in limits.items() if value is not None}
        if known:
            tightest = min(known, key=known.__getitem__)
            usable = max(_usable_bytes(known[tightest]) - table_bytes, 0)
            if capacity > usable:
                capacity = usable - usable % _ALIGN
                warnings.warn(
                    f"SharedCache: capacity_bytes={requested} is more than shared memory can "
                    f"hold ({known[tightest]} bytes {tightest}, less headroom for DataLoader "
                    f"batches); using {capacity} bytes. For more, free memory or enlarge "
                    f"{_SHM_DIR} (docker run --shm-size=...).",
                    RuntimeWarning,
                    stacklevel=2,
                )
        # The arena is a torch shared tensor in /dev/shm, named and unlinked at once, committed
        # with fallocate so that a full tmpfs fails here rather than with a SIGBUS on a later
        # write; the table of entries is an anonymous region.
        try:
            table = SharedRegion(table_bytes, "packer-shared-cache")
            arena = _new_shared_tensor(capacity, torch.uint8)
        except (OSError, RuntimeError) as error:
            raise RuntimeError(
                f"SharedCache: cannot allocate {capacity} + {table_bytes} bytes of shared memory "
                f"in {_SHM_DIR}: {error}{_remove_failed_segment(str(error))}"
            ) from error
        self._setup(num_items, capacity, arena, table, ProcessLock("SharedCache"))

    def _setup(
        self,
        num_items: int,
        capacity: int,
        arena: torch.Tensor,
        table: SharedRegion,
        lock: ProcessLock,
    ) -> None:
        self._num_items = num_items
        self._capacity = capacity
        self._arena_tensor: torch.Tensor | None = arena
        self._table: SharedRegion | None = table
        self._lock = lock
        # NumPy views: scalar access through them is several times faster than through torch.
        self._arena = arena.numpy()
        self._header = SlotTable(_HEADER_FIELDS, table, slots=_HEADER)
        entries = int64_rows(table, _ENTRY_FIELDS, num_items, SlotTable.nbytes(_HEADER))
        self._offsets, self._lengths, self._states = (entries[f] for f in _ENTRY_FIELDS)

    # -- pickling: shared through multiprocessing only ---------------------------------------

    def __reduce__(self) -> tuple:
        raise TypeError(
            "SharedCache can only be sent to processes started by multiprocessing (DataLoader "
            "workers, multiprocessing queues); the standard pickle module would copy it and the "
            "copy would no longer be shared"
        )

    def __copy__(self) -> SharedCache:
        return self

    def __deepcopy__(self, memo: dict) -> SharedCache:
        return self

    # -- the API -------------------------------------------------------------------------------

    @property
    def num_items(self) -> int:
        """Number of sample slots."""
        return self._num_items

    @property
    def capacity(self) -> int:
        """The bound in bytes, after clamping to ``/dev/shm``."""
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Bytes of the arena in use (entries plus alignment padding), at most ``capacity``."""
        self._check_open()
        return self._header["ptr"]

    @property
    def hits(self) -> int:
        """Number of ``get`` calls, in all processes, that found their entry."""
        self._check_open()
        return self._header["hits"]

    @property
    def misses(self) -> int:
        """Number of ``get`` calls, in all processes, that did not."""
        self._check_open()
        return self._header["misses"]

    @property
    def rejected(self) -> int:
        """Number of ``put`` calls refused because the cache was full."""
        self._check_open()
        return self._header["rejected"]

    def __len__(self) -> int:
        """Number of cached entries."""
        self._check_open()
        return self._header["entries"]

    def __contains__(self, index: object) -> bool:
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            return False
        self._check_open()
        if not 0 <= index < self._num_items:
            return False
        with self._lock.hold():
            return int(self._states[index]) == _READY

    def get(self, index: int) -> memoryview | None:
        """The cached bytes of sample ``index`` as a read-only memoryview, or None on a miss.

        The view points into shared memory, without a copy; it stays valid after ``close()``
        (the memory lives as long as a view does). ``np.frombuffer(view, np.uint8)`` gives an
        array, ``bytes(view)`` a copy.
        """
        index = self._check_index(index)
        with self._lock.hold():
            offset, length = int(self._offsets[index]), int(self._lengths[index])
            state = int(self._states[index])
            if state == _READY:
                self._header["hits"] += 1
            else:
                self._header["misses"] += 1
        if state != _READY:
            return None
        view = self._arena[offset : offset + length]
        view.flags.writeable = False
        return view.data

    def put(
        self,
        index: int,
        data: bytes | bytearray | memoryview | np.ndarray | torch.Tensor | tuple,
    ) -> bool:
        """Store the bytes of sample ``index``; return whether they are cached now.

        Returns True when the entry was stored by this call or was already cached, False when
        the cache is full (the bound is never exceeded; read the sample uncached) or another
        process is storing the same entry at this moment. Never raises for a full cache.

        Args:
            index: the sample number.
            data: a bytes-like object, or a NumPy array or CPU tensor (its raw C-order bytes are
                stored; the dtype and shape are not, so keep them elsewhere or store encoded
                bytes), or a tuple of those, stored one after the other as one entry
                (a header and pixels without first joining them in a new buffer).
        """
        # Reserve the bytes and mark the entry WRITING under the lock, copy without it, then mark
        # it READY under the lock: a get reads the entry under the lock, so it never sees READY
        # before the bytes (the lock is the memory barrier). A writer that dies mid-copy leaves
        # its entry WRITING: never cached, its bytes lost to the bound. Entries never move.
        index = self._check_index(index)
        parts = [_as_bytes(d, index) for d in data] if isinstance(data, tuple) else [_as_bytes(data, index)]
        length = sum(part.size for part in parts)
        with self._lock.hold():
            state = int(self._states[index])
            if state != _EMPTY:
                return state == _READY
            offset = self._header["ptr"]
            end = offset + length
            if end > self._capacity:
                self._header["rejected"] += 1
                return False
            self._header["ptr"] = min(-(-end // _ALIGN) * _ALIGN, self._capacity)
            self._offsets[index], self._lengths[index] = offset, length
            self._states[index] = _WRITING
        try:
            at = offset
            for part in parts:
                self._arena[at : at + part.size] = part
                at += part.size
        except BaseException:
            with self._lock.hold():
                self._states[index] = _EMPTY
            raise
        with self._lock.hold():
            self._states[index] = _READY
            self._header["entries"] += 1
        return True

    def close(self) -> None:
        """Drop this process's references to the shared memory and the lock; idempotent.

        The memory is freed when no process maps it and no view from ``get`` is alive. Other
        processes' copies of the cache keep working.
        """
        if self._arena_tensor is None:
            return
        self._lock.close()
        if self._table is not None:
            self._table.close()
        self._arena_tensor = self._table = None
        self._arena = np.empty(0, dtype=np.uint8)
        self._header = SlotTable(_HEADER_FIELDS, bytearray(SlotTable.nbytes(_HEADER)), slots=_HEADER)
        self._offsets = self._lengths = self._states = np.zeros(0, dtype=np.int64)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called in this process."""
        return self._arena_tensor is None

    def __enter__(self) -> SharedCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return f"SharedCache(num_items={self._num_items}, capacity={self._capacity}, closed)"
        return (
            f"SharedCache(num_items={self._num_items}, capacity={self._capacity}, "
            f"nbytes={self.nbytes}, entries={len(self)}, hits={self.hits}, misses={self.misses})"
        )

    # -- helpers -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._arena_tensor is None:
            raise ValueError("SharedCache is closed")

    def _check_index(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"SharedCache index must be an int, got {type(index).__name__}")
        self._check_open()
        if not 0 <= index < self._num_items:
            raise IndexError(f"SharedCache index {index} out of range for {self._num_items} items")
        return int(index)


def _check_count(name: str, value: object) -> int:
    if isinstance(value, str):
        raise TypeError(f"SharedCache: {name} must be an integer, got str {value!r} (convert sizes "
                        f"with packer.sizes.parse_size)")
    return check_int(f"SharedCache: {name}", value, 0)


def _as_bytes(data: object, index: int) -> np.ndarray:
    """A 1-D uint8 view (or contiguous copy) of ``data``'s bytes."""
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:
            raise TypeError(
                f"SharedCache.put({index}): cannot store an array of Python objects "
                f"(dtype {data.dtype}); store bytes"
            )
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if isinstance(data, torch.Tensor):
        return _as_bytes(data.detach().cpu().contiguous().numpy(), index)
    if isinstance(data, str):
        raise TypeError(f"SharedCache.put({index}): expected bytes, got str; encode it first")
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"SharedCache.put({index}): expected bytes, bytearray, memoryview or a NumPy "
            f"array, got {type(data).__name__}"
        ) from None
    if not view.c_contiguous:
        return np.frombuffer(view.tobytes(), dtype=np.uint8)
    return np.frombuffer(view.cast("B"), dtype=np.uint8)


def _reduce_cache(cache: SharedCache) -> tuple:
    if cache.closed:
        raise ValueError("cannot send a closed SharedCache to another process")
    return _rebuild_cache, (
        cache._num_items,
        cache._capacity,
        cache._arena_tensor,
        cache._table,
        cache._lock,
    )


def _rebuild_cache(
    num_items: int,
    capacity: int,
    arena: torch.Tensor,
    table: SharedRegion,
    lock: ProcessLock,
) -> SharedCache:
    cache = SharedCache.__new__(SharedCache)
    cache._setup(num_items, capacity, arena, table, lock)
    return cache


# multiprocessing's pickler (used to start spawn/forkserver workers and by its queues) shares
# the memory; torch registers its tensor reductions with the same pickler.
reduction.ForkingPickler.register(SharedCache, _reduce_cache)
