"""The file-system layer of conversions: durable writes, free space, publishing a finished dataset,
refusing destinations that would destroy the source, and owning a destination.

Publishing: a dataset is built in the hidden sibling ``.NAME.packer-tmp`` and appears under its
name by one rename (an atomic exchange when replacing, where Linux offers it).

Every conversion (any source kind, any output format, unpacking included) calls
:func:`check_destination` before it touches anything and holds :func:`claim_destination` from
before it cleans up leftovers until it has published. The claim is an exclusive ``flock`` on
``.NAME.packer-lock`` beside the destination: the kernel drops it when the owner exits, however it
exits, so a killed run never blocks the next one (or its ``--resume``), and a second conversion to
the same destination fails at once, naming the owner's pid and host.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import os
import shutil
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

from ..errors import DestinationBusyError, DiskFullError, SourceError
from ..sizes import format_size

__all__ = ["check_destination", "claim_destination", "drop_stale_claim", "holding_claim", "sibling_path", "fsync_dir",
           "atomic_write_bytes", "free_bytes", "no_room", "temp_dir_for", "publish", "recover_publish",
           "no_space", "SpaceAtFailure", "space_at_failure", "disk_full_error", "is_url"]

_HELD: set[tuple[int, str]] = set()  # (pid, lock path) of the claims this process holds


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` other than ``file://``: data that fsspec, not the OS, reads."""
    text = os.fspath(path)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isascii() and scheme.replace("+", "").isalnum() and scheme != "file"


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
def claim_destination(dst: str | os.PathLike[str], shown: str | None = None) -> Iterator[None]:
    """Own ``dst`` for the duration of the block: one conversion per destination at a time.

    Raises :class:`~packer.errors.DestinationBusyError` naming the owner when another process
    holds the claim (and ``shown`` in place of ``dst``: the URL a local folder stands for). The lock file is removed when the block ends; one left by a killed run holds
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
                    f"{shown or os.fspath(dst)} is being written by another conversion ({_owner(fd)}); wait for "
                    f"it to finish or stop it (lock: {path})", path=shown or os.fspath(dst),
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


def drop_stale_claim(dst: str | os.PathLike[str]) -> str | None:
    """Remove the claim file of ``dst`` when no process holds it (its owner was killed: a torchrun
    rank that saw it die cleans up for it), so it is not left looking like a conversion under way.
    Returns the owner it recorded, or None when there was no stale claim (none, or one held)."""
    path = sibling_path(os.fspath(dst), "lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None  # held: a live owner
        if not _same(_stat_nofollow(path), os.fstat(fd)):
            return None  # replaced meanwhile by a new claim
        owner = _owner(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)  # while locked, as claim_destination removes its own
        return owner
    finally:
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


# -- durable writes and free space ----------------------------------------------------------------
def fsync_dir(path: str) -> None:
    """fsync a directory so a rename inside it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file, fsync, rename and directory fsync."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def free_bytes(directory: str) -> int:
    """Bytes an unprivileged writer may still use on the file system of ``directory`` (-1 if unknown)."""
    try:
        st = os.statvfs(directory)
    except (OSError, AttributeError):
        return -1
    return st.f_bavail * st.f_frsize


def no_room(path: str, nbytes: int, margin: int = 1 << 20) -> OSError | None:
    """The OSError (ENOSPC or EFBIG) that writing ``nbytes`` more to ``path`` would meet, keeping
    ``margin`` spare, or None. For libraries that cannot report or survive a full disk themselves
    (LMDB reports a short write as EIO; HDF5 cannot close a file after a failed write)."""
    free = free_bytes(os.path.dirname(path) or ".")
    if 0 <= free < nbytes + margin:
        err = OSError(errno.ENOSPC, f"No space left on device ({free} bytes free, {nbytes + margin} needed)", path)
        err.bytes_needed = nbytes + margin  # type: ignore[attr-defined]  # for the DiskFullError
        return err
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return None
    size = os.path.getsize(path) if os.path.exists(path) else 0
    if limit != resource.RLIM_INFINITY and size + nbytes + margin > limit:
        return OSError(errno.EFBIG, f"File too large (the process's file size limit is {limit} bytes)", path)
    return None


# -- publishing ----------------------------------------------------------------------------------
def temp_dir_for(dst: str) -> str:
    """The hidden sibling folder a conversion of ``dst`` is built in."""
    parent, name = os.path.split(os.path.abspath(dst))
    return os.path.join(parent, f".{name}.packer-tmp")


_sibling = sibling_path


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Atomically swap the paths ``a`` and ``b`` (Linux ``renameat2(RENAME_EXCHANGE)``); False
    where the OS or the file system cannot, so the caller falls back to two renames."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), b)


