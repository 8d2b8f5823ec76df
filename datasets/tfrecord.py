"""The tfrecord reader's former home, kept for code that imports it from here: the reader is
:mod:`packer.datasets.formats.tfrecord`, beside the other formats' readers."""

from packer.datasets.formats.tfrecord import *  # noqa: F403
from packer.datasets.formats.tfrecord import __all__  # noqa: F401
