"""The fields an item of :func:`packer.pipeline.items.convert_items` may carry besides its image, as a
fourth element: ``{"mask": path or bytes, "images": {name: path or bytes}, "boxes": [[x0, y0, x1,
y1], ...], "box_labels": [class name or number, ...], "size": [width, height]}`` (any of the keys;
boxes in the source image's pixels; ``size`` the image's size they were given for, checked against
the image file's header before any field is read). Checked per item, read and processed with the
image in the worker processes."""

from __future__ import annotations

import abc
import hashlib
import math
import numbers
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ImageError
from ..fields import KINDS
from ..fields import named as kind_named
from ..fields.boxes import BOXES
from ..fields.image import IMAGE
from ..fields.mask import MASK
from ..fields.sample import FieldSources, check_field_name, process_sample
from ..files.fileio import NotReadableError, read_source_file
from ..images.imageheader import sniff
from ..images.imageproc import ProcessOptions, above_pixel_limit
from .sourcefiles import NO_STAMP, Stamp, file_stamp, stamp_mismatch

__all__ = ["FIELD_KEYS", "payload_keys", "MadeSource", "SourceSize", "ItemFields", "FieldFiles", "item_fields", "declared_fields", "fields_entry", "with_stamps",
           "process_with_fields", "field_processor"]

#: The keys an item's fields dict may have (and the name of each field kind that fixes its
#: field's name and stores it: :func:`payload_keys`).
FIELD_KEYS = ("mask", "images", "boxes", "box_labels", "size")


def payload_keys() -> tuple[str, ...]:
    """The item keys of the other kinds in :data:`packer.fields.KINDS` that fix their field's
    name and store it as a payload (the mask has its own key): a source path or bytes each."""
    return tuple(k.field_name for k in KINDS.values() if k.stored and k.field_name and k is not MASK)


@dataclass(frozen=True)
class SourceSize:
    """The size (width, height) an item's boxes and mask were given for, and what declared it
    (``images[3]`` of a COCO file): an image file of another size is a skip, found from its
    header before anything is drawn or decoded."""

    width: int
    height: int
    declared_by: str = "the item's size"

    def mismatch(self, data: bytes, max_pixels: int) -> str | None:
        """Why the image file ``data`` cannot take these fields (its header above ``max_pixels``, or
        another size once its EXIF orientation is applied), or None (also for an unreadable header:
        the image's own processing says why)."""
        info = sniff(data)
        if info is None:
            return None
        if info.pixels > max_pixels:
            return above_pixel_limit(info, max_pixels)
        w, h = (info.height, info.width) if info.orientation >= 5 else (info.width, info.height)
        if (w, h) != (self.width, self.height):
            return (f"{self.declared_by} declares {self.width}x{self.height} but the image file is {w}x{h}; its "
                    f"boxes and mask are given for the declared size")
        return None

class MadeSource(abc.ABC):
    """A field's file made where it is processed, in a worker (a mask drawn from polygons): its
    bytes on demand, and a digest of everything that decides them (for the fingerprint)."""

    @abc.abstractmethod
    def data(self) -> bytes:
        """The file's bytes (an exception is a skip of the sample, with its message)."""

    @abc.abstractmethod
    def digest(self) -> str:
        """A digest of what decides :meth:`data`, the same whenever the bytes are the same."""


#: A field's source: a file path, the file's bytes, or a file made on demand.
Source = str | bytes | MadeSource


@dataclass(frozen=True)
class ItemFields:
    """One item's fields as checked: the mask's source, the extra images' sources by name (in the
    item's order), the boxes (floats, source pixels) and the box labels as given."""

    mask: Source | None = None
    images: tuple[tuple[str, Source], ...] = ()
    boxes: tuple[tuple[float, float, float, float], ...] | None = None
    box_labels: tuple[str | int, ...] | None = None
    size: SourceSize | None = None
    #: The fields of other kinds that fix their name (:func:`payload_keys`), by that name.
    payloads: tuple[tuple[str, Source], ...] = ()

    def signature(self) -> tuple[Any, ...]:
        """What fields the item has (every item of a conversion must have the same)."""
        return (self.mask is not None, frozenset(n for n, _ in self.images), self.boxes is not None,
                self.box_labels is not None, *(n for n, _ in self.payloads))

    def describe(self) -> str:
        """The fields as a user reads them: ``mask, images left and right, boxes``."""
        parts = ["mask"] if self.mask is not None else []
        parts += [f"image {n!r}" for n, _ in self.images]
        parts += [n for n, _ in self.payloads]
        parts += ["boxes"] if self.boxes is not None else []
        parts += ["box_labels"] if self.box_labels is not None else []
        return ", ".join(parts) or "no fields"


