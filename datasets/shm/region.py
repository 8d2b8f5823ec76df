"""Shared memory for a process and its DataLoader workers: a region, views of it, a slot table.

:class:`SharedRegion` is anonymous shared memory and :class:`SlotTable` named int64 fields in a
region (the locks and node-named segments: :mod:`packer.datasets.shm.locks`). A region is a
``memfd`` file with no name anywhere (an unlinked temporary file where ``memfd_create`` is
missing), so nothing is left in ``/dev/shm`` after Ctrl-C, SIGKILL of the whole process group or
a crash: the kernel frees it with its last holder. It reaches DataLoader workers under fork
(inherited), spawn and forkserver (sent as a file descriptor by multiprocessing's pickler,
``reduction.DupFd``); the standard ``pickle`` module refuses it, since a copy would silently stop
being shared.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Sequence
from multiprocessing import reduction
from typing import Any

import numpy as np

from packer.files.fileio import anonymous_file

__all__ = ["OwnedDescriptor", "SharedRegion", "SharedBytes", "region_views", "SlotTable", "int64_rows"]


class OwnedDescriptor:
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


class SharedRegion(OwnedDescriptor):
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


class SharedBytes:
    """Read-only bytes in a shared region: slicing gives ``bytes``, as the bytes object it stands for."""

    def __init__(self, buffer: Any, offset: int, size: int) -> None:
        self.view, self.size = memoryview(buffer)[offset : offset + size], size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: slice) -> bytes:
        return self.view[i].tobytes()


def region_views(region: SharedRegion, layout: Sequence[tuple[str, str, int, Any]]) -> dict[str, Any]:
    """Read-only views of parts of ``region``, by name: for each ``(name, dtype, offset, shape)``
    a NumPy array of that dtype and shape (an int: that many items) at byte ``offset``, or, with
    the dtype ``"bytes"``, :class:`SharedBytes` of ``shape`` bytes."""
    out: dict[str, Any] = {}
    for name, dtype, offset, shape in layout:
        if dtype == "bytes":
            out[name] = SharedBytes(region.buffer, offset, shape)
            continue
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        view = np.frombuffer(region.buffer, np.dtype(dtype), count=math.prod(dims), offset=offset).reshape(dims)
        view.flags.writeable = False
        out[name] = view
    return out


def _rebuild_region(dup_fd: Any, size: int, name: str) -> SharedRegion:
    return SharedRegion(size, name, fd=dup_fd.detach())


def _reduce_region(region: SharedRegion) -> tuple:
    if region.fd is None:
        raise ValueError(f"cannot send the closed shared memory {region.name!r} to another process")
    return _rebuild_region, (reduction.DupFd(region.fd), region.size, region.name)



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
# descriptor; fork children inherit it.
reduction.ForkingPickler.register(SharedRegion, _reduce_region)
