"""Inter-process locks and the shared-memory segments unrelated processes of one node find by name.

:class:`ProcessLock` is the lock of a process and its DataLoader workers; :class:`FileLock` and
the ``*_segment`` functions serve a region that unrelated processes of one node share
(docs/datasets.md). A lock is a ``memfd`` file with no name anywhere, released by the kernel when
its holder dies; it reaches workers as a file descriptor (multiprocessing's pickler), and the
standard ``pickle`` module refuses it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import reduction
from typing import Any

from packer.files.fileio import anonymous_file

from .region import OwnedDescriptor

__all__ = ["ProcessLock", "FileLock", "node_segments_supported", "new_segment", "publish_segment", "open_segment",
           "release_segment", "remove_stale_segments", "unlink_if_named"]


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


class _Lock(OwnedDescriptor):
    """What both locks share: an owner's name and a refusal of the standard pickle module."""

    owner: str

    def __reduce__(self) -> tuple:
        raise TypeError(f"a {self.owner} lock can only be sent through multiprocessing")


class ProcessLock(_Lock):
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



def _rebuild_lock(kind: type, owner: str, dup_fd: Any) -> ProcessLock | FileLock:
    return kind(owner, dup_fd.detach())


def _reduce_lock(lock: ProcessLock | FileLock) -> tuple:
    if lock.fd is None:
        raise ValueError(f"cannot send a closed {lock.owner} to another process")
    return _rebuild_lock, (type(lock), lock.owner, reduction.DupFd(lock.fd))


class FileLock(_Lock):
    """A lock between any processes that open the same file, related or not, plus a thread lock.

    An open-file-description lock (``F_OFD_SETLKW``) on byte 0 of the file, taken through a
    description that each process opens for itself (``/proc/self/fd``), so a forked or spawned
    child competes with its parent exactly as an unrelated process does. Unlike ``lockf`` it is
    not dropped when the process closes another descriptor of the file (an ``mmap``'s
    duplicate), so it may sit on a mapped file; the kernel releases it when its holder dies.
    Linux only (:func:`node_segments_supported`).

    Args:
        owner: what the lock guards, for error messages.
        fd: a descriptor of the file, owned (closed by :meth:`close`).
    """

    def __init__(self, owner: str, fd: int) -> None:
        self.owner = owner
        self.fd: int | None = fd
        stat = os.fstat(fd)
        self._file = (stat.st_dev, stat.st_ino)
        self._own: tuple[int, int] | None = None  # (pid, descriptor) of this process's description

    def _description(self) -> int:
        pid = os.getpid()
        if self._own is None or self._own[0] != pid:
            if self._own is not None:  # the parent's, inherited across fork
                os.close(self._own[1])
            self._own = (pid, os.open(f"/proc/self/fd/{self.fd}", os.O_RDWR | os.O_CLOEXEC))
        return self._own[1]

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the lock for the ``with`` block; ValueError after :meth:`close`."""
        if self.fd is None:
            raise ValueError(f"{self.owner} is closed")
        with _thread_lock(self._file):
            fd = self._description()
            _ofd_lock(fd, fcntl.F_WRLCK, _MUTEX_BYTE, wait=True)
            try:
                yield
            finally:
                _ofd_lock(fd, fcntl.F_UNLCK, _MUTEX_BYTE, wait=False)

    def close(self) -> None:
        """Close this process's descriptors; idempotent."""
        own, self._own = self._own, None
        if own is not None:
            os.close(own[1])
        super().close()


# -- segments that unrelated processes of one node find by name ------------------------------------
#
# A segment is a file in a tmpfs directory (/dev/shm). Every process that uses it holds a read
# lock on byte 1 (the holder byte) through a description of its own: inherited and passed copies
# of the descriptor share that description, so the lock lasts until the last of them closes it or
# dies. A segment whose holder byte can be write-locked has no holder left: a crashed job's, safe
# to remove. Byte 0 is :class:`FileLock`'s. Both are open-file-description locks (Linux 3.15+).

_FLOCK = struct.Struct("hhqqi4x")  # struct flock: type, whence, start, len, pid (0 for OFD locks)
_MUTEX_BYTE, _HOLDER_BYTE = 0, 1


