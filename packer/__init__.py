"""packer: pack image folders into LMDB, HDF5, WebDataset tar shards or TFRecord, and read them fast."""

__version__ = "0.1.0"

from .errors import (  # noqa: E402 - after __version__, which setup.cfg reads
    CorruptDataError,
    DiskFullError,
    ImageError,
    ManifestError,
    PackerError,
    ResumeError,
    SourceError,
    UnfinishedDatasetError,
)

__all__ = [
    "__version__",
    "PackerError",
    "SourceError",
    "UnfinishedDatasetError",
    "ManifestError",
    "CorruptDataError",
    "ImageError",
    "DiskFullError",
    "ResumeError",
]
