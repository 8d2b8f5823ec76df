"""Whole-file checks made once per node: a stamp per checked file in a node-local folder.

A sample table is checked whole (CRC32C of every section, offsets in order) before it is used;
at 100M samples that reads gigabytes. :func:`check_once` runs such a check in the first process
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

__all__ = ["check_once", "stamp_folder", "SETTLED_NS"]

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
