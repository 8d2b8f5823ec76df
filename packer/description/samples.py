"""What a dataset knows about each sample besides its image: label kinds, per-sample metadata, and
the sample table (``samples.table``) that holds every sample's label, key and metadata in one file.

Label kinds (the manifest's ``labels.kind``; absent means ``class``):

- ``class``: one class per sample, an index into ``classes`` (ImageFolder's labels).
- ``multi``: a list of classes per sample (multi-label), each an index into ``classes``.
- ``number``: one number per sample (regression targets, scores), stored as float64.

Per-sample metadata is a JSON object (str keys; str, number, bool, null, lists and objects as
values; no NaN or infinity), at most :data:`MAX_META_BYTES` as compact UTF-8 JSON and nested at most
:data:`MAX_META_DEPTH` deep. It is never
pickled. Every format keeps it in the sample table; tar shards and TFRecord files also carry it
in the sample itself (``KEY.json``, the ``packer/meta`` feature) for other tools.

The table is written by every conversion next to the payload files and listed in the manifest
(``samples`` 0, like index files), so ``ds.targets``, ``ds.keys`` and metadata never read an
image. Its byte layout is in docs/FORMATS.md ("The sample table").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import mmap
import os
import struct
import weakref
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import crc32c
import numpy as np

from ..errors import CorruptDataError
from ..fields import KINDS, named
from ..fields.boxes import BOXES
from . import sections
from .manifest import FileEntry, file_sha256
from .nodecheck import check_once, scan_file
from .sections import LABEL_KINDS, table_id, write_table

__all__ = [
    "LABEL_KINDS", "MAX_META_BYTES", "MAX_META_DEPTH", "TABLE_NAME", "Label", "SampleTable", "SampleTableWriter",
    "encode_meta", "decode_meta", "sample_fields", "carried_label", "build_table", "is_table_name", "table_entry",
    "table_id", "table_file_entry", "write_table",
]

#: The largest metadata one sample may carry, as compact UTF-8 JSON.
MAX_META_BYTES = 64 * 1024
#: The deepest nesting of lists and objects metadata may have (the object itself is depth 1).
MAX_META_DEPTH = 64
TABLE_NAME = "samples.table"
#: The version every conversion and merge writes (per-section checksums, narrow class labels);
#: versions 1 and 2 (2: version 1 with a boxes section) stay readable.
TABLE_VERSION = sections.VERSION
BOXES_TABLE_VERSION = 2
_MAGIC = b"PKST"
# versions 1 and 2: magic, version, label kind, zero, N, M (multi-label ids), K (key blob), E (meta blob), CRC of the body
_HEAD = struct.Struct("<4sHBBQQQQI")
_HEADER_BYTES = 48  # _HEAD (44 bytes) + CRC32C of those 44 bytes
_ROW = struct.Struct("<qII")  # the same row, packed


class Label(int):
    """A sample's label as the engine hands it to a writer: the class index (``-1`` for the
    ``multi`` and ``number`` kinds, which have none), carrying the sample's ``labels`` (multi),
    ``target`` (number) and ``meta`` (the metadata object, or None)."""

    labels: tuple[int, ...] | None
    target: float | None
    meta: dict[str, Any] | None

    def __new__(cls, value: int, *, labels: Sequence[int] | None = None, target: float | None = None,
                meta: dict[str, Any] | None = None) -> Label:
        """``value`` the class index (or -1); the other fields as the label kind needs."""
        obj = super().__new__(cls, value)
        obj.labels = tuple(int(x) for x in labels) if labels is not None else None
        obj.target = float(target) if target is not None else None
        obj.meta = meta or None
        return obj

    def __reduce__(self) -> tuple[Any, ...]:  # between processes only, never on disk
        return (_make_label, (int(self), self.labels, self.target, self.meta))


def _make_label(value: int, labels: Any, target: Any, meta: Any) -> Label:
    return Label(value, labels=labels, target=target, meta=meta)


def carried_label(ds: Any, index: int, label: int, remap: Sequence[int] | None = None) -> int:
    """Sample ``index`` of the packed dataset ``ds`` (a reader) as a label for a writer: its
    class index (renumbered through ``remap`` when given), with its multi-label classes, number
    and metadata from ``ds``'s sample table, so conversions and merges carry them."""
    table = ds.sample_table() if hasattr(ds, "sample_table") else None
    if table is None:  # packer 0.1, or other tools' files (whose metadata the reader finds in the sample)
        value = remap[label] if remap is not None and label >= 0 else label
        meta = ds.meta(index) if hasattr(ds, "meta") else None
        return Label(value, meta=meta) if meta else value
    kind, meta = table.kind, table.meta(index) or None
    if kind == "number":
        return Label(-1, target=float(table.target_of(index)), meta=meta)
    if kind == "multi":
        ids = table.labels_of(index)
        return Label(-1, labels=[remap[x] for x in ids] if remap is not None else ids, meta=meta)
    value = remap[label] if remap is not None and label >= 0 else label
    return Label(value, meta=meta) if meta else value


