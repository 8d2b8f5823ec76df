"""The tar reader's former home, kept for code that imports it from here: the reader is
:mod:`packer.datasets.formats.tar`, beside the other formats' readers."""

from packer.datasets.formats.tar import *  # noqa: F403
from packer.datasets.formats.tar import __all__  # noqa: F401
