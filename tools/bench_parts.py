"""The benchmarks that each answer one question about one part, as subcommands of one script.

    python -m tools.bench_parts --help               # the subcommands
    python -m tools.bench_parts SUBCOMMAND --help    # what one measures, and how

Each compares side by side in one run (only the ratios travel between machines) and prints
Markdown tables; docs/benchmarks.md quotes them with the command of each figure. Each section's
benchmark is a module of tools/bench/, which lists its subcommands; this script gathers them.
"""

from __future__ import annotations

import argparse
import inspect

from tools.bench import (
    distributed,
    engines,
    fields,
    hdf5index,
    ranges,
    reads,
    reduced,
    remote,
    scale,
    scalegen,
    scalenode,
    scaletable,
    shuffle,
    streamcost,
    training,
    v2fusion,
    versions,
    window,
)
from tools.bench.common import Subcommand

#: subcommand -> (what it runs, what adds its arguments); the help is the first line of the docstring.
SUBCOMMANDS: dict[str, Subcommand] = {
    **reads.SUBCOMMANDS,  # getitems, cache-fill
    **window.SUBCOMMANDS,
    **v2fusion.SUBCOMMANDS,
    **training.SUBCOMMANDS,  # reduced-decode, train-stages, area-resize
    **reduced.SUBCOMMANDS,
    **remote.SUBCOMMANDS,
    **ranges.SUBCOMMANDS,
    **streamcost.SUBCOMMANDS,
    **scale.SUBCOMMANDS,
    **scalegen.SUBCOMMANDS,  # scale-data
    **scalenode.SUBCOMMANDS,  # scale-node
    **scaletable.SUBCOMMANDS,  # scale-table
    **hdf5index.SUBCOMMANDS,  # scale-hdf5-index
    **shuffle.SUBCOMMANDS,
    **distributed.SUBCOMMANDS,
    **versions.SUBCOMMANDS,
    **fields.SUBCOMMANDS,
    **engines.SUBCOMMANDS,
}


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per benchmark, each with the method in its ``--help``."""
    p = argparse.ArgumentParser(prog="python -m tools.bench_parts", description=__doc__.splitlines()[0])
    subs = p.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for name, (run, add_arguments) in SUBCOMMANDS.items():
        doc = inspect.cleandoc(run.__doc__ or "")
        sub = subs.add_parser(name, help=doc.splitlines()[0], description=doc,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        add_arguments(sub)
        sub.set_defaults(run=run, error=sub.error)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one benchmark; its exit status."""
    a = parser().parse_args(argv)
    return a.run(a)


if __name__ == "__main__":
    raise SystemExit(main())
