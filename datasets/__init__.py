"""Readers for packed datasets, installed as ``packer.datasets``.

``open_dataset(path)`` reads the manifest and returns the right map-style dataset.
"""

from __future__ import annotations

from typing import Any

from packer.storage.shardspec import ShardSpecError

from .base import OUTPUTS, PackedDataset
from .collation import collate
from .encoded import EncodedBatch, collate_encoded
from .opening import listed_format, open_dataset
from .prefetch import prefetch_to_device
from .samplers import ExactDistributedSampler
from .seeding import seed_everything, seed_worker, worker_rng
from .shm.cache import SharedCache
from .streaming import StreamingDataset

__all__ = ["open_dataset", "listed_format", "ShardSpecError", "PackedDataset", "OUTPUTS", "StreamingDataset", "ExactDistributedSampler", "SharedCache", "collate",
           "collate_encoded", "EncodedBatch", "prefetch_to_device", "seed_everything", "seed_worker", "worker_rng",
           # the format readers, resolved lazily through the registry by __getattr__ below
           "LMDBDataset", "HDF5Dataset", "TarDataset", "TFRecordDataset"]


def __getattr__(name: str) -> Any:
    # The format readers are imported on first use, so importing packer.datasets stays light.
    if name.endswith("Dataset"):
        from packer.formats import FORMATS

        for fmt in FORMATS.values():  # each reader is named <Format>Dataset
            if name.lower() == f"{fmt.name}dataset" and fmt.reader.__name__ == name:
                return fmt.reader
    raise AttributeError(f"module 'packer.datasets' has no attribute {name!r}")
