"""Readers for packed datasets, installed as ``packer.datasets``.

``open_dataset(path)`` reads the manifest and returns the right map-style dataset.
"""

from __future__ import annotations

import os
from typing import Any

from packer.manifest import read_manifest
from packer.registry import reader_class

from .base import OUTPUTS, PackedDataset

__all__ = ["open_dataset", "PackedDataset", "OUTPUTS"]


def open_dataset(path: str | os.PathLike[str], **kwargs: Any) -> PackedDataset:
    """Open a packed dataset, choosing the reader from its manifest's ``format`` field.

    Keyword arguments go to the reader: ``transform``, ``target_transform``, ``output``
    (``"tensor"``, ``"numpy"`` or ``"pil"``), ``verify``, ``on_error``. Raises
    UnfinishedDatasetError when the directory has no manifest.
    """
    manifest = read_manifest(path)
    return reader_class(manifest.format)(path, manifest=manifest, **kwargs)


def __getattr__(name: str) -> Any:
    # The format readers are imported on first use, so importing packer.datasets stays light.
    if name.endswith("Dataset"):
        from packer.registry import FORMATS

        for fmt, (_, reader) in FORMATS.items():
            if reader.endswith(":" + name):
                return reader_class(fmt)
    raise AttributeError(f"module 'packer.datasets' has no attribute {name!r}")
