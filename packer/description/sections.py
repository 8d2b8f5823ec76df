"""Sample table version 3: a header that names each section (labels, multi-label ids, keys,
metadata, boxes) with its own offset, length and CRC32C, so a reader checks only the sections it
uses, each when first asked for; and class labels in the narrowest integer column that holds
them. The byte layout is in docs/FORMATS.md ("The sample table", version 3).

This module knows the layout: :func:`pack_header` / :func:`unpack_header`, :func:`label_dtype`
(the column chosen at write time), :class:`SectionWriter` (the writer's per-section CRCs and
padding) and :func:`check_section` (a section's CRC and offsets, read through one buffer).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import crc32c
import numpy as np

from ..errors import CorruptDataError
from .nodecheck import scan_file

__all__ = ["VERSION", "LABEL_KINDS", "SECTIONS", "HEADER_BYTES", "CLASS_DTYPES", "TableHeader", "label_dtype", "pack_header",
           "unpack_header", "SectionWriter", "check_section", "expected_lengths", "SPILL_ROW", "write_table",
           "table_id"]

VERSION = 3
#: The label kinds by their code in the header (byte 6).
LABEL_KINDS = ("class", "multi", "number")
#: The sections in file order; each has an entry (offset, length, CRC32C) in the header.
SECTIONS = ("labels", "label ids", "keys", "metadata", "boxes")
# magic, version, label kind, label column code, N, M (multi-label ids), K (key blob), E (metadata blob), B (boxes)
_HEAD = struct.Struct("<4sHBBQQQQQ")
_ENTRY = struct.Struct("<QQI4x")  # a section's offset, length, CRC32C, 4 zero bytes
_FLAGS = struct.Struct("<I")  # bit 0: the table has a boxes section
_FIELDS_BYTES = _HEAD.size + len(SECTIONS) * _ENTRY.size + _FLAGS.size  # 172: what the header's CRC covers
#: The header's size: its fields, the sections' entries, the flags, and the CRC32C of all of those.
HEADER_BYTES = _FIELDS_BYTES + 4
#: The class label columns by code (0 is the float64 of ``number`` and the u64 offsets of ``multi``).
CLASS_DTYPES = {1: "<u1", 2: "<u2", 3: "<i1", 4: "<i2", 5: "<i4", 6: "<i8"}


@dataclass(frozen=True)
class TableHeader:
    """A version 3 header's fields: ``kind`` the label kind's index; ``column`` the label column's
    code (:data:`CLASS_DTYPES`, 0 for the other kinds); the counts; ``sections`` maps each of
    :data:`SECTIONS` to (offset, length, CRC32C)."""

    kind: int
    column: int
    n: int
    m: int
    k: int
    e: int
    b: int
    boxes: bool
    sections: dict[str, tuple[int, int, int]]


def label_dtype(low: int, high: int) -> int:
    """The code of the narrowest class label column holding every label in ``low`` .. ``high``
    (-1 marks a sample without a class): uint8, uint16 when none is negative, else int8, int16;
    int32, int64 beyond."""
    if low >= 0:
        for code in (1, 2):
            if high <= np.iinfo(CLASS_DTYPES[code]).max:
                return code
    for code in (3, 4, 5):
        info = np.iinfo(CLASS_DTYPES[code])
        if info.min <= low and high <= info.max:
            return code
    return 6


def pack_header(head: TableHeader) -> bytes:
    """The table's :data:`HEADER_BYTES` header bytes for ``head``."""
    out = _HEAD.pack(b"PKST", VERSION, head.kind, head.column, head.n, head.m, head.k, head.e, head.b)
    for name in SECTIONS:
        out += _ENTRY.pack(*head.sections[name])
    out += _FLAGS.pack(1 if head.boxes else 0)
    return out + struct.pack("<I", crc32c.crc32c(out))


def expected_lengths(head: TableHeader) -> dict[str, int]:
    """Each section's length as the header's counts imply it (8-byte padded)."""
    n, m, b = head.n, head.m, head.b
    width = np.dtype(CLASS_DTYPES[head.column]).itemsize if head.column else 8
    return {"labels": _pad(width * n), "label ids": _pad(4 * m), "keys": 8 * n + _pad(head.k),
            "metadata": 8 * n + _pad(head.e), "boxes": 8 * n + _pad(20 * b) if head.boxes else 0}


