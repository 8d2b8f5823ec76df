"""The lmdb reader's former home, kept for code that imports it from here: the reader is
:mod:`packer.datasets.formats.lmdb`, beside the other formats' readers."""

from packer.datasets.formats.lmdb import *  # noqa: F403
from packer.datasets.formats.lmdb import __all__  # noqa: F401
