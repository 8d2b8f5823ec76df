"""COCO detection files as a source: an ``instances_*.json`` and its image folder become samples
with boxes, per-box categories, ``iscrowd`` and the image's metadata, and optionally a mask
rasterised from the annotations' polygons and RLEs (:func:`read_coco`, :func:`convert_coco`).

The class list is the file's categories in id order; box labels are indices into it; each
image's label is the set of categories it shows (label kind ``multi``). docs/sources.md has the
details (what a semantic and an instance mask hold, crowd regions, what is checked).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from ..description.samples import encode_meta
from ..errors import SourceError
from ..fields.mask import encode_mask
from ..pipeline.itemfields import MadeSource, SourceSize

__all__ = ["CocoSource", "DrawnMask", "MASK_KINDS", "read_coco", "convert_coco", "rle_counts", "decode_rle"]

#: What ``masks`` can ask for: category index + 1 per pixel, or annotation number + 1.
MASK_KINDS = ("semantic", "instance")


def rle_counts(counts: str | Sequence[int]) -> list[int]:
    """The run lengths of a COCO RLE: an uncompressed list as it is, or the compressed string
    form decoded (6-bit characters from ``0``, five value bits and a continuation bit each, the
    last one's sign bit extending; from the fourth run on, the run two before is added)."""
    if not isinstance(counts, str):
        return [int(c) for c in counts]
    out: list[int] = []
    p = 0
    while p < len(counts):
        value, shift, more = 0, 0, True
        while more:
            if p >= len(counts):
                raise ValueError("the RLE string ends inside a number")
            c = ord(counts[p]) - 48
            if not 0 <= c < 64:
                raise ValueError(f"character {counts[p]!r} is not of a COCO RLE string")
            value |= (c & 0x1F) << shift
            more = bool(c & 0x20)
            p += 1
            shift += 5
            if not more and c & 0x10:
                value -= 1 << shift
        if len(out) > 2:
            value += out[-2]
        out.append(value)
    return out


def decode_rle(counts: Sequence[int], height: int, width: int) -> np.ndarray:
    """A binary H x W uint8 mask from RLE run lengths (zeros first, column by column)."""
    if any(c < 0 for c in counts) or sum(counts) != height * width:
        raise ValueError(f"its runs cover {sum(counts)} pixels (some negative), the {width}x{height} image "
                         f"{height * width}")
    values = np.arange(len(counts), dtype=np.int64) % 2
    flat = np.repeat(values.astype(np.uint8), np.asarray(counts, dtype=np.int64))
    return np.ascontiguousarray(flat.reshape(width, height).T)


@dataclass
class _Image:
    """One image entry (``images[index]`` of the file) with its annotations (in the file's order)."""

    entry: dict[str, Any]
    path: str
    index: int
    anns: list[dict[str, Any]] = field(default_factory=list)

    @property
    def where(self) -> str:
        """The entry as errors and skips name it: ``images[3]``."""
        return f"images[{self.index}]"


class CocoSource(Sequence[tuple[Any, ...]]):
    """A parsed COCO file: the class list and the images as convert_items' items, made when
    asked for by position (a mask as a :class:`DrawnMask`, drawn by the worker that processes
    the image)."""

    def __init__(self, path: str, classes: list[str], category_index: dict[int, int], images: list[_Image],
                 masks: str | None) -> None:
        self.path, self.classes, self.category_index, self.images, self.masks = (
            path, classes, category_index, images, masks)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return self.item(self.images[i])

    @property
    def keys(self) -> list[str]:
        """Each image's key: its ``file_name``."""
        return [im.entry["file_name"] for im in self.images]

    def item(self, im: _Image) -> tuple[str, list[int], dict[str, Any], dict[str, Any]]:
        """One image as an item: (path, categories present, metadata, fields). Its ``size`` is the
        entry's, which the image file must have (a skip naming the entry otherwise)."""
        boxes = [_xyxy(a["bbox"], im.entry["width"], im.entry["height"]) for a in im.anns]
        labels = [self.category_index[a["category_id"]] for a in im.anns]
        fields: dict[str, Any] = {"boxes": boxes, "box_labels": labels,
                                  "size": SourceSize(im.entry["width"], im.entry["height"], im.where)}
        if self.masks is not None:
            values = [labels[k] + 1 if self.masks == "semantic" else k + 1 for k in range(len(im.anns))]
            top = len(self.classes) if self.masks == "semantic" else len(im.anns)
            fields["mask"] = DrawnMask(int(im.entry["height"]), int(im.entry["width"]), top >= 255,
                                       tuple(zip(values, (a.get("segmentation") for a in im.anns))))
        return im.path, sorted(set(labels)), _meta(im), fields


def _meta(im: _Image) -> dict[str, Any]:
    """An image's metadata: its entry, its annotations' ``iscrowd`` and ids."""
    return {**im.entry, "iscrowd": [int(a.get("iscrowd", 0)) for a in im.anns],
            "annotation_ids": [a.get("id") for a in im.anns]}


@dataclass(frozen=True)
class DrawnMask(MadeSource):
    """An image's mask drawn in the worker that processes it: ``shapes`` are (value, COCO
    segmentation: polygons or an RLE) in drawing order, later ones over earlier ones, on a zero
    background of ``height`` x ``width``, 8-bit or ``wide`` (16-bit)."""

    height: int
    width: int
    wide: bool
    shapes: tuple[tuple[int, Any], ...]

    def array(self) -> np.ndarray:
        """The mask: polygons filled with OpenCV at 1/8 pixel precision, RLEs decoded."""
        out = np.zeros((self.height, self.width), np.uint16 if self.wide else np.uint8)
        for value, seg in self.shapes:
            if isinstance(seg, list):
                polys = [np.round(np.asarray(p, np.float64).reshape(-1, 2) * 8).astype(np.int32) for p in seg]
                cv2.fillPoly(out, polys, value, lineType=cv2.LINE_8, shift=3)
            elif isinstance(seg, dict):
                out[decode_rle(rle_counts(seg["counts"]), self.height, self.width).astype(bool)] = value
        return out

    def data(self) -> bytes:
        """The mask as a grayscale PNG."""
        return encode_mask(self.array())

    def digest(self) -> str:
        """SHA-256 of the size, depth and shapes (as JSON)."""
        text = json.dumps([self.height, self.width, self.wide, self.shapes], separators=(",", ":"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except OSError as e:
        raise SourceError(f"{path}: cannot read the COCO file ({e.strerror or e})") from None
    except (ValueError, RecursionError) as e:
        raise SourceError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "categories")):
        raise SourceError(f"{path}: not a COCO file (a JSON object with lists 'images', 'annotations', 'categories')")
    if not isinstance(data.get("annotations", []), list):
        raise SourceError(f"{path}: 'annotations' is not a list")
    return data


def _categories(path: str, cats: list[Any]) -> tuple[list[str], dict[int, int]]:
    """The class list (names in category id order) and each category id's index in it."""
    for k, c in enumerate(cats):
        if not isinstance(c, dict) or not isinstance(c.get("id"), int) or not isinstance(c.get("name"), str):
            raise SourceError(f"{path}: categories[{k}] is not an object with an integer 'id' and a 'name'")
    ordered = sorted(cats, key=lambda c: c["id"])
    names = [c["name"] for c in ordered]
    for a, b in zip(ordered, ordered[1:]):
        if a["id"] == b["id"]:
            raise SourceError(f"{path}: category id {a['id']} is listed twice")
    if len(set(names)) != len(names):
        raise SourceError(f"{path}: category name {next(n for n in names if names.count(n) > 1)!r} is listed twice")
    return names, {c["id"]: i for i, c in enumerate(ordered)}


def _images(path: str, entries: list[Any], root: str) -> dict[Any, _Image]:
    """The image entries by id, their files joined to ``root`` (refused when they lead outside it)."""
    out: dict[Any, _Image] = {}
    names: set[str] = set()
    for k, e in enumerate(entries):
        where = f"{path}: images[{k}]"
        if not isinstance(e, dict) or not isinstance(e.get("file_name"), str) or not e["file_name"]:
            raise SourceError(f"{where} has no 'file_name'")
        if not all(isinstance(e.get(d), int) and not isinstance(e.get(d), bool) and e[d] > 0
                   for d in ("width", "height")):
            raise SourceError(f"{where} ({e['file_name']}) has no positive integer 'width' and 'height'")
        full = os.path.normpath(os.path.join(root, e["file_name"]))
        if not (full == root or full.startswith(root.rstrip(os.sep) + os.sep)):
            raise SourceError(f"{where}: file_name {e['file_name']!r} leads outside the image folder {root}")
        if e.get("id") in out or e["file_name"] in names:
            raise SourceError(f"{where}: image id {e.get('id')!r} or file_name {e['file_name']!r} is listed twice")
        names.add(e["file_name"])
        out[e.get("id")] = _Image(e, full, k)
    return out


def _check_annotation(where: str, a: Any, im: _Image | None, categories: dict[int, int]) -> None:
    """SourceError naming the annotation when packer cannot use it."""
    if not isinstance(a, dict):
        raise SourceError(f"{where} is not an object")
    if im is None:
        raise SourceError(f"{where}: image_id {a.get('image_id')!r} is not an image of the file")
    if a.get("category_id") not in categories:
        raise SourceError(f"{where}: category_id {a.get('category_id')!r} is not a category of the file")
    if a.get("iscrowd", 0) not in (0, 1) or isinstance(a.get("iscrowd"), bool):
        raise SourceError(f"{where}: iscrowd {a.get('iscrowd')!r} is not 0 or 1")
    box = a.get("bbox")
    if not isinstance(box, list) or len(box) != 4 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box) or min(box[2:]) < 0:
        raise SourceError(f"{where}: bbox {box!r} is not [x, y, width, height] (finite, width and height >= 0)")
    seg = a.get("segmentation")
    if isinstance(seg, list):
        for p in seg:
            if not isinstance(p, list) or len(p) < 6 or len(p) % 2 or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in p):
                raise SourceError(f"{where}: a polygon is not a list of x, y pairs (at least 3 points)")
    elif isinstance(seg, dict):
        h, w = im.entry["height"], im.entry["width"]
        if seg.get("size") != [h, w]:
            raise SourceError(f"{where}: RLE size {seg.get('size')!r} is not the image's [{h}, {w}]")
        try:
            counts = rle_counts(seg.get("counts", []))
            if sum(counts) != h * w or min(counts, default=0) < 0:
                raise ValueError(f"its runs cover {sum(counts)} pixels, the image {h * w}")
        except (TypeError, ValueError) as e:
            raise SourceError(f"{where}: the RLE cannot be decoded ({e})") from None


