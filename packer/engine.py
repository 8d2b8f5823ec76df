"""Moved to :mod:`packer.ops.engine` (operations sit above the core and the formats); this name
stays importable and is the same module."""

import sys

from packer.ops import engine as _module

sys.modules[__name__] = _module
