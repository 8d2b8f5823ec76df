"""Per-sample HDF5 datasets read where they lie in the file, through one read-only memory mapping.

A local ``data.h5`` whose index datasets (/labels, /shapes, /crc32c, /offsets, /codecs,
/key_crc32c and the fields' columns) are stored without filters, little-endian, either contiguous
or in whole chunks along the rows (what packer's writer produces: 8192 rows a chunk), is not read
into memory: each column is a :class:`MappedColumn`, a table of where its pieces lie (8 bytes per
chunk) over a ``mmap`` of the file. Every rank and DataLoader worker on a node then reads the same
pages of the page cache; a process holds O(chunks) of its own, and a spawned worker receives the
piece table and maps the file again through its own descriptor (:meth:`MappedColumn.bind`).
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import sys
from collections.abc import Iterator
from typing import Any

import h5py
import numpy as np

from packer.errors import CorruptDataError

__all__ = ["MappedColumn", "ConstColumn", "NotMappable", "mapped_column", "map_file", "local_mappable", "file_identity",
           "int64_offsets", "ascending", "all_in"]

#: Rows that one step of a whole-column pass (a CRC, a monotonicity check) looks at at once.
PASS_ROWS = 1 << 20


class NotMappable(Exception):
    """The dataset is not stored as plain little-endian rows in the file: read it instead."""


class MappedColumn:
    """The rows of one HDF5 dataset at their file offsets: ``col[i]`` reads row ``i`` (a NumPy
    scalar, or a 1-D array for a 2-D dataset) from the mapping; ``np.asarray(col)`` copies."""

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...], rows: int, addrs: np.ndarray,
                 mapping: mmap.mmap) -> None:
        """``shape``: the dataset's; ``rows``: rows per piece; ``addrs``: each piece's file offset."""
        self.dtype, self.shape, self.rows, self.addrs = dtype, shape, rows, addrs
        self.ndim = len(shape)
        self._width = math.prod(shape[1:])
        self._mm: mmap.mmap | None = mapping
        self._last = (-1, None)

    def __getstate__(self) -> dict[str, Any]:
        """The piece table only: the receiving process maps the file again (:meth:`bind`)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_mm", "_last")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._mm, self._last = None, (-1, None)

    @property
    def bound(self) -> bool:
        """Whether this process has the file mapped for this column."""
        return self._mm is not None

    def bind(self, mapping: mmap.mmap) -> None:
        """Read from ``mapping`` (this process's map of the same file) from now on."""
        self._mm, self._last = mapping, (-1, None)

    def __len__(self) -> int:
        return self.shape[0]

    def _piece(self, c: int) -> np.ndarray:
        """Piece ``c``'s rows as a read-only view of the mapping."""
        if self._mm is None:
            raise RuntimeError("index column used before the file was mapped in this process")
        count = min(self.rows, self.shape[0] - c * self.rows)
        view = np.frombuffer(self._mm, self.dtype, count * self._width, int(self.addrs[c]))
        return view.reshape(count, *self.shape[1:])

    def __getitem__(self, i: Any) -> Any:
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"a mapped index column takes one row number, not {type(i).__name__}")
        i = int(i)
        n = self.shape[0]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} out of range for {n} rows")
        c, r = divmod(i, self.rows)
        last_c, view = self._last
        if c != last_c:
            view = self._piece(c)
            self._last = (c, view)
        return view[r]

    def blocks(self) -> Iterator[np.ndarray]:
        """The rows in order, as views of at most about :data:`PASS_ROWS` rows (a whole pass reads
        the shared pages; nothing is copied)."""
        for c in range(len(self.addrs)):
            piece = self._piece(c)  # a chunk (8,192 rows as packer writes them), or the whole contiguous column
            for s in range(0, len(piece), PASS_ROWS):
                yield piece[s : s + PASS_ROWS]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        pos = 0
        for b in self.blocks():
            out[pos : pos + len(b)] = b
            pos += len(b)
        return out if dtype is None else out.astype(dtype, copy=False)


class ConstColumn:
    """A per-sample value that is the same for every sample (a field's one codec or depth)."""

    def __init__(self, value: int, n: int) -> None:
        self.value, self.shape, self.ndim = np.uint8(value), (n,), 1

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, i: Any) -> Any:
        return self.value


