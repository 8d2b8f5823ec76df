"""The command line: ``packer`` and ``python -m packer`` both call :func:`main`.

Subcommands are registered in one table (``COMMANDS``); format choices come from the registry.
A bad command line is one line on stderr and exit status 2; a failure is one line and status 1;
a conversion that skipped bad images finishes and exits 3, so scripts notice. Ctrl-C exits 130 and
SIGTERM (a scheduler preempting the job) 143, both after keeping a resumable partial output.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence

from .. import __version__
from ..errors import PackerError, UnfinishedDatasetError
from ..fields import KINDS
from ..formats import format_names, read_manifest
from ..wording import describe_skips, noun, plural
from .conversion import remote_deadline
from .options import (
    COMMAND_LINE,
    OPTIONS,
    STORAGE_GROUP,
    Option,
    OptionError,
    convert_request,
    dst_formats,
)
from .sources import source_names

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_SKIPPED", "EXIT_INTERRUPTED",
           "EXIT_TERMINATED", "Terminated"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_SKIPPED, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 3, 130, 143


class UsageError(OptionError):
    """A bad command line (exit status 2, as for every OptionError)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and an exception, not a usage dump and exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr)


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
    """The flags of ``options`` (packer.ops.options), in their groups."""
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
    from .conversion import run_conversion
    from .distributed import torchrun_launch

    request = convert_request(COMMAND_LINE, a.src_format, a.dst_format, a.src, a.dst,
                              {o.name: getattr(a, o.name) for o in OPTIONS})
    launch = None if request.no_torchrun else torchrun_launch()
    report = run_conversion(request, launch)
    if launch is None:
        return _summary(a, report)
    if launch.rank != 0:
        if not a.quiet:
            print(f"rank {launch.rank}: part converted; rank 0 merged the parts into {a.dst}")
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
        _say(f"warning: {plural(len(empty), 'empty class')}, no image has {noun(len(empty), 'its')} label: "
             + ", ".join(map(str, empty[:20])) + (f", ... ({len(empty)} in all)" if len(empty) > 20 else ""))
    if report.skipped:
        for s in report.skipped[:20]:
            _say(f"skipped {s.path}: {s.reason}")
        if len(report.skipped) > 20:
            _say(f"... and {len(report.skipped) - 20} more (all listed in {a.dst}/manifest.json)")
        by_reason = describe_skips(((s.path, s.reason) for s in report.skipped), examples=0)
        _say(f"{plural(len(report.skipped), 'file')} skipped: {by_reason}; exit status {skipped_status}")
        return skipped_status
    return EXIT_OK


def _say_done(a: argparse.Namespace, report) -> None:  # noqa: ANN001 - a ConvertReport
    """The summary lines of a conversion that ``--quiet`` leaves out: what was written, notes,
    what was ignored and what was left small."""
    from ..sizes import format_size

    m = report.manifest
    if getattr(report, "already_complete", False):
        print(f"{a.dst} is already complete ({plural(m.num_samples, 'image')}, same source and options); nothing to do")
        return
    for note in getattr(report, "notes", []):
        _say(f"packer: {note}")
    if getattr(report, "resumed", None):
        _say(f"packer: resumed: kept {plural(report.resumed['written'], 'sample')} written before the interruption")
    size = sum(f.bytes for f in m.files)
    where = f"{format_size(size)}, {plural(len(m.files), 'file')}" if m.files else "one file per image"
    print(f"wrote {plural(m.num_samples, 'image')} in {plural(len(m.classes), 'class')} to {a.dst} ({m.format}, "
          f"{where}) in {report.seconds:.1f} s = {report.rate:.0f} img/s")
    ignored = [f"{n} {_IGNORED.get(k, (k, k))[n != 1]}" for k, n in m.ignored.items() if n]
    if ignored:
        _say(f"ignored: {', '.join(ignored)}")
    small = getattr(report, "left_small", 0)
    if small:
        _say(f"left small: {plural(small, 'image')} below --resize {m.processing.get('resize')} kept "
             f"{noun(small, 'its')} size (--upscale enlarges {noun(small, 'it')})")


