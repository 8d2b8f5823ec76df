"""Opening packed files safely, and reading their bytes into buffers the caller owns.

:func:`open_regular` opens only regular files: never through a symlink, never blocking on a FIFO.
:func:`read_source_file` reads a source file (an image to convert, a list) the same way, bounded.

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

from ..errors import CorruptDataError

__all__ = ["pread_buffer", "open_regular", "read_source_file", "open_source_file", "NotReadableError", "anonymous_file"]

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


class NotReadableError(ValueError):
    """A source path that is not a regular file, or one larger than the caller allows; the message
    says which (``a FIFO``, ``a character device``, ``12 GiB, more than ...``)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a file"


def open_source_file(path: str, max_bytes: int) -> tuple[int, os.stat_result]:
    """Open a source file (symlinks followed, as in an image folder) and return ``(fd, fstat)``.

    The check is on the opened descriptor (``fstat``), never a ``stat`` before the open, and the
    open never blocks on a FIFO. Raises OSError when it cannot be opened and NotReadableError when
    it is not a regular file or is larger than ``max_bytes``.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotReadableError(f"not a regular file ({_kind(st.st_mode)}); not read")
        if st.st_size > max_bytes:
            raise NotReadableError(f"{st.st_size} bytes, more than the {max_bytes} read from one source file; "
                                   f"not read")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_source_file(path: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``path``, at most ``max_bytes``, and its ``fstat`` taken on the
    descriptor they were read from (see :func:`open_source_file`; a file that grows past the bound
    while being read raises NotReadableError too)."""
    fd, st = open_source_file(path, max_bytes)
    size = st.st_size
    try:
        chunks: list[bytes] = []
        got = 0
        while True:  # the size fstat gave, then one more read to see the end (a file may still grow)
            chunk = os.read(fd, min(max(size - got, 0) + 1, max_bytes - got + 1))
            if not chunk:
                break
            got += len(chunk)
            if got > max_bytes:
                raise NotReadableError(f"grew past the {max_bytes} bytes read from one source file; not read")
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks), st


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
