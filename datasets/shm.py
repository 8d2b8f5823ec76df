"""Shared-memory primitives for a process and its DataLoader workers: region, lock, slot table.

:class:`SharedRegion` is anonymous shared memory, :class:`ProcessLock` an inter-process lock and
:class:`SlotTable` named int64 fields in a region. Region and lock are ``memfd`` files with no
name anywhere (an unlinked temporary file where ``memfd_create`` is missing), so nothing is left
in ``/dev/shm`` after Ctrl-C, SIGKILL of the whole process group or a crash: the kernel frees
them with their last holder. They reach DataLoader workers under fork (inherited), spawn and
forkserver (sent as file descriptors by multiprocessing's pickler, ``reduction.DupFd``); the
standard ``pickle`` module refuses them, since a copy would silently stop being shared.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing import reduction
from typing import Any

import numpy as np

from packer.fileio import anonymous_file

__all__ = ["SharedRegion", "ProcessLock", "SlotTable", "int64_rows"]


class _OwnedDescriptor:
    """Owns ``self.fd`` and closes it once: on :meth:`close` or when garbage collected."""

    fd: int | None

    def close(self) -> None:
        """Close this process's descriptor; idempotent."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        try:
            if getattr(self, "fd", None) is not None:  # not if __init__ failed
                self.close()
        except OSError:  # pragma: no cover - closed elsewhere
            pass


class SharedRegion(_OwnedDescriptor):
    """``size`` bytes of anonymous shared memory, mapped in this process.

    :meth:`close` closes the descriptor: the region can no longer be sent to another process,
    and the mapping stays while this object or a view of it is alive.

    Args:
        size: bytes, at least 1.
        name: shown in ``/proc/<pid>/fd`` and ``/proc/<pid>/maps`` (``memfd:<name>``).
        fd: a descriptor of an existing region to map and own instead of creating one.
    """

    def __init__(self, size: int, name: str = "packer-shm", *, fd: int | None = None) -> None:
        created = fd is None
        if fd is None:
            fd = anonymous_file(name)
        try:
            if created:
                os.ftruncate(fd, size)
            self.buffer: mmap.mmap = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.fd: int | None = fd
        self.size = size
        self.name = name

    def int64(self, offset: int = 0, count: int = -1) -> np.ndarray:
        """A writable int64 view of the region from byte ``offset`` (``count`` items, or all)."""
        return np.frombuffer(self.buffer, np.int64, count=count, offset=offset)

    def uint8(self, offset: int = 0) -> np.ndarray:
        """A writable byte view of the region from byte ``offset`` to its end."""
        return np.frombuffer(self.buffer, np.uint8, offset=offset)

    def __reduce__(self) -> tuple:
        raise TypeError(f"shared memory {self.name!r} can only be sent through multiprocessing; "
                        f"a pickled copy would no longer be shared")


def _rebuild_region(dup_fd: Any, size: int, name: str) -> SharedRegion:
    return SharedRegion(size, name, fd=dup_fd.detach())


def _reduce_region(region: SharedRegion) -> tuple:
    if region.fd is None:
        raise ValueError(f"cannot send the closed shared memory {region.name!r} to another process")
    return _rebuild_region, (reduction.DupFd(region.fd), region.size, region.name)


# This process's thread lock per lock file (device, inode); the pid tells a forked child, which
# must not inherit a thread lock that another thread held at the fork.
_thread_locks: dict[tuple[int, int], threading.Lock] = {}
_thread_locks_pid = os.getpid()
_thread_locks_guard = threading.Lock()


def _thread_lock(file: tuple[int, int]) -> threading.Lock:
    global _thread_locks, _thread_locks_pid, _thread_locks_guard
    if _thread_locks_pid != os.getpid():
        _thread_locks, _thread_locks_pid = {}, os.getpid()
        _thread_locks_guard = threading.Lock()
    lock = _thread_locks.get(file)
    if lock is None:
        with _thread_locks_guard:
            lock = _thread_locks.setdefault(file, threading.Lock())
    return lock


