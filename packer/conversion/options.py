"""The options of a conversion, Python first: one table of options (name, type, default, help)
and the typed request they make (:class:`ConvertRequest`: the engine's :class:`ConvertOptions`
with the source's and the object store's options). The keywords of ``packer.convert`` and
``packer.pack`` and the flags of the command line are built from the same table;
:func:`packer.conversion.request.convert_request` checks them into a request. This module sits
below the source table, whose rows name the options they take and convert a request."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..formats import format_names

if TYPE_CHECKING:
    from ..pipeline.engine import ConvertOptions

__all__ = ["Option", "OPTIONS", "STORAGE_GROUP", "Caller", "COMMAND_LINE", "OptionError", "SourceOptions", "StorageOptions",
           "ConvertRequest", "get_option", "options_named", "dst_formats",
           "writes_image_folder"]


class OptionError(ValueError):
    """A bad option or combination of options; the command line exits 2 for it."""


@dataclass(frozen=True)
class Option:
    """One conversion option: a keyword of ``packer.convert`` and a flag of ``packer convert``.

    ``kind``: ``bool`` (a switch), ``int``, ``float``, ``str``, ``"strs"`` (a string or a list of
    them; the flag repeats), ``"seconds"`` (a positive number) or ``"storage"`` (fsspec storage
    options: a dict, or ``KEY=VALUE`` strings). ``pack``: :func:`packer.pack` takes it too."""

    name: str
    kind: Any
    group: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    short: str | None = None
    pack: bool = True

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_LIST, _COCO, _SHARDS = "labels and list sources", "COCO sources", "shards (tar, tfrecord)"
STORAGE_GROUP = _STORAGE = "object storage (paths given as s3://, gs://, https://, ... URLs)"

#: Every option of a conversion, in the order ``packer convert --help`` shows them.
OPTIONS: tuple[Option, ...] = (
    Option("resize", str, "images",
           "shorter:N, longer:N, WxH or none (default: none; from a packed SRC: copy the stored images)"),
    Option("encode", str, "images", "jpeg:Q, webp:Q, png, raw or keep (default: keep with --resize none, else "
                                    "jpeg:90; from a packed SRC: copy the stored bytes)"),
    Option("upscale", bool, "images", "enlarge images smaller than the target", False),
    Option("max_pixels", int, "images", "refuse larger images (decompression bombs)"),
    Option("exact_decode", bool, "images",
           "always decode JPEGs at full size (default: libjpeg's reduced-size decode when the target allows)", False),
    Option("keep_damaged_jpeg", bool, "images", "keep JPEGs that libjpeg decodes only with a warning (truncated, "
                                                "garbled data; default: skip them with the warning as the reason)", False),
    Option("workers", int, "conversion", "worker processes (default: all cores)", os.cpu_count() or 1),
    Option("seed", int, "conversion", "seed of the write-time shuffle (default: 0)", 0),
    Option("no_shuffle", bool, "conversion", "keep folder order instead of shuffling", False),
    Option("strict", bool, "conversion", "stop at the first bad image instead of skipping it", False),
    Option("overwrite", bool, "conversion", "replace DST (atomically, once the new one is complete)", False),
    Option("resume", bool, "conversion",
           "continue an interrupted conversion from its partial output (same SRC and options)", False),
    Option("checkpoint_samples", int, "conversion", "lmdb, hdf5: commit (a point --resume continues from) every N "
                                                    "samples (default: 1024 lmdb, 8192 hdf5); tar and tfrecord "
                                                    "checkpoint at every shard", metavar="N"),
    Option("quiet", bool, "conversion", "print only errors, warnings and skips (the skipped files and their count): "
                                        "no progress, no summary; under torchrun the same on every rank", False,
           short="-q"),
    Option("log_interval", float, "conversion", "when stderr is not a terminal (nohup, SLURM, CI): seconds between "
                                                "plain progress lines (count, rate, ETA; default: 30)",
           metavar="SECONDS"),
    Option("no_torchrun", bool, "conversion", "convert in this process alone even where torchrun's environment is "
                                              "set (e.g. when started by a training script that torchrun runs)",
           False, pack=False),
    Option("rank_timeout", "seconds", "conversion", "under torchrun: how long a rank may stay silent (stopped, hung) "
                                                    "before the job fails naming it (default: PACKER_TORCHRUN_TIMEOUT, "
                                                    "else 1800); a live rank is waited for however long its part "
                                                    "takes", metavar="SECONDS", pack=False),
    Option("classes_from", str, _LIST, "use this class list (a packed dataset's, e.g. the training set's, or a text "
                                       "file with one name per line) so labels line up; a source class not in it is "
                                       "an error", metavar="DATASET_OR_FILE", pack=False),
    Option("root", str, _LIST, "list and parquet sources: the folder its paths are relative to (default: the list's "
                               "or Parquet file's folder)", pack=False),
    Option("allow_outside_root", bool, _LIST, "list and parquet sources: accept rows whose paths lead outside --root "
                                              "(../x.jpg, absolute paths elsewhere); refused by default", pack=False),
    Option("path_column", str, _LIST, "list source: the column of image paths (default: path, file, filename or "
                                      "image)", pack=False),
    Option("label_column", str, _LIST, "list, mds, litdata and parquet sources: the label column (default: label, "
                                       "labels, class or target)", pack=False),
    Option("drop_column", "strs", _LIST, "mds, litdata and parquet sources: leave this column out of the metadata "
                                         "(repeatable)", metavar="NAME", pack=False),
    Option("label_kind", str, _LIST, "list source: class (one class per image), multi (several), number; auto: multi "
                                     "for JSON lists, number for JSON numbers with a fraction, else class", "auto",
           choices=("auto", "class", "multi", "number"), pack=False),
    Option("label_sep", str, _LIST, "list source: separator of multi-label classes in CSV/TSV (default: |)", "|",
           pack=False),
    Option("mask_column", str, _LIST, "list source: the column of mask files (label maps: 8- or 16-bit, or palette "
                                      "PNG indices; stored as PNG)", metavar="COL", pack=False),
    Option("image_column", "strs", _LIST, "list source: a column of EXTRA image files, processed like the image and "
                                          "named after the column (repeatable; the image's own column is "
                                          "--path-column); mds, litdata and parquet sources: THE image column, given "
                                          "once (default: the one column of an image type)", metavar="COL", pack=False),
    Option("boxes_column", str, _LIST, "list source: the column of boxes, a JSON list of [x0, y0, x1, y1] in source "
                                       "pixels (in CSV/TSV a JSON string)", metavar="COL", pack=False),
    Option("box_labels_column", str, _LIST, "list source: the column of box labels, a JSON list of class names or "
                                            "numbers, one per box", metavar="COL", pack=False),
    Option("metadata_types", str, _LIST, "list source, CSV/TSV: auto stores a metadata column as integers, numbers or "
                                         "booleans (true/false) when every non-empty cell of it is one (a column with "
                                         "one text cell stays text; integers with leading zeros are text); text keeps "
                                         "every cell a string (default: auto; JSON Lines keep their JSON types)",
           choices=("auto", "text"), pack=False),
    Option("images", str, _COCO, "coco source: the folder of the file's images (file_name is relative to it)",
           metavar="DIR", pack=False),
    Option("masks", str, _COCO, "coco source: also store a mask rasterised from the annotations (semantic: category "
                                "index + 1 per pixel; instance: annotation number + 1; 0: background)",
           choices=("semantic", "instance"), pack=False),
    Option("shard_size", str, _SHARDS, "max bytes per shard, e.g. 256MB, 1GiB"),
    Option("shard_samples", int, _SHARDS, "max samples per shard"),
    Option("gzip", bool, _SHARDS, "gzip-compress TFRecord files", False),
    Option("prefix", str, _SHARDS, "shard file names PREFIX-000000.tar, ... (default: shard)"),
    Option("storage_option", "storage", _STORAGE, "an fsspec storage option, e.g. client_kwargs.endpoint_url="
                                                  "http://host:9000 (repeatable; VALUE parsed as JSON when it can be)",
           (), metavar="KEY=VALUE", pack=False),
    Option("cache_dir", str, _STORAGE, "node-local download cache (default: PACKER_CACHE_DIR, else ~/.cache/packer)",
           metavar="DIR", pack=False),
    Option("cache_limit", str, _STORAGE, "most bytes the download cache keeps, e.g. 20GB", metavar="SIZE",
           pack=False),
    Option("remote_deadline", "seconds", _STORAGE, "how long the read of one remote file may take, open to last "
                                                   "byte, before it fails naming the URL, whatever the storage "
                                                   "library's retries do (default: PACKER_REMOTE_DEADLINE, else 120)",
           metavar="SECONDS", pack=False),
)
_BY_NAME = {o.name: o for o in OPTIONS}


def get_option(name: str) -> Option:
    """The option named ``name`` (KeyError for another name)."""
    return _BY_NAME[name]


def options_named(*groups: str) -> tuple[Option, ...]:
    """The options of these groups (``"images"``, ``"conversion"``, ...), in table order."""
    return tuple(o for o in OPTIONS if o.group in groups)


def dst_formats() -> list[str]:
    """What a conversion writes: every packed format, and an image folder (from a packed source)."""
    return [*format_names(), "imagefolder"]


def writes_image_folder(dst_format: str) -> bool:
    """Whether a conversion to ``dst_format`` writes an image folder, the one destination of
    :func:`dst_formats` that is not packed (the one place that names it)."""
    return dst_format == "imagefolder"


@dataclass(frozen=True)
class Caller:
    """Who asks, which decides how an error names an option: ``packer convert`` names the flag
    (``--shard-size``), ``packer.convert()`` the keyword (``shard_size``)."""

    prog: str
    flags: bool = False

    def name(self, option: str) -> str:
        """The option as this caller spells it."""
        return _BY_NAME[option].flag if self.flags and option in _BY_NAME else option

    def error(self, message: str) -> OptionError:
        """An OptionError whose message starts with the caller."""
        return OptionError(f"{self.prog}: {message}")


COMMAND_LINE = Caller("packer convert", flags=True)


@dataclass(frozen=True)
class SourceOptions:
    """The options that only some sources take (see the source table, :mod:`packer.sources.table`)."""

    root: str | None = None
    allow_outside_root: bool | None = None
    path_column: str | None = None
    label_column: str | None = None
    drop_column: tuple[str, ...] | None = None
    label_kind: str = "auto"
    label_sep: str = "|"
    mask_column: str | None = None
    image_column: tuple[str, ...] | None = None
    boxes_column: str | None = None
    box_labels_column: str | None = None
    metadata_types: str | None = None
    images: str | None = None
    masks: str | None = None
    classes_from: str | None = None


@dataclass(frozen=True)
class StorageOptions:
    """Object storage: fsspec's storage options, the node cache, the deadline of one remote read."""

    options: Mapping[str, Any]
    cache_dir: str | None = None
    cache_limit: str | None = None
    remote_deadline: float | None = None


@dataclass(frozen=True)
class ConvertRequest:
    """One conversion, checked: what to convert, the engine's options, the source's and storage's.
    ``resize`` and ``encode`` keep the texts given (None: not given): a packed source copies its
    stored images unless one is given."""

    src_format: str
    dst_format: str
    src: str
    dst: str
    options: ConvertOptions
    source: SourceOptions
    storage: StorageOptions
    resize: str | None = None
    encode: str | None = None
    no_torchrun: bool = False
    rank_timeout: float | None = None
    caller: Caller = COMMAND_LINE

    @property
    def quiet(self) -> bool:
        return not self.options.progress
