"""The binary layout of one packed sample, used as the LMDB value (and anywhere a self-describing
record is needed). No pickle: a 32-byte little-endian header, then the key, then the payload.

    0  magic b"PKS2" (PKS1 in version 1, PKS3 in version 3)    4  codec id   5  channels (3)
    6  key length K (u16)   8  label (i64)   16 height (u32)   20 width (u32)
    24 payload length P (u32)
    28 CRC32C of [0, 28) + everything after byte 32, seeded with the sample's place
       (packer.description.placement; PKS1: not seeded) (u32)
    32 key (K bytes, UTF-8, the source path relative to the source root), then the payload (P)
    PKS3 only, after the payload: the masks and extra images, each a 16-byte header <BBBBIII
    (name length L, codec id, channels, bits per channel, height, width, payload length Q),
    the name (L bytes, UTF-8), then Q bytes.

docs/FORMATS.md repeats this table for people reading our files without packer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from ..errors import CorruptDataError
from ..images.codecs import CODEC_IDS, CODEC_NAMES
from ..images.imageproc import ProcessedField

__all__ = ["MAGIC", "MAGICS", "HEADER", "CODEC_IDS", "Record", "pack_record", "unpack_record", "pack_fields",
           "unpack_fields"]

MAGIC = b"PKS2"
MAGIC_V1 = b"PKS1"
MAGIC_V3 = b"PKS3"
MAGICS = (MAGIC, MAGIC_V1, MAGIC_V3)
HEADER = struct.Struct("<4sBBHqIII")  # everything before the CRC: 28 bytes
FIELD_HEADER = struct.Struct("<BBBBIII")
_CRC = struct.Struct("<I")
_CODEC_NAMES = CODEC_NAMES


@dataclass(frozen=True)
class Record:
    """A decoded record header plus views of its key and payload."""

    codec: str
    label: int
    height: int
    width: int
    key: str
    payload: memoryview | bytes
    channels: int = 3
    #: Per-sample metadata found in the sample itself (other tools' TFRecord features), when asked for.
    meta: dict | None = None
    #: The sample's masks and extra images, as stored (payloads are views), in the dataset's order.
    fields: tuple[ProcessedField, ...] = ()
    #: Boxes ``[x0, y0, x1, y1]`` in stored pixels and their labels, where the sample itself holds
    #: them (other tools' data); packer's own datasets keep them in the sample table.
    boxes: tuple[tuple[float, float, float, float], ...] | None = None
    box_labels: tuple[int, ...] | None = None


def pack_fields(fields: tuple[ProcessedField, ...] | list[ProcessedField]) -> bytes:
    """Masks and extra images as the record's field section (module docstring)."""
    out = []
    for f in fields:
        name = f.name.encode("utf-8")
        out += [FIELD_HEADER.pack(len(name), CODEC_IDS[f.codec], f.channels, f.depth, f.height, f.width,
                                  len(f.payload)), name, f.payload]
    return b"".join(out)


def unpack_fields(mv: memoryview, path: str | None = None, sample: int | None = None,
                  base: int = 0) -> tuple[ProcessedField, ...]:
    """The fields packed by :func:`pack_fields` in ``mv`` (whole: CorruptDataError, with the
    offset from ``base``, when anything is left over or cut)."""
    out, at = [], 0
    while at < len(mv):
        if at + FIELD_HEADER.size > len(mv):
            raise CorruptDataError("field header cut short", path=path, sample=sample, offset=base + at)
        nlen, codec_id, channels, depth, height, width, qlen = FIELD_HEADER.unpack_from(mv, at)
        start = at + FIELD_HEADER.size + nlen
        if start + qlen > len(mv) or codec_id not in _CODEC_NAMES or depth not in (8, 16):
            raise CorruptDataError(f"field header inconsistent (codec {codec_id}, {depth} bits, payload {qlen} B)",
                                   path=path, sample=sample, offset=base + at)
        name = bytes(mv[at + FIELD_HEADER.size:start]).decode("utf-8", "replace")
        out.append(ProcessedField(name, _CODEC_NAMES[codec_id], mv[start:start + qlen], height, width, channels, depth))
        at = start + qlen
    return tuple(out)


def pack_record(
    key: str, label: int, codec: str, height: int, width: int, payload: bytes, seed: int | None = None,
    fields: tuple[ProcessedField, ...] | None = None,
) -> bytes:
    """Serialise one sample into the record layout above: ``PKS2`` with its place ``seed``
    (:func:`packer.description.placement.place_seed`), ``PKS3`` when it has ``fields`` (even
    none: a version 3 dataset's sample), or ``PKS1`` without a seed (records that never leave
    memory, such as the RAM cache's, which keeps fields only in ``PKS3``)."""
    k = key.encode("utf-8")
    if len(k) > 0xFFFF:
        raise ValueError(f"sample key longer than 65535 bytes: {key[:80]}...")
    magic = MAGIC_V3 if fields is not None else MAGIC_V1 if seed is None else MAGIC
    head = HEADER.pack(magic, CODEC_IDS[codec], 3, len(k), label, height, width, len(payload))
    tail = pack_fields(fields) if fields else b""
    crc = crc32c.crc32c(tail, crc32c.crc32c(payload, crc32c.crc32c(k, crc32c.crc32c(head, seed or 0))))
    return b"".join((head, _CRC.pack(crc), k, payload, tail))


def unpack_record(
    buf: bytes | memoryview,
    *,
    verify: bool = True,
    path: str | None = None,
    sample: int | None = None,
    seed: int | None = None,
) -> Record:
    """Parse a record; with ``verify`` check its CRC32C, from ``seed`` (the sample's place in a
    version 2 dataset; None for version 1, whose records are ``PKS1``). Raises CorruptDataError
    with context, also for a record of the other version."""
    mv = memoryview(buf)
    if len(mv) < 32:
        raise CorruptDataError(f"record of {len(mv)} bytes is shorter than its 32-byte header", path=path, sample=sample)
    magic, codec_id, channels, klen, label, height, width, plen = HEADER.unpack_from(mv, 0)
    if magic not in MAGICS:
        raise CorruptDataError(f"bad record magic {bytes(magic)!r}", path=path, sample=sample, offset=0)
    if verify and magic != MAGIC_V3 and (magic == MAGIC) != (seed is not None):
        raise CorruptDataError(f"a {bytes(magic).decode()} record in a version {2 if seed is not None else 1} "
                               f"dataset (a record from another dataset?)", path=path, sample=sample, offset=0)
    end = 32 + klen + plen
    if (end != len(mv) and not (magic == MAGIC_V3 and end < len(mv))) or codec_id not in _CODEC_NAMES:
        raise CorruptDataError(
            f"record header inconsistent (codec {codec_id}, key {klen} B, payload {plen} B, record {len(mv)} B)",
            path=path, sample=sample, offset=4,
        )
    if verify:
        (stored,) = _CRC.unpack_from(mv, 28)
        actual = crc32c.crc32c(mv[32:], crc32c.crc32c(mv[:28], seed or 0))
        if actual != stored:
            raise CorruptDataError(
                f"record checksum mismatch (stored {stored:08x}, computed {actual:08x}; damaged, or a "
                f"sample from another place)",
                path=path, sample=sample, offset=28,
            )
    key = bytes(mv[32 : 32 + klen]).decode("utf-8", "replace")
    fields = unpack_fields(mv[end:], path, sample, end) if magic == MAGIC_V3 else ()
    return Record(_CODEC_NAMES[codec_id], label, height, width, key, mv[32 + klen:end], channels, fields=fields)
