"""The binary layout of one packed sample, used as the LMDB value (and anywhere a self-describing
record is needed). No pickle: fixed little-endian header, then the key, then the payload.

    offset size  field
    0      4     magic b"PKS2" (b"PKS1" in version 1 datasets)
    4      1     codec id (0 raw, 1 jpeg, 2 png, 3 webp, 4 bmp, 5 tiff, 6 pnm, 7 gif)
    5      1     channels (3)
    6      2     key length K in bytes (uint16)
    8      8     label (int64)
    16     4     height (uint32)
    20     4     width (uint32)
    24     4     payload length P (uint32)
    28     4     CRC32C of bytes [0, 28) + key + payload, seeded with the sample's place
                 (packer.description.placement; PKS1: not seeded) (uint32)
    32     K     key, UTF-8 (the source path relative to the source root, '/'-separated)
    32+K   P     payload: encoded image bytes, or H*W*3 RGB uint8 for raw

docs/FORMATS.md repeats this table for people reading our files without packer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from ..errors import CorruptDataError
from ..images.codecs import CODEC_IDS, CODEC_NAMES

__all__ = ["MAGIC", "MAGICS", "HEADER", "CODEC_IDS", "Record", "pack_record", "unpack_record"]

MAGIC = b"PKS2"
MAGIC_V1 = b"PKS1"
MAGICS = (MAGIC, MAGIC_V1)
HEADER = struct.Struct("<4sBBHqIII")  # everything before the CRC: 28 bytes
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


def pack_record(
    key: str, label: int, codec: str, height: int, width: int, payload: bytes, seed: int | None = None
) -> bytes:
    """Serialise one sample into the record layout above: ``PKS2`` with its place ``seed``
    (:func:`packer.description.placement.place_seed`), or ``PKS1`` without one (records that never leave
    memory, such as the RAM cache's)."""
    k = key.encode("utf-8")
    if len(k) > 0xFFFF:
        raise ValueError(f"sample key longer than 65535 bytes: {key[:80]}...")
    magic = MAGIC_V1 if seed is None else MAGIC
    head = HEADER.pack(magic, CODEC_IDS[codec], 3, len(k), label, height, width, len(payload))
    crc = crc32c.crc32c(payload, crc32c.crc32c(k, crc32c.crc32c(head, seed or 0)))
    return b"".join((head, _CRC.pack(crc), k, payload))


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
    if verify and (magic == MAGIC) != (seed is not None):
        raise CorruptDataError(f"a {bytes(magic).decode()} record in a version {2 if seed is not None else 1} "
                               f"dataset (a record from another dataset?)", path=path, sample=sample, offset=0)
    end = 32 + klen + plen
    if end != len(mv) or codec_id not in _CODEC_NAMES:
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
    return Record(_CODEC_NAMES[codec_id], label, height, width, key, mv[32 + klen :], channels)