def unpack_header(buf: Any, size: int, path: str, kinds: int) -> TableHeader:
    """The version 3 header of the table mapped as ``buf`` (``size`` bytes), checked: its CRC, the
    label column against the kind (``kinds`` label kinds exist), and the sections in order, each
    where the previous one ends, as long as the counts imply, the last ending at the file's end;
    CorruptDataError naming ``path`` otherwise."""
    if size < HEADER_BYTES:
        raise CorruptDataError(f"sample table is {size} bytes, shorter than its version 3 header", path=path)
    (crc,) = struct.unpack_from("<I", buf, _FIELDS_BYTES)
    if crc32c.crc32c(buf[:_FIELDS_BYTES]) != crc:
        raise CorruptDataError("sample table header is damaged", path=path, offset=0)
    _magic, _version, kind, column, n, m, k, e, b = _HEAD.unpack_from(buf, 0)
    entries = {name: _ENTRY.unpack_from(buf, _HEAD.size + i * _ENTRY.size) for i, name in enumerate(SECTIONS)}
    (flags,) = _FLAGS.unpack_from(buf, _HEAD.size + len(SECTIONS) * _ENTRY.size)
    if kind >= kinds or (column not in CLASS_DTYPES if kind == 0 else column != 0) or flags > 1:
        raise CorruptDataError(f"sample table label kind {kind} / column {column} / flags {flags} is not one "
                               "this packer reads", path=path, offset=6)
    head = TableHeader(kind, column, n, m, k, e, b, bool(flags), entries)
    at = HEADER_BYTES
    for name, want in expected_lengths(head).items():
        offset, length, _crc = entries[name]
        if offset != at or length != want:
            raise CorruptDataError(f"sample table's {name} section is at {offset} ({length} bytes), its header "
                                   f"implies {at} ({want} bytes)", path=path, offset=at)
        at += length
    if at != size:
        raise CorruptDataError(f"sample table is {size} bytes, its header implies {at}", path=path)
    return head


def _pad(nbytes: int) -> int:
    return nbytes + -nbytes % 8


