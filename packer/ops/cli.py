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
from ..formats import format_names, formats_taking, get_format, read_manifest
from ..wording import describe_skips, noun, plural
from .importers import IMPORT_FORMATS

__all__ = ["main", "convert_options", "convert_from_args", "convert_arguments", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_SKIPPED", "EXIT_INTERRUPTED", "EXIT_TERMINATED",
           "Terminated"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_SKIPPED, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 3, 130, 143


class UsageError(Exception):
    """A bad command line (exit status 2)."""


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
    fmts = format_names()
    p.add_argument("src_format", choices=["imagefolder", "list", "coco", *fmts, *IMPORT_FORMATS],
                   help="format of SRC (list: a .csv, .tsv or .jsonl file naming images, labels and metadata; coco: "
                        "a COCO instances_*.json, its images in --images DIR; mds, litdata, parquet: a MosaicML "
                        "Streaming, LitData or Parquet dataset to import)")
    p.add_argument("dst_format", choices=[*fmts, "imagefolder"], help="format to write")
    p.add_argument("src", help="source folder, list file or packed dataset (a packed SRC may be a URL); tar and "
                               "tfrecord: also a brace pattern of shard files, dir/shard-{000000..000009}.tar")
    p.add_argument("dst", help="destination directory or URL (must not exist unless --overwrite)")
    g = p.add_argument_group("images")
    g.add_argument("--resize", default=None,
                   help="shorter:N, longer:N, WxH or none (default: none; from a packed SRC: copy the stored images)")
    g.add_argument("--encode", default=None,
                   help="jpeg:Q, webp:Q, png, raw or keep (default: keep with --resize none, else jpeg:90; from a "
                        "packed SRC: copy the stored bytes)")
    g.add_argument("--upscale", action="store_true", help="enlarge images smaller than the target")
    g.add_argument("--max-pixels", type=int, default=None, help="refuse larger images (decompression bombs)")
    g.add_argument("--exact-decode", action="store_true",
                   help="always decode JPEGs at full size (default: libjpeg's reduced-size decode when the target allows)")
    g.add_argument("--keep-damaged-jpeg", action="store_true",
                   help="keep JPEGs that libjpeg decodes only with a warning (truncated, garbled data; default: skip "
                        "them with the warning as the reason)")
    g = p.add_argument_group("conversion")
    g.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    g.add_argument("--seed", type=int, default=0, help="seed of the write-time shuffle (default: 0)")
    g.add_argument("--no-shuffle", action="store_true", help="keep folder order instead of shuffling")
    g.add_argument("--strict", action="store_true", help="stop at the first bad image instead of skipping it")
    g.add_argument("--overwrite", action="store_true", help="replace DST (atomically, once the new one is complete)")
    g.add_argument("--resume", action="store_true",
                   help="continue an interrupted conversion from its partial output (same SRC and options)")
    g.add_argument("--checkpoint-samples", type=int, default=None, metavar="N",
                   help="lmdb, hdf5: commit (a point --resume continues from) every N samples "
                        "(default: 1024 lmdb, 8192 hdf5); tar and tfrecord checkpoint at every shard")
    g.add_argument("--quiet", "-q", action="store_true",
                   help="print only errors, warnings and skips (the skipped files and their count): no progress, no "
                        "summary; under torchrun the same on every rank")
    g.add_argument("--log-interval", type=float, default=None, metavar="SECONDS",
                   help="when stderr is not a terminal (nohup, SLURM, CI): seconds between plain progress lines "
                        "(count, rate, ETA; default: 30)")
    g.add_argument("--no-torchrun", action="store_true",
                   help="convert in this process alone even where torchrun's environment is set (e.g. when started "
                        "by a training script that torchrun runs)")
    g.add_argument("--rank-timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="under torchrun: how long a rank may stay silent (stopped, hung) before the job fails naming "
                        "it (default: PACKER_TORCHRUN_TIMEOUT, else 1800); a live rank is waited for however long "
                        "its part takes")
    _add_list_options(p)
    _add_coco_options(p)
    g = p.add_argument_group("shards (tar, tfrecord)")
    g.add_argument("--shard-size", default=None, help="max bytes per shard, e.g. 256MB, 1GiB")
    g.add_argument("--shard-samples", type=int, default=None, help="max samples per shard")
    g.add_argument("--gzip", action="store_true", help="gzip-compress TFRecord files")
    g.add_argument("--prefix", default=None, help="shard file names PREFIX-000000.tar, ... (default: shard)")
    _add_storage(p)


def _add_coco_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("COCO sources")
    g.add_argument("--images", metavar="DIR", help="coco source: the folder of the file's images (file_name is "
                                                   "relative to it)")
    g.add_argument("--masks", choices=["semantic", "instance"], default=None,
                   help="coco source: also store a mask rasterised from the annotations (semantic: category index "
                        "+ 1 per pixel; instance: annotation number + 1; 0: background)")


def _add_list_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("labels and list sources")
    g.add_argument("--classes-from", metavar="DATASET_OR_FILE",
                   help="use this class list (a packed dataset's, e.g. the training set's, or a text file with one "
                        "name per line) so labels line up; a source class not in it is an error")
    g.add_argument("--root", help="list and parquet sources: the folder its paths are relative to (default: the "
                                  "list's or Parquet file's folder)")
    g.add_argument("--allow-outside-root", action="store_true", default=None,
                   help="list and parquet sources: accept rows whose paths lead outside --root (../x.jpg, absolute paths "
                        "elsewhere); refused by default")
    g.add_argument("--path-column", help="list source: the column of image paths (default: path, file, filename "
                                         "or image)")
    g.add_argument("--label-column", help="list, mds, litdata and parquet sources: the label column (default: label, "
                                          "labels, class or target)")
    g.add_argument("--drop-column", action="append", default=None, metavar="NAME",
                   help="mds, litdata and parquet sources: leave this column out of the metadata (repeatable)")
    g.add_argument("--label-kind", default="auto", choices=["auto", "class", "multi", "number"],
                   help="list source: class (one class per image), multi (several), number; auto: multi for JSON "
                        "lists, number for JSON numbers with a fraction, else class")
    g.add_argument("--label-sep", default="|", help="list source: separator of multi-label classes in CSV/TSV "
                                                    "(default: |)")
    g.add_argument("--mask-column", metavar="COL", help="list source: the column of mask files (label maps: 8- or "
                                                        "16-bit, or palette PNG indices; stored as PNG)")
    g.add_argument("--image-column", action="append", default=None, metavar="COL",
                   help="list source: a column of EXTRA image files, processed like the image and named after the "
                        "column (repeatable; the image's own column is --path-column); mds, litdata and parquet "
                        "sources: THE image column, given once (default: the one column of an image type)")
    g.add_argument("--boxes-column", metavar="COL", help="list source: the column of boxes, a JSON list of [x0, y0, "
                                                         "x1, y1] in source pixels (in CSV/TSV a JSON string)")
    g.add_argument("--box-labels-column", metavar="COL",
                   help="list source: the column of box labels, a JSON list of class names or numbers, one per box")
    g.add_argument("--metadata-types", choices=["auto", "text"], default=None,
                   help="list source, CSV/TSV: auto stores a metadata column as integers, numbers or booleans (true/"
                        "false) when every non-empty cell of it is one (a column with one text cell stays text; "
                        "integers with leading zeros are text); text keeps every cell a string (default: auto; JSON "
                        "Lines keep their JSON types)")


#: WriterOptions field -> its flag, and what to say when a format does not take it.
_OPTION_FLAGS = {"shard_bytes": "--shard-size", "shard_samples": "--shard-samples", "gzip": "--gzip", "prefix": "--prefix",
                 "checkpoint_samples": "--checkpoint-samples"}
_OPTION_HINTS = {"checkpoint_samples": " (shard formats checkpoint at every shard)"}


def convert_options(a: argparse.Namespace):  # noqa: ANN201 - ConvertOptions, imported lazily
    """The ConvertOptions (image processing, writer options, workers, ...) that the ``convert``
    arguments ``a`` ask for; UsageError naming the option that is wrong."""
    from ..converters.base import WriterOptions
    from ..images.imageproc import DEFAULT_MAX_PIXELS, ProcessOptions, parse_encoding, parse_resize
    from ..sizes import parse_size
    from .engine import ConvertOptions

    try:
        processing = ProcessOptions(
            resize=parse_resize(a.resize if a.resize is not None else "none"),
            encoding=parse_encoding(a.encode if a.encode is not None else _default_encoding(a.resize)),
            upscale=a.upscale,
            max_pixels=a.max_pixels if a.max_pixels is not None else DEFAULT_MAX_PIXELS,
            reduced_decode=not a.exact_decode,
            keep_damaged_jpeg=a.keep_damaged_jpeg,
        )
        shard_bytes = parse_size(a.shard_size) if a.shard_size is not None else None
    except ValueError as e:
        raise UsageError(f"packer convert: {e}") from None
    if a.workers < 1:
        raise UsageError("packer convert: --workers must be at least 1")
    if a.log_interval is not None and not a.log_interval > 0:
        raise UsageError("packer convert: --log-interval must be above 0 seconds")
    if shard_bytes is not None and shard_bytes < 1:
        raise UsageError("packer convert: --shard-size must be at least 1 byte")
    if a.shard_samples is not None and a.shard_samples < 1:
        raise UsageError("packer convert: --shard-samples must be at least 1")
    if a.resume and a.dst_format == "imagefolder":
        raise UsageError("packer convert: --resume applies to packed output (lmdb, hdf5, tar, tfrecord) only")
    if a.checkpoint_samples is not None and a.checkpoint_samples < 1:
        raise UsageError("packer convert: --checkpoint-samples must be at least 1")
    try:
        writer = WriterOptions(shard_bytes=shard_bytes, shard_samples=a.shard_samples, gzip=a.gzip,
                               checkpoint_samples=a.checkpoint_samples, prefix=a.prefix)
    except ValueError as e:
        raise UsageError(f"packer convert: --prefix: {e}") from None
    refused = get_format(a.dst_format).refused_options(writer) if a.dst_format != "imagefolder" else [
        f for f in _OPTION_FLAGS if getattr(writer, f) not in (None, False)]
    if refused:
        flag = _OPTION_FLAGS[refused[0]]
        raise UsageError(f"packer convert: {flag} applies to {' and '.join(formats_taking(refused[0]))} output only"
                         + _OPTION_HINTS.get(refused[0], ""))
    return ConvertOptions(
        processing=processing,
        writer=writer,
        workers=a.workers,
        shuffle=not a.no_shuffle,
        seed=a.seed,
        strict=a.strict,
        overwrite=a.overwrite,
        progress=not a.quiet,
        progress_interval=a.log_interval if a.log_interval is not None else ConvertOptions.progress_interval,
        resume=a.resume,
    )


def convert_arguments(src_format: str, dst_format: str, src: str | os.PathLike[str], dst: str | os.PathLike[str],
                      options: dict[str, object], *, caller: str = "packer.convert",
                      accepted: Sequence[str] | None = None) -> argparse.Namespace:
    """The arguments of ``packer convert SRC_FORMAT DST_FORMAT SRC DST`` with ``options`` given as
    keyword arguments named like the flags (``resize="shorter:256"``, ``shard_size="256MB"``,
    ``workers=8``, ``no_shuffle=True``; ``~`` in SRC and DST expanded, as a shell would): what the
    command line parses, for :func:`packer.convert`
    and :func:`packer.pack`. ``accepted`` limits the options taken (default: every flag).
    TypeError for an unknown keyword (naming the accepted ones) or a value of the wrong type;
    ValueError for a value the flag refuses."""
    parser = _Parser(prog="packer convert")
    _add_convert(parser)
    flags = {x.dest: x for x in parser._actions if x.option_strings and x.dest != "help"}
    if accepted is not None:
        flags = {k: x for k, x in flags.items() if k in accepted}
    for key in options:
        if key not in flags:
            raise TypeError(f"{caller}() got an unexpected keyword argument {key!r}; it takes "
                            f"{', '.join(sorted(flags))}")
    try:
        a = parser.parse_args(["--", src_format, dst_format, os.path.expanduser(os.fspath(src)),
                               os.path.expanduser(os.fspath(dst))])
    except UsageError as e:
        raise ValueError(str(e).replace("packer convert", caller)) from None
    for key, value in options.items():
        setattr(a, key, _keyword_value(caller, key, value, flags[key]))
    return a


def _keyword_value(caller: str, key: str, value: object, action: argparse.Action) -> object:
    """A keyword option's value as the flag's parse would give it; TypeError/ValueError naming it."""
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise TypeError(f"{caller}(): {key} takes True or False, not {value!r}")
        return value
    if isinstance(action, argparse._AppendAction) and action.dest != "storage_option":  # e.g. --image-column
        if isinstance(value, str):
            return [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"{caller}(): {key} takes a string or a list of strings, not {value!r}")
        return list(value)
    if isinstance(action, argparse._AppendAction):  # --storage-option: a dict or KEY=VALUE strings
        if isinstance(value, dict):
            import json

            return [f"{k}={json.dumps(v)}" for k, v in value.items()]
        if isinstance(value, str) or not all(isinstance(v, str) for v in value):  # type: ignore[union-attr]
            raise TypeError(f"{caller}(): {key} takes a dict or a list of 'KEY=VALUE' strings, not {value!r}")
        return list(value)  # type: ignore[call-overload]
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    kind = action.type or str
    if isinstance(value, str) and kind is not str:
        try:
            value = kind(value)  # type: ignore[operator]
        except ValueError:
            raise ValueError(f"{caller}(): {key}={value!r} is not a {getattr(kind, '__name__', kind)}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, kind):  # type: ignore[arg-type]
        raise TypeError(f"{caller}(): {key} takes a {getattr(kind, '__name__', kind)}, not {value!r}")
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{caller}(): {key}={value!r} is not one of {', '.join(map(str, action.choices))}")
    return value


def _default_encoding(resize: str | None) -> str:
    """``keep`` when nothing is resized (no silent lossy re-encode of the originals), else ``jpeg:90``."""
    return "keep" if resize is None or resize.strip().lower() == "none" else "jpeg:90"


def _run_convert(a: argparse.Namespace) -> int:
    from .distributed import torchrun_launch

    launch = None if a.no_torchrun else torchrun_launch()
    report = convert_from_args(a, launch)
    if launch is None:
        return _summary(a, report)
    if launch.rank != 0:
        if not a.quiet:
            print(f"rank {launch.rank}: part converted; rank 0 merged the parts into {a.dst}")
        return EXIT_OK
    # Done with skipped files is status 0 under torchrun: torchrun reports any other status as a
    # failed job (the skips are printed and listed in the manifest).
    return _summary(a, report, skipped_status=EXIT_OK)


def convert_from_args(a: argparse.Namespace, launch=None):  # noqa: ANN001, ANN201 - Launch, ConvertReport
    """Run the conversion that the ``convert`` arguments ``a`` describe and return its
    ConvertReport (None on a torchrun rank other than 0, whose part rank 0 merged). What
    ``packer convert`` and :func:`packer.convert` both call. UsageError for bad arguments."""
    from ..storage.remote import is_url
    from ..storage.shardspec import has_braces

    if launch is not None and a.src_format in ("list", "coco", *IMPORT_FORMATS):
        split = " (or split the list and merge the parts: packer merge)" if a.src_format == "list" else ""
        raise UsageError(f"packer convert: a {a.src_format} source converts in one process; under torchrun add "
                         f"--no-torchrun{split}")
    if launch is not None:
        return _convert_torchrun(a, launch)
    _check_source_flags(a)
    if is_url(a.src) and has_braces(a.src):
        a.src = _fetched_shards(a, a.src)
    elif is_url(a.src) and a.src_format not in IMPORT_FORMATS:  # an importer reads its URL itself
        if a.src_format in ("imagefolder", "list", "coco"):
            raise UsageError("packer convert: an image folder, list or COCO file is read from a local path; a URL "
                             "SRC must be packed")
        a.src = _fetched(a, a.src)
    if not is_url(a.dst):
        return _convert_local(a)
    return _convert_to_url(a)


#: The flags that only some sources take, and the sources that take each: list only, imported
#: (mds, litdata, parquet) only, both, coco only.
_LIST_ONLY = ("root", "path_column", "allow_outside_root", "mask_column", "boxes_column", "box_labels_column",
              "metadata_types")
_IMPORT_ONLY = ("drop_column",)
_LIST_OR_IMPORT = ("label_column", "image_column")
_COCO_ONLY = ("images", "masks")
_LIST_OR_PARQUET = ("root", "allow_outside_root")  # of _LIST_ONLY, the flags a parquet source takes too


def _check_source_flags(a: argparse.Namespace) -> None:
    """UsageError for a flag that the source does not take; a coco source needs --images."""
    imported = a.src_format in IMPORT_FORMATS
    takes = {"list": _LIST_ONLY + _LIST_OR_IMPORT, "coco": _COCO_ONLY,
             "parquet": _IMPORT_ONLY + _LIST_OR_IMPORT + _LIST_OR_PARQUET}.get(
        a.src_format, _IMPORT_ONLY + _LIST_OR_IMPORT if imported else ())
    for k in _LIST_ONLY + _IMPORT_ONLY + _LIST_OR_IMPORT + _COCO_ONLY:
        if getattr(a, k) is not None and k not in takes:
            what = ("list and parquet sources" if k in _LIST_OR_PARQUET else "a list source" if k in _LIST_ONLY else "a coco source" if k in _COCO_ONLY else
                    "mds, litdata and parquet sources" if k in _IMPORT_ONLY else "list, mds, litdata and parquet "
                    "sources")
            raise UsageError(f"packer convert: --{k.replace('_', '-')} applies to {what} only")
    if imported and a.image_column is not None and len(a.image_column) > 1:
        raise UsageError(f"packer convert: a {a.src_format} source has one image column; --image-column is given "
                         f"{len(a.image_column)} times")
    if a.src_format == "coco" and a.images is None:
        raise UsageError("packer convert: a coco source needs --images DIR, the folder of its images")


def pinned_classes(spec: str) -> list[str]:
    """The class list of ``--classes-from``: a packed dataset's (its manifest) or a text file's
    (one name per line; blank lines ignored). UsageError saying what is wrong."""
    from ..description.manifest import MANIFEST_NAME
    from ..errors import PackerError

    try:
        if os.path.isdir(spec):
            if not os.path.exists(os.path.join(spec, MANIFEST_NAME)):
                raise UsageError(f"packer convert: --classes-from {spec}: not a packed dataset (no manifest.json)")
            classes = read_manifest(spec).classes
        else:
            with open(spec, encoding="utf-8") as f:
                classes = [line.strip() for line in f if line.strip()]
    except (OSError, UnicodeDecodeError, PackerError) as e:
        raise UsageError(f"packer convert: --classes-from {spec}: {e}") from None
    if not classes:
        raise UsageError(f"packer convert: --classes-from {spec}: no class names")
    from .items import check_classes

    try:
        return check_classes(classes, f"packer convert: --classes-from {spec}")
    except ValueError as e:
        raise UsageError(str(e)) from None


def _convert_to_url(a: argparse.Namespace):  # noqa: ANN202 - ConvertReport
    """Convert into a local folder of the node cache, uploading each file as it is finished (the
    manifest last); the folder's name comes from the URL, so --resume finds it again. The folder
    is claimed before anything in it is touched and until the upload has finished, so a second
    conversion to the URL on this node is refused and removes nothing."""
    import shutil

    from ..files.filesystem import claim_destination
    from ..storage.nodecache import NodeCache
    from ..storage.remote import Uploader, check_remote_destination, upload_folder, watch_uploads

    url = a.dst
    work = upload_folder(NodeCache(a.cache_dir).root, url)
    with claim_destination(work, shown=url):
        uploader = Uploader(check_remote_destination(url, _storage(a), a.overwrite))
        a.dst = os.path.join(work, "dataset")
        if os.path.lexists(a.dst):
            shutil.rmtree(a.dst)  # an earlier run's finished copy; the upload record says what is uploaded
        keep = False
        try:
            with watch_uploads(uploader, a.dst):
                report = _convert_local(a)

            uploader.finish(a.dst, read_manifest(a.dst))
            if not a.quiet:
                print(f"uploaded to {url}")
            report.output = url
            return report
        except BaseException as e:
            keep = getattr(e, "partial_output", None) is not None
            raise
        finally:
            a.dst = url
            if not keep:
                shutil.rmtree(work, ignore_errors=True)


def _convert_local(a: argparse.Namespace):  # noqa: ANN202 - ConvertReport
    from dataclasses import replace

    from .engine import convert_imagefolder

    options = convert_options(a)
    if a.src_format in ("imagefolder", "list", "coco", *IMPORT_FORMATS) and a.dst_format == "imagefolder":
        raise UsageError(f"packer convert: {a.src_format} -> imagefolder is not a conversion")
    if a.classes_from is not None:
        if a.src_format not in ("imagefolder", "list", *IMPORT_FORMATS):
            raise UsageError("packer convert: --classes-from applies to imagefolder and list sources and to mds, "
                             "litdata and parquet (a packed source keeps its classes, a COCO file's are its "
                             "categories; packer merge reconciles class lists)")
        options = replace(options, classes=tuple(pinned_classes(a.classes_from)))
    _warn_partial_output(a)
    if a.src_format == "list":
        from .listsource import convert_list

        try:
            report = convert_list(a.src, a.dst, a.dst_format, options, root=a.root, path_column=a.path_column,
                                  label_column=a.label_column, label_kind=a.label_kind, label_sep=a.label_sep,
                                  allow_outside_root=bool(a.allow_outside_root), mask_column=a.mask_column,
                                  image_columns=a.image_column or (), boxes_column=a.boxes_column,
                                  box_labels_column=a.box_labels_column,
                                  metadata_types=a.metadata_types or "auto")
        except ValueError as e:  # metadata that cannot be stored, named by its item
            from ..errors import SourceError

            if isinstance(e, SourceError):  # names the list already
                raise
            raise SourceError(f"{a.src}: {e}") from None
    elif a.src_format == "coco":
        from .coco import convert_coco

        report = convert_coco(a.src, a.dst, a.dst_format, options, images=a.images, masks=a.masks)
    elif a.src_format in IMPORT_FORMATS:
        report = _convert_import(a, options)
    elif a.src_format == "imagefolder":
        report = convert_imagefolder(a.src, a.dst, a.dst_format, options)
    else:  # packed -> packed or imagefolder: copy stored bytes unless --resize/--encode ask otherwise
        from ..description.manifest import MANIFEST_NAME
        from .transcode import convert_dataset, processing_for

        src_manifest = read_manifest(a.src) if os.path.exists(os.path.join(a.src, MANIFEST_NAME)) else None
        processing = processing_for(src_manifest, a.resize, a.encode, options.processing)
        report = convert_dataset(a.src, a.dst, a.src_format, a.dst_format, replace(options, processing=processing))
        renamed = getattr(report, "renamed", [])
        for key, path, why in renamed[:20]:
            _say(f"renamed {key} -> {path}: {why}")
        if len(renamed) > 20:
            _say(f"... and {len(renamed) - 20} more renamed")
    return report


def _convert_import(a: argparse.Namespace, options):  # noqa: ANN001, ANN202 - ConvertOptions, ConvertReport
    """Convert an MDS, LitData or Parquet dataset (packer.ops.importers)."""
    from .importers import open_table
    from .importers.common import convert_import

    table = open_table(a.src_format, a.src, _storage(a), root=a.root, allow_outside_root=bool(a.allow_outside_root))
    image_column = a.image_column[0] if a.image_column else None  # one at most (_check_source_flags)
    return convert_import(table, a.dst, a.dst_format, options, image_column=image_column,
                          label_column=a.label_column, drop_columns=a.drop_column or (), label_kind=a.label_kind,
                          classes=options.classes, source_kind=a.src_format)


def _warn_partial_output(a: argparse.Namespace) -> None:
    """Say, before it happens, that a run without --resume deletes an interrupted run's partial output."""
    from ..files.filesystem import temp_dir_for
    from .engine import interrupted_samples

    if a.resume or a.dst_format == "imagefolder" or (os.path.lexists(a.dst) and not a.overwrite):
        return
    dropped = interrupted_samples(a.dst)
    if dropped is not None:
        _say(f"packer: starting over: deleting the partial output of an interrupted conversion in "
             f"{temp_dir_for(a.dst)} ({plural(dropped, 'sample')} written); --resume continues from it instead")


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


def _convert_torchrun(a: argparse.Namespace, launch):  # noqa: ANN001, ANN202 - a distributed.Launch
    """One rank of ``torchrun ... -m packer convert imagefolder FMT SRC DST``: a part per rank,
    merged by rank 0 (packer.ops.distributed); the report on rank 0, None on the others."""
    from datetime import timedelta

    from ..storage.remote import is_url
    from .distributed import convert_imagefolder_torchrun, rank_timeout

    if not a.quiet:
        print(f"packer: torchrun detected: {launch.describe()}; converting one part per rank, rank 0 merges",
              flush=True)
    if a.src_format != "imagefolder" or a.dst_format == "imagefolder" or is_url(a.dst):
        raise UsageError("packer convert: under torchrun only an image folder converts in parts, to a local packed "
                         "destination; run other conversions without torchrun")
    timeout = rank_timeout() if a.rank_timeout is None else timedelta(seconds=a.rank_timeout)
    report = convert_imagefolder_torchrun(a.src, a.dst, a.dst_format, convert_options(a), launch, timeout)
    return report if launch.rank == 0 else None


# -- object storage ------------------------------------------------------------------------------
def _add_storage(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("object storage (paths given as s3://, gs://, https://, ... URLs)")
    g.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an fsspec storage option, e.g. client_kwargs.endpoint_url=http://host:9000 "
                        "(repeatable; VALUE parsed as JSON when it can be)")
    g.add_argument("--cache-dir", metavar="DIR", help="node-local download cache (default: PACKER_CACHE_DIR, "
                                                      "else ~/.cache/packer)")
    g.add_argument("--cache-limit", metavar="SIZE", help="most bytes the download cache keeps, e.g. 20GB")
    g.add_argument("--remote-deadline", type=_seconds, metavar="SECONDS",
                   help="how long the read of one remote file may take, open to last byte, before it fails naming "
                        "the URL, whatever the storage library's retries do (default: PACKER_REMOTE_DEADLINE, else "
                        "120)")


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


def _fetched(a: argparse.Namespace, url: str) -> str:
    """The node cache's complete copy of the dataset at ``url`` (an error if a file is bad)."""
    from ..storage.remote import local_copy

    view, problems = local_copy(url, _storage(a), a.cache_dir, a.cache_limit, format_names())
    if problems:
        raise PackerError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    return view


def _fetched_shards(a: argparse.Namespace, pattern: str) -> str:
    """For a brace pattern of shard URLs: the local pattern of their copies in the node cache, or
    for all of a packer dataset's shards, the node cache's copy of the dataset."""
    from packer.datasets import open_dataset

    ds = open_dataset(pattern, format=a.src_format, output="numpy", storage_options=_storage(a),
                      cache_dir=a.cache_dir, cache_limit=a.cache_limit)
    if not ds.manifest.layout.get("foreign"):
        return _fetched(a, ds.url)
    return os.path.join(ds.root, pattern.rsplit("/", 1)[1])  # every shard was downloaded to be scanned


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
    if f["kind"] != "mask":
        return f["kind"]
    return f"mask, {f['dtype']}" if "dtype" in f else "mask, uint8 or uint16 as each is stored"


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
        with _remote_deadline(getattr(a, "remote_deadline", None)):
            return COMMANDS[a.command][2](a)
    except UsageError as e:
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
        if terminated:  # a worker process killed by the same SIGTERM (SLURM signals the whole job)
            _say("packer: terminated (SIGTERM)" + _partial_note(e))
            return EXIT_TERMINATED
        if isinstance(e, UnfinishedDatasetError) and getattr(e, "directory", None):
            from ..formats import explain_missing_manifest

            e = explain_missing_manifest(e, e.directory)
        _say(f"packer: error: {e}" + _partial_note(e))
        return EXIT_ERROR


@contextlib.contextmanager
def _remote_deadline(seconds: float | None) -> Iterator[None]:
    """``--remote-deadline``: PACKER_REMOTE_DEADLINE for the command (every Remote it makes, its
    worker processes too), as it was before once the command returns."""
    if seconds is None:
        yield
        return
    before = os.environ.get("PACKER_REMOTE_DEADLINE")
    os.environ["PACKER_REMOTE_DEADLINE"] = repr(seconds)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PACKER_REMOTE_DEADLINE", None)
        else:
            os.environ["PACKER_REMOTE_DEADLINE"] = before


def _partial_note(e: BaseException) -> str:
    """The hint a resumable failure carries (see packer.ops.engine.write_packed)."""
    kept = getattr(e, "partial_output", None)
    return f"; partial output kept in {kept}; run again with --resume to continue" if kept else ""