def is_table_name(name: str) -> bool:
    """Whether a manifest's file ``name`` is the sample table: ``samples.table``, or
    ``samples.<generation>.table`` where an upload over a live dataset renamed it
    (packer.storage.remote)."""
    return name == TABLE_NAME or (name.startswith("samples.") and name.endswith(".table"))


def table_entry(manifest: Any) -> FileEntry | None:
    """``manifest``'s entry for its sample table, or None when it lists none."""
    return next((f for f in manifest.files if not f.samples and is_table_name(f.name)), None)


def sample_fields(label: int) -> dict[str, Any]:
    """What a sample carries besides its class index, for formats that store it in the sample
    itself: ``labels`` (multi), ``target`` (number) and ``meta``, each only when present."""
    out: dict[str, Any] = {}
    labels = getattr(label, "labels", None)
    if labels is not None:
        out["labels"] = list(labels)
    target = getattr(label, "target", None)
    if target is not None:
        out["target"] = target
    meta = getattr(label, "meta", None)
    if meta:
        out["meta"] = meta
    return out


def encode_meta(meta: Mapping[str, Any] | None, where: str = "metadata") -> bytes:
    """``meta`` as compact UTF-8 JSON (``b""`` for None or empty), or ValueError naming ``where``
    and what is wrong: not an object, a non-string key, NaN or infinity, an unsupported type, or
    more than :data:`MAX_META_BYTES` or nesting deeper than :data:`MAX_META_DEPTH`."""
    if meta is None or (isinstance(meta, Mapping) and not meta):
        return b""
    if not isinstance(meta, Mapping):
        raise ValueError(f"{where}: must be a JSON object (a dict), not {type(meta).__name__}")
    _check_json(meta, where)
    data = json.dumps(meta, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(data) > MAX_META_BYTES:
        raise ValueError(f"{where}: {len(data)} bytes of JSON, more than the {MAX_META_BYTES} a sample may carry")
    return data


def _check_json(value: Any, where: str, depth: int = 1) -> None:
    if isinstance(value, (Mapping, list, tuple)) and depth > MAX_META_DEPTH:
        raise ValueError(f"{where}: nested more than {MAX_META_DEPTH} deep")
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value!r} is not a JSON number")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where}: key {k!r} is not a string")
            _check_json(v, f"{where}.{k}", depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json(v, f"{where}[{i}]", depth + 1)
        return
    raise ValueError(f"{where}: {type(value).__name__} is not JSON (str, number, bool, None, list or dict)")


def decode_meta(data: bytes | memoryview, where: str = "metadata") -> dict[str, Any]:
    """The metadata object stored as ``data`` (``{}`` for empty), or CorruptDataError."""
    if not len(data):
        return {}
    try:
        value = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptDataError(f"{where}: stored metadata is not JSON ({e})") from None
    except RecursionError:
        raise CorruptDataError(f"{where}: stored metadata is JSON nested too deeply to read") from None
    if not isinstance(value, dict):
        raise CorruptDataError(f"{where}: stored metadata is not a JSON object")
    return value


# -- writing ----------------------------------------------------------------------------------------
class SampleTableWriter:
    """Wraps a format writer: every ``add`` also records the sample's label, key and metadata in
    spill files (so memory stays flat in the number of samples); ``close`` writes
    ``samples.table`` from them and lists it after the writer's files. Checkpoints and resume
    cover the spill files, so a resumed conversion writes the same table. It also keeps the bits
    of the widest mask added (:attr:`mask_bits`), which the manifest declares as the masks' dtype."""

    _PARTS = ("fixed", "keys", "meta", "multi", "boxcount", "boxes", "boxlabels")

    def __init__(self, writer: Any, label_kind: str = "class", boxes: bool = False,
                 checkpoints: bool | None = None) -> None:
        """``checkpoints``: whether :meth:`checkpoint` will be called (None: when the writer is
        resumable); only then are the spill lengths of each row kept until the next checkpoint,
        so a run that never checkpoints (a merge, a conversion without a journal) keeps none."""
        if label_kind not in LABEL_KINDS:
            raise ValueError(f"label kind must be one of {LABEL_KINDS}, not {label_kind!r}")
        self.writer = writer
        self.kind = label_kind
        self.boxes = boxes
        self.resumable = getattr(writer, "resumable", False) if checkpoints is None else checkpoints
        self._files: dict[str, Any] = {}
        self._count = 0
        # spill lengths after each row since the last checkpoint, one group per row (row
        # ``_base + i`` ends at ``_lengths[P * i : P * i + P]``, P parts): a writer's checkpoint
        # may hold fewer samples than were added (a sharded writer counts finished shards only)
        self._base = 0
        self._lengths = array("Q", bytes(8 * len(self._PARTS)))
        #: Bits of the widest mask added (8 until a 16-bit one comes), checkpointed with the table.
        self.mask_bits = 8

    def _spill(self, part: str) -> str:
        return self.writer.path(f".{TABLE_NAME}.{part}")

    def _open(self, mode: str) -> None:
        self._files = {p: open(self._spill(p), mode) for p in self._PARTS}  # noqa: SIM115 - closed in close/abort

    def __getattr__(self, name: str) -> Any:  # directory, path, options, checkpoint_due, ...
        return getattr(self.writer, name)

    def begin(self, info: dict[str, Any]) -> None:
        """The writer's ``begin``; opens the spill files."""
        self._open("ab")  # a resumed run cuts them back in resume()
        self.writer.begin(info)

    def add(self, index: int, key: str, label: int, image: Any) -> None:
        """Record the sample's table row, then hand it to the writer."""
        self._row(key, label, getattr(image, "boxes", None), getattr(image, "box_labels", None))
        self.writer.add(index, key, label, image)
        for f in getattr(image, "fields", ()):
            if named(f.name).dtyped and f.depth > self.mask_bits:
                self.mask_bits = f.depth

    def _row(self, key: str, label: int, boxes: Any = None, box_labels: Any = None) -> None:
        meta = getattr(label, "meta", None)
        k = key.encode("utf-8")
        m = encode_meta(meta, f"sample {key!r}") if meta else b""
        if self.kind == "class":
            value = int(label)
        elif self.kind == "number":
            target = getattr(label, "target", None)
            if target is None:
                raise ValueError(f"sample {key!r} has no number label")
            value = struct.unpack("<q", struct.pack("<d", float(target)))[0]
        else:
            labels = getattr(label, "labels", None)
            if labels is None:
                raise ValueError(f"sample {key!r} has no list of labels")
            value = len(labels)
            self._files["multi"].write(np.asarray(labels, "<u4").tobytes())
        self._files["fixed"].write(_ROW.pack(value, len(k), len(m)))
        self._files["keys"].write(k)
        self._files["meta"].write(m)
        if self.boxes:
            self._box_row(key, boxes, box_labels)
        elif boxes is not None:
            raise ValueError(f"sample {key!r} has boxes, but the dataset was begun without them")
        self._count += 1
        if self.resumable:  # pruned at each checkpoint
            self._lengths.extend(f.tell() for f in self._files.values())

    def _box_row(self, key: str, boxes: Any, box_labels: Any) -> None:
        if boxes is None:
            raise ValueError(f"sample {key!r} has no boxes (every sample of a dataset with boxes has a list, maybe empty)")
        b = np.asarray(boxes, "<f4").reshape(-1, 4)
        lab = np.full(len(b), -1, "<i4") if box_labels is None else np.asarray(box_labels, "<i4")
        if len(lab) != len(b):
            raise ValueError(f"sample {key!r}: {len(lab)} box labels for {len(b)} boxes")
        self._files["boxcount"].write(struct.pack("<I", len(b)))
        self._files["boxes"].write(b.tobytes())
        self._files["boxlabels"].write(lab.tobytes())

    def checkpoint(self) -> dict[str, Any]:
        """The writer's checkpoint, with the spill files made durable and their lengths recorded."""
        state = dict(self.writer.checkpoint())
        done = int(state["samples"])
        for f in self._files.values():
            f.flush()
            os.fsync(f.fileno())
        p = len(self._PARTS)
        at = p * (done - self._base)
        state["table"] = dict(zip(self._PARTS, self._lengths[at:at + p]))
        # the widest of every mask added, also those after the checkpoint: a resumed run adds them again
        state["mask_bits"] = self.mask_bits
        del self._lengths[:at]
        self._base = done
        return state

    def resume(self, state: dict[str, Any]) -> None:
        """The writer's resume; the spill files cut back to the checkpoint's lengths."""
        lengths = state.get("table")
        if not isinstance(lengths, dict):
            raise CorruptDataError(f"{self.writer.directory}: the journal has no sample-table state; "
                                   "run without --resume to start over")
        if not self._files:
            self._open("ab")
        for part, f in self._files.items():
            f.flush()
            f.truncate(int(lengths.get(part, 0)))
            f.seek(0, os.SEEK_END)
        self._count = int(state["samples"])
        self._base = self._count
        self._lengths = array("Q", (int(lengths.get(p, 0)) for p in self._PARTS))
        # a journal written before masks were tracked: 16, which holds any mask's values
        self.mask_bits = int(state.get("mask_bits", 16))
        self.writer.resume({k: v for k, v in state.items() if k not in ("table", "mask_bits")})

    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Close the writer, then write ``samples.table`` and list it after the writer's files.
        The spill files stay until :meth:`forget_checkpoints`: a run killed before its final
        journal resumes from the last checkpoint, which needs them."""
        files, layout = self.writer.close()
        for f in self._files.values():
            f.close()
        path = self.writer.path(TABLE_NAME)
        tid = write_table(path, self.kind, *(self._spill(p) for p in self._PARTS[:4]),
                          boxes=tuple(self._spill(p) for p in self._PARTS[4:]) if self.boxes else None)
        return [*files, table_file_entry(path, tid)], layout

    def forget_checkpoints(self) -> None:
        """After the final journal: delete the spill files, then the writer's resume-only files."""
        for p in self._PARTS:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._spill(p))
        self.writer.forget_checkpoints()

    def _drop(self) -> None:
        for f in self._files.values():
            f.close()

    def abort(self) -> None:
        """The writer's abort (the spill files stay for ``--resume``)."""
        self._drop()
        self.writer.abort()

    def discard(self) -> None:
        """The writer's discard."""
        self._drop()
        self.writer.discard()


