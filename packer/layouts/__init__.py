"""One module per format holding all of its on-disk knowledge: file names, structs, index
pack/unpack, member scans and damage locators. The writer (packer.converters), the reader
(packer.datasets), ``verify`` and the tests import these; readers never import writers.
docs/FORMATS.md is the user's reference for the same layouts. This package holds what they
share; the registry, which lists them, is :mod:`packer.formats`."""

from __future__ import annotations

__all__ = ["read_head"]


def read_head(path: str, n: int = 1 << 16) -> bytes:
    """The first ``n`` bytes of ``path`` (empty when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""
