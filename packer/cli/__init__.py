"""The command line, on the Python API: ``packer`` and ``python -m packer`` both call :func:`main`.
argparse lives only here: the parser and main (parser), ``packer convert``'s flags built from the
options and source tables (convert), the other commands (commands), what they share (base)."""

from __future__ import annotations

from .base import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_SKIPPED, EXIT_TERMINATED, EXIT_USAGE
from .parser import Terminated, build_parser, main

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_SKIPPED", "EXIT_INTERRUPTED",
           "EXIT_TERMINATED", "Terminated"]