class ProcessLock(_OwnedDescriptor):
    """A lock between processes: ``fcntl.lockf`` on an anonymous file, plus a thread lock.

    Unlike ``multiprocessing.Lock`` (a named POSIX semaphore, ``/dev/shm/sem.mp-*``, left behind
    when its process group is SIGKILLed) it has no name, and the kernel releases it when its
    holder dies, so a killed worker cannot deadlock the others. POSIX record locks belong to a
    process, so a forked child competes with its parent; a thread lock per lock file serialises
    the threads of one process, also across copies of the lock received in the same process, and
    is made anew in a forked child (a held one must not be inherited).

    The lock is on a file of its own, not on a :class:`SharedRegion`'s: closing *any* descriptor
    of a file drops the process's record locks on it, and ``mmap`` keeps and closes a duplicate.

    Args:
        owner: what the lock guards, for error messages (``"SharedCache"``).
        fd: a descriptor of an existing lock file to own instead of creating one.
    """

    def __init__(self, owner: str, fd: int | None = None) -> None:
        self.owner = owner
        self.fd: int | None = anonymous_file(f"packer-{owner}-lock") if fd is None else fd
        stat = os.fstat(self.fd)
        self._file = (stat.st_dev, stat.st_ino)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the lock for the ``with`` block; ValueError after :meth:`close`."""
        if self.fd is None:
            raise ValueError(f"{self.owner} is closed")
        with _thread_lock(self._file):
            fcntl.lockf(self.fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.lockf(self.fd, fcntl.LOCK_UN)

    def __reduce__(self) -> tuple:
        raise TypeError(f"a {self.owner} lock can only be sent through multiprocessing")


def _rebuild_lock(owner: str, dup_fd: Any) -> ProcessLock:
    return ProcessLock(owner, dup_fd.detach())


def _reduce_lock(lock: ProcessLock) -> tuple:
    if lock.fd is None:
        raise ValueError(f"cannot send a closed {lock.owner} to another process")
    return _rebuild_lock, (lock.owner, reduction.DupFd(lock.fd))


class SlotTable:
    """Named int64 fields over shared memory: ``table["hits"] += 1`` instead of ``header[1]``.

    Reads and writes of one field are single aligned 8-byte accesses; anything that reads one
    field and writes another must hold a :class:`ProcessLock`.

    Args:
        fields: the field names, stored in this order, 8 bytes each.
        buffer: a :class:`SharedRegion` or any writable buffer (``bytearray`` for a private table).
        offset: byte offset of the first field.
        slots: int64 slots reserved (at least ``len(fields)``; the rest stay zero).
    """

    def __init__(self, fields: Sequence[str], buffer: SharedRegion | bytearray,
                 offset: int = 0, slots: int | None = None) -> None:
        self.fields = tuple(fields)
        self._index = {name: i for i, name in enumerate(self.fields)}
        slots = len(self.fields) if slots is None else slots
        if len(self._index) != len(self.fields) or slots < len(self.fields):
            raise ValueError(f"SlotTable: fields must be distinct and fit {slots} slots, "
                             f"got {self.fields}")
        data = buffer.buffer if isinstance(buffer, SharedRegion) else buffer
        self.values = np.frombuffer(data, np.int64, count=slots, offset=offset)

    @staticmethod
    def nbytes(slots: int) -> int:
        """Bytes that ``slots`` int64 fields take."""
        return 8 * slots

    def __getitem__(self, name: str) -> int:
        return int(self.values[self._index[name]])

    def __setitem__(self, name: str, value: int) -> None:
        self.values[self._index[name]] = value

    def as_dict(self) -> dict[str, int]:
        """Every field and its value."""
        return {name: int(self.values[i]) for i, name in enumerate(self.fields)}


def int64_rows(buffer: SharedRegion, fields: Sequence[str], count: int, offset: int) -> np.ndarray:
    """``count`` rows of named int64 fields from byte ``offset``: a NumPy structured array
    whose columns (``rows["state"]``) and rows (``rows[i] = (...)``) write through."""
    dtype = np.dtype([(name, np.int64) for name in fields])
    return np.frombuffer(buffer.buffer, dtype, count=count, offset=offset)


# multiprocessing's pickler (used to start spawn/forkserver workers and by its queues) passes the
# descriptors; fork children inherit them.
reduction.ForkingPickler.register(SharedRegion, _reduce_region)
reduction.ForkingPickler.register(ProcessLock, _reduce_lock)
