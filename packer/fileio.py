"""Opening packed files safely, and reading their bytes into buffers the caller owns.

:func:`open_regular` opens only regular files: never through a symlink, never blocking on a FIFO.

``os.pread`` returns ``bytes``: read-only, so a reader that wants a writable array (a ``raw``
payload handed to the user as pixels) must copy it again, and slicing a record out of it copies
once more. :func:`pread_buffer` reads into a fresh, uninitialised NumPy buffer with
``os.preadv`` and returns a writable ``memoryview``: slicing it is free, and
``np.frombuffer`` over it is a writable array that nothing else references.
"""

from __future__ import annotations

import os
import stat
import tempfile

import numpy as np

from .errors import CorruptDataError

__all__ = ["pread_buffer", "open_regular", "anonymous_file"]

_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def open_regular(name: str, dir_fd: int | None = None, *, where: str = "") -> int:
    """Open ``name`` (in ``dir_fd``) read-only and return its descriptor, only if it is a regular file
    (never following a symlink, never blocking on a FIFO).

    Raises FileNotFoundError when it does not exist and CorruptDataError naming ``where`` (the
    path shown to the user) otherwise.
    """
    where = where or name
    try:
        fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise CorruptDataError(f"cannot open ({e.strerror}; packed files must be regular files, not symlinks)",
                               path=where) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptDataError("not a regular file (a FIFO, device or folder where a packed file belongs)",
                                   path=where)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def pread_buffer(fd: int, size: int, offset: int) -> memoryview:
    """Up to ``size`` bytes of ``fd`` at ``offset`` in a new writable buffer (fewer only at EOF).

    Raises OSError as ``os.pread`` does; the caller checks the length, as with ``os.pread``.
    """
    buf = np.empty(size, np.uint8)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return view[:got] if got < size else view


def anonymous_file(name: str) -> int:
    """A descriptor of a new, empty file with no name on disk (``memfd`` where the OS has it, an
    unlinked temporary file elsewhere): nothing is left behind when its last holder exits."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create(name, os.MFD_CLOEXEC)
    with tempfile.TemporaryFile() as handle:  # pragma: no cover - macOS
        return os.dup(handle.fileno())
