"""Moved to :mod:`packer.ops.loaderbench` (operations sit above the core and the formats); this name
stays importable and is the same module."""

import sys

from packer.ops import loaderbench as _module

sys.modules[__name__] = _module
