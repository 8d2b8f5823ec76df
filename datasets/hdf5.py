"""The hdf5 reader's former home, kept for code that imports it from here: the reader is
:mod:`packer.datasets.formats.hdf5`, beside the other formats' readers."""

from packer.datasets.formats.hdf5 import *  # noqa: F403
from packer.datasets.formats.hdf5 import __all__  # noqa: F401
