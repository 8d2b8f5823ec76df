"""Binding every stored sample to its place: the payload file it was written into, and its position
in that file (on-disk version 2).

A checksum that covers only a sample's own bytes cannot tell a valid sample in the wrong place
from the right one: two shards swapped on disk, a manifest naming the wrong file, a file copied in
from another conversion, a damaged B-tree pointer that leads to another record. So each payload
file gets an identity, and each sample's checksum starts from a seed made of that identity and the
sample's position within the file:

    file id    the first 8 bytes of SHA-256(b"packer file" + ordinal (u64 LE) + first key (UTF-8)
               + 0x00 + first payload), written as 16 lowercase hex digits in ``files[].id``
    seed       CRC32C(b"PKPL" + file id (8 bytes) + position in the file (u64 LE))

The identity is derived from the file's content (its first sample and its number in the
conversion), never from a clock or a random number, so a conversion stays byte-reproducible; and it
is bound to the file and the position in it, not to a dataset-wide index, so files can be merged
into another dataset unchanged. Version 1 datasets have no ids; their seed is 0 (the plain CRC).
"""

from __future__ import annotations

import hashlib
import re
import struct

import crc32c

__all__ = ["file_id", "place_seed", "is_file_id"]

_ID = re.compile(r"[0-9a-f]{16}")


def file_id(ordinal: int, first_key: str, first_payload: bytes | bytearray | memoryview) -> str:
    """The identity of the payload file number ``ordinal`` of a conversion whose first sample has
    ``first_key`` and ``first_payload`` (the stored bytes)."""
    h = hashlib.sha256(b"packer file")
    h.update(struct.pack("<Q", ordinal))
    h.update(first_key.encode("utf-8", "surrogatepass") + b"\0")
    h.update(first_payload)
    return h.hexdigest()[:16]


def place_seed(fid: str | None, position: int) -> int:
    """The CRC32C seed of the sample at ``position`` in the file with id ``fid`` (0 without an id:
    version 1 data)."""
    if not fid:
        return 0
    return crc32c.crc32c(b"PKPL" + bytes.fromhex(fid) + struct.pack("<Q", position))


def is_file_id(value: object) -> bool:
    """True for a well-formed file id (16 lowercase hex digits)."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None
