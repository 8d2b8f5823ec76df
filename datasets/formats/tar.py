"""``TarDataset``: map-style reader for tar shards, ours (with ``.pkidx`` index files) or WebDataset's.

For packer's shards the per-shard index files (layout in packer.layouts.tar and
docs/FORMATS.md) are read once at construction into numpy arrays (at a URL: each shard's when it
is first read, so opening costs no request per shard); ``ds[i]`` is then one ``os.pread`` (or one
ranged GET) of the image member's data, checked against its CRC32C when ``verify`` is on.

Shards written by other tools (``webdataset.ShardWriter``, ``tar`` itself) have no index:
:meth:`TarDataset.open_foreign` scans the tar headers once, in the calling process, reads each
``KEY.cls`` member for the label, and builds the same arrays plus an in-memory manifest (class
names are unknown, so they are the labels as strings ``"0"`` .. ``"K-1"``, K = 1 + the largest
label). Foreign samples have no CRC; the key of a sample is its tar key (member name without
extensions). The arrays pickle with the dataset, so workers never rescan.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

import crc32c
import numpy as np

from packer.description.manifest import FIRST_FIELDS_VERSION, FileEntry
from packer.description.record import Record
from packer.description.samples import MAX_META_BYTES, table_entry
from packer.errors import CorruptDataError, ManifestError
from packer.fields.boxes import BOXES
from packer.fields.mask import MASK
from packer.images.codecs import CODEC_NAMES
from packer.images.imageproc import ProcessedField
from packer.images.placeholder import placeholder_reason
from packer.layouts.tar import (
    FIELD_ENTRY,
    IMAGE_EXTENSIONS,
    TAR_SUFFIX,
    compressed_tar_note,
    index_name,
    json_boxes,
    npy_payload,
    read_index,
    scan_shard,
)

from . import shardindex
from .shardindex import LazyTarIndex
from .shards import ShardedDataset, foreign_manifest, listed_shards

__all__ = ["TarDataset", "IMAGE_EXTENSIONS"]

_CODEC_NAMES = CODEC_NAMES
#: The columns of a version 3 index's field entries the reader keeps.
FIELD_COLUMNS = ("offset", "size", "height", "width", "crc", "codec", "channels", "depth")

class _Rows(NamedTuple):
    """Index columns of some samples (one shard's, or the whole dataset's), row by row; the
    field columns hold F rows per sample (None without stored fields)."""

    offset: np.ndarray
    size: np.ndarray
    label: np.ndarray
    height: np.ndarray
    width: np.ndarray
    crc: np.ndarray
    codec: np.ndarray
    key_end: np.ndarray  # the end of each row's key in ``keys``
    keys: bytes
    f_offset: np.ndarray | None
    f_size: np.ndarray | None
    f_height: np.ndarray | None
    f_width: np.ndarray | None
    f_crc: np.ndarray | None
    f_codec: np.ndarray | None
    f_channels: np.ndarray | None
    f_depth: np.ndarray | None


class TarDataset(ShardedDataset):
    """Map-style dataset over tar shards (see :class:`PackedDataset` for the options).

    ``TarDataset(path)`` opens a packer dataset; ``TarDataset.open_foreign(path)`` (or
    ``open_dataset(path, format="tar")``) opens WebDataset shards that have no manifest.
    """

    format = "tar"
    shard_suffixes = (TAR_SUFFIX,)
    _every_row: _Rows | None = None
    #: A large local dataset's shard indexes read where they lie (None: loaded, or read per shard at a URL).
    _in_place: LazyTarIndex | None = None
    _index_what = "tar index file"

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        index: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(path, transform, target_transform, **kwargs)
        entries = self._shard_entries()
        self._init_shards(entries)
        names = {f.name for f in self.manifest.files}
        self._index_of = [index_name(f.name, names) for f in entries] if index is None else []
        for f, idx_name in zip(entries, self._index_of):
            if idx_name not in names:
                raise ManifestError(f"{self.root}: manifest lists {f.name} without its index {idx_name}")
        # Version 3: the stored fields (names in stored order) and their members, F per sample.
        self._field_names: list[str] = (self.manifest.stored_fields
                                        if self.manifest.version >= FIRST_FIELDS_VERSION else [])
        self._has_crc = True
        self._extras: tuple[np.ndarray, list[str], np.ndarray, np.ndarray] | None = None
        if self._lazy and index is None:
            return  # each shard's index is read when the shard is first read (see ShardedDataset)
        if index is None and self._reads_in_place():
            #: A large local dataset's shard indexes, read where they lie (packer.datasets.formats.shardindex).
            self._in_place = LazyTarIndex(self._index_of, self._firsts, self._sizes, self._bytes, self.root)
            return
        cols = index if index is not None else self._load_index(entries)
        self._offset: np.ndarray = cols["offset"]
        self._size: np.ndarray = cols["size"]
        self._label: np.ndarray = cols["label"]
        self._height: np.ndarray = cols["height"]
        self._width: np.ndarray = cols["width"]
        self._crc: np.ndarray = cols["crc"]
        self._codec: np.ndarray = cols["codec"]
        self._shard: np.ndarray = cols["shard"]
        self._key_end: np.ndarray = cols["key_end"]
        self._keys: bytes = cols["keys"]
        self._has_crc = bool(cols["has_crc"])
        self._extras = cols.get("extras")
        self._field_names = cols.get("field_names", [])
        fields = cols.get("fields", {})  # one column each, so large ones go to workers in shared memory
        self._f_offset: np.ndarray | None = fields.get("offset")
        self._f_size: np.ndarray | None = fields.get("size")
        self._f_height: np.ndarray | None = fields.get("height")
        self._f_width: np.ndarray | None = fields.get("width")
        self._f_crc: np.ndarray | None = fields.get("crc")
        self._f_codec: np.ndarray | None = fields.get("codec")
        self._f_channels: np.ndarray | None = fields.get("channels")
        self._f_depth: np.ndarray | None = fields.get("depth")
        if len(self._offset) != len(self):
            raise ManifestError(f"{self.root}: index lists {len(self._offset)} samples, manifest {len(self)}")

    def _reads_in_place(self) -> bool:
        """Whether the shard indexes are read where they lie: a local packer dataset of at least
        :data:`LAZY_INDEX_SAMPLES` samples with a sample table (labels and keys come from it) and
        no stored fields."""
        m = self.manifest
        return (len(self) >= shardindex.LAZY_INDEX_SAMPLES and self._remote is None and not m.layout.get("foreign")
                and table_entry(m) is not None and m.version < FIRST_FIELDS_VERSION)

    def _close(self) -> None:
        super()._close()
        if self._in_place is not None:
            self._in_place.close()

    def _rows(self, index: int) -> tuple[int, _Rows, int]:
        """The shard holding sample ``index``, the index rows holding it and its row in them: the
        shard's own rows (read on first use) for a dataset at a URL, else the whole dataset's."""
        if self._lazy:
            shard = self._shard_of(index)
            return shard, self._shard_rows(shard), index - self._starts[shard]
        rows = self._every_row
        if rows is None or rows.offset is not self._offset:  # the columns moved to shared memory
            rows = self._every_row = _Rows(self._offset, self._size, self._label, self._height, self._width,
                                           self._crc, self._codec, self._key_end, self._keys, self._f_offset,
                                           self._f_size, self._f_height, self._f_width, self._f_crc, self._f_codec,
                                           self._f_channels, self._f_depth)
        return int(self._shard[index]), rows, index

    def _meta_without_table(self, index: int) -> dict[str, Any]:
        """Another tool's sample metadata, from the sample's other members: a ``.json`` object's
        fields, and each UTF-8 text member (``.txt``, ...) under its extension. Members larger than
        a sample's metadata may be, or not UTF-8, are left out."""
        if self._extras is None:
            return {}
        samples, exts, offsets, sizes = self._extras
        lo, hi = int(np.searchsorted(samples, index)), int(np.searchsorted(samples, index, "right"))
        meta: dict[str, Any] = {}
        shard = self._rows(index)[0]
        self._ensure_open()
        for j in range(lo, hi):
            if int(sizes[j]) > MAX_META_BYTES:
                continue
            data = bytes(self._pread(shard, int(sizes[j]), int(offsets[j]), index))
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if exts[j] == "json":
                try:
                    value = json.loads(text)
                except ValueError:
                    value = text
                if isinstance(value, dict):
                    meta.update(value)
                    continue
                meta["json"] = value
            else:
                meta[exts[j]] = text
        return meta

    def _every_shards_rows(self) -> list[_Rows]:
        """The index rows of every shard in order (the whole dataset's as one)."""
        if not self._lazy:
            return [self._rows(0)[1]] if len(self) else []
        return [self._shard_rows(s) for s in range(len(self._files))]

    def _labels_without_table(self) -> np.ndarray:
        return np.concatenate([np.zeros(0, np.int64), *(r.label for r in self._every_shards_rows())]).astype(np.int64)

    def _keys_without_table(self) -> list[str]:
        keys = []
        for rows in self._every_shards_rows():
            ends = rows.key_end
            keys += [rows.keys[(int(ends[i - 1]) if i else 0):int(ends[i])].decode("utf-8", "replace")
                     for i in range(len(ends))]
        return keys

    # -- index --------------------------------------------------------------------------------
    def _index_files(self, shard: int) -> list[str]:
        return [self._index_of[shard]]

    def _read_shard_index(self, s: int, data: bytes) -> tuple[np.ndarray, bytes, np.ndarray]:
        """Shard ``s``'s index ``data``, checked against the manifest: (entries, key blob, field rows)."""
        f, idx_name = self._files[s], self._index_of[s]
        path = self._file_path(idx_name)
        try:
            first, e, k, field_names, field_rows = read_index(data, path)
        except CorruptDataError:
            why = placeholder_reason(data[:256])
            if why:
                raise CorruptDataError(f"{path} is {why}", path=path) from None
            raise
        if first != f.first or len(e) != f.samples:
            raise CorruptDataError(
                f"tar index holds samples {first}..{first + len(e) - 1}, the manifest says "
                f"{f.first}..{f.first + f.samples - 1}", path=path,
            )
        if len(e) and int(np.max(e["offset"] + e["size"])) > f.bytes:
            raise CorruptDataError("tar index points past the end of its shard", path=path)
        _check_fields(path, self.manifest.version, self.manifest.stored_fields, field_names, field_rows, f.bytes)
        return e, k, field_rows

    def _shard_rows_from(self, shard: int, blobs: list[bytes]) -> _Rows:
        e, keys, fields = self._read_shard_index(shard, blobs[0])
        f = {name: np.ascontiguousarray(fields[name]) for name in FIELD_COLUMNS} if self._field_names else {}
        return _Rows(*(np.ascontiguousarray(e[c]) for c in ("offset", "size", "label", "height", "width", "crc",
                                                             "codec")),
                     e["key_end"].astype(np.int64), keys, *(f.get(c) for c in FIELD_COLUMNS))

    def _load_index(self, entries: list[FileEntry]) -> dict[str, Any]:
        parts, keys, key_base, fields = [], [], 0, []
        for s in range(len(entries)):
            e, k, field_rows = self._read_shard_index(s, self._read_small_file(self._index_of[s], self._index_what))
            fields.append(field_rows)
            parts.append((s, e, key_base))
            keys.append(k)
            key_base += len(k)
        n = sum(len(e) for _, e, _ in parts)
        cols = _empty_columns(n)
        pos = 0
        for s, e, base in parts:
            sl = slice(pos, pos + len(e))
            for name in ("offset", "size", "label", "height", "width", "crc", "codec"):
                cols[name][sl] = e[name]
            cols["shard"][sl] = s
            cols["key_end"][sl] = e["key_end"].astype(np.int64) + base
            pos += len(e)
        cols["keys"] = b"".join(keys)
        cols["has_crc"] = True
        if self.manifest.version >= FIRST_FIELDS_VERSION:
            rows = np.concatenate(fields) if fields else np.zeros(0, FIELD_ENTRY)
            cols["field_names"] = self.manifest.stored_fields
            cols["fields"] = {name: np.ascontiguousarray(rows[name]) for name in FIELD_COLUMNS}
        return cols

    @classmethod
    def open_foreign(cls, path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], **kwargs: Any) -> TarDataset:
        """Open tar shards without a manifest: a directory of ``*.tar`` files (sorted by name), one
        ``.tar`` file, or a list of shard files in one folder (read in the order given). Every
        sample needs an image member and a ``.cls`` label member."""
        if not isinstance(path, (str, os.PathLike)):
            root, names = listed_shards(path)
            note = compressed_tar_note(names)
            if note:
                raise ValueError(f"{root}: {note}")
        elif os.path.isdir(path := os.path.abspath(os.fspath(path))):
            root = path
            names = sorted(n for n in os.listdir(root) if n.endswith(TAR_SUFFIX) and not n.startswith("."))
            if not names:
                note = compressed_tar_note(sorted(os.listdir(root)))
                raise FileNotFoundError(f"no .tar shards in {root}" + (f": {note}" if note else ""))
        elif os.path.isfile(path):
            root, name = os.path.split(path)
            names = [name]
            note = compressed_tar_note(names)
            if note:
                raise ValueError(f"{path}: {note}")
        else:
            raise FileNotFoundError(f"no tar shards at {path}")
        rows: list[tuple[int, int, int, int, int]] = []  # offset, size, label, codec, shard
        keys: list[bytes] = []
        extras: list[tuple[int, str, int, int]] = []  # sample, member extension, offset, size
        files = []
        for s, name in enumerate(names):
            before = len(rows)
            scan_shard(os.path.join(root, name), s, rows, keys, extras)
            files.append(FileEntry(name, len(rows) - before, os.path.getsize(os.path.join(root, name)), "", before))
        cols = _empty_columns(len(rows))
        if rows:
            arr = np.array(rows, dtype=np.int64)
            cols["offset"][:] = arr[:, 0]
            cols["size"][:] = arr[:, 1]
            cols["label"][:] = arr[:, 2]
            cols["codec"][:] = arr[:, 3]
            cols["shard"][:] = arr[:, 4]
            cols["key_end"][:] = np.cumsum([len(k) for k in keys])
        cols["keys"] = b"".join(keys)
        cols["has_crc"] = False
        cols["extras"] = (np.array([e[0] for e in extras], np.int64), [e[1] for e in extras],
                          np.array([e[2] for e in extras], np.int64), np.array([e[3] for e in extras], np.int64))
        max_label = int(cols["label"].max()) if rows else -1
        manifest = foreign_manifest("tar", files, max_label, {"kind": "tar shards", "path": root})
        return cls(root, manifest=manifest, index=cols, **kwargs)

    # -- reading ------------------------------------------------------------------------------
    def _read(self, index: int, fields: Collection[str] | None = None) -> Record:
        """Sample ``index``'s record; with ``fields`` (names of stored fields), only those of its
        masks and extra images are read (None: all of them), each with one ``pread``."""
        if self._in_place is not None:
            return self._read_in_place(index)
        shard, rows, j = self._rows(index)
        offset = int(rows.offset[j])
        if self._ranged and self._field_names:  # the image and the fields asked for: one GET
            self._prefetch(shard, self._record_spans(rows, j, fields), index)
        buf = self._pread(shard, int(rows.size[j]), offset, index)
        if self.verify and self._has_crc:
            self._check_crc(buf, int(rows.crc[j]), shard, index, offset, "image data")
        codec = _CODEC_NAMES[rows.codec[j]]
        height, width = int(rows.height[j]), int(rows.width[j])
        payload: bytes | memoryview = buf
        if codec == "raw":
            payload, height, width = npy_payload(buf, height, width, self._shard_paths[shard], index, offset)
        start = int(rows.key_end[j - 1]) if j else 0
        # Other tools' member names need not be UTF-8: such bytes read as U+FFFD (a backslash escape
        # would be a path separator when unpacked), so the key is valid UTF-8 for every destination.
        key = rows.keys[start : int(rows.key_end[j])].decode("utf-8", "replace")
        if self._extras is not None:  # another tool's shards: a mask member, boxes in the .json
            return Record(codec, int(rows.label[j]), height, width, key, payload,
                          **self._foreign_fields(index, shard, fields))
        stored = self._read_fields(rows, j, index, shard, fields) if self._field_names else ()
        return Record(codec, int(rows.label[j]), height, width, key, payload, fields=stored)

    def _read_in_place(self, index: int) -> Record:
        """Sample ``index``'s record through its shard's index file (a dataset without fields)."""
        shard, offset, size, label, height, width, crc, codec_id, key = self._in_place.entry(index, self._open_file)  # type: ignore[union-attr]
        buf = self._pread(shard, size, offset, index)
        if self.verify:
            self._check_crc(buf, crc, shard, index, offset, "image data")
        codec = _CODEC_NAMES[codec_id]
        payload: bytes | memoryview = buf
        if codec == "raw":
            payload, height, width = npy_payload(buf, height, width, self._shard_paths[shard], index, offset)
        return Record(codec, label, height, width, key, payload, fields=())

    def _record_spans(self, rows: _Rows, j: int, wanted: Collection[str] | None) -> list[tuple[int, int]]:
        """``(offset, size)`` of row ``j``'s image member and of its stored fields in ``wanted``."""
        spans = [(int(rows.offset[j]), int(rows.size[j]))]
        count = len(self._field_names)
        for n, name in enumerate(self._field_names):
            if wanted is None or name in wanted:
                k = j * count + n
                spans.append((int(rows.f_offset[k]), int(rows.f_size[k])))  # type: ignore[index]
        return spans

    def _foreign_fields(self, index: int, shard: int, wanted: Collection[str] | None) -> dict[str, Any]:
        """Another tool's sample's ``KEY.mask.png`` member as its mask field, and ``boxes`` (with
        ``box_labels``) from its ``KEY.json`` object, where it has them (the JSON read only when
        ``wanted`` holds ``boxes``, or is None)."""
        samples, exts, offsets, sizes = self._extras  # type: ignore[misc]
        lo, hi = int(np.searchsorted(samples, index)), int(np.searchsorted(samples, index, "right"))
        out: dict[str, Any] = {}
        for j in range(lo, hi):
            if exts[j] == f"{MASK.name}.{MASK.codec}" and (wanted is None or MASK.name in wanted):
                buf = self._pread(shard, int(sizes[j]), int(offsets[j]), index)
                h, w, channels, depth = MASK.shape(buf) or (0, 0, MASK.channels, 8)
                out["fields"] = (ProcessedField(MASK.name, "png", buf, h, w, channels, depth),)  # type: ignore[arg-type]
            elif exts[j] == "json" and (wanted is None or BOXES.name in wanted) and int(sizes[j]) <= MAX_META_BYTES:
                out.update(json_boxes(bytes(self._pread(shard, int(sizes[j]), int(offsets[j]), index))))
        return out

    def _check_crc(self, buf: memoryview, stored: int, shard: int, index: int, offset: int, what: str) -> None:
        actual = crc32c.crc32c(buf, self._seed(shard, index))
        if actual != stored:
            raise CorruptDataError(
                f"{what} checksum mismatch (stored {stored:08x}, computed {actual:08x}; damaged, or a "
                f"sample from another place)",
                path=self._shard_paths[shard], sample=index, offset=offset,
            )

    def _read_fields(self, rows: _Rows, j: int, index: int, shard: int, wanted: Collection[str] | None
                     ) -> tuple[ProcessedField, ...]:
        """The stored fields of sample ``index`` (row ``j`` of ``rows``) named in ``wanted`` (all
        for None), CRC checked."""
        out = []
        count = len(self._field_names)
        for n, name in enumerate(self._field_names):
            if wanted is not None and name not in wanted:
                continue
            k = j * count + n
            offset, size = int(rows.f_offset[k]), int(rows.f_size[k])  # type: ignore[index]
            buf = self._pread(shard, size, offset, index)
            if self.verify:
                self._check_crc(buf, int(rows.f_crc[k]), shard, index, offset, f"{name} member")  # type: ignore[index]
            codec = _CODEC_NAMES[int(rows.f_codec[k])]  # type: ignore[index]
            height, width = int(rows.f_height[k]), int(rows.f_width[k])  # type: ignore[index]
            payload: memoryview = buf
            if codec == "raw":
                payload, height, width = npy_payload(buf, height, width, self._shard_paths[shard], index, offset)
            out.append(ProcessedField(name, codec, payload, height, width,  # type: ignore[arg-type]
                                      int(rows.f_channels[k]), int(rows.f_depth[k])))  # type: ignore[index]
        return tuple(out)


def _check_fields(path: str, version: int, stored: list[str], names: list[str], rows: np.ndarray,
                  shard_bytes: int) -> None:
    """A shard index agrees with the manifest's stored fields and stays inside its shard."""
    if version >= FIRST_FIELDS_VERSION and names != stored:
        raise CorruptDataError(f"tar index lists the fields {names}, the manifest {stored} (an index of "
                               f"{'an older version' if not names else 'another dataset'}?)", path=path)
    if version < FIRST_FIELDS_VERSION and names:
        raise CorruptDataError(f"tar index lists the fields {names} in a version {version} dataset", path=path)
    if len(rows) and int(np.max(rows["offset"] + rows["size"])) > shard_bytes:
        raise CorruptDataError("tar index points a field past the end of its shard", path=path)


def _empty_columns(n: int) -> dict[str, Any]:
    return {
        "offset": np.zeros(n, np.uint64), "size": np.zeros(n, np.uint64), "label": np.zeros(n, np.int64),
        "height": np.zeros(n, np.uint32), "width": np.zeros(n, np.uint32), "crc": np.zeros(n, np.uint32),
        "codec": np.zeros(n, np.uint8), "shard": np.zeros(n, np.uint32), "key_end": np.zeros(n, np.int64),
    }
