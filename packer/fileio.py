"""Reading file bytes into buffers the caller owns, without the copies ``os.pread`` implies.

``os.pread`` returns ``bytes``: read-only, so a reader that wants a writable array (a ``raw``
payload handed to the user as pixels) must copy it again, and slicing a record out of it copies
once more. :func:`pread_buffer` reads into a fresh, uninitialised NumPy buffer with
``os.preadv`` and returns a writable ``memoryview``: slicing it is free, and
``np.frombuffer`` over it is a writable array that nothing else references.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["pread_buffer"]


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
