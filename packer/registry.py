"""The format registry: one line per format, naming its writer and its reader.

Readers are chosen by the manifest's ``format`` field, never by the caller. Entries are import
paths resolved on first use, so ``import packer`` stays light and a format whose optional
dependency is missing fails only when used. Adding a format: a writer module in converters/,
a reader module of the same name in datasets/, and one line here.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["FORMATS", "format_names", "writer_class", "reader_class"]

#: format name -> (writer "module:Class", reader "module:Class")
FORMATS: dict[str, tuple[str, str]] = {
    "lmdb": ("packer.converters.lmdb:LMDBWriter", "packer.datasets.lmdb:LMDBDataset"),
    "tar": ("packer.converters.tar:TarWriter", "packer.datasets.tar:TarDataset"),
    "tfrecord": ("packer.converters.tfrecord:TFRecordWriter", "packer.datasets.tfrecord:TFRecordDataset"),
    "hdf5": ("packer.converters.hdf5:HDF5Writer", "packer.datasets.hdf5:HDF5Dataset"),
}


def format_names() -> list[str]:
    """The registered format names, in registry order."""
    return list(FORMATS)


def _load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _entry(fmt: str) -> tuple[str, str]:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}; known formats: {', '.join(FORMATS)}") from None


def writer_class(fmt: str) -> Any:
    """The writer class for ``fmt`` (ValueError for an unknown format)."""
    return _load(_entry(fmt)[0])


def reader_class(fmt: str) -> Any:
    """The map-style dataset class for ``fmt`` (ValueError for an unknown format)."""
    return _load(_entry(fmt)[1])
