"""Counting samples skipped by ``on_error="skip"`` across a reader and all its DataLoader workers.

The count lives in an 8-byte anonymous file (memfd) that every process holding the reader shares;
increments take a ``lockf`` record lock, which vanishes with its holder, so a killed worker leaves
nothing behind. Sent to workers as a passed descriptor (multiprocessing's pickler, under fork,
spawn or forkserver); a reader pickled any other way starts a count of its own.
"""

from __future__ import annotations

import fcntl
import os
import struct
import warnings
from multiprocessing import reduction
from typing import Any

from packer.files.fileio import anonymous_file

__all__ = ["SkipCounter", "SkippedSampleWarning"]

_Q = struct.Struct("<q")


class SkippedSampleWarning(UserWarning):
    """A corrupt sample was skipped (``on_error="skip"``); the message names file, sample and offset."""


class SkipCounter:
    """A count shared by every process that holds it."""

    def __init__(self, fd: int | None = None) -> None:
        if fd is None:
            fd = anonymous_file("packer-skips")
            os.pwrite(fd, _Q.pack(0), 0)
        self.fd = fd

    @property
    def value(self) -> int:
        """Skips so far, in every process."""
        data = os.pread(self.fd, 8, 0)
        return _Q.unpack(data)[0] if len(data) == 8 else 0

    def add(self, n: int = 1) -> int:
        """Count ``n`` more skips; return the new total."""
        fcntl.lockf(self.fd, fcntl.LOCK_EX)
        try:
            total = self.value + n
            os.pwrite(self.fd, _Q.pack(total), 0)
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)
        return total

    def warn(self, message: str) -> None:
        """Count one skip and issue a :class:`SkippedSampleWarning` with ``message``."""
        total = self.add()
        warnings.warn(f"{message} (skipped; {total} skipped so far)", SkippedSampleWarning, stacklevel=3)

    def __reduce__(self) -> tuple[Any, ...]:
        return SkipCounter, ()  # plain pickle: a fresh count

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass


def _rebuild(dup_fd: Any) -> SkipCounter:
    return SkipCounter(dup_fd.detach())


def _reduce(counter: SkipCounter) -> tuple[Any, ...]:
    return _rebuild, (reduction.DupFd(counter.fd),)


reduction.ForkingPickler.register(SkipCounter, _reduce)