class SectionWriter:
    """Writes a table's sections in order into ``out`` (already past the header), each section's
    CRC32C computed as its bytes go by; :meth:`end` pads it to 8 bytes and records its entry."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.sections: dict[str, tuple[int, int, int]] = {}
        self._at = HEADER_BYTES
        self._start = HEADER_BYTES
        self._crc = 0

    def put(self, data: Any) -> None:
        """Append ``data`` (bytes or a NumPy array) to the current section."""
        raw = data.tobytes() if isinstance(data, np.ndarray) else data
        self._crc = crc32c.crc32c(raw, self._crc)
        self.out.write(raw)
        self._at += len(raw)

    def end(self, name: str) -> None:
        """Close section ``name``: zero padding to 8 bytes, then its (offset, length, CRC32C)."""
        self.put(bytes(-(self._at - self._start) % 8))
        self.sections[name] = (self._start, self._at - self._start, self._crc)
        self._start, self._crc = self._at, 0


def check_section(fd: int, head: TableHeader, name: str, path: str, last: int | None = None) -> None:
    """Check section ``name`` of the table open on ``fd``: its CRC32C, and with ``last`` its
    leading N u64 end offsets (in order, the last equal to ``last``). CorruptDataError naming the
    file and the section otherwise. Reads the section through one buffer (no mapping)."""
    offset, length, crc = head.sections[name]
    ordered = [(offset, head.n, last)] if last is not None else []
    got, bad = scan_file(fd, offset, offset + length, ordered)  # type: ignore[arg-type]
    if got != crc:
        raise CorruptDataError(f"sample table's {name} section is damaged (checksum mismatch)", path=path, offset=offset)
    if bad is not None:
        raise CorruptDataError(f"sample table's {name} offsets are inconsistent", path=path, offset=offset)


#: One spill row per sample, as :class:`packer.description.samples.SampleTableWriter` writes it:
#: the label (float64 bits for ``number``, the label count for ``multi``), key and metadata lengths.
SPILL_ROW = np.dtype([("value", "<i8"), ("keylen", "<u4"), ("metalen", "<u4")])


def write_table(path: str, kind: str, fixed_path: str, keys_path: str, meta_path: str, multi_path: str,
                boxes: tuple[str, str, str] | None = None) -> str:
    """Write a version 3 sample table at ``path`` (via a temporary name, then renamed) from the
    spill files (rows of :data:`SPILL_ROW`, the key and metadata blobs, the multi-label ids and,
    with ``boxes``, the box count, box and box-label files), a chunk of rows at a time, so memory
    does not grow with the number of samples; return its id (:func:`table_id`). Class labels take the narrowest
    column that holds them (:func:`label_dtype`, from a first pass over the rows)."""
    n = os.path.getsize(fixed_path) // SPILL_ROW.itemsize
    fixed = np.memmap(fixed_path, SPILL_ROW, mode="r", shape=(n,)) if n else np.zeros(0, SPILL_ROW)
    spans = [(a, min(a + (1 << 20), n)) for a in range(0, n, 1 << 20)]

    def ends(column: str) -> Any:  # running end offsets of a length column, chunk by chunk
        total = 0
        for a, b in spans:
            out = np.cumsum(fixed[column][a:b], dtype="<u8") + np.uint64(total)
            total = int(out[-1])
            yield out

    code, m, totals = 0, 0, {}
    if kind == "class":
        low = min((int(fixed["value"][a:b].min()) for a, b in spans), default=0)
        code = label_dtype(min(low, 0), max((int(fixed["value"][a:b].max()) for a, b in spans), default=0))
    tmp = path + ".partial"
    with open(tmp, "wb") as out:
        out.write(bytes(HEADER_BYTES))
        w = SectionWriter(out)
        if kind == "multi":
            last = np.zeros(0, "<u8")
            for last in ends("value"):
                w.put(last)
            m = int(last[-1]) if len(last) else 0
            if os.path.getsize(multi_path) != 4 * m:
                raise CorruptDataError(f"{multi_path}: {os.path.getsize(multi_path) // 4} labels, the samples claim {m}")
            w.end("labels")
            for data in _chunks(multi_path):
                w.put(data)
        else:
            for a, b in spans:  # float64 bits for number
                w.put(np.ascontiguousarray(fixed["value"][a:b]).astype(CLASS_DTYPES[code] if code else "<i8"))
            w.end("labels")
        w.end("label ids")
        for column, blob, name in (("keylen", keys_path, "keys"), ("metalen", meta_path, "metadata")):
            last = np.zeros(0, "<u8")
            for last in ends(column):
                w.put(last)
            totals[name] = int(last[-1]) if len(last) else 0
            if os.path.getsize(blob) != totals[name]:
                raise CorruptDataError(f"{path}: the spill files do not match their row counts")
            for data in _chunks(blob):
                w.put(data)
            w.end(name)
        b = _put_boxes(w, n, *boxes) if boxes is not None else 0
        w.end("boxes")
        head = pack_header(TableHeader(LABEL_KINDS.index(kind), code, n, m, totals["keys"], totals["metadata"], b,
                                       boxes is not None, w.sections))
        out.seek(0)
        out.write(head)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    return table_id(head)


def table_id(header: bytes | memoryview) -> str:
    """The identity of the sample table whose header is ``header`` (its first 48 bytes in versions
    1 and 2, :data:`HEADER_BYTES` in version 3): the first 16 hex digits of SHA-256(b"packer
    table" + header). The header holds the CRC32C of the rest of the table (of each section, in
    version 3), so the id names the whole table for the cost of reading its header; the manifest
    records it in the table's ``files[].id`` and readers compare the two at open."""
    v3 = len(header) >= 6 and struct.unpack_from("<H", header, 4)[0] == VERSION
    return hashlib.sha256(b"packer table" + bytes(header[:HEADER_BYTES if v3 else 48])).hexdigest()[:16]


def _chunks(path: str) -> Iterator[bytes]:
    """A file's bytes, 1 MiB at a time."""
    with open(path, "rb") as f:
        while data := f.read(1 << 20):
            yield data


def _put_boxes(w: SectionWriter, n: int, count_path: str, boxes_path: str, labels_path: str) -> int:
    """The boxes section's bytes: N u64 end offsets, B x 4 float32, B int32 labels; return B."""
    counts = np.fromfile(count_path, "<u4") if os.path.getsize(count_path) else np.zeros(0, "<u4")
    ends = np.cumsum(counts, dtype="<u8")
    b = int(ends[-1]) if len(ends) else 0
    if len(counts) != n or os.path.getsize(boxes_path) != 16 * b or os.path.getsize(labels_path) != 4 * b:
        raise CorruptDataError(f"{boxes_path}: the box spill files do not match their row counts")
    w.put(ends.astype("<u8"))
    for p in (boxes_path, labels_path):
        for data in _chunks(p):
            w.put(data)
    return b
