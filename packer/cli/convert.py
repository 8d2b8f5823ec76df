"""``packer convert``: its flags, built from the options table and the source table
(:mod:`packer.conversion.options`, :mod:`packer.sources.table`), the conversion run through
:func:`packer.conversion.run.run_conversion`, and its summary; also the object storage flags the
other commands share."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..conversion.options import (
    COMMAND_LINE,
    OPTIONS,
    STORAGE_GROUP,
    Option,
    dst_formats,
)
from ..conversion.request import convert_request
from ..sources.table import source_names
from ..wording import describe_skips, noun, plural
from .base import EXIT_OK, EXIT_SKIPPED, Command, UsageError, say, tell

__all__ = ["COMMAND", "add_storage", "storage_options"]


# -- convert -------------------------------------------------------------------------------------
def _add_convert(p: argparse.ArgumentParser) -> None:
    p.epilog = ("exit status: 0 done, 1 failed, 2 bad command line, 3 done with skipped files, 130 interrupted "
                "(Ctrl-C), 143 terminated (SIGTERM); after 130 or 143 the partial output (once past its first "
                "checkpoint) is kept and --resume continues it")
    p.add_argument("src_format", choices=source_names(),
                   help="format of SRC (list: a .csv, .tsv or .jsonl file naming images, labels and metadata; coco: "
                        "a COCO instances_*.json, its images in --images DIR; mds, litdata, parquet: a MosaicML "
                        "Streaming, LitData or Parquet dataset to import)")
    p.add_argument("dst_format", choices=dst_formats(), help="format to write")
    p.add_argument("src", help="source folder, list file or packed dataset (a packed SRC may be a URL); tar and "
                               "tfrecord: also a brace pattern of shard files, dir/shard-{000000..000009}.tar")
    p.add_argument("dst", help="destination directory or URL (must not exist unless --overwrite)")
    _add_flags(p, OPTIONS)


def _add_flags(p: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """The flags of ``options`` (packer.conversion.options), in their groups."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for o in options:
        if o.group not in groups:
            groups[o.group] = p.add_argument_group(o.group)
        kw: dict = {"dest": o.name, "help": o.help, "default": o.default}
        if o.metavar:
            kw["metavar"] = o.metavar
        if o.kind is bool:
            kw["action"] = "store_true"
        elif o.kind in ("strs", "storage"):
            kw.update(action="append", default=None if o.default is None else list(o.default))
        else:
            kw.update(type=_seconds if o.kind == "seconds" else o.kind, choices=o.choices)
        groups[o.group].add_argument(o.flag, *([o.short] if o.short else []), **kw)


def _run_convert(a: argparse.Namespace) -> int:
    from ..conversion.distributed import torchrun_launch
    from ..conversion.run import run_conversion

    request = convert_request(COMMAND_LINE, a.src_format, a.dst_format, a.src, a.dst,
                              {o.name: getattr(a, o.name) for o in OPTIONS})
    launch = None if request.no_torchrun else torchrun_launch()
    report = run_conversion(request, launch)
    if launch is None:
        return _summary(a, report)
    if launch.rank != 0:
        if not a.quiet:
            tell(f"rank {launch.rank}: part converted; rank 0 merged the parts into {a.dst}")
        return EXIT_OK
    # Done with skipped files is status 0 under torchrun: torchrun reports any other status as a
    # failed job (the skips are printed and listed in the manifest).
    return _summary(a, report, skipped_status=EXIT_OK)


#: Manifest ``ignored`` counts -> what the summary calls one of them, and several.
_IGNORED = {"hidden": ("hidden (names starting with '.')",) * 2, "outside_classes": ("outside class folders",) * 2,
            "not_images": ("not an image (no image extension)", "not images (no image extension)")}


def _summary(a: argparse.Namespace, report, skipped_status: int = EXIT_SKIPPED) -> int:  # noqa: ANN001
    """Print what a conversion (a ConvertReport) did; the exit status (``skipped_status`` when it
    skipped files). Its last lines: what was ignored, left small, skipped (each file, then the count
    by reason), and empty classes. ``--quiet`` leaves out all but the warnings and the skips."""
    m = report.manifest
    if not a.quiet:
        _say_done(a, report)
    if getattr(report, "already_complete", False):
        return EXIT_OK
    empty = m.source.get("empty_classes") or []
    if empty:
        say(f"warning: {plural(len(empty), 'empty class')}, no image has {noun(len(empty), 'its')} label: "
             + ", ".join(map(str, empty[:20])) + (f", ... ({len(empty)} in all)" if len(empty) > 20 else ""))
    if report.skipped:
        for s in report.skipped[:20]:
            say(f"skipped {s.path}: {s.reason}")
        if len(report.skipped) > 20:
            say(f"... and {len(report.skipped) - 20} more (all listed in {a.dst}/manifest.json)")
        by_reason = describe_skips(((s.path, s.reason) for s in report.skipped), examples=0)
        say(f"{plural(len(report.skipped), 'file')} skipped: {by_reason}; exit status {skipped_status}")
        return skipped_status
    return EXIT_OK


def _say_done(a: argparse.Namespace, report) -> None:  # noqa: ANN001 - a ConvertReport
    """The summary lines of a conversion that ``--quiet`` leaves out: what was written, notes,
    what was ignored and what was left small."""
    from ..sizes import format_size

    m = report.manifest
    if getattr(report, "already_complete", False):
        tell(f"{a.dst} is already complete ({plural(m.num_samples, 'image')}, same source and options); nothing to do")
        return
    for note in getattr(report, "notes", []):
        say(f"packer: {note}")
    if getattr(report, "resumed", None):
        say(f"packer: resumed: kept {plural(report.resumed['written'], 'sample')} written before the interruption")
    size = sum(f.bytes for f in m.files)
    where = f"{format_size(size)}, {plural(len(m.files), 'file')}" if m.files else "one file per image"
    tell(f"wrote {plural(m.num_samples, 'image')} in {plural(len(m.classes), 'class')} to {a.dst} ({m.format}, "
          f"{where}) in {report.seconds:.1f} s = {report.rate:.0f} img/s")
    ignored = [f"{n} {_IGNORED.get(k, (k, k))[n != 1]}" for k, n in m.ignored.items() if n]
    if ignored:
        say(f"ignored: {', '.join(ignored)}")
    small = getattr(report, "left_small", 0)
    if small:
        say(f"left small: {plural(small, 'image')} below --resize {m.processing.get('resize')} kept "
             f"{noun(small, 'its')} size (--upscale enlarges {noun(small, 'it')})")


# -- object storage ------------------------------------------------------------------------------
def add_storage(p: argparse.ArgumentParser) -> None:
    """The object storage flags (--storage-option, --cache-dir, ...), from the options table."""
    _add_flags(p, [o for o in OPTIONS if o.group == STORAGE_GROUP])


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return seconds


def storage_options(a: argparse.Namespace) -> dict:
    """The fsspec storage options the --storage-option flags give; UsageError for a bad one."""
    from ..storage.remote import parse_storage_options

    try:
        return parse_storage_options(a.storage_option)
    except ValueError as e:
        raise UsageError(f"packer: {e}") from None


COMMAND: Command = ("convert an image folder or packed dataset to another format", _add_convert, _run_convert)
