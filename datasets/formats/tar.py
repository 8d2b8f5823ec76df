"""``TarDataset``: map-style reader for tar shards, ours (with ``.pkidx`` index files) or WebDataset's.

For packer's shards the per-shard index files (layout in packer.layouts.tar and
docs/FORMATS.md) are read once at construction into numpy arrays; ``ds[i]`` is then one
``os.pread`` of the image member's data, checked against its CRC32C when ``verify`` is on.

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
from typing import Any

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

class TarDataset(ShardedDataset):
    """Map-style dataset over tar shards (see :class:`PackedDataset` for the options).

    ``TarDataset(path)`` opens a packer dataset; ``TarDataset.open_foreign(path)`` (or
    ``open_dataset(path, format="tar")``) opens WebDataset shards that have no manifest.
    """

    format = "tar"
    shard_suffixes = (TAR_SUFFIX,)

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
        #: A large local dataset's shard indexes, read where they lie (packer.datasets.formats.shardindex).
        self._lazy: LazyTarIndex | None = None
        if index is None and self._reads_lazily():
            names = {f.name for f in self.manifest.files}
            idx = [index_name(f.name, names) for f in entries]
            missing = next((f for f, i in zip(entries, idx) if i not in names), None)
            if missing is not None:
                raise ManifestError(f"{self.root}: manifest lists {missing.name} without its index "
                                    f"{index_name(missing.name, names)}")
            self._lazy = LazyTarIndex(idx, self._firsts, self._sizes, self._bytes, self.root)
            self._has_crc, self._extras, self._field_names = True, None, []
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
        self._has_crc: bool = bool(cols["has_crc"])
        self._extras: tuple[np.ndarray, list[str], np.ndarray, np.ndarray] | None = cols.get("extras")
        # Version 3: the stored fields (names in stored order) and their members, F per sample.
        self._field_names: list[str] = cols.get("field_names", [])
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

    def _reads_lazily(self) -> bool:
        """Whether the shard indexes are read where they lie: a local packer dataset of at least
        :data:`LAZY_INDEX_SAMPLES` samples with a sample table (labels and keys come from it) and
        no stored fields."""
        m = self.manifest
        return (len(self) >= shardindex.LAZY_INDEX_SAMPLES and self._remote is None and not m.layout.get("foreign")
                and table_entry(m) is not None and m.version < FIRST_FIELDS_VERSION)

    def _close(self) -> None:
        super()._close()
        if self._lazy is not None:
            self._lazy.close()

    def _meta_without_table(self, index: int) -> dict[str, Any]:
        """Another tool's sample metadata, from the sample's other members: a ``.json`` object's
        fields, and each UTF-8 text member (``.txt``, ...) under its extension. Members larger than
        a sample's metadata may be, or not UTF-8, are left out."""
        if self._extras is None:
            return {}
        samples, exts, offsets, sizes = self._extras
        lo, hi = int(np.searchsorted(samples, index)), int(np.searchsorted(samples, index, "right"))
        meta: dict[str, Any] = {}
        shard = int(self._shard[index])
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

    def _labels_without_table(self) -> np.ndarray:
        return np.array(self._label, np.int64)

    def _keys_without_table(self) -> list[str]:
        ends = self._key_end
        return [self._keys[(int(ends[i - 1]) if i else 0):int(ends[i])].decode("utf-8", "replace")
                for i in range(len(ends))]

    # -- index --------------------------------------------------------------------------------
    def _load_index(self, entries: list[FileEntry]) -> dict[str, Any]:
        names = {f.name for f in self.manifest.files}
        parts, keys, key_base, fields = [], [], 0, []
        stored = self.manifest.stored_fields
        for s, f in enumerate(entries):
            idx_name = index_name(f.name, names)
            path = os.path.join(self.root, idx_name)
            if idx_name not in names:
                raise ManifestError(f"{self.root}: manifest lists {f.name} without its index {idx_name}")
            data = self._read_small_file(idx_name, "tar index file")
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
            _check_fields(path, self.manifest.version, stored, field_names, field_rows, f.bytes)
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
            cols["field_names"] = stored
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
        if self._lazy is not None:
            return self._read_lazily(index)
        shard = int(self._shard[index])
        offset = int(self._offset[index])
        if self._ranged and self._field_names:  # the image and the fields asked for: one GET
            self._prefetch(shard, self._record_spans(index, fields), index)
        buf = self._pread(shard, int(self._size[index]), offset, index)
        if self.verify and self._has_crc:
            self._check_crc(buf, int(self._crc[index]), shard, index, offset, "image data")
        codec = _CODEC_NAMES[self._codec[index]]
        height, width = int(self._height[index]), int(self._width[index])
        payload: bytes | memoryview = buf
        if codec == "raw":
            payload, height, width = npy_payload(buf, height, width, self._shard_paths[shard], index, offset)
        start = int(self._key_end[index - 1]) if index else 0
        # Other tools' member names need not be UTF-8: such bytes read as U+FFFD (a backslash escape
        # would be a path separator when unpacked), so the key is valid UTF-8 for every destination.
        key = self._keys[start : int(self._key_end[index])].decode("utf-8", "replace")
        if self._extras is not None:  # another tool's shards: a mask member, boxes in the .json
            return Record(codec, int(self._label[index]), height, width, key, payload,
                          **self._foreign_fields(index, shard, fields))
        stored = self._read_fields(index, shard, fields) if self._field_names else ()
        return Record(codec, int(self._label[index]), height, width, key, payload, fields=stored)

    def _read_lazily(self, index: int) -> Record:
        """Sample ``index``'s record through its shard's index file (a dataset without fields)."""
        shard, offset, size, label, height, width, crc, codec_id, key = self._lazy.entry(index, self._open_file)  # type: ignore[union-attr]
        buf = self._pread(shard, size, offset, index)
        if self.verify:
            self._check_crc(buf, crc, shard, index, offset, "image data")
        codec = _CODEC_NAMES[codec_id]
        payload: bytes | memoryview = buf
        if codec == "raw":
            payload, height, width = npy_payload(buf, height, width, self._shard_paths[shard], index, offset)
        return Record(codec, label, height, width, key, payload, fields=())

    def _record_spans(self, index: int, wanted: Collection[str] | None) -> list[tuple[int, int]]:
        """``(offset, size)`` of sample ``index``'s image member and of its stored fields in ``wanted``."""
        spans = [(int(self._offset[index]), int(self._size[index]))]
        count = len(self._field_names)
        for j, name in enumerate(self._field_names):
            if wanted is None or name in wanted:
                k = index * count + j
                spans.append((int(self._f_offset[k]), int(self._f_size[k])))  # type: ignore[index]
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

    def _read_fields(self, index: int, shard: int, wanted: Collection[str] | None) -> tuple[ProcessedField, ...]:
        """The stored fields of sample ``index`` named in ``wanted`` (all for None), CRC checked."""
        out = []
        count = len(self._field_names)
        for j, name in enumerate(self._field_names):
            if wanted is not None and name not in wanted:
                continue
            k = index * count + j
            offset, size = int(self._f_offset[k]), int(self._f_size[k])  # type: ignore[index]
            buf = self._pread(shard, size, offset, index)
            if self.verify:
                self._check_crc(buf, int(self._f_crc[k]), shard, index, offset, f"{name} member")  # type: ignore[index]
            codec = _CODEC_NAMES[int(self._f_codec[k])]  # type: ignore[index]
            height, width = int(self._f_height[k]), int(self._f_width[k])  # type: ignore[index]
            payload: memoryview = buf
            if codec == "raw":
                payload, height, width = npy_payload(buf, height, width, self._shard_paths[shard], index, offset)
            out.append(ProcessedField(name, codec, payload, height, width,  # type: ignore[arg-type]
                                      int(self._f_channels[k]), int(self._f_depth[k])))  # type: ignore[index]
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