# -- object storage ------------------------------------------------------------------------------
def _add_storage(p: argparse.ArgumentParser) -> None:
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


def _storage(a: argparse.Namespace) -> dict:
    from ..storage.remote import parse_storage_options

    try:
        return parse_storage_options(a.storage_option)
    except ValueError as e:
        raise UsageError(f"packer: {e}") from None


# -- info ----------------------------------------------------------------------------------------
def _add_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="+",
                   help="packed dataset directory or URL, or its shards: a brace pattern "
                        "(dir/shard-{000000..000009}.tar) or several shard files (tar or TFRecord, any tool's)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.add_argument("--shards", action="store_true",
                   help="print the data files' paths (URLs), one per line, e.g. for DALI's readers")
    _add_storage(p)


def brace_pattern(names: Sequence[str]) -> str | None:
    """``train-{000000..000009}.tar`` for consecutively numbered shard names with one prefix and
    suffix (the form ``webdataset.WebDataset`` and ``braceexpand`` take), else None."""
    parts = [re.fullmatch(r"(.+)-(\d+)(\.[^-]+)", n) for n in names]
    if not names or not all(parts):
        return None
    stems = {(p.group(1), p.group(3), len(p.group(2))) for p in parts}  # type: ignore[union-attr]
    numbers = [int(p.group(2)) for p in parts]  # type: ignore[union-attr]
    if len(stems) != 1 or numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        return None
    prefix, suffix, width = stems.pop()
    if len(names) == 1:
        return names[0]
    return f"{prefix}-{{{numbers[0]:0{width}d}..{numbers[-1]:0{width}d}}}{suffix}"


def _info_manifest(a: argparse.Namespace):  # noqa: ANN202 - (Manifest, shown path, folder of its files)
    """The manifest ``packer info`` describes, the path to show, and the folder or URL of its files:
    a dataset's own, or for shard files (a pattern, several files) the one their reader builds."""
    from ..storage.remote import Remote, is_url, read_remote_manifest
    from ..storage.shardspec import has_braces

    paths: list[str] = a.path
    if len(paths) == 1 and not has_braces(paths[0]):
        if is_url(paths[0]):
            return read_remote_manifest(Remote(paths[0], _storage(a)), format_names())[0], paths[0], paths[0].rstrip("/")
        return read_manifest(paths[0]), os.path.abspath(paths[0]), os.path.abspath(paths[0])
    from packer.datasets import open_dataset

    remote = any(is_url(p) for p in paths)
    options = dict(storage_options=_storage(a), cache_dir=a.cache_dir, cache_limit=a.cache_limit) if remote else {}
    ds = open_dataset(paths if len(paths) > 1 else paths[0], output="numpy", **options)
    folder = getattr(ds, "url", None) or ds.root
    return ds.manifest, paths[0] if len(paths) == 1 else f"{len(paths)} files in {folder}", folder


def _field_type(f: dict) -> str:
    """A manifest field as ``info`` shows it: its kind, and a mask's dtype."""
    return KINDS[f["kind"]].describe(f)


