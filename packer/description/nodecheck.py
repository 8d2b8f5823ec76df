"""Checks made once per node: a stamp per checked file (and part of it) in a node-local folder.

A sample table is checked before it is used (CRC32C, offsets in order): a version 3 table a
section at a time, its labels at open and its keys, metadata and boxes when first read (one stamp
each, ``what`` naming the section); a table of version 1 or 2 whole, which at 100M samples reads
gigabytes. :func:`check_once` runs such a check in the first process
on a node that opens the file, under a lock so that ranks and DataLoader workers starting
together wait for it instead of repeating it, and leaves a stamp naming the file's identity
(device, inode, size, modification and change times, and what was checked) once the file is
two seconds old (:data:`SETTLED_NS`; a fresher file is checked at every open). Every later open
on the node that finds the stamp skips the check, so it touches only the pages it reads. Any
write to the file changes its times, hence its stamp, and the next open checks it again.

The folder: ``$PACKER_CHECKED_DIR``, else ``/dev/shm`` (else the temporary folder), in a
subfolder ``packer-checked-UID`` private to the user (mode 0700); where it cannot be made or
is not private, every open checks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Callable

__all__ = ["check_once", "stamp_folder", "scan_file", "SETTLED_NS", "SCAN_BYTES"]

#: A file is stamped only once its modification and change times are this old (ns): file times
#: advance by clock ticks, so a write in the same tick as the check would keep the stamp's name;
#: a write after the stamp always moves them past this margin.
SETTLED_NS = 2_000_000_000


def stamp_folder() -> str | None:
    """The private node-local folder of the stamps (made if missing), or None where none can be used."""
    base = os.environ.get("PACKER_CHECKED_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    folder = os.path.join(base, f"packer-checked-{os.getuid()}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return folder


def _stamp_name(fd: int, what: str) -> str | None:
    st = os.fstat(fd)
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < SETTLED_NS:
        return None
    ident = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{what}"
    return hashlib.blake2b(ident.encode(), digest_size=16).hexdigest()


def check_once(fd: int, what: str, check: Callable[[], None]) -> bool:
    """Run ``check()`` (which raises when the file open on ``fd`` is bad) unless a process on this
    node already ran it on this same file for ``what``; True when it ran here. The first process
    holds a lock while it checks, and leaves the stamp only when ``check`` returned."""
    folder = stamp_folder()
    name = _stamp_name(fd, what) if folder is not None else None
    if folder is None or name is None:
        check()
        return True
    stamp = os.path.join(folder, name)
    if os.path.exists(stamp):
        return False
    lock = os.open(stamp + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(stamp):  # another process checked it while this one waited
            return False
        check()
        with contextlib.suppress(OSError):
            os.close(os.open(stamp, os.O_WRONLY | os.O_CREAT, 0o600))
        return True
    finally:
        os.close(lock)  # closing releases the lock


#: Bytes a whole-file check reads at a time (into one buffer: the file is never mapped whole).
SCAN_BYTES = 16 << 20


def scan_file(fd: int, start: int, end: int, ordered: list[tuple[int, int, int]], crc: int = 0) -> tuple[int, int | None]:
    """Read bytes ``start`` .. ``end`` of the file open on ``fd`` through one reused buffer:
    their CRC32C (continuing ``crc``), and the first of the ``ordered`` sections (``(offset,
    count, last)``: ``count`` little-endian u64 at an 8-byte-aligned ``offset`` that must not
    decrease and must end at ``last``) that fails, by position in the list, or None. Reading with
    ``preadv`` rather than through a mapping costs no page faults and leaves no pages mapped in
    this process: only the page cache holds the file, for every process of the node."""
    import crc32c
    import numpy as np

    buf = bytearray(min(SCAN_BYTES, max(0, end - start)) or 1)
    view = memoryview(buf)
    prev = [-1] * len(ordered)
    bad: int | None = None
    pos = start
    while pos < end:
        want = min(len(buf), end - pos)
        got = os.preadv(fd, [view[:want]], pos)
        if got != want:
            raise OSError(f"short read at {pos}: {got} of {want} bytes")
        crc = crc32c.crc32c(view[:want], crc)
        for k, (offset, count, _last) in enumerate(ordered):
            lo, hi = max(offset, pos), min(offset + 8 * count, pos + want)
            if bad is not None or lo >= hi:
                continue
            vals = np.frombuffer(buf, "<u8", (hi - lo) // 8, lo - pos)  # sections and chunks: 8-aligned
            if len(vals) and (int(vals[0]) < prev[k] or bool(np.any(vals[1:] < vals[:-1]))):
                bad = k
            elif len(vals):
                prev[k] = int(vals[-1])
        pos += want
    if bad is None:
        bad = next((k for k, (_o, count, last) in enumerate(ordered) if count and prev[k] != last), None)
    return crc, bad
