"""The one function that checks a conversion's options into a :class:`ConvertRequest`, whether
they came as keywords (``packer.convert``, ``packer.pack``) or as flags (the command line): each
value typed and checked against the options table, the source's options against the source
table, the writer's against the format registry. Errors name the keyword or the flag."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..formats import formats_taking, get_format
from ..sources.table import get_source, source_names, sources_taking
from .options import (
    OPTIONS,
    Caller,
    ConvertRequest,
    Option,
    OptionError,
    SourceOptions,
    StorageOptions,
    dst_formats,
    get_option,
    writes_image_folder,
)

if TYPE_CHECKING:
    from ..pipeline.engine import ConvertOptions

__all__ = ["convert_request"]


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
    if not get_source(src_format).packed and writes_image_folder(dst_format):
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
        if v[k] is not None and get_option(k).default is None and k not in source.takes:
            who = [s.name for s in sources_taking()[k]]
            what = f"a {who[0]} source" if len(who) == 1 else f"{', '.join(who[:-1])} and {who[-1]} sources"
            raise caller.error(f"{caller.name(k)} applies to {what} only")
    if source.one_image_column and v["image_column"] is not None and len(v["image_column"]) > 1:
        raise caller.error(f"a {src_format} source has one image column; {caller.name('image_column')} is given "
                           f"{len(v['image_column'])} times")
    for k, why in source.needs:
        if v[k] is None:
            metavar = f" {get_option(k).metavar}" if caller.flags and get_option(k).metavar else ""
            raise caller.error(f"a {src_format} source needs {caller.name(k)}{metavar}, {why}")


#: WriterOptions field -> the option that sets it, and what to add when a format does not take it.
_WRITER_OPTIONS = {"shard_bytes": "shard_size", "shard_samples": "shard_samples", "gzip": "gzip", "prefix": "prefix",
                   "checkpoint_samples": "checkpoint_samples"}
_WRITER_HINTS = {"checkpoint_samples": " (shard formats checkpoint at every shard)"}


def _convert_options(caller: Caller, dst_format: str, v: Mapping[str, Any]) -> ConvertOptions:
    """The engine's ConvertOptions of the values ``v``; OptionError naming the option that is wrong."""
    from ..converters.base import WriterOptions
    from ..images.imageproc import DEFAULT_MAX_PIXELS, ProcessOptions, parse_encoding, parse_resize
    from ..pipeline.engine import ConvertOptions
    from ..sizes import parse_size

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
            (v["resume"] and writes_image_folder(dst_format),
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
    refused = get_format(dst_format).refused_options(writer) if not writes_image_folder(dst_format) else [
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