def _run_info(a: argparse.Namespace) -> int:
    from ..sizes import format_size
    from ..storage.remote import is_url

    m, shown_path, folder = _info_manifest(a)

    def where(name: str) -> str:  # a file's path or URL, usable as printed
        return f"{folder}/{name}" if is_url(folder) else os.path.join(folder, name)

    if a.shards:
        for f in m.files:
            if f.samples:
                print(where(f.name))
        return EXIT_OK
    if a.json:
        sys.stdout.write(m.dumps().decode("utf-8"))
        return EXIT_OK
    size = sum(f.bytes for f in m.files)
    shown = ", ".join(m.classes[:8]) + (f", ... ({len(m.classes)} in all)" if len(m.classes) > 8 else "")
    print(f"path        {shown_path}")
    print(f"format      {m.format} (manifest v{m.version}, {m.created_by})")
    print(f"samples     {m.num_samples}")
    print(f"classes     {len(m.classes)}: {shown}")
    if m.label_kind != "class":
        print(f"labels      {m.label_kind}" + (" (a list of classes per sample)" if m.label_kind == "multi" else ""))
    if m.fields:
        print("fields      " + ", ".join(f"{f['name']} ({_field_type(f)})" for f in m.fields)
              + "; read them with fields=(\"image\", ..., \"label\")")
    print(f"processing  resize {m.processing.get('resize')}, encoding {m.processing.get('encoding')}, "
          f"color {m.processing.get('color')}")
    print("order       " + (f"shuffled at write time, seed {m.shuffle_seed}" if m.shuffle_seed is not None else "source order"))
    print(f"files       {len(m.files)}, {format_size(size)} ({size} bytes)")
    shards = [f.name for f in m.files if f.samples]
    if len(shards) > 1 or (shards and shards[0] not in ("data.mdb", "data.h5")):
        pattern = brace_pattern(shards)
        print(f"shards      {len(shards)}" + (f": {where(pattern)} (a brace pattern: packer, WebDataset)" if pattern else "")
              + "; --shards lists them one per line (e.g. for DALI)")
    print(f"skipped     {len(m.skipped)}" + (f" (first: {m.skipped[0].path}: {m.skipped[0].reason})" if m.skipped else ""))
    # Read from a URL, every process reading at once (ranks x DataLoader workers on a node) holds
    # one file open in the node cache; read-ahead uses only what is left.
    largest = max((f.bytes for f in m.files), default=0)
    print("node cache  cache_limit >= largest file x processes reading at once on a node (ranks x workers): "
          + ", ".join(f"{n}: {format_size(largest * n)}" for n in (1, 2, 4, 8)))
    return EXIT_OK


# -- verify --------------------------------------------------------------------------------------
def _add_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="packed dataset directory or URL (its files are downloaded into the cache)")
    p.add_argument("--no-decode", action="store_true", help="check file checksums only")
    _add_storage(p)


def _run_verify(a: argparse.Namespace) -> int:
    from ..storage.remote import is_url, local_copy
    from .verify import verify_dataset

    fetch_problems: list[str] = []
    path = a.path
    if is_url(a.path):
        path, fetch_problems = local_copy(a.path, _storage(a), a.cache_dir, a.cache_limit, format_names())
    report = verify_dataset(path, decode=not a.no_decode)
    report.problems[:0] = fetch_problems
    for line in report.problems[:50]:
        _say(line)
    if len(report.problems) > 50:
        _say(f"... and {plural(len(report.problems) - 50, 'more problem')}")
    samples = (f"{report.samples_ok}/{report.samples} {noun(report.samples, 'sample')} decoded" if not a.no_decode
               else "samples not decoded (--no-decode)")
    print(f"{a.path}: {report.files_ok}/{report.files} {noun(report.files, 'file')} intact, {samples}"
          + ("" if report.ok else " -- CORRUPT"))
    return EXIT_OK if report.ok else EXIT_ERROR


# -- demo ----------------------------------------------------------------------------------------
def _add_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", default=None, help="keep the sample and its LMDB here (default: a temp dir)")
    p.add_argument("--classes", type=int, default=8, choices=range(1, 9), metavar="1..8")
    p.add_argument("--per-class", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)


