"""``HDF5Dataset``: map-style reader for packed HDF5 files (layout: packer.layouts.hdf5); how it
reads without h5py, under fork and spawn, and what it refuses: docs/datasets.md ("HDF5Dataset").
"""

from __future__ import annotations

import bisect
import copy
import math
import os
from collections.abc import Collection
from multiprocessing.context import get_spawning_popen
from typing import Any

import crc32c
import h5py
import numpy as np

from packer.description.placement import place_seed
from packer.description.record import Record
from packer.errors import CorruptDataError
from packer.images.codecs import CODEC_IDS, CODEC_NAMES
from packer.images.imageproc import ProcessedField
from packer.images.placeholder import file_placeholder_reason
from packer.layouts.hdf5 import FIELDS_LAYOUT_VERSION, LAYOUT_VERSIONS, field_group
from packer.storage.ranges import coalesce

from ..base import PackedDataset
from ..shm.region import SharedRegion, region_views
from .hdf5map import (
    ConstColumn,
    MappedColumn,
    NotMappable,
    all_in,
    ascending,
    file_identity,
    int64_offsets,
    local_mappable,
    map_file,
    mapped_column,
)

__all__ = ["HDF5Dataset"]

_KEY_BLOCK = 8192
_CODEC_NAMES = CODEC_NAMES
#: A dataset's rows must be stored in the file before they are read into memory: byte for byte
#: without a filter, and at most this many times their stored size with one (deflate, the filter
#: ``h5repack`` uses, cannot expand more than 1032:1). So an 8 kB file cannot make a reader
#: allocate gigabytes for rows it only declares.
_MAX_INFLATION = 1100
#: /images chunks smaller than this are read through h5py instead of a table of chunk addresses
#: (the table costs 8 bytes per chunk; packer writes 1 MiB chunks).
_MIN_TABLE_CHUNK = 64 << 10
#: Index arrays of at least this size go to spawn/forkserver workers in shared memory.
SHARE_INDEX_BYTES = 1 << 20
#: Map a local file's index datasets where they lie (datasets.formats.hdf5map) when they are
#: stored plainly; False: read them into memory, as for a remote file.
MAP_INDEX = True


def _h5open(path: str, fd: int | None = None) -> h5py.File:
    """Open read-only without HDF5 file locks; if this process already has the file open with
    locking (a user's own ``h5py.File``), HDF5 requires the same flag, so follow it.

    With ``fd`` (Linux), HDF5 opens that very file through ``/proc/self/fd``, not whatever the
    path names by now."""
    if fd is not None and os.path.isdir("/proc/self/fd"):
        path = f"/proc/self/fd/{fd}"
    try:
        return h5py.File(path, "r", locking=False)
    except OSError as e:
        if "locking flag" not in str(e):
            raise
        return h5py.File(path, "r")


