"""The commands of the command line but convert: info, verify, demo, bench, merge, preview and
doctor, each its arguments and its run (the work is done in :mod:`packer.operations`)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from ..fields import KINDS
from ..formats import format_names, read_manifest
from ..wording import noun, plural
from .base import EXIT_ERROR, EXIT_OK, Command, UsageError, say
from .convert import add_storage, storage_options

__all__ = ["COMMANDS", "brace_pattern"]


# -- info ----------------------------------------------------------------------------------------
def _add_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="+",
                   help="packed dataset directory or URL, or its shards: a brace pattern "
                        "(dir/shard-{000000..000009}.tar) or several shard files (tar or TFRecord, any tool's)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.add_argument("--shards", action="store_true",
                   help="print the data files' paths (URLs), one per line, e.g. for DALI's readers")
    add_storage(p)


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
            return read_remote_manifest(Remote(paths[0], storage_options(a)), format_names())[0], paths[0], paths[0].rstrip("/")
        return read_manifest(paths[0]), os.path.abspath(paths[0]), os.path.abspath(paths[0])
    from packer.datasets import open_dataset

    remote = any(is_url(p) for p in paths)
    options = dict(storage_options=storage_options(a), cache_dir=a.cache_dir, cache_limit=a.cache_limit) if remote else {}
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
    if is_url(folder):
        from ..storage.ranges import RANGE_FORMATS

        print("remote reads " + ("ds[i] by one ranged GET of its record (open_dataset(..., remote=\"range\"), the "
                                 "default); StreamingDataset whole shards" if m.format in RANGE_FORMATS else
                                 f"{m.format} files are downloaded whole (records are found through the file's pages)"))
        from ..storage.remote import streaming_cost

        (open_n, open_b), (epoch_n, epoch_b) = streaming_cost(m)
        print(f"requests    once per node {open_n} ({format_size(open_b)}: the manifest at open, each shard's index "
              f"with its first read); a streaming epoch through an empty node cache "
              f"{epoch_n} ({format_size(epoch_b)}, whole shards, one GET per 16 MiB; its cost: requests x price per "
              f"request + bytes x egress price)")
    print("node cache  cache_limit >= largest file x processes reading at once on a node (ranks x workers): "
          + ", ".join(f"{n}: {format_size(largest * n)}" for n in (1, 2, 4, 8)))
    return EXIT_OK


# -- verify --------------------------------------------------------------------------------------
def _add_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="packed dataset directory or URL (its files are downloaded into the cache)")
    p.add_argument("--no-decode", action="store_true", help="check file checksums only")
    add_storage(p)


def _run_verify(a: argparse.Namespace) -> int:
    from ..operations.verify import verify_dataset
    from ..storage.remote import is_url, local_copy

    fetch_problems: list[str] = []
    path = a.path
    if is_url(a.path):
        path, fetch_problems = local_copy(a.path, storage_options(a), a.cache_dir, a.cache_limit, format_names())
    report = verify_dataset(path, decode=not a.no_decode)
    report.problems[:0] = fetch_problems
    for line in report.problems[:50]:
        say(line)
    if len(report.problems) > 50:
        say(f"... and {plural(len(report.problems) - 50, 'more problem')}")
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
    from ..operations.demo import run_demo

    return run_demo(a.workdir, a.classes, a.per_class, a.workers)


# -- doctor -------------------------------------------------------------------------------------
def _add_doctor(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _run_doctor(a: argparse.Namespace) -> int:
    from ..operations.doctor import run_doctor

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
    from ..operations.loaderbench import collate_slots, decide, format_report, run_bench, to_json

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
        from ..operations.loaderbench import plot_bench

        drawn_by = plot_bench(rows, a.plot, title=f"packer bench {os.path.basename(os.path.abspath(a.path))}")
        say(f"plot: {a.plot} (drawn with {drawn_by})")
    print(to_json(rows, decision, slots) if a.json else format_report(rows, decision, crop=a.crop, slots=slots))
    return EXIT_OK


# -- preview -------------------------------------------------------------------------------------
def _add_preview(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="packed dataset directory or URL (only the samples shown are downloaded)")
    p.add_argument("--out", required=True, metavar="OUT.png", help="the contact sheet to write (PNG)")
    p.add_argument("--n", type=int, default=16, help="samples to show (default: 16)")
    p.add_argument("--seed", type=int, default=0, help="which samples: the same seed shows the same ones (default: 0)")
    p.add_argument("--tile", type=int, default=160, help="pixels per tile side (default: 160)")
    p.add_argument("--remote", choices=("range", "whole"), default=None,
                   help="for a URL: fetch each sample shown by one ranged GET (range: the default for tar, "
                        "TFRecord and HDF5) or download whole files into the node cache (whole: LMDB's only way)")
    add_storage(p)


def _run_preview(a: argparse.Namespace) -> int:
    from packer.datasets import open_dataset

    from ..operations.preview import contact_sheet, write_png
    from ..storage.remote import is_url

    if a.n < 1 or a.tile < 16:
        raise UsageError("packer preview: --n must be at least 1 and --tile at least 16")
    remote = dict(storage_options=storage_options(a), cache_dir=a.cache_dir, cache_limit=a.cache_limit,
                  remote=a.remote) if is_url(a.path) else {}
    ds = open_dataset(a.path, output="numpy", **remote)
    try:
        total = len(ds)
        sheet = contact_sheet(ds, a.n, a.seed, a.tile)
    finally:
        ds.close()
    write_png(a.out, sheet.image)
    for i, why in sheet.unreadable[:20]:
        say(f"sample {i} unreadable: {why}")
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
    from ..operations.merge import merge
    from ..sizes import format_size

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


#: name -> (help, add_arguments, run), in the order ``packer --help`` lists them after convert
COMMANDS: dict[str, Command] = {
    "info": ("describe a packed dataset", _add_info, _run_info),
    "verify": ("check every checksum and decode every sample", _add_verify, _run_verify),
    "demo": ("convert and read a generated sample end to end", _add_demo, _run_demo),
    "bench": ("measure the DataLoader alone over a grid of settings", _add_bench, _run_bench),
    "merge": ("merge packed datasets of one format, made separately, into one", _add_merge, _run_merge),
    "preview": ("draw a contact sheet of seeded samples with their class names", _add_preview, _run_preview),
    "doctor": ("say what this machine gives packer (paste it into bug reports)", _add_doctor, _run_doctor),
}
