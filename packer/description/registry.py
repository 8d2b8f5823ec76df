"""The format registry's former home, kept for code that imports it from here: the registry is
:mod:`packer.formats`, above the layouts, writers and readers it lists."""

from packer.formats import *  # noqa: F403
from packer.formats import __all__  # noqa: F401