def mapped_column(d: h5py.Dataset, mapping: mmap.mmap, size: int, path: str) -> MappedColumn:
    """Dataset ``d`` as a :class:`MappedColumn` over ``mapping`` (a map of the ``size``-byte file);
    :class:`NotMappable` unless its rows are stored plainly (no filter, little-endian integers,
    contiguous or in whole chunks that span the row); CorruptDataError if they lie outside the file."""
    dtype = d.dtype
    if dtype.kind not in "iu" or dtype.byteorder == ">" or (dtype.byteorder == "=" and not _little()):
        raise NotMappable(d.name)
    dcpl = d.id.get_create_plist()
    if dcpl.get_nfilters() or not d.shape:
        raise NotMappable(d.name)
    n = d.shape[0]
    row_bytes = math.prod(d.shape[1:]) * dtype.itemsize
    layout = dcpl.get_layout()
    if layout == h5py.h5d.CONTIGUOUS:
        offset = d.id.get_offset()
        if offset is None:  # never written (HDF5 would give fill values)
            raise NotMappable(d.name)
        rows, addrs = max(n, 1), np.array([offset] if n else [], np.int64)
    elif layout == h5py.h5d.CHUNKED and d.chunks is not None and tuple(d.chunks[1:]) == tuple(d.shape[1:]):
        rows = d.chunks[0]
        addrs = _chunk_addrs(d, rows, -(-n // rows), rows * row_bytes)
    else:
        raise NotMappable(d.name)
    pieces = len(addrs)
    for c in range(pieces):
        end = int(addrs[c]) + min(rows, n - c * rows) * row_bytes
        if addrs[c] < 0 or end > size:
            raise CorruptDataError(f"{d.name} rows at {int(addrs[c])}..{end} lie outside the file ({size} bytes)",
                                   path=path, offset=int(addrs[c]))
    return MappedColumn(dtype, tuple(d.shape), rows, addrs, mapping)


def _chunk_addrs(d: h5py.Dataset, rows: int, nchunks: int, chunk_bytes: int) -> np.ndarray:
    """The file offset of each of the ``nchunks`` chunks; NotMappable if one is missing or not
    stored as ``chunk_bytes`` plain bytes."""
    addrs = np.full(nchunks, -1, np.int64)

    def visit(info: Any) -> None:
        c = info.chunk_offset[0] // rows
        if c < nchunks and info.size == chunk_bytes and info.filter_mask == 0:
            addrs[c] = info.byte_offset

    try:
        d.id.chunk_iter(visit)
    except (AttributeError, NotImplementedError):  # HDF5 < 1.12.3
        zeros = (0,) * (d.ndim - 1)
        for c in range(nchunks):
            info = d.id.get_chunk_info_by_coord((c * rows, *zeros))
            if info.byte_offset is not None and info.size == chunk_bytes and not info.filter_mask:
                addrs[c] = info.byte_offset
    if nchunks and addrs.min() < 0:
        raise NotMappable(d.name)
    return addrs


def int64_offsets(a: np.ndarray | MappedColumn) -> np.ndarray | MappedColumn:
    """Offsets read into memory as int64 (a mapped column keeps its stored integers)."""
    return a.astype(np.int64) if isinstance(a, np.ndarray) else a


def ascending(a: np.ndarray | MappedColumn) -> bool:
    """Whether ``a`` never decreases (a mapped column checked block by block over its pages)."""
    if isinstance(a, np.ndarray):
        return not np.any(np.diff(a) < 0)
    last = None
    for b in a.blocks():
        if len(b) and ((last is not None and b[0] < last) or np.any(b[1:] < b[:-1])):
            return False
        last = b[-1] if len(b) else last
    return True


def all_in(a: Any, allowed: list[int] | tuple[int, ...]) -> bool:
    """Whether every value of ``a`` (an array, a mapped column or one value) is in ``allowed``."""
    if isinstance(a, MappedColumn):
        return all(np.isin(b, allowed).all() for b in a.blocks())
    return bool(np.isin(a, allowed).all())


def _little() -> bool:
    return sys.byteorder == "little"


def map_file(fd: int) -> mmap.mmap:
    """A read-only map of the whole file open as ``fd``."""
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


def file_identity(fd: int) -> tuple[int, int, int, int]:
    """(device, inode, size, modification time) of the file open as ``fd``."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def local_mappable(fd: int | None) -> bool:
    """Whether a file open as ``fd`` can be mapped (a local, non-empty regular file)."""
    if fd is None:
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0
