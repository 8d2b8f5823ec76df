"""A byte cache shared by every DataLoader worker of one process tree, or of a node, bounded in bytes.

A per-worker ``dict`` cache holds one copy of the data per worker and is lost whenever
non-persistent workers restart. :class:`SharedCache` keeps one copy in shared memory that the
main process and all workers read and write: a sample put by worker A in epoch 1 is a hit for
worker B in epoch 2 and for the main process; with ``identity=`` the ranks of a job on one node
share that copy too. Layout, locking, lifetime after a crash, memory accounting and pickling:
docs/datasets.md.
"""

from __future__ import annotations

import errno
import hashlib
import os
import warnings
import weakref
from collections.abc import Sequence
from multiprocessing import reduction
from typing import Any

import numpy as np
import torch

from packer.checks import check_int
from packer.files.fileio import anonymous_file

from .budget import ALIGN, SHM_DIR, clamp_capacity
from .locks import (
    FileLock,
    ProcessLock,
    new_segment,
    node_segments_supported,
    open_segment,
    publish_segment,
    release_segment,
    remove_stale_segments,
    unlink_if_named,
)
from .region import SharedRegion, SlotTable, int64_rows

__all__ = ["SharedCache", "node_key_from_env"]

_EMPTY, _WRITING, _READY = 0, 1, 2
_PAGE = 4096

# One segment: a header of named fields (16 slots) and the identity digest, the table of one
# (offset, length, state) row per sample from byte 256, then the arena from the next page.
_HEADER_FIELDS = ("magic", "layout", "num_items", "capacity", "arena", "size",
                  "ptr", "hits", "misses", "entries", "rejected")
_HEADER = 16
_DIGEST_AT, _TABLE_AT = 128, 256
_ENTRY_FIELDS = ("offset", "length", "state")
_MAGIC = int.from_bytes(b"pkcache\0", "little")
_LAYOUT = 1

_PREFIX = "packer-cache-"  # node-shared segments: /dev/shm/packer-cache-<digest>


