"""packer: pack image folders into LMDB, HDF5, WebDataset tar shards or TFRecord, and read them fast."""

__version__ = "0.2.0.dev0"

from .errors import *  # noqa: E402, F403 - after __version__, which setup.cfg reads
from .errors import __all__ as _error_names  # noqa: E402

__all__ = ["__version__", *_error_names]
