"""The skip counter's former home, kept for code that imports ``SkippedSampleWarning`` from here:
it is :mod:`packer.datasets.shm.skips`, beside the other shared-memory parts."""

from packer.datasets.shm.skips import *  # noqa: F403
from packer.datasets.shm.skips import __all__  # noqa: F401
