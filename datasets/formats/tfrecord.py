"""``TFRecordDataset``: map-style reader for TFRecord files of ``tf.train.Example`` images.

For packer's files the ``.idx`` text indexes (and ``.zidx`` for gzip; layouts in
packer.layouts.tfrecord and docs/FORMATS.md) are read once at construction into numpy
arrays (at a URL: each file's when it is first read, so opening costs no request per file); ``ds[i]`` is then one ``os.pread`` of exactly the record's bytes as the index gives them
(and one inflate for gzip). The length field is checked against the index before anything is
trusted, so a crafted length can never make the reader allocate or read more than the index
says; with ``verify`` both masked CRC32Cs (length and data) are checked. Any mismatch raises
CorruptDataError naming the file, the sample and the byte offset.

Files written by other tools (TensorFlow, the ``tfrecord`` package) have no manifest:
:meth:`TFRecordDataset.open_foreign` walks the record framing of every file once, in the calling
process (checking each length CRC and that each record fits in the file), parses each record's
``image/class/label``, and builds the same arrays plus an in-memory manifest (class names are the
labels as strings ``"0"`` .. ``"K-1"``, K = 1 + the largest label). Compressed foreign files (GZIP
or ZLIB) are refused, saying so: a compressed stream without packer's ``.zidx`` has no random access.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

import numpy as np

from packer.description.manifest import FileEntry
from packer.description.record import Record
from packer.description.samples import table_entry
from packer.errors import CorruptDataError, ManifestError
from packer.layouts.tfexample import example_class
from packer.layouts.tfrecord import (
    FOREIGN_SUFFIXES,
    GZIP_SUFFIX,
    HEAD,
    INDEX_SUFFIX,
    TFRECORD_SUFFIX,
    ZINDEX_SUFFIX,
    ZLIB_ADVICE,
    image_record,
    masked_crc32c,
    parse_idx,
    scan_file,
    unpack_zindex,
    zlib_tfrecord,
)

from . import shardindex
from .shardindex import LazyPairs
from .shards import ShardedDataset, foreign_manifest, listed_shards

__all__ = ["TFRecordDataset", "FOREIGN_SUFFIXES"]

_U32 = struct.Struct("<I")


class _Rows(NamedTuple):
    """Index columns of some records (one shard's, or the whole dataset's), row by row."""

    offset: np.ndarray
    length: np.ndarray
    zstart: np.ndarray  # gzip: where each record's deflate segment starts (0 otherwise)
    zend: np.ndarray


class TFRecordDataset(ShardedDataset):
    """Map-style dataset over TFRecord files (see :class:`PackedDataset` for the options).

    ``TFRecordDataset(path)`` opens a packer dataset; ``TFRecordDataset.open_foreign(path)`` (or
    ``open_dataset(path, format="tfrecord")``) opens TFRecord files that have no manifest.
    """

    format = "tfrecord"
    shard_suffixes = (TFRECORD_SUFFIX, GZIP_SUFFIX)
    _every_row: _Rows | None = None
    #: A large local dataset's shard indexes, parsed shard by shard when read (None: loaded, or read per shard at a URL).
    _in_place: LazyPairs | None = None
    _index_what = "TFRecord index file"

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        index: dict[str, np.ndarray] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(path, transform, target_transform, **kwargs)
        entries = self._shard_entries()
        self._init_shards(entries)
        self._gzip = [f.name.endswith(GZIP_SUFFIX) for f in entries]
        if self._lazy and index is None:
            listed = {f.name for f in self.manifest.files}
            for s in range(len(entries)):
                for name in self._index_files(s):
                    if name not in listed:
                        raise ManifestError(f"{self.root}: manifest does not list the index file {name}")
            return  # each shard's index is read when the shard is first read (see ShardedDataset)
        #: A large local dataset's shard indexes, parsed shard by shard when read (shardindex).
        m = self.manifest
        if (index is None and len(self) >= shardindex.LAZY_INDEX_SAMPLES and self._remote is None
                and not m.layout.get("foreign") and table_entry(m) is not None):
            names = {f.name for f in m.files}
            stems = [f.name[: -len(GZIP_SUFFIX if gz else TFRECORD_SUFFIX)] for f, gz in zip(entries, self._gzip)]
            missing = next((st + INDEX_SUFFIX for st in stems if st + INDEX_SUFFIX not in names), None)
            if missing is not None:
                raise ManifestError(f"{self.root}: manifest does not list the index file {missing}")
            self._in_place = LazyPairs(stems, self._firsts, self._sizes, self.root, self._parse_shard)
            return
        cols = index if index is not None else self._load_index(entries)
        self._shard: np.ndarray = cols["shard"]
        self._offset: np.ndarray = cols["offset"]
        self._length: np.ndarray = cols["length"]
        self._zstart: np.ndarray = cols["zstart"]
        self._zend: np.ndarray = cols["zend"]
        if len(self._offset) != len(self):
            raise ManifestError(f"{self.root}: index lists {len(self._offset)} records, manifest {len(self)}")

    # -- index --------------------------------------------------------------------------------
    def _read_small(self, name: str) -> bytes:
        if name not in {f.name for f in self.manifest.files}:
            raise ManifestError(f"{self.root}: manifest does not list the index file {name}")
        return self._read_small_file(name, "TFRecord index file")

    def _index_files(self, shard: int) -> list[str]:
        name = self._files[shard].name
        stem = name[: -len(GZIP_SUFFIX if self._gzip[shard] else TFRECORD_SUFFIX)]
        return [stem + INDEX_SUFFIX, *([stem + ZINDEX_SUFFIX] if self._gzip[shard] else [])]

    def _read_shard_index(self, s: int, blobs: list[bytes]) -> tuple[np.ndarray, list[int] | None]:
        """Shard ``s``'s ``(offset, length)`` pairs and, gzip, its segment bounds (one more than the
        records) from its index files' bytes ``blobs``, each checked against the manifest."""
        f, names = self._files[s], self._index_files(s)
        idx_path = self._file_path(names[0])
        pairs = parse_idx(blobs[0], idx_path)
        if len(pairs) != f.samples:
            raise CorruptDataError(f"TFRecord index lists {len(pairs)} records, the manifest {f.samples}",
                                   path=idx_path)
        if len(names) > 1:
            z_path = self._file_path(names[1])
            z = unpack_zindex(blobs[1], z_path)
            if len(z) != len(pairs) + 1 or z[-1] > f.bytes:
                raise CorruptDataError("gzip index does not match its file", path=z_path)
            return pairs, z
        if len(pairs) and int(pairs[-1, 0] + pairs[-1, 1]) != f.bytes:
            raise CorruptDataError(f"TFRecord index covers {int(pairs[-1, 0] + pairs[-1, 1])} bytes, "
                                   f"the file has {f.bytes}", path=idx_path)
        return pairs, None

    def _shard_rows_from(self, shard: int, blobs: list[bytes]) -> _Rows:
        pairs, z = self._read_shard_index(shard, blobs)
        bounds = np.asarray(z if z is not None else np.zeros(len(pairs) + 1), np.uint64)
        return _Rows(np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1]), bounds[:-1], bounds[1:])

    def _rows(self, index: int) -> tuple[int, _Rows, int]:
        """The shard holding sample ``index``, the index rows holding it and its row in them (see
        the tar reader's)."""
        if self._lazy:
            shard = self._shard_of(index)
            return shard, self._shard_rows(shard), index - self._starts[shard]
        rows = self._every_row
        if rows is None or rows.offset is not self._offset:  # the columns moved to shared memory
            rows = self._every_row = _Rows(self._offset, self._length, self._zstart, self._zend)
        return int(self._shard[index]), rows, index

    def _load_index(self, entries: list[FileEntry]) -> dict[str, np.ndarray]:
        indexes = [self._read_shard_index(s, [self._read_small(n) for n in self._index_files(s)])
                   for s in range(len(entries))]  # each checked before the columns are allocated
        cols = _empty_columns(sum(f.samples for f in entries))
        pos = 0
        for s, (pairs, z) in enumerate(indexes):
            sl = slice(pos, pos + len(pairs))
            cols["shard"][sl] = s
            cols["offset"][sl] = pairs[:, 0]
            cols["length"][sl] = pairs[:, 1]
            if z is not None:
                cols["zstart"][sl] = z[:-1]
                cols["zend"][sl] = z[1:]
            pos += len(pairs)
        return cols

    def _parse_shard(self, s: int, open_file: Callable[[str], int]) -> tuple[np.ndarray, ...]:
        """Shard ``s``'s record offsets and lengths (and gzip segments), checked as a full load checks them."""
        pairs, z = self._read_shard_index(s, [_read_fd(open_file(name)) for name in self._index_files(s)])
        return (pairs,) if z is None else (pairs, z)

    def _close(self) -> None:
        super()._close()
        if self._in_place is not None:
            self._in_place.close()

    @classmethod
    def open_foreign(cls, path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                     **kwargs: Any) -> TFRecordDataset:
        """Open TFRecord files without a manifest: a directory (files ending in .tfrecord,
        .tfrecords or .tfr, sorted by name), one file, or a list of files in one folder (read in
        the order given). Every record needs ``image/encoded`` and ``image/class/label``."""
        if not isinstance(path, (str, os.PathLike)):
            root, names = listed_shards(path)
        elif os.path.isdir(path := os.path.abspath(os.fspath(path))):
            root = path
            names = sorted(n for n in os.listdir(root) if n.endswith(FOREIGN_SUFFIXES) and not n.startswith("."))
            if not names:
                if any(n.endswith(".gz") for n in os.listdir(root)):
                    raise ValueError(f"{root}: compressed TFRecord files without a packer manifest cannot be "
                                     f"read randomly; decompress them (gunzip) first")
                raise FileNotFoundError(f"no TFRecord files ({', '.join(FOREIGN_SUFFIXES)}) in {root}")
        elif os.path.isfile(path):
            root, name = os.path.split(path)
            names = [name]
        else:
            raise FileNotFoundError(f"no TFRecord files at {path}")
        rows: list[tuple[int, int]] = []
        files: list[FileEntry] = []
        max_label = -1
        example = example_class()
        for name in names:
            fp = os.path.join(root, name)
            with open(fp, "rb") as fh:
                head = fh.read(64)
            if head[:2] == b"\x1f\x8b":
                raise ValueError(f"{fp} is gzip-compressed; without a packer manifest it cannot be read "
                                 f"randomly; decompress it (gunzip) first")
            if zlib_tfrecord(head):  # else its first length CRC fails: "checksum mismatch" says nothing useful
                raise ValueError(f"{fp} is ZLIB-compressed (TFRecord compression 'ZLIB'); {ZLIB_ADVICE}")
            before = len(rows)
            max_label = max(max_label, scan_file(fp, rows, example))
            files.append(FileEntry(name, len(rows) - before, os.path.getsize(fp), "", before))
        cols = _empty_columns(len(rows))
        if rows:
            arr = np.array(rows, dtype=np.int64)
            cols["offset"][:], cols["length"][:] = arr[:, 0], arr[:, 1]
            pos = 0
            for s, f in enumerate(files):
                cols["shard"][pos : pos + f.samples] = s
                pos += f.samples
        manifest = foreign_manifest("tfrecord", files, max_label, {"kind": "tfrecord files", "path": root})
        return cls(root, manifest=manifest, index=cols, **kwargs)

    # -- reading ------------------------------------------------------------------------------
    def _record(self, index: int) -> tuple[bytes, int, int]:
        """The framed record bytes of sample ``index``, its shard and its (stream) offset."""
        if self._in_place is not None:
            shard, j, parsed = self._in_place.get(index, self._open_file)
            offset, length = int(parsed[0][j, 0]), int(parsed[0][j, 1])
            zstart, zend = (int(parsed[1][j]), int(parsed[1][j + 1])) if len(parsed) > 1 else (0, 0)
        else:
            shard, rows, j = self._rows(index)
            offset, length = int(rows.offset[j]), int(rows.length[j])
            zstart, zend = (int(rows.zstart[j]), int(rows.zend[j])) if self._gzip[shard] else (0, 0)
        if not self._gzip[shard]:
            return self._pread(shard, length, offset, index), shard, offset
        segment = self._pread(shard, zend - zstart, zstart, index)
        try:
            buf = zlib.decompressobj(-zlib.MAX_WBITS).decompress(segment, length + 1)
        except zlib.error as e:
            raise CorruptDataError(f"cannot inflate record ({e})", path=self._shard_paths[shard],
                                   sample=index, offset=zstart) from None
        if len(buf) != length:
            raise CorruptDataError(f"record inflates to {len(buf)} bytes, the index says {length}",
                                   path=self._shard_paths[shard], sample=index, offset=zstart)
        return buf, shard, offset

    def _meta_without_table(self, index: int) -> dict[str, Any]:
        """Another tool's sample metadata: the Example's features packer does not read otherwise."""
        self._ensure_open()
        return self._read(index, want_meta=True).meta or {}

    def _read(self, index: int, want_meta: bool = False, fields: Collection[str] | None = None) -> Record:
        """Sample ``index``'s record (its masks and extra images: those named in ``fields``, all
        for None; the record is read whole, its checksums cover them all)."""
        buf, shard, offset = self._record(index)
        n = len(buf)
        length, length_crc = HEAD.unpack_from(buf)
        if length != n - 16:
            raise CorruptDataError(f"record length field says {length} bytes, the index {n - 16}",
                                   path=self._shard_paths[shard], sample=index, offset=offset)
        mv = memoryview(buf)
        if self.verify:
            if masked_crc32c(mv[:8]) != length_crc:
                raise CorruptDataError("record length checksum mismatch", path=self._shard_paths[shard],
                                       sample=index, offset=offset + 8)
            if masked_crc32c(mv[12 : n - 4]) != _U32.unpack_from(buf, n - 4)[0]:
                raise CorruptDataError("record data checksum mismatch", path=self._shard_paths[shard],
                                       sample=index, offset=offset + 12)
        place = self._seed(shard, index) if self._fids[shard] and self.verify else None
        stored = [name for name in self.manifest.stored_fields if fields is None or name in fields]
        return image_record(example_class(), mv[12 : n - 4], self._shard_paths[shard], index, offset + 12, place,
                            want_meta, foreign=bool(self.manifest.layout.get("foreign")), stored=stored)


def _empty_columns(n: int) -> dict[str, np.ndarray]:
    return {
        "shard": np.zeros(n, np.uint32), "offset": np.zeros(n, np.uint64), "length": np.zeros(n, np.uint64),
        "zstart": np.zeros(n, np.uint64), "zend": np.zeros(n, np.uint64),
    }


def _read_fd(fd: int) -> bytes:
    """The whole file open on ``fd``, which is then closed."""
    with os.fdopen(fd, "rb") as f:
        return f.read()