def publish(tmp: str, dst: str, overwrite: bool) -> None:
    """Move a finished dataset from ``tmp`` to ``dst``; an existing ``dst`` is replaced only after
    the new one is complete, so a failure leaves the old dataset in place.

    Replacing uses one atomic exchange of the two folders where Linux offers it, so ``dst`` names
    the old or the new dataset at every instant. Elsewhere it takes two renames; a crash between
    them leaves the old dataset in ``.NAME.packer-old``, which :func:`recover_publish` (run at the
    start of every conversion) puts back."""
    parent = os.path.dirname(os.path.abspath(dst))
    if not os.path.lexists(dst):
        os.replace(tmp, dst)
        fsync_dir(parent)
        return
    if not overwrite:
        raise FileExistsError(f"destination exists: {dst} (use --overwrite to replace it)")
    old, trash = _sibling(dst, "old"), _sibling(dst, "trash")
    for leftover in (old, trash):
        if os.path.lexists(leftover):
            shutil.rmtree(leftover)
    if _exchange(tmp, dst):
        fsync_dir(parent)
        os.replace(tmp, trash)  # the old dataset, now at tmp
    else:
        os.replace(dst, old)
        os.replace(tmp, dst)
        fsync_dir(parent)
        os.replace(old, trash)
    fsync_dir(parent)
    shutil.rmtree(trash, ignore_errors=True)


def recover_publish(dst: str) -> None:
    """Undo what an interrupted :func:`publish` left: put the old dataset back at ``dst`` when a
    crash came between the two renames of a replacement, and delete leftovers."""
    dst = os.path.abspath(dst)
    old, trash = _sibling(dst, "old"), _sibling(dst, "trash")
    if os.path.lexists(old):
        if os.path.lexists(dst):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, dst)
            fsync_dir(os.path.dirname(dst))
    if os.path.lexists(trash):
        shutil.rmtree(trash, ignore_errors=True)


# -- disk full --------------------------------------------------------------------------------------
_NO_SPACE = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
             errno.EFBIG: "file too large for the file system or the process's file size limit"}
_NO_SPACE_TEXT = ("No space left on device", "Disk quota exceeded", "File too large")


def no_space(exc: BaseException | None, tmp: str) -> tuple[str, str | None] | None:
    """(reason, file) when ``exc`` or an exception it chains to is a full disk (ENOSPC, EDQUOT,
    EFBIG; also HDF5's errors, which carry only the text), or is an I/O error on a file system
    with less than 1 MiB left (some libraries report a short write as EIO)."""
    if isinstance(exc, (OSError, RuntimeError)) and getattr(exc, "errno", None) not in _NO_SPACE:
        free = free_bytes(tmp if os.path.isdir(tmp) else os.path.dirname(tmp))
        if 0 <= free < (1 << 20) and not isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError)):
            return _NO_SPACE[errno.ENOSPC], getattr(exc, "filename", None)
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            name = exc.filename
            return _NO_SPACE[exc.errno], os.fsdecode(name) if name is not None else None
        text = str(exc)
        for i, marker in enumerate(_NO_SPACE_TEXT):
            if marker in text:
                return _NO_SPACE[(errno.ENOSPC, errno.EDQUOT, errno.EFBIG)[i]], None
        exc = exc.__cause__ or exc.__context__
    return None


class SpaceAtFailure(NamedTuple):
    """The file system as a write found it full, measured before any cleanup frees space."""

    free: int  #: bytes still free for an unprivileged writer (-1 if unknown)
    written: int  #: bytes the partial output took on disk (allocated blocks, so sparse files count as used)
    needed: int | None = None  #: bytes the failed write asked for, where the writer knew (``bytes_needed``)


def space_at_failure(tmp: str, exc: BaseException | None = None) -> SpaceAtFailure:
    """Measure, before the partial output in ``tmp`` is removed, what the failed write saw; the
    write's size comes from a ``bytes_needed`` attribute on ``exc`` or an exception it chains to."""
    written = 0
    for folder, _, names in os.walk(tmp):
        for name in names:
            with contextlib.suppress(OSError):
                written += os.lstat(os.path.join(folder, name)).st_blocks * 512
    needed, seen = None, set()
    while exc is not None and needed is None and id(exc) not in seen:
        seen.add(id(exc))
        needed = getattr(exc, "bytes_needed", None)
        exc = exc.__cause__ or exc.__context__
    free = free_bytes(tmp if os.path.isdir(tmp) else os.path.dirname(os.path.abspath(tmp)))
    return SpaceAtFailure(free, written, needed)


def disk_full_error(reason: str, name: str | None, tmp: str, dst: str, space: SpaceAtFailure | None = None,
                    done: tuple[int, int | None] | None = None) -> DiskFullError:
    """The one-line DiskFullError for a conversion of ``dst`` that ran out of space writing ``name``:
    ``space`` is what the write saw (:func:`space_at_failure`, taken before the cleanup; measured
    now when not given), ``done`` the (samples written, samples in all) that estimate the need."""
    if space is None:
        space = space_at_failure(tmp)
    free = f"{format_size(space.free)} free when the write failed" if space.free >= 0 else "free space unknown"
    need = f", the write needed {format_size(space.needed)}" if space.needed else ""
    if done is not None and done[0] > 0 and done[1] and done[1] > done[0] and space.written > 0:
        need += (f", the output needs about {format_size(space.written * done[1] / done[0])} in all "
                f"({done[0]} of {done[1]} samples took {format_size(space.written)})")
    elif space.written > 0:
        need += f", the partial output had taken {format_size(space.written)}"
    where = name or tmp
    what = "file size limit" if reason == _NO_SPACE[errno.EFBIG] else "disk full"
    return DiskFullError(
        f"{what}: {reason} while writing {where} ({free}{need}); the partial output was removed and {dst} was "
        f"left as it was", path=where,
    )