def _run_demo(a: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(a.workdir, a.classes, a.per_class, a.workers)


# -- doctor -------------------------------------------------------------------------------------
def _add_doctor(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _run_doctor(a: argparse.Namespace) -> int:
    from .doctor import run_doctor

    return run_doctor(a.json)


# -- bench --------------------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise UsageError(f"packer bench: expected comma-separated integers, got {text!r}") from None


def _add_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="packed dataset directory")
    p.add_argument("--workers", default=None, help="num_workers values, e.g. 0,2,4 (default: 0,1,2,cores,2xcores)")
    p.add_argument("--batch-sizes", default="64,256", help="batch sizes (default: 64,256)")
    p.add_argument("--pin-memory", default=None, choices=["on", "off", "both"],
                   help="pin_memory values (default: both with CUDA, off without)")
    p.add_argument("--cache", default="none,decoded", help="cache modes: none, encoded, decoded (default: none,decoded)")
    p.add_argument("--collate", default="packer,default",
                   help="collate_fn: packer (packer.datasets.collate), default (torch's) (default: both)")
    p.add_argument("--samples", type=int, default=2000, help="samples read per configuration in each round (default: 2000)")
    p.add_argument("--crop", type=int, default=224, help="center crop so batches collate (default: 224)")
    p.add_argument("--crop-in", default="transform",
                   help="where the crop is made: transform (a center crop that pads small images), reader "
                        "(open_dataset(..., crop=N): JPEGs decoded only in the crop's window; every image must be "
                        "at least N a side), or both as transform,reader (default: transform)")
    p.add_argument("--repeats", type=int, default=3,
                   help="rounds per setting, interleaved across the settings; a winner is named only when its lead "
                        "is larger than the spread of the rounds, which takes at least 3 (default: 3)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", metavar="OUT.png", default=None,
                   help="also draw images/s against num_workers, a line per configuration, into a PNG (drawn with "
                        "matplotlib where it is installed, else with OpenCV; no extra dependency)")


def _run_bench(a: argparse.Namespace) -> int:
    from .loaderbench import collate_slots, decide, format_report, run_bench, to_json

    caches = [c for c in a.cache.split(",") if c]
    if any(c not in ("none", "encoded", "decoded") for c in caches):
        raise UsageError(f"packer bench: --cache takes none, encoded, decoded; got {a.cache!r}")
    collates = [c for c in a.collate.split(",") if c]
    if not collates or any(c not in ("packer", "default") for c in collates):
        raise UsageError(f"packer bench: --collate takes packer, default; got {a.collate!r}")
    crop_in = [c for c in a.crop_in.split(",") if c]
    if not crop_in or any(c not in ("transform", "reader") for c in crop_in):
        raise UsageError(f"packer bench: --crop-in takes transform, reader; got {a.crop_in!r}")
    if a.repeats < 1:
        raise UsageError(f"packer bench: --repeats takes a whole number of at least 1, got {a.repeats}")
    read_manifest(a.path)  # a clear error before any worker starts
    pin = {"on": [True], "off": [False], "both": [False, True], None: None}[a.pin_memory]
    rows = run_bench(a.path, workers=_int_list(a.workers) if a.workers else None, pin=pin,
                     batch_sizes=_int_list(a.batch_sizes), caches=caches, collates=collates,
                     samples=a.samples, crop=a.crop, crop_in=crop_in, repeats=a.repeats,
                     progress=not a.json and sys.stderr.isatty())
    decision, slots = decide(rows), collate_slots()
    if a.plot:
        from .loaderbench import plot_bench

        drawn_by = plot_bench(rows, a.plot, title=f"packer bench {os.path.basename(os.path.abspath(a.path))}")
        _say(f"plot: {a.plot} (drawn with {drawn_by})")
    print(to_json(rows, decision, slots) if a.json else format_report(rows, decision, crop=a.crop, slots=slots))
    return EXIT_OK


# -- preview -------------------------------------------------------------------------------------
def _add_preview(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="packed dataset directory or URL (only the samples shown are downloaded)")
    p.add_argument("--out", required=True, metavar="OUT.png", help="the contact sheet to write (PNG)")
    p.add_argument("--n", type=int, default=16, help="samples to show (default: 16)")
    p.add_argument("--seed", type=int, default=0, help="which samples: the same seed shows the same ones (default: 0)")
    p.add_argument("--tile", type=int, default=160, help="pixels per tile side (default: 160)")
    _add_storage(p)


def _run_preview(a: argparse.Namespace) -> int:
    from packer.datasets import open_dataset

    from ..storage.remote import is_url
    from .preview import contact_sheet, write_png

    if a.n < 1 or a.tile < 16:
        raise UsageError("packer preview: --n must be at least 1 and --tile at least 16")
    remote = dict(storage_options=_storage(a), cache_dir=a.cache_dir, cache_limit=a.cache_limit) if is_url(a.path) else {}
    ds = open_dataset(a.path, output="numpy", **remote)
    try:
        total = len(ds)
        sheet = contact_sheet(ds, a.n, a.seed, a.tile)
    finally:
        ds.close()
    write_png(a.out, sheet.image)
    for i, why in sheet.unreadable[:20]:
        _say(f"sample {i} unreadable: {why}")
    h, w = sheet.image.shape[:2]
    print(f"wrote {a.out}: {len(sheet.indices)} of {plural(total, 'sample')} (seed {a.seed}), {w}x{h} pixels")
    return EXIT_ERROR if sheet.unreadable else EXIT_OK


# -- merge ---------------------------------------------------------------------------------------
def _add_merge(p: argparse.ArgumentParser) -> None:
    p.add_argument("dst", help="destination directory (must not exist unless --overwrite)")
    p.add_argument("parts", nargs="+", metavar="PART", help="packed datasets of one format, in sample order")
    p.add_argument("--overwrite", action="store_true", help="replace DST (atomically, once the new one is complete)")
    p.add_argument("--link", action="store_true",
                   help="hard-link shards taken whole instead of copying them (same file system; the parts then "
                        "share those files: do not modify them)")


def _run_merge(a: argparse.Namespace) -> int:
    from ..sizes import format_size
    from .merge import merge

    report = merge(a.parts, a.dst, a.overwrite, link=a.link)
    for line in report.mapping_lines(a.parts):
        print(f"labels of {line}")
    m = report.manifest
    done = (f"{plural(report.copied_files, 'shard')} copied, {report.rewritten_files} rewritten"
            if report.copied_files or report.rewritten_files else "records copied")
    print(f"merged {plural(m.num_samples, 'image')} in {plural(len(m.classes), 'class')} from "
          f"{plural(len(a.parts), 'part')} into {a.dst} "
          f"({m.format}, {format_size(sum(f.bytes for f in m.files))}; {done}) in {report.seconds:.1f} s")
    return EXIT_OK


#: name -> (help, add_arguments, run)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "convert": ("convert an image folder or packed dataset to another format", _add_convert, _run_convert),
    "info": ("describe a packed dataset", _add_info, _run_info),
    "verify": ("check every checksum and decode every sample", _add_verify, _run_verify),
    "demo": ("convert and read a generated sample end to end", _add_demo, _run_demo),
    "bench": ("measure the DataLoader alone over a grid of settings", _add_bench, _run_bench),
    "merge": ("merge packed datasets of one format, made separately, into one", _add_merge, _run_merge),
    "preview": ("draw a contact sheet of seeded samples with their class names", _add_preview, _run_preview),
    "doctor": ("say what this machine gives packer (paste it into bug reports)", _add_doctor, _run_doctor),
}


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
            return COMMANDS[a.command][2](a)
    except OptionError as e:
        _say(str(e))
        return EXIT_USAGE
    except Terminated as e:
        _say("packer: terminated (SIGTERM)" + _partial_note(e))
        return EXIT_TERMINATED
    except KeyboardInterrupt as e:
        _say("packer: interrupted" + _partial_note(e))
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
            _say("packer: terminated (SIGTERM)" + _partial_note(e))
            return EXIT_TERMINATED
        if isinstance(e, UnfinishedDatasetError) and getattr(e, "directory", None):
            from ..formats import explain_missing_manifest

            e = explain_missing_manifest(e, e.directory)
        _say(f"packer: error: {e}" + _partial_note(e))
        return EXIT_ERROR


def _partial_note(e: BaseException) -> str:
    """The hint a resumable failure carries (see packer.ops.engine.write_packed)."""
    kept = getattr(e, "partial_output", None)
    return f"; partial output kept in {kept}; run again with --resume to continue" if kept else ""