@dataclass(frozen=True)
class FieldFiles:
    """What a worker needs to read and process one item's fields: sources (paths or bytes),
    boxes with their labels already made class numbers, and the ``(size, mtime_ns)`` each file
    had when the items were listed (by path; a file read must still have it)."""

    mask: Source | None
    images: tuple[tuple[str, Source], ...]
    boxes: tuple[tuple[float, float, float, float], ...] | None
    box_labels: tuple[int, ...] | None
    stamps: tuple[tuple[str, Stamp], ...] = ()
    size: SourceSize | None = None
    payloads: tuple[tuple[str, Source], ...] = ()

    @property
    def paths(self) -> list[str]:
        """The fields' files given by path: the mask's, the extra images' in order, the other kinds'."""
        return [s for s in (self.mask, *(src for _, src in self.images), *(src for _, src in self.payloads))
                if isinstance(s, str)]


def _source(i: int, what: str, value: Any) -> Source:
    if isinstance(value, MadeSource):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (str, os.PathLike)) and os.fspath(value):
        return os.fspath(value)
    raise TypeError(f"item {i}: {what} must be a file path or the file's bytes, not {type(value).__name__}")


def _boxes(i: int, value: Any) -> tuple[tuple[float, float, float, float], ...]:
    try:
        rows = [list(b) for b in value]
    except TypeError:
        raise ValueError(f"item {i}: boxes must be a list of [x0, y0, x1, y1], not {type(value).__name__}") from None
    out = []
    for k, row in enumerate(rows):
        if len(row) != 4 or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in row):
            raise ValueError(f"item {i}: box {k} {row!r} is not four numbers [x0, y0, x1, y1]")
        b = tuple(float(v) for v in row)
        if not all(math.isfinite(v) for v in b):
            raise ValueError(f"item {i}: box {k} {list(b)} is not finite")
        out.append(b)
    return tuple(out)  # type: ignore[arg-type]


def _box_labels(i: int, value: Any, n: int) -> tuple[str | int, ...]:
    if isinstance(value, (str, bytes)):
        raise ValueError(f"item {i}: box_labels must be a list of class names or numbers, not a string")
    labels = tuple(int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v for v in value)
    for v in labels:
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise ValueError(f"item {i}: box label {v!r} is not a class name or number")
    if len(labels) != n:
        raise ValueError(f"item {i}: {len(labels)} box labels for {n} boxes")
    return labels


def _size(i: int, value: Any) -> SourceSize:
    if isinstance(value, SourceSize):
        return value
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2 or not all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in value):
        raise ValueError(f"item {i}: size must be [width, height] (two positive integers), not {value!r}")
    return SourceSize(int(value[0]), int(value[1]))


def item_fields(i: int, value: Any) -> ItemFields | None:
    """Item ``i``'s fields dict checked (None or empty: no fields); TypeError/ValueError naming it."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"item {i}: fields must be a dict with keys of {', '.join(FIELD_KEYS)}, "
                        f"not {type(value).__name__}")
    keys = (*FIELD_KEYS, *payload_keys())
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise ValueError(f"item {i}: unknown field {unknown[0]!r} (an item's fields are {', '.join(keys)})")
    if not value:
        return None
    images = value.get("images") or {}
    if not isinstance(images, dict):
        raise TypeError(f"item {i}: images must be a dict of name: path or bytes, not {type(images).__name__}")
    named = []
    for name, src in images.items():
        try:
            check_field_name(name)
        except ValueError as e:
            raise ValueError(f"item {i}: {e}") from None
        named.append((name, _source(i, f"image {name!r}", src)))
    boxes = _boxes(i, value["boxes"]) if value.get("boxes") is not None else None
    labels = value.get("box_labels")
    if labels is not None and boxes is None:
        raise ValueError(f"item {i}: box_labels without boxes")
    payloads = tuple((k, _source(i, k, value[k])) for k in payload_keys() if value.get(k) is not None)
    if value.get("mask") is None and not named and boxes is None and not payloads:
        return None  # a size alone: nothing to check it for
    return ItemFields(_source(i, "mask", value["mask"]) if value.get("mask") is not None else None, tuple(named),
                      boxes, _box_labels(i, labels, len(boxes)) if labels is not None else None,
                      _size(i, value["size"]) if value.get("size") is not None else None, payloads)


def declared_fields(first: ItemFields, image_order: Sequence[str]) -> list[dict[str, Any]]:
    """The manifest's ``fields`` for items like ``first``: the mask, the extra images in
    ``image_order``, the other kinds' fields, the boxes (with ``labels`` when they have them)."""
    out: list[dict[str, Any]] = [MASK.declare(MASK.name)] if first.mask is not None else []
    out += [IMAGE.declare(n) for n in image_order]
    out += [kind_named(n).declare(n) for n, _ in first.payloads]
    if first.boxes is not None:
        out.append(BOXES.declare(BOXES.name, labels=first.box_labels is not None))
    return out