def node_key_from_env() -> str | None:
    """What tells this job's processes on a node apart from other jobs': the torchrun run id
    (``TORCHELASTIC_RUN_ID``, unless torchrun's default ``none``), else ``MASTER_ADDR:MASTER_PORT``;
    None outside a distributed job."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if run and run != "none":
        return f"run:{run}"
    addr, port = os.environ.get("MASTER_ADDR", "").strip(), os.environ.get("MASTER_PORT", "").strip()
    return f"master:{addr}:{port}" if addr and port else None


def _digest(identity: str | bytes, num_items: int, key: str) -> bytes:
    ident = identity.encode() if isinstance(identity, str) else bytes(identity)
    h = hashlib.sha256(b"packer-cache\0%d\0%d\0%d\0" % (_LAYOUT, num_items, os.getuid()))
    for part in (ident, key.encode()):
        h.update(b"%d:" % len(part) + part)
    return h.digest()


def _layout(num_items: int, capacity: int) -> tuple[int, int]:
    """(arena offset, segment size) for a cache of ``num_items`` and ``capacity`` bytes."""
    arena = -(-(_TABLE_AT + 24 * num_items) // _PAGE) * _PAGE
    return arena, arena + capacity


class SharedCache:
    """A bounded byte cache, indexed by sample number, shared by a process and its workers, and
    with ``identity`` by every process of a distributed job on one node.

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
            clamped, with a warning, to what the available RAM, the container's memory limit
            (cgroup: :func:`cgroup_free_bytes`) and, for a node-shared cache, ``/dev/shm`` can
            hold. A cache joined on the node keeps its creator's capacity.
        identity: what the cached bytes are (the dataset's content and the cache mode; anything
            that changes a stored byte). With it, the processes of one job on one node (same
            ``node_key``) share one cache: the first creates ``/dev/shm/packer-cache-<digest>``,
            the others map it. Without it the cache is this process tree's own.
        node_key: which processes share: default :func:`node_key_from_env` (the torchrun job);
            outside a distributed job, and without a key, nothing is shared. Give the same key to
            share across jobs on a node.

    Raises:
        TypeError, ValueError: for arguments that are not non-negative ints.
        RuntimeError: when shared memory cannot be allocated.
    """

    def __init__(
        self,
        num_items: int,
        capacity_bytes: int,
        *,
        identity: str | bytes | None = None,
        node_key: str | None = None,
    ) -> None:
        num_items = _check_count("num_items", num_items)
        requested = _check_count("capacity_bytes", capacity_bytes)
        if identity is not None and not isinstance(identity, (str, bytes)):
            raise TypeError(f"SharedCache: identity must be str or bytes, got {type(identity).__name__}")
        path = digest = None
        key = node_key if node_key is not None else node_key_from_env()
        if identity is not None and key is not None:
            if node_segments_supported() and os.path.isdir(SHM_DIR):
                digest = _digest(identity, num_items, key)
                path = os.path.join(SHM_DIR, _PREFIX + digest.hex()[:40])
            else:
                warnings.warn("SharedCache: this system cannot share a cache between the processes of a "
                              "node (needs Linux with /dev/shm); each process tree keeps its own",
                              RuntimeWarning, stacklevel=2)
        if node_segments_supported():
            remove_stale_segments(SHM_DIR, _PREFIX)  # crashed jobs' memory, before measuring what is free
        overhead = _layout(num_items, 0)[0]
        while path is not None and digest is not None:
            if self._attach(path, num_items, digest):
                return
            # Claim the name with an empty file first, its lock held, and commit the memory only
            # once the name is ours: processes that start together (torchrun's ranks) would
            # otherwise each commit a whole segment before learning that one of them won.
            fd = _empty_segment()
            if fd is None:
                warnings.warn(f"SharedCache: cannot create a file in {SHM_DIR} for the node's cache "
                              f"(no O_TMPFILE or no permission there); this process tree keeps its own",
                              RuntimeWarning, stacklevel=2)
                break
            lock = FileLock("SharedCache", os.dup(fd))
            region = None
            try:
                with lock.hold():  # joiners wait on it until the segment is set up
                    if publish_segment(fd, path):  # else another process named its segment first: join it
                        region = _node_region(fd, path, num_items, clamp_capacity(requested, overhead, node=True))
                        _initialise(region, num_items, digest)
            finally:
                os.close(fd)
                if region is None:
                    lock.close()
            if region is not None:
                self._setup(num_items, region, lock, path)
                return
        region = _private_region(num_items, clamp_capacity(requested, overhead, node=False))
        _initialise(region, num_items, b"")
        self._setup(num_items, region, ProcessLock("SharedCache"), None)

    def _attach(self, path: str, num_items: int, digest: bytes) -> bool:
        """Map the node's published segment at ``path``; False when there is none (or only one
        whose creator died or failed before it was set up, which is removed)."""
        fd = open_segment(path)
        if fd is None:
            return False
        lock = FileLock("SharedCache", os.dup(fd))
        try:
            with lock.hold():  # its creator holds the lock until the segment is set up
                size = os.fstat(fd).st_size
                if size == 0:  # named but never set up: its creator died or failed
                    unlink_if_named(fd, path)
        except BaseException:
            lock.close()
            os.close(fd)
            raise
        if size == 0:
            lock.close()
            os.close(fd)
            return False
        try:
            region = SharedRegion(size, "packer-cache", fd=fd)  # owns fd (closed on failure)
        except BaseException:
            lock.close()
            raise
        header = SlotTable(_HEADER_FIELDS, region, slots=_HEADER) if size >= _TABLE_AT else None
        if (header is None or header["magic"] != _MAGIC or header["layout"] != _LAYOUT
                or header["num_items"] != num_items or header["size"] != size
                or bytes(region.buffer[_DIGEST_AT:_DIGEST_AT + len(digest)]) != digest):
            lock.close()
            region.close()
            raise RuntimeError(f"SharedCache: {path} is not this dataset's cache (another program's "
                               f"file or another packer version's, in use); remove it when it is unused")
        self._setup(num_items, region, lock, path)
        return True

    def _setup(self, num_items: int, region: SharedRegion, lock: ProcessLock | FileLock,
               path: str | None, holder: bool = True) -> None:
        self._num_items = num_items
        self._region: SharedRegion | None = region
        self._lock = lock
        self._path = path
        # The process that opened a node segment holds it (docs/datasets.md): its last holder
        # removes the name, at close() or when the cache is garbage collected or Python exits.
        self._hold = None
        if path is not None and holder:
            self._hold = weakref.finalize(self, _release_hold, os.dup(region.fd), path, os.getpid())
        self._header = SlotTable(_HEADER_FIELDS, region, slots=_HEADER)
        self._capacity = self._header["capacity"]
        self._arena_at = self._header["arena"]
        self._fd: int = region.fd  # type: ignore[assignment]
        # NumPy views: scalar access through them is several times faster than through torch.
        self._arena = region.uint8(self._arena_at)
        entries = int64_rows(region, _ENTRY_FIELDS, num_items, _TABLE_AT)
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
        """The bound in bytes, after clamping (or the creator's, for a node-shared cache)."""
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

    def get_many(self, indices: Sequence[int]) -> list[memoryview | None]:
        """:meth:`get` for each of ``indices``, under one hold of the lock (a batch's lookups)."""
        checked = [self._check_index(i) for i in indices]
        with self._lock.hold():
            offsets = self._offsets[checked].tolist()
            lengths = self._lengths[checked].tolist()
            ready = (self._states[checked] == _READY).tolist()
            hits = sum(ready)
            self._header["hits"] += hits
            self._header["misses"] += len(checked) - hits
        out: list[memoryview | None] = []
        for offset, length, ok in zip(offsets, lengths, ready):
            if not ok:
                out.append(None)
                continue
            view = self._arena[offset : offset + length]
            view.flags.writeable = False
            out.append(view.data)
        return out

    def put_many(self, items: Sequence[tuple[int, Any]]) -> list[bool]:
        """:meth:`put` for each ``(index, data)`` of ``items``, with two holds of the lock for the
        whole batch instead of two per entry; returns what ``put`` would for each."""
        # Reserve the bytes and mark the entries WRITING under the lock, copy without it, then
        # mark them READY under the lock: a get reads an entry under the lock, so it never sees
        # READY before the bytes (the lock is the memory barrier). A writer that dies mid-copy
        # leaves its entries WRITING: never cached, their bytes lost to the bound. Entries never
        # move. The copy is a pwrite into the file, not a store through the mapping: a store
        # faults in every fresh page of the mapping one by one (docs/benchmarks.md, section 7).
        # Every entry is checked before any is reserved.
        entries = [(self._check_index(i), [_as_bytes(d, i) for d in data] if isinstance(data, tuple)
                    else [_as_bytes(data, i)]) for i, data in items]
        out: list[bool] = []
        todo: list[tuple[int, int, list[np.ndarray]]] = []  # (index, offset, parts) to write
        with self._lock.hold():
            for index, parts in entries:
                state = int(self._states[index])
                if state != _EMPTY:  # cached, being stored, or twice in this batch
                    out.append(state == _READY)
                    continue
                length = sum(part.size for part in parts)
                offset = self._header["ptr"]
                end = offset + length
                if end > self._capacity:
                    self._header["rejected"] += 1
                    out.append(False)
                    continue
                self._header["ptr"] = min(-(-end // ALIGN) * ALIGN, self._capacity)
                self._offsets[index], self._lengths[index] = offset, length
                self._states[index] = _WRITING
                todo.append((index, offset, parts))
                out.append(True)
        written = 0
        try:
            for _, offset, parts in todo:
                _pwrite_all(self._fd, parts, self._arena_at + offset)
                written += 1
        finally:
            with self._lock.hold():
                for k, (index, _, _) in enumerate(todo):
                    self._states[index] = _READY if k < written else _EMPTY
                self._header["entries"] += written
        return out

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
        return self.put_many([(index, data)])[0]

    def close(self) -> None:
        """Drop this process's references to the shared memory and the lock; idempotent.

        The memory is freed when no process maps it and no view from ``get`` is alive. Other
        processes' copies of the cache keep working. The last process of a node to close a
        node-shared cache also removes its name from ``/dev/shm``.
        """
        if self._region is None:
            return
        if self._hold is not None:
            self._hold()
        self._lock.close()
        self._region.close()
        self._region = None
        self._arena = np.empty(0, dtype=np.uint8)
        self._header = SlotTable(_HEADER_FIELDS, bytearray(SlotTable.nbytes(_HEADER)), slots=_HEADER)
        self._offsets = self._lengths = self._states = np.zeros(0, dtype=np.int64)

    @property
    def name(self) -> str | None:
        """The path of a node-shared cache in ``/dev/shm``; None for a process tree's own."""
        return self._path

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called in this process."""
        return self._region is None

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
        if self._region is None:
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


def _pwrite_all(fd: int, parts: list[np.ndarray], at: int) -> None:
    """Write ``parts`` back to back into file ``fd`` from byte ``at``, in as few calls as it takes."""
    views = [memoryview(part) for part in parts if part.size]
    while views:
        written = os.pwritev(fd, views, at)
        at += written
        while views and written >= views[0].nbytes:
            written -= views[0].nbytes
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def _empty_segment() -> int | None:
    """A new empty, unnamed file in /dev/shm for a node-shared cache, held by this process; None
    where the system or the permissions allow none."""
    try:
        return new_segment(SHM_DIR, 0)
    except OSError as error:
        if error.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.EACCES, errno.EPERM, errno.EROFS):
            return None
        raise _allocation_error(0, f"in {SHM_DIR}", error) from error


def _node_region(fd: int, path: str, num_items: int, capacity: int) -> SharedRegion:
    """The segment ``fd``, just named ``path`` by this process, grown to hold the cache with its
    whole size committed, mapped through a duplicate of ``fd``. On failure the name is removed."""
    size = _layout(num_items, capacity)[1]
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        unlink_if_named(fd, path)
        raise _allocation_error(size, f"in {SHM_DIR}", error) from error
    return SharedRegion(size, "packer-cache", fd=os.dup(fd))


def _private_region(num_items: int, capacity: int) -> SharedRegion:
    """An anonymous file for a process tree's own cache, its whole size committed."""
    size = _layout(num_items, capacity)[1]
    try:
        fd = anonymous_file("packer-shared-cache")
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
        except BaseException:
            os.close(fd)
            raise
    except OSError as error:
        raise _allocation_error(size, "(an anonymous memfd)", error) from error
    return SharedRegion(size, "packer-shared-cache", fd=fd)


def _allocation_error(size: int, where: str, error: OSError) -> RuntimeError:
    return RuntimeError(f"SharedCache: cannot allocate {size} bytes of shared memory {where}: {error}")


def _initialise(region: SharedRegion, num_items: int, digest: bytes) -> None:
    arena = _layout(num_items, 0)[0]
    size, capacity = region.size, region.size - arena
    header = SlotTable(_HEADER_FIELDS, region, slots=_HEADER)
    header["layout"], header["num_items"], header["capacity"] = _LAYOUT, num_items, capacity
    header["arena"], header["size"] = arena, size
    region.buffer[_DIGEST_AT:_DIGEST_AT + len(digest)] = digest
    header["magic"] = _MAGIC


def _release_hold(fd: int, path: str, pid: int) -> None:
    """Close this hold on a node-shared segment; the last holder of the node removes its name."""
    try:
        if os.getpid() == pid:
            release_segment(fd, path)
    except OSError:  # pragma: no cover - /dev/shm went away
        pass
    finally:
        os.close(fd)


def _reduce_cache(cache: SharedCache) -> tuple:
    if cache.closed:
        raise ValueError("cannot send a closed SharedCache to another process")
    return _rebuild_cache, (cache._num_items, cache._region, cache._lock, cache._path)


def _rebuild_cache(num_items: int, region: SharedRegion, lock: ProcessLock | FileLock,
                   path: str | None) -> SharedCache:
    cache = SharedCache.__new__(SharedCache)
    cache._setup(num_items, region, lock, path, holder=False)
    return cache


# multiprocessing's pickler (used to start spawn/forkserver workers and by its queues) shares
# the memory; torch registers its tensor reductions with the same pickler.
reduction.ForkingPickler.register(SharedCache, _reduce_cache)
