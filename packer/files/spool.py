"""Spool files: a sample given as bytes, written to a temporary folder so that a conversion reads
it as a file, and knows it again when a resumed conversion spools the same bytes."""

from __future__ import annotations

import hashlib
import os

__all__ = ["write_spooled"]


def write_spooled(path: str, data: bytes) -> None:
    """Write an image's bytes to ``path`` in a spool folder. A conversion knows a file by its size
    and modification time: the time is set from the content, so the same sample spooled again (a
    resumed conversion) is the same file to it."""
    with open(path, "wb") as f:
        f.write(data)
    stamp = int.from_bytes(hashlib.sha256(data).digest()[:7], "little")
    os.utime(path, ns=(stamp, stamp))