def fields_entry(files: FieldFiles) -> dict[str, Any]:
    """What an item's fingerprint records of its fields: each file's size and modification time
    (as ``files.stamps`` has them; the SHA-256 of bytes), the boxes and the box labels' numbers."""
    stamps = dict(files.stamps)

    def stamp(src: Source) -> Any:
        if isinstance(src, MadeSource):
            return {"made": src.digest()}
        return hashlib.sha256(src).hexdigest() if isinstance(src, bytes) else [src, *stamps.get(src, NO_STAMP)]

    entry: dict[str, Any] = {}
    if files.mask is not None:
        entry["mask"] = stamp(files.mask)
    if files.images:
        entry["images"] = [[n, stamp(s)] for n, s in files.images]
    entry.update((n, stamp(s)) for n, s in files.payloads)
    if files.boxes is not None:
        entry["boxes"] = [list(b) for b in files.boxes]
    if files.box_labels is not None:
        entry["box_labels"] = list(files.box_labels)
    if files.size is not None:
        entry["size"] = [files.size.width, files.size.height]
    return entry


def with_stamps(files: FieldFiles, stamps: Sequence[Stamp] | None = None) -> FieldFiles:
    """``files`` with the stamps of its files by path: ``stamps`` in :attr:`FieldFiles.paths`'
    order (what was listed), or looked up now."""
    paths = files.paths
    found = list(stamps) if stamps is not None else [file_stamp(p) for p in paths]
    return replace(files, stamps=tuple((p, tuple(st)) for p, st in zip(paths, found)))  # type: ignore[misc]


class _Unreadable(Exception):
    """A field's file could not be read: the skip's reason."""


def _read(src: Source, what: str, opts: ProcessOptions, stamps: dict[str, Stamp]) -> bytes:
    """A field's bytes; a file must be as listed (SourceError otherwise: not the planned file)."""
    if isinstance(src, bytes):
        return src
    if isinstance(src, MadeSource):
        try:
            return src.data()
        except Exception as e:  # noqa: BLE001 - a file that cannot be made is a skip with the reason
            raise _Unreadable(f"{what} could not be made: {type(e).__name__}: {e}") from None
    try:
        data, seen = read_source_file(src, opts.max_source_bytes)
    except OSError as e:
        raise _Unreadable(f"{what} file {src}: cannot read: {e.strerror or e}") from None
    except NotReadableError as e:
        raise _Unreadable(f"{what} file {src}: {e}") from None
    want = stamps.get(src)
    if want is not None and (seen.st_size, seen.st_mtime_ns) != tuple(want):
        raise stamp_mismatch(src, (seen.st_size, seen.st_mtime_ns), want)
    return data


def _at_fault(reason: str, files: FieldFiles) -> str:
    """``reason`` with the file of the field it is about, when that field came from a file."""
    if reason.startswith("mask") and isinstance(files.mask, str):
        return f"{reason} (mask file {files.mask})"
    for name, src in files.images:
        if reason.startswith(f"image {name!r}") and isinstance(src, str):
            return f"{reason} (file {src})"
    for name, src in files.payloads:
        if reason.startswith(name) and isinstance(src, str):
            return f"{reason} ({name} file {src})"
    return reason


def process_with_fields(data: bytes, opts: ProcessOptions, files: FieldFiles) -> tuple[Any, str | None]:
    """The image's bytes processed with its fields (:func:`~packer.images.fields.process_sample`),
    or (None, the reason) for a skip, naming the field's file when one is at fault. An image file
    of another size than ``files.size``, or above the pixel limit, is a skip found from its header,
    before any field is read or drawn."""
    if files.size is not None:
        mismatch = files.size.mismatch(data, opts.max_pixels)
        if mismatch:
            return None, mismatch
    stamps = dict(files.stamps)
    try:
        sources = FieldSources(_read(files.mask, "mask", opts, stamps) if files.mask is not None else None,
                               tuple((n, _read(s, f"image {n!r}", opts, stamps)) for n, s in files.images),
                               files.boxes, files.box_labels,
                               tuple((n, _read(s, n, opts, stamps)) for n, s in files.payloads))
    except _Unreadable as e:
        return None, str(e)
    try:
        return process_sample(data, opts, sources), None
    except ImageError as e:
        return None, _at_fault(str(e), files)
    except Exception as e:  # noqa: BLE001 - any decoder failure is a skip with the reason
        return None, _at_fault(f"{type(e).__name__}: {e}", files)


def field_processor(files: FieldFiles) -> Callable[[bytes, ProcessOptions], tuple[Any, str | None]]:
    """A ``process(data, opts)`` for :func:`packer.pipeline.sourcefiles.process_file` that adds ``files``."""
    def process(data: bytes, opts: ProcessOptions) -> tuple[Any, str | None]:
        return process_with_fields(data, opts, files)
    return process
