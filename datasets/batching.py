"""Moved to :mod:`packer.datasets.collation` (the name says what it holds: ``collate``); this
name stays importable and is the same module."""

import sys

from packer.datasets import collation as _module

sys.modules[__name__] = _module
