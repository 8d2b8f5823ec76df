"""packer: pack image folders into LMDB, HDF5, WebDataset tar shards or TFRecord, and read them fast.

``import packer`` is light: ``packer.convert``, ``packer.pack``, ``packer.open_dataset``,
``packer.StreamingDataset``, ``packer.collate``, ``packer.convert_items``, ``packer.merge`` and
``packer.ConvertOptions`` import what they need when first used; ``packer.ray`` (Ray Data's
``Sink``, ``Source`` and ``write``) and ``packer.spark`` (``write``) import their engine when first used.
"""

from __future__ import annotations

__version__ = "0.2.0.dev0"

import importlib  # noqa: E402
from typing import Any  # noqa: E402

from .errors import *  # noqa: E402, F403 - after __version__, which setup.cfg reads
from .errors import __all__ as _error_names  # noqa: E402

#: Public name -> the module that defines it, imported on first use (PEP 562).
_LAZY = {
    "convert": "packer.api",
    "pack": "packer.api",
    "ConvertOptions": "packer.pipeline.engine",
    "convert_items": "packer.pipeline.items",
    "merge": "packer.operations.merge",
    "open_dataset": "packer.datasets",
    "StreamingDataset": "packer.datasets",
    "collate": "packer.datasets",
}

#: Public name -> a module of the cluster engines, imported (with its engine) on first use.
_ENGINES = {"ray": "packer.engines.ray", "spark": "packer.engines.spark"}

__all__ = ["__version__", *_LAZY, *_error_names]


def __getattr__(name: str) -> Any:
    if name in _ENGINES:
        value = importlib.import_module(_ENGINES[name])
        globals()[name] = value
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'packer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_ENGINES})
