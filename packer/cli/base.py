"""What the commands of the command line share: their exit statuses, the usage error (exit
status 2) and the one-line message on stderr."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..conversion.options import OptionError

__all__ = ["EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_SKIPPED", "EXIT_INTERRUPTED", "EXIT_TERMINATED", "UsageError",
           "say", "Command"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_SKIPPED, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 3, 130, 143

#: A command: its help, what adds its arguments to its parser, what runs it (-> the exit status).
Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


class UsageError(OptionError):
    """A bad command line (exit status 2, as for every OptionError)."""


def say(msg: str) -> None:
    """``msg`` as one line on stderr, in one write: under torchrun (unbuffered streams) the ranks
    share the terminal, and a line written as text, then newline, can be split by another rank's."""
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def tell(msg: str) -> None:
    """``msg`` as one line on stdout, in one write (see :func:`say`)."""
    sys.stdout.write(msg + "\n")
