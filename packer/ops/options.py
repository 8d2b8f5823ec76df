"""The options of a conversion, Python first: one table of options (name, type, default, help),
the typed request they make (:class:`ConvertRequest`: the engine's :class:`ConvertOptions` with
the source's and the object store's options) and :func:`convert_request`, the one function that
checks them, whether they came as keywords (``packer.convert``, ``packer.pack``) or as flags (the
command line builds its flags from the same table). Errors name the keyword or the flag."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..formats import format_names, formats_taking, get_format
from .sources import get_source, source_names, sources_taking

if TYPE_CHECKING:
    from .engine import ConvertOptions

__all__ = ["Option", "OPTIONS", "STORAGE_GROUP", "Caller", "COMMAND_LINE", "OptionError", "SourceOptions", "StorageOptions",
           "ConvertRequest", "convert_request", "options_named", "dst_formats"]


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


def options_named(*groups: str) -> tuple[Option, ...]:
    """The options of these groups (``"images"``, ``"conversion"``, ...), in table order."""
    return tuple(o for o in OPTIONS if o.group in groups)


def dst_formats() -> list[str]:
    """What a conversion writes: every packed format, and an image folder (from a packed source)."""
    return [*format_names(), "imagefolder"]


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
    """The options that only some sources take (see the source table, :mod:`packer.ops.sources`)."""

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


def convert_request(caller: Caller, src_format: str, dst_format: str, src: str | os.PathLike[str],
                    dst: str | os.PathLike[str], values: Mapping[str, Any],
                    accepted: Sequence[Option] = OPTIONS) -> ConvertRequest:
    """The checked request of a conversion from option ``values`` (keywords, or the flags the
    command line parsed; those not given take their default). ``accepted``: the options taken.
    TypeError for an unknown option or a value of the wrong type; OptionError (a ValueError) for a
    bad value or combination; both name the option as ``caller`` spells it. For keywords, ``~`` in
    SRC and DST is expanded, as a shell does for the command line."""
    taken = {o.name: o for o in accepted}
    for key in values:
        if key not in taken:
            raise TypeError(f"{caller.prog} got an unexpected keyword argument {key!r}; it takes "
                            f"{', '.join(sorted(taken))}")
    v = {o.name: o.default for o in OPTIONS}
    v.update((key, _typed(caller, taken[key], value)) for key, value in values.items())
    for what, value, choices in (("src_format", src_format, source_names()), ("dst_format", dst_format, dst_formats())):
        if value not in choices:
            raise caller.error(f"{what}: invalid choice: {value!r} (choose from {', '.join(choices)})")
    _check_source_options(caller, src_format, v)
    options = _convert_options(caller, dst_format, v)
    if not get_source(src_format).packed and dst_format == "imagefolder":
        raise caller.error(f"{src_format} -> imagefolder is not a conversion")
    if v["classes_from"] is not None and not get_source(src_format).pins_classes:
        raise caller.error(f"{caller.name('classes_from')} applies to imagefolder and list sources and to mds, "
                           "litdata and parquet (a packed source keeps its classes, a COCO file's are its "
                           "categories; packer merge reconciles class lists)")
    fields = SourceOptions.__dataclass_fields__
    src, dst = os.fspath(src), os.fspath(dst)
    if not caller.flags:
        src, dst = os.path.expanduser(src), os.path.expanduser(dst)
    return ConvertRequest(
        src_format, dst_format, src, dst, options,
        SourceOptions(**{k: tuple(v[k]) if isinstance(v[k], list) else v[k] for k in fields}),
        StorageOptions(_storage(caller, v["storage_option"]), v["cache_dir"], v["cache_limit"], v["remote_deadline"]),
        resize=v["resize"], encode=v["encode"], no_torchrun=v["no_torchrun"], rank_timeout=v["rank_timeout"],
        caller=caller)


def _typed(caller: Caller, option: Option, value: Any) -> Any:
    """``value`` as ``option`` takes it (None: its default); TypeError/OptionError naming it."""
    key, kind = caller.name(option.name), option.kind
    if kind is bool:
        if not isinstance(value, bool) and not (value is None and option.default is None):
            raise TypeError(f"{caller.prog}: {key} takes True or False, not {value!r}")
        return value
    if value is None:
        return option.default
    if kind == "strs":
        if isinstance(value, str):
            return [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
            raise TypeError(f"{caller.prog}: {key} takes a string or a list of strings, not {value!r}")
        return list(value)
    if kind == "storage":
        if isinstance(value, dict):
            import json

            return [f"{k}={json.dumps(x)}" for k, x in value.items()]
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
            raise TypeError(f"{caller.prog}: {key} takes a dict or a list of 'KEY=VALUE' strings, not {value!r}")
        return list(value)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if kind == "seconds":
        return _seconds(caller, key, value)
    if isinstance(value, str) and kind is not str:
        try:
            value = kind(value)
        except ValueError:
            raise caller.error(f"{key}={value!r} is not a {kind.__name__}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{caller.prog}: {key} takes a {kind.__name__}, not {value!r}")
    if option.choices is not None and value not in option.choices:
        raise caller.error(f"{key}={value!r} is not one of {', '.join(option.choices)}")
    return value


def _seconds(caller: Caller, key: str, value: Any) -> float:
    """A positive, finite number of seconds (a number or its text)."""
    try:
        seconds = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else -1.0
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise caller.error(f"{key}={value!r} is not a positive number of seconds")
    return seconds


def _check_source_options(caller: Caller, src_format: str, v: Mapping[str, Any]) -> None:
    """OptionError for an option that the source does not take (one whose default is None, given),
    or one it needs and lacks."""
    source = get_source(src_format)
    for k in sources_taking():
        if v[k] is not None and _BY_NAME[k].default is None and k not in source.takes:
            who = [s.name for s in sources_taking()[k]]
            what = f"a {who[0]} source" if len(who) == 1 else f"{', '.join(who[:-1])} and {who[-1]} sources"
            raise caller.error(f"{caller.name(k)} applies to {what} only")
    if source.one_image_column and v["image_column"] is not None and len(v["image_column"]) > 1:
        raise caller.error(f"a {src_format} source has one image column; {caller.name('image_column')} is given "
                           f"{len(v['image_column'])} times")
    for k, why in source.needs:
        if v[k] is None:
            metavar = f" {_BY_NAME[k].metavar}" if caller.flags and _BY_NAME[k].metavar else ""
            raise caller.error(f"a {src_format} source needs {caller.name(k)}{metavar}, {why}")


#: WriterOptions field -> the option that sets it, and what to add when a format does not take it.
_WRITER_OPTIONS = {"shard_bytes": "shard_size", "shard_samples": "shard_samples", "gzip": "gzip", "prefix": "prefix",
                   "checkpoint_samples": "checkpoint_samples"}
_WRITER_HINTS = {"checkpoint_samples": " (shard formats checkpoint at every shard)"}


def _convert_options(caller: Caller, dst_format: str, v: Mapping[str, Any]) -> ConvertOptions:
    """The engine's ConvertOptions of the values ``v``; OptionError naming the option that is wrong."""
    from ..converters.base import WriterOptions
    from ..images.imageproc import DEFAULT_MAX_PIXELS, ProcessOptions, parse_encoding, parse_resize
    from ..sizes import parse_size
    from .engine import ConvertOptions

    n = caller.name
    resize = _parsed(caller, "resize", parse_resize, v["resize"] if v["resize"] is not None else "none")
    encoding = _parsed(caller, "encode", parse_encoding,
                       v["encode"] if v["encode"] is not None else _default_encoding(v["resize"]))
    shard_bytes = _parsed(caller, "shard_size", parse_size, v["shard_size"]) if v["shard_size"] is not None else None
    processing = ProcessOptions(resize=resize, encoding=encoding, upscale=v["upscale"],
                                max_pixels=v["max_pixels"] if v["max_pixels"] is not None else DEFAULT_MAX_PIXELS,
                                reduced_decode=not v["exact_decode"], keep_damaged_jpeg=v["keep_damaged_jpeg"])
    for bad, message in (
            (v["workers"] < 1, f"{n('workers')} must be at least 1"),
            (v["log_interval"] is not None and not v["log_interval"] > 0, f"{n('log_interval')} must be above 0 seconds"),
            (shard_bytes is not None and shard_bytes < 1, f"{n('shard_size')} must be at least 1 byte"),
            (v["shard_samples"] is not None and v["shard_samples"] < 1, f"{n('shard_samples')} must be at least 1"),
            (v["resume"] and dst_format == "imagefolder",
             f"{n('resume')} applies to packed output (lmdb, hdf5, tar, tfrecord) only"),
            (v["checkpoint_samples"] is not None and v["checkpoint_samples"] < 1,
             f"{n('checkpoint_samples')} must be at least 1")):
        if bad:
            raise caller.error(message)
    try:
        writer = WriterOptions(shard_bytes=shard_bytes, shard_samples=v["shard_samples"], gzip=v["gzip"],
                               checkpoint_samples=v["checkpoint_samples"], prefix=v["prefix"])
    except ValueError as e:
        raise caller.error(f"{n('prefix')}: {e}") from None
    refused = get_format(dst_format).refused_options(writer) if dst_format != "imagefolder" else [
        f for f in _WRITER_OPTIONS if getattr(writer, f) not in (None, False)]
    if refused:
        raise caller.error(f"{n(_WRITER_OPTIONS[refused[0]])} applies to {' and '.join(formats_taking(refused[0]))} "
                           "output only" + _WRITER_HINTS.get(refused[0], ""))
    return ConvertOptions(processing=processing, writer=writer, workers=v["workers"], shuffle=not v["no_shuffle"],
                          seed=v["seed"], strict=v["strict"], overwrite=v["overwrite"], progress=not v["quiet"],
                          progress_interval=v["log_interval"] if v["log_interval"] is not None
                          else ConvertOptions.progress_interval, resume=v["resume"])


def _parsed(caller: Caller, option: str, parse: Any, text: str) -> Any:
    """``parse(text)``; OptionError naming the option for its ValueError."""
    try:
        return parse(text)
    except ValueError as e:
        raise caller.error(f"{caller.name(option)}: {e}") from None


def _default_encoding(resize: str | None) -> str:
    """``keep`` when nothing is resized (no silent lossy re-encode of the originals), else ``jpeg:90``."""
    return "keep" if resize is None or resize.strip().lower() == "none" else "jpeg:90"


def _storage(caller: Caller, pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` storage options parsed (fsspec's ``storage_options``)."""
    from ..storage.remote import parse_storage_options

    try:
        return parse_storage_options(pairs)
    except ValueError as e:
        raise OptionError(f"packer: {e}" if caller.flags else f"{caller.prog}: {caller.name('storage_option')}: {e}") \
            from None