def table_file_entry(path: str, tid: str) -> FileEntry:
    """The manifest entry of the sample table just written at ``path`` with id ``tid``."""
    return FileEntry(os.path.basename(path), 0, os.path.getsize(path), file_sha256(path), 0, tid)


def build_table(path: str, kind: str, rows: Iterator[tuple[Any, ...]], boxes: bool = False) -> str:
    """Write a sample table at ``path`` from ``(key, label)`` rows (labels as :class:`Label` for the
    ``multi`` and ``number`` kinds or with metadata), for tools that assemble datasets from parts;
    with ``boxes``, rows are ``(key, label, boxes, box_labels)``. Return its id (:func:`table_id`)."""
    directory = os.path.dirname(path)

    class _Dir:
        def path(self, name: str) -> str:
            return os.path.join(directory, name)

    spill = SampleTableWriter(_Dir(), kind, boxes)
    spill._open("wb")
    try:
        for row in rows:
            spill._row(*row)
    finally:
        spill._drop()
    parts = [spill._spill(p) for p in SampleTableWriter._PARTS]
    try:
        return write_table(path, kind, *parts[:4], boxes=tuple(parts[4:]) if boxes else None)
    finally:
        for p in parts:
            os.remove(p)


# -- reading ----------------------------------------------------------------------------------------
class _Strings(Sequence[str]):
    """A read-only sequence of strings kept as one UTF-8 blob and their end offsets."""

    def __init__(self, blob: memoryview, ends: np.ndarray) -> None:
        self._blob, self._ends = blob, ends

    def __len__(self) -> int:
        return len(self._ends)

    def _bytes(self, i: int) -> memoryview:
        start = int(self._ends[i - 1]) if i else 0
        return self._blob[start:int(self._ends[i])]

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} entries")
        return bytes(self._bytes(i % n)).decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))