def read_coco(path: str | os.PathLike[str], images: str | os.PathLike[str], masks: str | None = None) -> CocoSource:
    """Parse a COCO detection file whose images lie in the folder ``images``. ``masks``: None,
    ``"semantic"`` (each pixel its annotation's category index + 1) or ``"instance"`` (its
    annotation's number + 1 in the image's order), 0 where none is. SourceError naming the file
    and the entry (``images[3]``, ``annotations[17]``) for anything that cannot be used: a missing
    field, an unknown image or category, a bbox that is not four finite numbers, a polygon or RLE
    that cannot be read, a file name leading outside ``images``, metadata that is not JSON (NaN).
    An image file of another size than its entry's, or above the pixel limit, is a skip naming
    the entry, found from the file's header in the worker, before any mask is drawn."""
    path = os.fspath(path)
    if masks is not None and masks not in MASK_KINDS:
        raise ValueError(f"masks must be one of {', '.join(MASK_KINDS)} or None, not {masks!r}")
    data = _load(path)
    classes, category_index = _categories(path, data["categories"])
    by_id = _images(path, data["images"], os.path.abspath(os.fspath(images)))
    for k, a in enumerate(data.get("annotations", [])):
        im = by_id.get(a.get("image_id")) if isinstance(a, dict) else None
        _check_annotation(f"{path}: annotations[{k}]", a, im, category_index)
        im.anns.append(a)  # type: ignore[union-attr]  # checked above
    for im in by_id.values():
        try:
            encode_meta(_meta(im), "its metadata")
        except ValueError as e:
            raise SourceError(f"{path}: {im.where} ({im.entry['file_name']}): {e}") from None
    return CocoSource(path, classes, category_index, list(by_id.values()), masks)