def _ofd_lock(fd: int, kind: int, byte: int, wait: bool) -> bool:
    """Set an open-file-description lock of ``kind`` on ``byte``; without ``wait``, False if
    another description holds a conflicting one."""
    command = fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK
    try:
        fcntl.fcntl(fd, command, _FLOCK.pack(kind, os.SEEK_SET, byte, 1, 0))
    except OSError as error:
        if wait or error.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


def node_segments_supported() -> bool:
    """Whether this system has what named segments need: OFD locks, ``O_TMPFILE`` and /proc."""
    return (hasattr(fcntl, "F_OFD_SETLKW") and hasattr(os, "O_TMPFILE")
            and os.path.isdir("/proc/self/fd"))


def _names(fd: int, path: str) -> bool:
    """Whether ``path`` is (still) the file open as ``fd``."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)


def new_segment(directory: str, size: int) -> int:
    """A descriptor of a new ``size``-byte file in ``directory``, held by this process, with no
    name yet (``O_TMPFILE``: nothing is left if the process dies before :func:`publish_segment`).

    The bytes are committed with ``fallocate``, so a full tmpfs fails here (OSError) and not with
    a SIGBUS on a later write.
    """
    fd = os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        _ofd_lock(fd, fcntl.F_RDLCK, _HOLDER_BYTE, wait=True)
        os.ftruncate(fd, size)
        if size:
            os.posix_fallocate(fd, 0, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def publish_segment(fd: int, path: str) -> bool:
    """Give the segment from :func:`new_segment` the name ``path``, once it is fully written;
    False (and nothing changed) when another process published one under that name first."""
    # linkat(AT_SYMLINK_FOLLOW) names the open file itself; os.link calls it only when given a
    # directory descriptor (plain link() would try to link the /proc symlink).
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(f"/proc/self/fd/{fd}", os.path.basename(path), dst_dir_fd=directory, follow_symlinks=True)
    except FileExistsError:
        return False
    finally:
        os.close(directory)
    return True


def open_segment(path: str) -> int | None:
    """A descriptor of the segment named ``path``, held by this process, or None if there is
    none. A segment removed or replaced while it was being opened is looked up again."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            _ofd_lock(fd, fcntl.F_RDLCK, _HOLDER_BYTE, wait=True)
            if _names(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def release_segment(fd: int, path: str) -> bool:
    """Give up this process's hold on the segment open as ``fd`` and remove the name ``path`` if
    no other process holds it; return whether it did. Call it in the process that opened ``fd``
    (its copies in child processes share its hold), just before closing ``fd``; the memory stays
    while anything maps it.

    The hold is dropped before the test, so of several holders closing at once the last to drop
    its hold finds none left, whichever order they run in.
    """
    _ofd_lock(fd, fcntl.F_UNLCK, _HOLDER_BYTE, wait=False)
    if not _ofd_lock(fd, fcntl.F_WRLCK, _HOLDER_BYTE, wait=False):
        return False
    try:
        if _names(fd, path):
            os.unlink(path)
            return True
        return False
    finally:
        _ofd_lock(fd, fcntl.F_UNLCK, _HOLDER_BYTE, wait=False)


def unlink_if_named(fd: int, path: str) -> bool:
    """Remove the name ``path`` if it still names the file open as ``fd``; return whether it did.
    For a segment that was named but never set up (hold its :class:`FileLock` while calling)."""
    if _names(fd, path):
        os.unlink(path)
        return True
    return False


def remove_stale_segments(directory: str, prefix: str) -> list[str]:
    """Remove the segments named ``prefix*`` in ``directory`` that no process holds (left by a
    job that crashed); return their paths. Segments in use and other users' files are left."""
    removed: list[str] = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if _ofd_lock(fd, fcntl.F_WRLCK, _HOLDER_BYTE, wait=False) and _names(fd, path):
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


# multiprocessing's pickler (used to start spawn/forkserver workers and by its queues) passes the
# descriptors; fork children inherit them.
reduction.ForkingPickler.register(ProcessLock, _reduce_lock)
reduction.ForkingPickler.register(FileLock, _reduce_lock)
