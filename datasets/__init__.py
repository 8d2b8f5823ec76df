"""Readers for packed datasets, installed as ``packer.datasets``.

``open_dataset(path)`` reads the manifest and returns the right map-style dataset.
"""

from __future__ import annotations

import os
from typing import Any

from packer.description.manifest import MANIFEST_NAME, read_manifest
from packer.description.registry import reader_class
from packer.errors import UnfinishedDatasetError
from packer.layouts import explain_missing_manifest
from packer.storage.remote import is_url

from .base import OUTPUTS, PackedDataset
from .cache import SharedCache
from .collation import collate
from .encoded import EncodedBatch, collate_encoded
from .prefetch import prefetch_to_device
from .samplers import ExactDistributedSampler
from .seeding import seed_everything, seed_worker, worker_rng
from .streaming import StreamingDataset

__all__ = ["open_dataset", "PackedDataset", "OUTPUTS", "StreamingDataset", "ExactDistributedSampler", "SharedCache", "collate",
           "collate_encoded", "EncodedBatch", "prefetch_to_device", "seed_everything", "seed_worker", "worker_rng",
           # the format readers, resolved lazily through the registry by __getattr__ below
           "LMDBDataset", "HDF5Dataset", "TarDataset", "TFRecordDataset"]


def open_dataset(path: str | os.PathLike[str], *, format: str | None = None, **kwargs: Any) -> PackedDataset:
    """Open a packed dataset, choosing the reader from its manifest's ``format`` field.

    Keyword arguments go to the reader: ``transform``, ``target_transform``, ``output``
    (``"tensor"``, ``"numpy"`` or ``"pil"``), ``verify``, ``on_error``. Raises
    UnfinishedDatasetError when the directory has no manifest.

    ``format`` opens data written by another tool, which has no manifest: ``"tar"`` for
    WebDataset shards (``KEY.jpg``/``.png``/... + ``KEY.cls``), ``"tfrecord"`` for TFRecord
    files of ``image/encoded`` + ``image/class/label`` Examples. The index is built by one scan at
    open and the manifest synthesised in memory (classes are the labels as strings). A directory
    that does have a manifest is opened from it, and must then be of that format.

    ``path`` may be a URL (``s3://bucket/data``, ``gs://...``, ``https://...``; needs the
    matching extra, e.g. ``pip install 'packer[s3]'``): ``storage_options`` go to fsspec, and the
    files are downloaded on first use into the node cache ``cache_dir`` (default
    ``PACKER_CACHE_DIR``, else ``~/.cache/packer``), which keeps at most ``cache_limit`` bytes
    (e.g. ``"20GB"``) and is shared by every process on the machine.
    """
    if is_url(path):
        return _open_url(os.fspath(path), format, **kwargs)
    path = os.path.expanduser(os.fspath(path))
    if format is None or os.path.exists(os.path.join(path, MANIFEST_NAME)):
        try:
            manifest = read_manifest(path)
        except UnfinishedDatasetError as e:
            raise explain_missing_manifest(e, path) from None
        if format is not None and manifest.format != format:
            raise ValueError(f"{os.fspath(path)} holds a {manifest.format!r} dataset, not {format!r}")
        ds = reader_class(manifest.format)(path, manifest=manifest, **kwargs)
        ds._ensure_cache()
        return ds
    open_foreign = getattr(reader_class(format), "open_foreign", None)
    if open_foreign is None:
        raise ValueError(f"format {format!r} cannot be read without a packer manifest")
    ds = open_foreign(path, **kwargs)
    ds._ensure_cache()
    return ds


def _open_url(url: str, format: str | None, *, storage_options: dict[str, Any] | None = None,
              cache_dir: str | None = None, cache_limit: int | str | None = None, **kwargs: Any) -> PackedDataset:
    """open_dataset for a packed dataset at a URL: its files are read through the node cache."""
    from packer.storage.remote import open_remote

    manifest, files = open_remote(url, storage_options, cache_dir, cache_limit)
    if format is not None and manifest.format != format:
        raise ValueError(f"{url} holds a {manifest.format!r} dataset, not {format!r}")
    ds = reader_class(manifest.format)(files.view, manifest=manifest, remote_files=files, **kwargs)
    ds.url = url
    ds._ensure_cache()
    return ds


def __getattr__(name: str) -> Any:
    # The format readers are imported on first use, so importing packer.datasets stays light.
    if name.endswith("Dataset"):
        from packer.description.registry import FORMATS

        for fmt in FORMATS.values():  # each reader is named <Format>Dataset
            if name.lower() == f"{fmt.name}dataset" and fmt.reader.__name__ == name:
                return fmt.reader
    raise AttributeError(f"module 'packer.datasets' has no attribute {name!r}")