#: How far (pixels) a box may reach past the image's border and be clipped to it: COCO's boxes
#: were rounded, and some end a fraction of a pixel outside their image.
BORDER_SLACK = 1.0


def _xyxy(bbox: Sequence[float], width: int, height: int) -> list[float]:
    """A COCO ``[x, y, width, height]`` box as ``[x0, y0, x1, y1]``, an edge less than
    :data:`BORDER_SLACK` outside the image moved onto its border (further out: left for the
    conversion to refuse, naming the box)."""
    x, y, w, h = bbox
    box = [x, y, x + w, y + h]
    for k, top in enumerate((width, height, width, height)):
        if -BORDER_SLACK < box[k] < 0:
            box[k] = 0.0
        elif top < box[k] < top + BORDER_SLACK:
            box[k] = float(top)
    return box


class _Ordered(Sequence[Any]):
    """``items`` in the order ``perm`` gives, made when asked for."""

    def __init__(self, items: Sequence[Any], perm: Sequence[int]) -> None:
        self.items, self.perm = items, perm

    def __len__(self) -> int:
        return len(self.perm)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return self.items[self.perm[i]]


def convert_coco(path: str | os.PathLike[str], dst: str | os.PathLike[str], fmt: str, options: Any = None, *,
                 images: str | os.PathLike[str], masks: str | None = None) -> Any:
    """Convert a COCO detection file (:func:`read_coco`) into a packed dataset of format ``fmt``
    at ``dst``; returns the ConvertReport. Samples are keyed by ``file_name`` and shuffled at write
    time with ``options.seed`` unless ``options.shuffle`` is off (then they keep the file's order)."""
    from ..pipeline.engine import ConvertOptions
    from ..pipeline.items import convert_items
    from ..pipeline.order import recorded_seed, write_order

    options = options if options is not None else ConvertOptions()
    source = read_coco(path, images, masks)
    perm = write_order(len(source), options)
    keys = source.keys
    return convert_items(_Ordered(source, perm), dst, fmt, options, source.classes, label_kind="multi",
                         keys=[keys[i] for i in perm],
                         source={"kind": "coco", "path": os.path.abspath(os.fspath(path)), "masks": masks},
                         shuffle_seed=recorded_seed(options), record_files=False)
