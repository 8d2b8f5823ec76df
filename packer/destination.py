"""Where a conversion writes: refusing destinations that would destroy the source, and owning one.

Every conversion (any source kind, any output format, unpacking included) calls
:func:`check_destination` before it touches anything and holds :func:`claim_destination` from
before it cleans up leftovers until it has published. The claim is an exclusive ``flock`` on
``.NAME.packer-lock`` beside the destination: the kernel drops it when the owner exits, however it
exits, so a killed run never blocks the next one (or its ``--resume``), and a second conversion to
the same destination fails at once, naming the owner's pid and host.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .errors import DestinationBusyError, SourceError

__all__ = ["check_destination", "claim_destination", "holding_claim", "sibling_path"]

_HELD: set[tuple[int, str]] = set()  # (pid, lock path) of the claims this process holds


def sibling_path(dst: str, what: str) -> str:
    """The hidden sibling ``.NAME.packer-WHAT`` of ``dst`` (temp folder, lock, old, trash)."""
    parent, name = os.path.split(os.path.abspath(dst).rstrip(os.sep) or os.sep)
    return os.path.join(parent, f".{name}.packer-{what}")


def _ancestors(path: str) -> Iterator[str]:
    """``path`` and every folder above it, deepest first (all resolved, so no symlinks or ``..``)."""
    while True:
        yield path
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def _same(a: os.stat_result | None, b: os.stat_result | None) -> bool:
    return a is not None and b is not None and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def check_destination(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Refuse a destination that is the source, lies inside it, or contains it.

    Paths are compared after resolving symlinks, ``..`` and trailing slashes, and folders are also
    compared by identity (device and inode), which catches bind mounts, hard-linked or
    case-insensitive names. Raises :class:`~packer.errors.SourceError` with both paths.
    """
    s, d = os.path.realpath(os.fspath(src)), os.path.realpath(os.fspath(dst))
    src_st, dst_st = _stat(s), _stat(d)
    if s == d or _same(src_st, dst_st):
        raise SourceError(f"destination {os.fspath(dst)} is the source; choose a destination outside the source")
    if any(a == s or _same(_stat(a), src_st) for a in _ancestors(os.path.dirname(d))):
        raise SourceError(f"destination {os.fspath(dst)} is inside the source {os.fspath(src)}; "
                          f"choose a destination outside it")
    if any(a == d or _same(_stat(a), dst_st) for a in _ancestors(os.path.dirname(s))):
        raise SourceError(f"source {os.fspath(src)} is inside the destination {os.fspath(dst)}; "
                          f"replacing the destination would delete the source")


def _owner(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {int(info['pid'])} on host {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "owner unknown"


@contextlib.contextmanager
def claim_destination(dst: str | os.PathLike[str]) -> Iterator[None]:
    """Own ``dst`` for the duration of the block: one conversion per destination at a time.

    Raises :class:`~packer.errors.DestinationBusyError` naming the owner when another process
    holds the claim. The lock file is removed when the block ends; one left by a killed run holds
    no lock and is taken over. Re-entrant within a process (an operation that claims ``dst`` may
    call another that claims it too).
    """
    path = sibling_path(os.fspath(dst), "lock")
    key = (os.getpid(), path)
    if key in _HELD:
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SourceError(f"{path} is not a regular file; remove it")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise DestinationBusyError(
                    f"{os.fspath(dst)} is being written by another conversion ({_owner(fd)}); wait for it to "
                    f"finish or stop it (lock: {path})", path=os.fspath(dst),
                ) from None
            # The owner before us may have removed the file after we opened it: our lock is then
            # on an orphan, and a third process could lock a new file under the same name.
            if _same(_stat_nofollow(path), os.fstat(fd)):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        _HELD.add(key)
        yield
    finally:
        _HELD.discard(key)
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still locked, so nobody can be waiting on this inode
        os.close(fd)


_F = TypeVar("_F", bound=Callable[..., Any])


def holding_claim(fn: _F) -> _F:
    """Decorate a function whose first argument is a destination to run under its claim."""

    @functools.wraps(fn)
    def claimed(dst: str, *args: Any, **kwargs: Any) -> Any:
        with claim_destination(dst):
            return fn(dst, *args, **kwargs)

    return claimed  # type: ignore[return-value]


def _stat_nofollow(path: str) -> os.stat_result | None:
    try:
        return os.stat(path, follow_symlinks=False)
    except OSError:
        return None
