"""The command line's parser and :func:`main` (``packer`` and ``python -m packer`` both call it).

Subcommands are registered in one table (``COMMANDS``: convert, then the others); format choices
come from the registry. A bad command line is one line on stderr and exit status 2; a failure is
one line and status 1; a conversion that skipped bad images finishes and exits 3, so scripts
notice. Ctrl-C exits 130 and SIGTERM (a scheduler preempting the job) 143, both after keeping a
resumable partial output.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence

from .. import __version__
from ..conversion.options import OptionError
from ..conversion.run import remote_deadline
from ..errors import PackerError, UnfinishedDatasetError
from . import commands, convert
from .base import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    Command,
    UsageError,
    say,
)

__all__ = ["main", "build_parser", "COMMANDS", "Terminated"]

#: name -> (help, add_arguments, run)
COMMANDS: dict[str, Command] = {"convert": convert.COMMAND, **commands.COMMANDS}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and an exception, not a usage dump and exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (exposed for docs and tests)."""
    parser = _Parser(prog="packer", description="Pack image datasets for fast PyTorch training.")
    parser.add_argument("--version", action="version", version=f"packer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (help_, add, _) in COMMANDS.items():
        add(sub.add_parser(name, help=help_, description=help_))
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (a scheduler preempting the job): raised where Ctrl-C raises KeyboardInterrupt,
    so a conversion stops the same way and keeps its resumable partial output."""


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[list[bool]]:
    """Within the block, SIGTERM raises :class:`Terminated` (once: a second SIGTERM during the
    cleanup is ignored). Yields a flag list that holds True once SIGTERM arrived, which tells a
    worker killed by the same signal (SLURM signals the whole job) from a crash."""
    got: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        got.append(True)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: sys.argv[1:]); return the exit status."""
    with _sigterm_as_interrupt() as terminated:
        return _main(argv, terminated)


def _main(argv: Sequence[str] | None, terminated: list[bool]) -> int:
    try:
        a = build_parser().parse_args(argv)
        if a.command is None:
            raise UsageError("packer: no command given (see packer --help)")
        with remote_deadline(getattr(a, "remote_deadline", None)):
            status = COMMANDS[a.command][2](a)
        # What the command printed reaches its reader now, not at interpreter exit, where a torchrun
        # rank's stdout has been seen to go missing on a loaded machine (and a closed pipe is ours
        # to report, below).
        sys.stdout.flush()
        return status
    except OptionError as e:
        say(str(e))
        return EXIT_USAGE
    except Terminated as e:
        say("packer: terminated (SIGTERM)" + _partial_note(e))
        return EXIT_TERMINATED
    except KeyboardInterrupt as e:
        say("packer: interrupted" + _partial_note(e))
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (`packer info DST | head`): stop quietly, and keep
        # Python from complaining again while it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except (PackerError, OSError, ValueError) as e:
        # a worker process killed by the same SIGTERM (SLURM signals the whole job); not a torchrun
        # rank stopped because another died, whose error names that rank
        if terminated and not getattr(e, "names_the_cause", False):
            say("packer: terminated (SIGTERM)" + _partial_note(e))
            return EXIT_TERMINATED
        if isinstance(e, UnfinishedDatasetError) and getattr(e, "directory", None):
            from ..formats import explain_missing_manifest

            e = explain_missing_manifest(e, e.directory)
        say(f"packer: error: {e}" + _partial_note(e))
        return EXIT_ERROR


def _partial_note(e: BaseException) -> str:
    """The hint a resumable failure carries (see packer.pipeline.engine.write_packed)."""
    kept = getattr(e, "partial_output", None)
    return f"; partial output kept in {kept}; run again with --resume to continue" if kept else ""
