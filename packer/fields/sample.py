"""A sample's fields processed with its image so that they stay aligned with it: each field by
its kind (:mod:`packer.fields`), the boxes scaled as the image is."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ImageError
from ..images.imageheader import describe_non_image, sniff
from ..images.imageproc import ProcessedImage, ProcessOptions, process_image
from . import KINDS, named
from .boxes import box_labels, scale_boxes
from .image import IMAGE
from .mask import MASK

__all__ = ["FieldSources", "RESERVED_NAMES", "check_field_name", "process_sample"]

#: Names a sample's extra image cannot take: the sample's own parts and what readers return.
RESERVED_NAMES = frozenset({"image", "label", "key", "meta", "index", "mask", "boxes", "box_labels", "json", "cls"})
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


def check_field_name(name: str) -> str:
    """``name`` if it can name an extra image (a letter, then letters, digits or ``_``, at most
    32, not a reserved name nor one a field kind fixes: it becomes a tar member's extension and a
    feature name); ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"extra image name {name!r}: use a letter then letters, digits or '_' (at most 32)")
    taken = RESERVED_NAMES | {k.field_name for k in KINDS.values() if k.field_name}
    if name in taken:
        raise ValueError(f"extra image name {name!r} is reserved ({', '.join(sorted(taken))})")
    return name


@dataclass(frozen=True)
class FieldSources:
    """What one sample has besides its image, as read from its source: the mask file's bytes,
    extra images' bytes by name, boxes in source pixels and their labels (class indices), and
    the files of fields of other kinds that fix their name (by that name)."""

    mask: bytes | None = None
    images: tuple[tuple[str, bytes], ...] = ()
    boxes: Sequence[Sequence[float]] | None = None
    box_labels: Sequence[int] | None = None
    payloads: tuple[tuple[str, bytes], ...] = ()

    def __bool__(self) -> bool:
        return self.mask is not None or bool(self.images) or self.boxes is not None or bool(self.payloads)


def _source_size(data: bytes) -> tuple[int, int]:
    """The (width, height) a source image decodes to (EXIF orientation applied)."""
    info = sniff(data)
    if info is None:
        raise ImageError(describe_non_image(data))
    return (info.height, info.width) if info.orientation >= 5 else (info.width, info.height)


def process_sample(data: bytes, opts: ProcessOptions, sources: FieldSources | None = None) -> ProcessedImage:
    """The image processed as :func:`~packer.images.imageproc.process_image` does, with its mask,
    extra images, other fields and boxes made to match it. ImageError (a skip) naming the field
    at fault."""
    image = process_image(data, opts)
    if not sources:
        return image
    source, stored = _source_size(data), (image.width, image.height)
    fields = []
    if sources.mask is not None:
        fields.append(MASK.process(MASK.name, sources.mask, source, stored, opts))
    fields.extend(IMAGE.process(name, b, source, stored, opts) for name, b in sources.images)
    fields.extend(named(name).process(name, b, source, stored, opts) for name, b in sources.payloads)
    boxes = labels = None
    if sources.boxes is not None:
        scaled = scale_boxes(sources.boxes, source, stored)
        boxes = tuple(tuple(float(v) for v in row) for row in scaled)
        labels = box_labels(sources.box_labels, len(boxes))
    elif sources.box_labels is not None:
        raise ImageError("box labels without boxes")
    return dataclasses.replace(image, fields=tuple(fields), boxes=boxes, box_labels=labels)