class SampleTable:
    """A sample table opened from a descriptor (memory-mapped: every process on a node shares its
    pages, and reads only those it uses), checked once per node (:mod:`.nodecheck`: later opens of
    the same unchanged file skip a check made on the node, ``checked_here`` False). Version 3
    checks at open only the header and what labels need (the labels and multi-label ids sections:
    CRC32C and offsets); keys, metadata and boxes are each checked when first asked for. Versions
    1 and 2 are checked whole at open (their one CRC covers every section). CorruptDataError names
    the file, and in version 3 the section, and what is wrong. With ``entry`` (the table's manifest
    entry) the table must also be the one the manifest lists: its id (:func:`table_id`) equal to
    the entry's, or, for tables listed without an id (written before tables had one), its SHA-256
    equal to the entry's."""

    def __init__(self, fd: int, path: str, num_samples: int | None = None, entry: FileEntry | None = None) -> None:
        self.path = path
        size = os.fstat(fd).st_size
        if size < _HEADER_BYTES:
            raise CorruptDataError(f"sample table is {size} bytes, shorter than its header", path=path)
        self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        buf = memoryview(self._map)
        (version,) = struct.unpack_from("<H", buf, 4)
        if bytes(buf[:4]) != _MAGIC:
            raise CorruptDataError("sample table header is damaged", path=path, offset=0)
        self._head: sections.TableHeader | None = None
        self._checked: set[str] = set()
        sha = entry.sha256 if entry is not None and not entry.id and entry.sha256 else ""
        opened = self._open_v3 if version == sections.VERSION else self._open_v12
        n, k, e, key_at, meta_at, check = opened(fd, buf, size, sha)
        if entry is not None and entry.id and entry.id != self.id:
            raise _not_this_datasets(path, f"its id is {self.id}, the manifest's {entry.id}")
        if num_samples is not None and n != num_samples:
            raise CorruptDataError(f"sample table holds {n} samples, the manifest says {num_samples}", path=path, offset=8)
        #: True when this process made the open's check, False when a process on this node had.
        self.checked_here = check_once(fd, f"sample table {self.id} {sha}" + (" labels" if self._head else ""), check)
        # the blobs: in version 3 each after its offsets (sections padded), before it both after both offset lists
        keys, meta = (key_at + 8 * n, meta_at + 8 * n) if self._head is not None else (meta_at + 8 * n, meta_at + 8 * n + k)
        self._keys = _Strings(buf[keys:keys + k], np.frombuffer(self._map, "<u8", n, key_at))
        self._meta = _Strings(buf[meta:meta + e], np.frombuffer(self._map, "<u8", n, meta_at))
        self.num_samples = n
        if self.has_boxes:
            self._open_boxes(n)

    def _open_v3(self, fd: int, buf: memoryview, size: int, sha: str) -> tuple[Any, ...]:
        """Version 3: the header checked, the label views made; (N, K, E, the key and metadata
        sections' offsets, the open's check: the labels and label ids sections)."""
        head = self._head = sections.unpack_header(buf, size, self.path, len(LABEL_KINDS))
        n = head.n
        self.id = table_id(buf)
        self.kind = LABEL_KINDS[head.kind]
        self.has_boxes = head.boxes
        at = {name: entry[0] for name, entry in head.sections.items()}
        column = sections.CLASS_DTYPES.get(head.column, "<i8") if self.kind != "multi" else "<u8"
        self._labels = np.frombuffer(self._map, column, n, at["labels"])
        self._ids = np.frombuffer(self._map, "<u4", head.m, at["label ids"]) if self.kind == "multi" else None
        self._box_at, self._box_total = at["boxes"] - 8, head.b
        self._fd = os.dup(fd)  # the sections checked later are read through it
        self._closer = weakref.finalize(self, os.close, self._fd)

        def check() -> None:  # what labels need: every other section waits until asked for
            for name in sections.SECTIONS[:2]:
                sections.check_section(self._fd, head, name, self.path, self._last(name))
            if sha and hashlib.sha256(buf).hexdigest() != sha:
                raise _not_this_datasets(self.path, "its SHA-256 differs from the manifest's")
        return n, head.k, head.e, at["keys"], at["metadata"], check

    def _open_v12(self, fd: int, buf: memoryview, size: int, sha: str) -> tuple[Any, ...]:
        """Versions 1 and 2: as :meth:`_open_v3`, the open's check reading the whole file."""
        path = self.path
        magic, version, kind, _zero, n, m, k, e, body_crc = _HEAD.unpack_from(buf, 0)
        (head_crc,) = struct.unpack_from("<I", buf, _HEAD.size)
        if version not in (1, BOXES_TABLE_VERSION) or kind >= len(LABEL_KINDS):  # a later packer's, or damaged
            raise CorruptDataError(f"sample table version {version} / label kind {kind} is not one this packer "
                                   "reads", path=path, offset=4)
        if crc32c.crc32c(buf[:_HEAD.size]) != head_crc:
            raise CorruptDataError("sample table header is damaged", path=path, offset=0)
        self.id = table_id(buf)
        self.kind = LABEL_KINDS[kind]
        multi = self.kind == "multi"
        self._check_size(buf, size, version, multi, n, m, k + e)
        self._labels = np.frombuffer(self._map, "<i8" if not multi else "<u8", n, _HEADER_BYTES)
        self._ids = np.frombuffer(self._map, "<u4", m, _HEADER_BYTES + 8 * n) if multi else None
        key_at = _HEADER_BYTES + 8 * n + (4 * (m + m % 2) if multi else 0)
        self.has_boxes = version == BOXES_TABLE_VERSION

        def check() -> None:  # reads every byte, through one buffer: once per node (nodecheck)
            ordered = [(key_at, n, k, "key"), (key_at + 8 * n, n, e, "metadata")]
            ordered += [(_HEADER_BYTES, n, m, "label")] if multi else []
            crc, bad = scan_file(fd, _HEADER_BYTES, size, [o[:3] for o in ordered])
            if crc != body_crc:
                raise CorruptDataError("sample table is damaged (checksum mismatch)", path=path, offset=_HEADER_BYTES)
            if bad is not None:
                raise CorruptDataError(f"sample table's {ordered[bad][3]} offsets are inconsistent", path=path)
            if sha and hashlib.sha256(buf).hexdigest() != sha:
                raise _not_this_datasets(path, "its SHA-256 differs from the manifest's")
            if self.has_boxes:
                self._open_boxes(n, check=True)
        return n, k, e, key_at, key_at + 8 * n, check

    def _last(self, name: str) -> int | None:
        """Where the leading offsets of version 3's section ``name`` must end (None: it has none)."""
        head = self._head
        assert head is not None
        ends = dict(zip(sections.SECTIONS, (head.m if self.kind == "multi" else None, None, head.k, head.e,
                                            head.b if head.boxes else None)))
        return ends[name]

    def _ensure(self, name: str) -> None:
        """Check section ``name`` of a version 3 table once per node, when first used here."""
        head = self._head
        if head is None or name in self._checked:
            return
        check_once(self._fd, f"sample table {self.id} {name}",
                   lambda: sections.check_section(self._fd, head, name, self.path, self._last(name)))
        self._checked.add(name)

    def check_all(self) -> None:
        """Check every section now, whatever the node's stamps say (``packer verify``): version 3's
        keys, metadata and boxes (labels were checked at open); CorruptDataError naming the file
        and the section."""
        head = self._head
        if head is None:
            return
        for name in sections.SECTIONS:
            sections.check_section(self._fd, head, name, self.path, self._last(name))
            self._checked.add(name)

    @property
    def keys(self) -> Sequence[str]:
        """Every sample's key (a read-only sequence over the mapped key blob)."""
        self._ensure("keys")
        return self._keys

    def _check_size(self, buf: memoryview, size: int, version: int, multi: bool, n: int, m: int, blobs: int) -> None:
        """The file's size against the header's counts (and, in version 2, the boxes section's)."""
        want = _HEADER_BYTES + 8 * n + (4 * (m + m % 2) if multi else 0) + 16 * n + blobs
        if version == BOXES_TABLE_VERSION:
            want += -blobs % 8
            b = struct.unpack_from("<Q", buf, want)[0] if size >= want + 8 else 0
            self._box_at, self._box_total = want, b
            want += 8 + 8 * n + 20 * b + 4 * (b % 2) if b < size else size + 1
        if size != want:
            raise CorruptDataError(f"sample table is {size} bytes, its header implies {want}", path=self.path)

    def _open_boxes(self, n: int, check: bool = False) -> None:
        at, b = self._box_at + 8, self._box_total
        self._box_ends = np.frombuffer(self._map, "<u8", n, at)
        if check and n and (int(self._box_ends[-1]) != b or bool(np.any(np.diff(self._box_ends.astype(np.int64)) < 0))):
            raise CorruptDataError("sample table's box offsets are inconsistent", path=self.path, offset=at)
        self._boxes = np.frombuffer(self._map, "<f4", 4 * b, at + 8 * n).reshape(b, 4)
        self._box_labels = np.frombuffer(self._map, "<i4", b, at + 8 * n + 16 * b)

    def boxes_of(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample ``i``'s boxes (N x 4 float32, ``[x0, y0, x1, y1]`` in stored pixels) and their
        labels (N int64; -1 where boxes have none), as new arrays."""
        if not self.has_boxes:
            raise KeyError(f"{self.path}: the samples have no boxes")
        self._ensure("boxes")
        start = int(self._box_ends[i - 1]) if i else 0
        end = int(self._box_ends[i])
        return np.array(self._boxes[start:end], np.float32), self._box_labels[start:end].astype(np.int64)

    @property
    def targets(self) -> np.ndarray | list[list[int]]:
        """Every sample's label: class indices (``class``) and float64 (``number``) as read-only
        views of the mapped file (no copy), or a list of class-index lists (``multi``). Class
        indices are int64 in table versions 1 and 2, and in version 3 the narrowest integer
        column that holds them (uint8, uint16, int8 or int16 with -1, int32, int64)."""
        if self.kind == "class":
            return self._labels
        if self.kind == "number":
            return self._labels.view("<f8").astype(np.float64, copy=False)
        return [self.labels_of(i) for i in range(self.num_samples)]

    def labels_of(self, i: int) -> list[int]:
        """The class indices of sample ``i`` (``multi``)."""
        assert self._ids is not None
        start = int(self._labels[i - 1]) if i else 0
        return [int(x) for x in self._ids[start:int(self._labels[i])]]

    def target_of(self, i: int) -> int | float | list[int]:
        """Sample ``i``'s label as its kind has it."""
        if self.kind == "class":
            return int(self._labels[i])
        if self.kind == "number":
            return float(self._labels[i:i + 1].view("<f8")[0])
        return self.labels_of(i)

    def meta(self, i: int) -> dict[str, Any]:
        """Sample ``i``'s metadata (``{}`` when it has none)."""
        self._ensure("metadata")
        raw = self._meta._bytes(i)
        return decode_meta(raw, f"{self.path}: sample {i}")

    def close(self) -> None:
        """Unmap the file (views handed out before stay valid only until then)."""
        try:
            self._map.close()
        except BufferError:  # a view is still alive; the mapping goes when it does
            pass
        if self._head is not None:
            self._closer()  # the descriptor kept for the sections checked later


def _not_this_datasets(path: str, why: str) -> CorruptDataError:
    return CorruptDataError(f"sample table is not this dataset's ({why}): copied from another conversion or "
                            f"altered; put back the dataset's own table or convert again", path=path)


def table_fields(root: str, manifest: Any) -> Any:
    """A function of a global sample index giving :func:`sample_fields`'s dict (and in version 3
    ``boxes`` and ``box_labels``, as lists) from the sample table of the dataset in ``root`` whose
    manifest is ``manifest`` (for tools that rebuild a sample's bytes); ``{}`` for every sample when the dataset has no table or the table cannot be
    read or is not the manifest's (the caller's own check then reports it)."""
    entry = table_entry(manifest)
    if entry is None:
        return lambda i: {}
    path = os.path.join(root, entry.name)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return lambda i: {}
    try:
        table = SampleTable(fd, path, manifest.num_samples, entry)
    except CorruptDataError:
        return lambda i: {}
    finally:
        os.close(fd)

    def fields(i: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if table.kind == "multi":
            out["labels"] = table.labels_of(i)
        elif table.kind == "number":
            out["target"] = table.target_of(i)
        meta = table.meta(i)
        if meta:
            out["meta"] = meta
        if table.has_boxes:  # version 3: boxes, and their labels where the manifest says they have them
            boxes, labels = table.boxes_of(i)
            out["boxes"] = [[float(v) for v in b] for b in boxes]
            if box_labels:
                out["box_labels"] = [int(v) for v in labels]
        return out

    box_labels = any(KINDS.get(f.get("kind")) is BOXES and f.get("labels") for f in getattr(manifest, "fields", []))
    return fields