class _Meta:
    """What one process needs to read samples: per-sample arrays and where ``/images`` lives.

    Loaded once per dataset object and kept across a fork (a worker reads the arrays its parent
    loaded, the pages shared), or sent to spawn/forkserver workers in one shared region
    (:meth:`share`): the index exists once per node, not once per worker."""

    #: The per-sample (and per-chunk) arrays; the rest of the attributes are small. ``f_*``: the
    #: fields' (version 3), one row per mask or extra image.
    ARRAYS = ("labels", "shapes", "crcs", "key_crcs", "codecs", "offsets", "table",
              "f_offsets", "f_shapes", "f_crcs", "f_codecs", "f_depths")

    def __init__(self, path: str, num_samples: int, verify: bool, fd: int | None = None,
                 fields: tuple[str, ...] | None = None, source: Any = None, size: int | None = None,
                 mappable: bool = True) -> None:
        """The index of ``path``; ``fields``: the stored fields a version 3 manifest lists (None
        before version 3). ``source``: a file object to read instead (a remote file read by
        range, of ``size`` bytes). ``mappable``: False reads the index (a copy of a remote file)."""
        self.path = path
        self.fd = fd
        self.fields = fields
        self.size = size if size is not None else os.fstat(fd).st_size if fd is not None else os.path.getsize(path)
        try:
            f = h5py.File(source, "r") if source is not None else _h5open(path, fd)
        except Exception as e:  # noqa: BLE001 - any h5py/HDF5 failure to open is a bad file
            why = file_placeholder_reason(path)
            raise CorruptDataError(f"{path} is {why}" if why else f"unreadable HDF5 file ({type(e).__name__}: {e})",
                                   path=path) from None
        self._mapping = map_file(fd) if MAP_INDEX and mappable and source is None and local_mappable(fd) else None
        self.identity = file_identity(fd) if self._mapping is not None else None
        try:
            with f:
                try:
                    self._load(f, num_samples, verify)
                except NotMappable:  # a dataset stored compressed, big-endian, ...: read them all
                    self._mapping = None
                    self._load(f, num_samples, verify)
        except CorruptDataError:
            raise
        except Exception as e:  # noqa: BLE001 - HDF5 reports damage as OSError, KeyError, RuntimeError, ...
            raise CorruptDataError(f"unreadable HDF5 file ({type(e).__name__}: {e})", path=path) from None
        finally:
            self.mapped = self._mapping is not None
            del self._mapping  # held by the columns only (never pickled)

    def columns(self) -> list[MappedColumn]:
        """The index columns read through a map of the file (none when read into memory)."""
        out: list[MappedColumn] = []
        for name in self.ARRAYS:
            a = getattr(self, name, None)
            out.extend(c for c in (a if isinstance(a, list) else [a]) if isinstance(c, MappedColumn))
        return out

    def reopened(self, fd: int) -> _Meta | None:
        """This index for a process that opened the file again as ``fd`` (the arrays shared);
        None when its columns must be mapped again but ``fd`` is another file than the one checked."""
        meta = copy.copy(self)
        meta.fd = fd
        unbound = [c for c in meta.columns() if not c.bound]  # a spawned worker's: map its own descriptor
        if unbound:
            if file_identity(fd) != self.identity:
                return None  # another file by now: load (and check) its index again
            mapping = map_file(fd)
            for c in unbound:
                c.bind(mapping)
        return meta

    def share(self) -> tuple[SharedRegion, list[tuple[str, str, int, tuple[int, ...]]], dict[str, Any]]:
        """Move the large arrays into one shared region (read-only views here too) and return
        what :meth:`from_shared` rebuilds this index from in another process."""
        big = [(name, a) for name in self.ARRAYS
               if isinstance(a := getattr(self, name, None), np.ndarray) and a.nbytes >= SHARE_INDEX_BYTES]
        layout, size = [], 0
        for name, a in big:
            layout.append((name, a.dtype.str, size, a.shape))
            size += -(-a.nbytes // 64) * 64  # every array 64-byte aligned
        region = SharedRegion(max(size, 1), "packer-hdf5-index")
        for (_, a), (_, _, offset, _) in zip(big, layout):
            region.buffer[offset : offset + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        self.__dict__.update(region_views(region, layout))
        small = {k: v for k, v in vars(self).items() if k not in {name for name, *_ in layout}}
        return region, layout, small

    @classmethod
    def from_shared(cls, region: SharedRegion, layout: list[tuple[str, str, int, tuple[int, ...]]],
                    small: dict[str, Any]) -> _Meta:
        """The index that :meth:`share` sent, its large arrays views of the shared region."""
        meta = cls.__new__(cls)
        meta.__dict__.update(small)
        meta.__dict__.update(region_views(region, layout))
        return meta

    def _stored_limit(self, d: h5py.Dataset, name: str) -> int:
        """The most bytes of ``d`` that the file can hold (see ``_MAX_INFLATION``)."""
        stored = d.id.get_storage_size()
        if stored > self.size:
            raise CorruptDataError(f"/{name} claims {stored} stored bytes, more than the file's {self.size}",
                                   path=self.path)
        return stored * (_MAX_INFLATION if d.id.get_create_plist().get_nfilters() else 1)

    def _stored_rows(self, f: h5py.File, name: str, rows: int) -> h5py.Dataset:
        """Per-sample dataset ``name``, checked to have ``rows`` rows, all stored in the file."""
        d = f[name]
        have = d.shape[0] if d.shape else 0
        if have != rows:
            raise CorruptDataError(f"/{name} has {have} rows, the manifest says {rows}", path=self.path)
        declared = d.size * d.dtype.itemsize
        if declared > self._stored_limit(d, name):
            raise CorruptDataError(f"/{name} declares {declared} bytes of rows, but they are not stored in the "
                                   f"file ({d.id.get_storage_size()} bytes stored)", path=self.path)
        return d

    def _rows(self, f: h5py.File, name: str, rows: int, verify: bool) -> np.ndarray:
        """Per-sample dataset ``name`` read into memory once its rows are known to be stored in the
        file, checked against its ``crc32c`` attribute."""
        return self._check(f, name, self._stored_rows(f, name, rows)[()], verify)

    def _col(self, f: h5py.File, name: str, rows: int, verify: bool) -> np.ndarray | MappedColumn:
        """Per-sample dataset ``name`` as :meth:`_rows` gives it, or, for a local file whose
        dataset is stored plainly, mapped where it lies (its CRC computed over the mapped pages)."""
        if self._mapping is None:
            return self._rows(f, name, rows, verify)
        d = self._stored_rows(f, name, rows)
        col = mapped_column(d, self._mapping, self.size, self.path)
        if verify and "crc32c" in d.attrs:
            stored, actual = int(d.attrs["crc32c"]), 0
            for b in col.blocks():
                actual = crc32c.crc32c(b, actual)
            if stored != actual:
                raise CorruptDataError(f"/{name} checksum mismatch (stored {stored:08x}, computed {actual:08x})",
                                       path=self.path, offset=int(col.addrs[0]) if len(col.addrs) else None)
        return col

    def _check(self, f: h5py.File, name: str, a: np.ndarray, verify: bool) -> np.ndarray:
        if a.dtype.kind not in "iu":
            raise CorruptDataError(f"/{name} has dtype {a.dtype}, expected integers", path=self.path)
        if verify and "crc32c" in f[name].attrs:
            stored = int(f[name].attrs["crc32c"])
            actual = crc32c.crc32c(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
            if stored != actual:
                raise CorruptDataError(
                    f"/{name} checksum mismatch (stored {stored:08x}, computed {actual:08x})",
                    path=self.path, offset=f[name].id.get_offset(),
                )
        return a

    def _load(self, f: h5py.File, n: int, verify: bool) -> None:
        version = f.attrs.get("packer_layout")
        if version not in LAYOUT_VERSIONS:
            raise CorruptDataError(f"HDF5 layout version {version!r} is not one of {LAYOUT_VERSIONS}", path=self.path)
        if (version == FIELDS_LAYOUT_VERSION) != (self.fields is not None):
            raise CorruptDataError(f"HDF5 layout version {version} in a version {3 if self.fields is not None else 2} "
                                   f"dataset (the file and the manifest disagree on fields)", path=self.path)
        self.file_id = str(f.attrs.get("file_id", ""))
        self.storage = str(f.attrs["storage"])
        for name in ("labels", "shapes", "crc32c", "offsets", "codecs", "key_crc32c", "images"):
            if name in f and (not isinstance(f[name], h5py.Dataset) or f[name].dtype.kind not in "iu"):
                raise CorruptDataError(f"/{name} is not an integer dataset (dtype "
                                       f"{getattr(f[name], 'dtype', 'group')})", path=self.path)
        self.labels = self._col(f, "labels", n, verify)
        if isinstance(self.labels, MappedColumn) and self.labels.dtype != np.int64:
            raise NotMappable("labels")
        self.labels = self.labels.astype(np.int64, copy=False) if isinstance(self.labels, np.ndarray) else self.labels
        self.shapes = self._col(f, "shapes", n, verify)
        self.crcs = self._col(f, "crc32c", n, verify)
        self.key_crcs = self._col(f, "key_crc32c", n, verify) if "key_crc32c" in f else None
        if "keys" in f:  # read in blocks by read_record: checked here, before any block is
            self._stored_rows(f, "keys", n)
        codec = str(f.attrs["codec"])
        self.codec = codec if codec != "mixed" else None
        self.codecs = self._col(f, "codecs", n, verify) if codec == "mixed" else None
        images = f["images"]
        if self.storage == "flat":
            self.offsets = int64_offsets(self._col(f, "offsets", n + 1, verify))
            total = images.shape[0]
            bad = len(self.offsets) != n + 1 or self.offsets[0] != 0 or self.offsets[-1] > total
            if bad or not ascending(self.offsets):
                raise CorruptDataError("/offsets inconsistent with /images or the manifest", path=self.path)
            self.row = 0
        elif self.storage == "array":
            if images.ndim != 4 or images.shape[0] != n or images.shape[3] != 3:
                raise CorruptDataError(f"/images has shape {images.shape}, expected ({n}, H, W, 3)", path=self.path)
            self.row = math.prod(images.shape[1:])  # Python ints: a forged extent cannot wrap to 0
            self.offsets = None
        else:
            raise CorruptDataError(f"unknown storage {self.storage!r}", path=self.path)
        if self.shapes.ndim != 2 or self.shapes.shape[1:] != (2,):
            raise CorruptDataError(f"/shapes has shape {self.shapes.shape}, expected (N, 2)", path=self.path)
        arrays = [("labels", self.labels), ("shapes", self.shapes), ("crc32c", self.crcs)]
        if self.key_crcs is not None:
            arrays.append(("key_crc32c", self.key_crcs))
        for name, a in arrays:
            if len(a) != n:
                raise CorruptDataError(f"/{name} has {len(a)} rows, the manifest says {n} samples", path=self.path)
        if self.codecs is not None and (len(self.codecs) != n or not all_in(self.codecs, list(_CODEC_NAMES))):
            raise CorruptDataError("/codecs inconsistent", path=self.path)
        if self.codec is not None and self.codec not in CODEC_IDS:
            raise CorruptDataError(f"unknown codec {self.codec!r}", path=self.path)
        needed = int(self.offsets[-1]) if self.offsets is not None else n * self.row
        if needed > self._stored_limit(images, "images"):
            raise CorruptDataError(f"the samples need {needed} bytes of /images, but they are not stored in the "
                                   f"file ({images.id.get_storage_size()} bytes stored)", path=self.path)
        self.base, self.table, self.chunk = _where(images, needed)
        self._load_fields(f, n, verify)

    def _load_fields(self, f: h5py.File, n: int, verify: bool) -> None:
        """Version 3: each stored field's offsets, shapes, checksums, codecs, bits and where its
        bytes lie, checked as /images's are."""
        names = self.field_names = self.fields or ()
        k = len(names)
        if self._mapping is not None:  # one column per field (row j: field j), none of them copied
            self.f_offsets, self.f_shapes, self.f_crcs, self.f_codecs, self.f_depths = [], [], [], [], []
        else:
            self.f_offsets = np.zeros((k, n + 1), np.int64)
            self.f_shapes = np.zeros((k, n, 2), np.uint32)
            self.f_crcs = np.zeros((k, n), np.uint32)
            self.f_codecs = np.zeros((k, n), np.uint8)
            self.f_depths = np.zeros((k, n), np.uint8)
        self.f_channels: list[int] = []
        self.f_where: list[tuple[int | None, np.ndarray | None, int]] = []
        for j, name in enumerate(names):
            self._load_field(f, j, field_group(name), n, verify)

    def _load_field(self, f: h5py.File, j: int, p: str, n: int, verify: bool) -> None:
        g = f.get(p)
        images = g.get("images") if isinstance(g, h5py.Group) else None
        if not isinstance(images, h5py.Dataset) or images.ndim != 1 or images.dtype != np.uint8:
            raise CorruptDataError(f"/{p} is not a group with a flat uint8 /{p}/images (the manifest lists the field)",
                                   path=self.path)
        offsets = int64_offsets(self._col(f, f"{p}/offsets", n + 1, verify))
        if offsets[0] != 0 or offsets[-1] > images.shape[0] or not ascending(offsets):
            raise CorruptDataError(f"/{p}/offsets inconsistent with /{p}/images", path=self.path)
        shapes = self._col(f, f"{p}/shapes", n, verify)
        if shapes.shape != (n, 2):
            raise CorruptDataError(f"/{p}/shapes has shape {shapes.shape}, expected ({n}, 2)", path=self.path)
        crcs = self._col(f, f"{p}/crc32c", n, verify)
        codec, depth, channels = (_plain(g.attrs.get(a)) for a in ("codec", "depth", "channels"))
        codecs = self._col(f, f"{p}/codecs", n, verify) if codec == "mixed" else CODEC_IDS.get(str(codec))
        depths = self._col(f, f"{p}/depths", n, verify) if depth == 0 else depth
        if codecs is None or not all_in(codecs, list(_CODEC_NAMES)) or not all_in(depths, (8, 16)):
            raise CorruptDataError(f"/{p} has codec {codec!r} and depth {depth!r}: not a known codec of 8 or 16 bits",
                                   path=self.path)
        if channels not in (1, 3):
            raise CorruptDataError(f"/{p} has {channels!r} channels, expected 1 or 3", path=self.path)
        if isinstance(self.f_offsets, list):
            self.f_offsets.append(offsets)
            self.f_shapes.append(shapes)
            self.f_crcs.append(crcs)
            self.f_codecs.append(codecs if not np.isscalar(codecs) else ConstColumn(int(codecs), n))
            self.f_depths.append(depths if not np.isscalar(depths) else ConstColumn(int(depths), n))
        else:
            self.f_offsets[j], self.f_shapes[j], self.f_crcs[j] = offsets, shapes, crcs
            self.f_codecs[j], self.f_depths[j] = codecs, depths
        self.f_channels.append(int(channels))
        needed = int(offsets[-1])
        if needed > self._stored_limit(images, f"{p}/images"):
            raise CorruptDataError(f"the samples need {needed} bytes of /{p}/images, but they are not stored in the "
                                   f"file ({images.id.get_storage_size()} bytes stored)", path=self.path)
        self.f_where.append(_where(images, needed))


def _plain(value: Any) -> Any:
    """An attribute's value as Python has it (a NumPy scalar's ``item()``), for messages."""
    return value.item() if isinstance(value, np.generic) else value


def _where(images: h5py.Dataset, needed: int) -> tuple[int | None, np.ndarray | None, int]:
    """Where the bytes of ``images`` lie in the file: (base, None, 0) when contiguous, (None, a
    chunk table covering the ``needed`` bytes, chunk size) when chunked, or (None, None, 0): read
    through h5py (filters, small chunks, other dtypes)."""
    dcpl = images.id.get_create_plist()
    layout = dcpl.get_layout()
    if dcpl.get_nfilters() or images.dtype != np.uint8:
        return None, None, 0
    if layout == h5py.h5d.CONTIGUOUS:
        return images.id.get_offset(), None, 0
    if layout != h5py.h5d.CHUNKED or images.chunks is None:
        return None, None, 0
    chunks = images.chunks
    if any(c != s for c, s in zip(chunks[1:], images.shape[1:])):
        return None, None, 0  # chunks split a row: not a plain byte range
    rows = chunks[0]
    chunk = int(np.prod(chunks))
    if chunk < _MIN_TABLE_CHUNK:
        return None, None, 0
    nchunks = -(-needed // chunk)  # needed <= the bytes stored in the file (_load)
    table = np.full(nchunks, -1, np.int64)

    def visit(info: Any) -> None:
        c = info.chunk_offset[0] // rows
        if c < nchunks and info.size == chunk:
            table[c] = info.byte_offset

    try:
        images.id.chunk_iter(visit)
    except (AttributeError, NotImplementedError):  # HDF5 < 1.12.3: one B-tree lookup per chunk
        zeros = (0,) * (images.ndim - 1)
        for c in range(nchunks):
            info = images.id.get_chunk_info_by_coord((c * rows, *zeros))
            if info.byte_offset is not None and info.size == chunk:
                table[c] = info.byte_offset
    return None, table, chunk


class HDF5Dataset(PackedDataset):
    """Map-style dataset over a packed HDF5 directory (see :class:`PackedDataset` for options)."""

    format = "hdf5"
    _meta: _Meta | None = None
    _file: Any = None  # raw binary file object of data.h5 (os.pread on its descriptor)
    _h5: h5py.File | None = None  # only when /images must be read through h5py
    _keys: dict[int, list[str]] | None = None
    _file_boxes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # /box_offsets, /boxes, /box_labels
    #: ``packer verify`` sets this: every key is read from /keys (checked against /key_crc32c),
    #: so damage there is found, though the sample table holds the same keys.
    audit = False
    _shared_meta: tuple[SharedRegion, list[tuple[str, str, int, tuple[int, ...]]], dict[str, Any]] | None = None

    @property
    def _path(self) -> str:
        """The file's path, or its URL when read by range."""
        if self._ranged:
            return self._remote.url(self.data_file)  # type: ignore[union-attr]
        return os.path.join(self.root, self.data_file)

    def _h5file(self) -> h5py.File:
        """The data file opened by h5py (through the open descriptor, or by range from its URL)."""
        if self._ranged:
            return h5py.File(self._remote.file(self.data_file), "r")  # type: ignore[union-attr]
        return _h5open(self._path, self._file.fileno())

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Takes :class:`PackedDataset`'s arguments; also loads the index (module docstring)."""
        super().__init__(*args, **kwargs)
        if self._remote is None or self._ranged:
            # The index is loaded here, before any DataLoader worker starts, so forked workers
            # share this process's copy and spawned ones get it in shared memory (_Meta.share).
            # No handle stays open (a damaged file reports at its first read, as before).
            try:
                self._ensure_open()
            except CorruptDataError:
                pass
            meta = self._meta
            self.close()
            self._meta = meta

    def _open(self) -> None:
        try:
            self._open_file_and_index()
        except CorruptDataError:
            if self._remote is None or self._ranged or not getattr(self._remote, "fallback", False):
                raise
            self._open_file_and_index()  # a server without range requests (the index read failed): whole

    def _open_file_and_index(self) -> None:
        inherited = self._meta  # the parent's index (fork), or the one sent in shared memory (spawn)
        self._drop()  # the handles inherited through fork belong to the parent: never used
        path = self._path
        fields = tuple(self.manifest.stored_fields) if self.manifest.fields else None
        if self._ranged:  # read by range: the index through h5py's reads of the remote file, in blocks
            self._file = self._remote.file(self.data_file)  # type: ignore[union-attr]
            size, fd = self._file.length, None
        else:
            self._file = os.fdopen(self._open_file(self.data_file), "rb", buffering=0)
            fd = self._file.fileno()
            size = os.fstat(fd).st_size
        meta = None
        if inherited is not None and inherited.path == path and inherited.size == size:
            meta = inherited.reopened(fd)
        if meta is None:
            meta = _Meta(path, len(self), self.verify, fd, fields, source=self._file if fd is None else None, size=size,
                         mappable=self._remote is None)  # a dataset at a URL: its index read as before
            self._shared_meta = None  # of the index loaded before, if any
        self._fid = self.manifest.files[0].id if self.manifest.files else ""
        if self._fid != meta.file_id:  # the file's identity, cheap to check at open
            raise CorruptDataError(f"{path} is another file than the manifest names (file id "
                                   f"{meta.file_id or 'none'}, the manifest says {self._fid or 'none'})", path=path)
        if any(b is None and t is None for b, t, _ in [(meta.base, meta.table, 0), *meta.f_where]):
            self._h5 = self._h5file()
        self._meta = meta
        self._keys = {}

    def _drop(self) -> None:
        for attr in ("_file", "_h5"):
            handle = getattr(self, attr)
            if handle is not None:
                try:
                    handle.close()
                except Exception:  # noqa: BLE001 - an inherited handle may already be unusable
                    pass
        self._file = self._h5 = self._meta = self._keys = self._file_boxes = None

    def _close(self) -> None:
        self._drop()

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_meta", "_file", "_h5", "_keys", "_shared_meta", "_file_boxes")

    # -- the index for spawn / forkserver workers -----------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if get_spawning_popen() is not None and self._meta is not None:
            if self._shared_meta is None:
                self._shared_meta = self._meta.share()
            state["_shared_meta"] = self._shared_meta
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        shared = state.pop("_shared_meta", None)
        super().__setstate__(state)
        self._shared_meta = None
        if shared is not None:
            self._meta = _Meta.from_shared(*shared)  # taken over by _open in this process

    # -- reading ---------------------------------------------------------------------------------
    def _pread(self, start: int, end: int, index: int, field: int | None = None) -> tuple[bytes | memoryview, int]:
        """Bytes [start, end) of the logical /images byte stream (with ``field``, of that field's
        images) in a new writable buffer, and the file offset of ``start``."""
        m = self._meta
        base, table, chunk = (m.base, m.table, m.chunk) if field is None else m.f_where[field]
        if base is not None:
            parts = [(base + start, end - start)]
        elif table is not None:
            parts = []
            pos = start
            while pos < end:
                c = pos // chunk
                addr = int(table[c]) if c < len(table) else -1
                if addr < 0:
                    raise CorruptDataError(f"{self._images(field)} chunk not stored", path=self._path, sample=index)
                n = min(end, (c + 1) * chunk) - pos
                parts.append((addr + pos - c * chunk, n))
                pos += n
        else:
            return self._h5_bytes(start, end, index, field), -1
        for off, n in parts:
            if off < 0 or off + n > m.size:
                raise CorruptDataError(f"sample data at {off}..{off + n} lies outside the file ({m.size} bytes; "
                                       f"truncated?)", path=self._path, sample=index, offset=off)
        if self._ranged:
            return self._ranged_parts(parts, end - start, index), (parts[0][0] if parts else -1)
        fd = self._file.fileno()
        buf = memoryview(np.empty(end - start, np.uint8))
        pos = 0
        for off, n in parts:
            try:
                got = os.preadv(fd, [buf[pos : pos + n]], off)
            except OSError as e:
                raise CorruptDataError(f"cannot read sample data ({e})", path=self._path, sample=index) from None
            if got != n:
                raise CorruptDataError(
                    f"file truncated: read {got} of {n} bytes", path=self._path, sample=index, offset=off
                )
            pos += n
        return buf, (parts[0][0] if parts else -1)

    def _ranged_parts(self, parts: list[tuple[int, int]], total: int, index: int) -> memoryview:
        """The ``(file offset, size)`` parts of a sample's bytes, in order, fetched by range: one
        GET for parts that lie close together (the chunks of one sample usually follow each other)."""
        buf = memoryview(np.empty(total, np.uint8))
        got: dict[int, tuple[int, bytes]] = {}
        for a, b in coalesce(parts):
            got[a] = (a, self._remote.read(self.data_file, a, b - a, index))  # type: ignore[union-attr]
        starts = sorted(got)
        pos = 0
        for off, n in parts:
            a, data = got[starts[bisect.bisect_right(starts, off) - 1]]
            buf[pos : pos + n] = data[off - a : off - a + n]
            pos += n
        return buf

    def _images(self, field: int | None) -> str:
        """The path of /images, or of field number ``field``'s images."""
        return "/images" if field is None else f"/{field_group(self._meta.field_names[field])}/images"

    def _h5_bytes(self, start: int, end: int, index: int, field: int | None = None) -> bytes:
        name = self._images(field)
        images = self._h5[name]
        try:
            if self._meta.storage == "flat" or field is not None:
                return images[start:end].tobytes()
            return images[index].tobytes()
        except Exception as e:  # noqa: BLE001 - h5py reports damage as OSError, ValueError, RuntimeError, ...
            raise CorruptDataError(f"cannot read {name} ({type(e).__name__}: {e})", path=self._path,
                                   sample=index) from None

    def _check_crc(self, payload: bytes | memoryview, stored: int, index: int, offset: int, what: str) -> None:
        """CorruptDataError unless ``payload``'s CRC32C seeded with sample ``index``'s place is ``stored``."""
        actual = crc32c.crc32c(payload, place_seed(self._fid, index))
        if actual != stored:
            raise CorruptDataError(
                f"{what} checksum mismatch (stored {stored:08x}, computed {actual:08x}; damaged, or a "
                f"sample from another place)",
                path=self._path, sample=index, offset=offset if offset >= 0 else None,
            )

    def _payload(self, index: int) -> tuple[bytes, str, int, int]:
        """(payload, codec, height, width) of sample ``index``, CRC checked when ``verify``."""
        m = self._meta
        if m.offsets is not None:
            start, end = int(m.offsets[index]), int(m.offsets[index + 1])
        else:
            start, end = index * m.row, (index + 1) * m.row
        payload, offset = self._pread(start, end, index)
        if self.verify:
            self._check_crc(payload, int(m.crcs[index]), index, offset, "payload")
        codec = m.codec if m.codec is not None else _CODEC_NAMES[int(m.codecs[index])]
        h, w = m.shapes[index]
        return payload, codec, int(h), int(w)

    def _key(self, index: int) -> str:
        table = None if self.audit else self.sample_table()
        kcrcs = self._meta.key_crcs
        if table is not None and kcrcs is not None:
            # The sample table holds every key: no /keys block read (a chunk's decompression). HDF5 stores
            # a key only up to a NUL; such a key differs from the table's: /keys decides.
            key = table.keys[index]
            if crc32c.crc32c(key.encode("utf-8", "surrogatepass")) == int(kcrcs[index]):
                return key
        block = index // _KEY_BLOCK
        keys = self._keys.get(block)
        if keys is None:
            start = block * _KEY_BLOCK
            try:
                with self._h5file() as f:
                    keys = f["keys"].asstr(errors="replace")[start : start + _KEY_BLOCK].tolist()
            except Exception as e:  # noqa: BLE001 - h5py reports damage as OSError, KeyError, ...
                raise CorruptDataError(f"cannot read /keys ({type(e).__name__}: {e})", path=self._path,
                                       sample=index) from None
            self._keys[block] = keys
        if index - block * _KEY_BLOCK >= len(keys):
            raise CorruptDataError("/keys is shorter than the dataset", path=self._path, sample=index)
        return self._checked_key(index, keys[index - block * _KEY_BLOCK])

    def _checked_key(self, index: int, key: str) -> str:
        kcrcs = self._meta.key_crcs
        if self.verify and kcrcs is not None:
            stored, actual = int(kcrcs[index]), crc32c.crc32c(key.encode("utf-8", "surrogatepass"))
            if stored != actual:
                raise CorruptDataError(f"key checksum mismatch (stored {stored:08x}, computed {actual:08x})",
                                       path=self._path, sample=index)
        return key

    def _labels_without_table(self) -> np.ndarray:
        self._ensure_open()
        assert self._meta is not None
        return np.array(self._meta.labels, np.int64)

    def _field(self, index: int, j: int) -> ProcessedField:
        """Field number ``j`` (a mask or extra image) of sample ``index`` as stored: one read, its
        checksum (bound to the sample's place) checked when ``verify``."""
        m = self._meta
        name = m.field_names[j]
        start, end = int(m.f_offsets[j][index]), int(m.f_offsets[j][index + 1])
        payload, offset = self._pread(start, end, index, j)
        if self.verify:
            self._check_crc(payload, int(m.f_crcs[j][index]), index, offset, f"field {name!r}")
        h, w = m.f_shapes[j][index]
        return ProcessedField(name, _CODEC_NAMES[int(m.f_codecs[j][index])], payload, int(h), int(w),
                              m.f_channels[j], int(m.f_depths[j][index]))

    def _stored_boxes(self, index: int) -> tuple[tuple[tuple[float, ...], ...], tuple[int, ...]]:
        """Sample ``index``'s boxes and labels as /boxes, /box_offsets and /box_labels hold them
        (read by ``packer verify``: packer's readers take boxes from the sample table)."""
        if self._file_boxes is None:
            m = self._meta
            try:
                with self._h5file() as f:
                    ends = m._rows(f, "box_offsets", len(self) + 1, True).astype(np.int64)
                    if ends[0] != 0 or np.any(np.diff(ends) < 0):
                        raise CorruptDataError("/box_offsets is not an ascending list from 0", path=self._path)
                    labels = m._rows(f, "box_labels", int(ends[-1]), True)
                    boxes = m._stored_rows(f, "boxes", int(ends[-1]))[()]
                    stored = int(f["boxes"].attrs.get("crc32c", -1))
            except CorruptDataError:
                raise
            except Exception as e:  # noqa: BLE001 - h5py reports damage as OSError, KeyError, ...
                raise CorruptDataError(f"cannot read /boxes ({type(e).__name__}: {e})", path=self._path) from None
            if boxes.shape != (len(labels), 4) or boxes.dtype.kind != "f" or crc32c.crc32c(
                    boxes.astype("<f4", copy=False).tobytes()) != stored:
                raise CorruptDataError(f"/boxes ({boxes.dtype} {boxes.shape}) does not match its checksum",
                                       path=self._path)
            self._file_boxes = ends, boxes, labels
        ends, boxes, labels = self._file_boxes
        a, b = int(ends[index]), int(ends[index + 1])
        return tuple(map(tuple, boxes[a:b].tolist())), tuple(labels[a:b].tolist())

    def _read(self, index: int, fields: Collection[str] | None = None) -> Record:
        payload, codec, h, w = self._payload(index)
        names = self._meta.field_names
        fields = tuple(self._field(index, j) for j in range(len(names)) if fields is None or names[j] in fields)
        boxes = labels = None
        if self.audit and self.manifest.field_kind("boxes") is not None:
            boxes, labels = self._stored_boxes(index)
        return Record(codec, int(self._meta.labels[index]), h, w, self._key(index), payload, fields=fields,
                      boxes=boxes, box_labels=labels)

    def load(self, index: int) -> tuple[np.ndarray, int]:
        """Sample ``index`` as (RGB uint8 H x W x 3 array, label); the fast path skips the key."""
        if self._cache_request is not None or self.cache is not None:
            return super().load(index)  # the shared cache stores whole records
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples in {self.root}")
        self._ensure_open()
        payload, codec, h, w = self._payload(index)
        return self._decode_payload(payload, codec, h, w, index, self._path), int(self._meta.labels[index])
