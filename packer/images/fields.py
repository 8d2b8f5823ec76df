"""The fields a sample carries besides its image: a mask (a label map), extra images and boxes,
processed with the image so that they stay aligned with it.

A mask is read unchanged (one channel, 8 or 16 bits; a palette PNG's indices are its values),
resized with the image's resize only by nearest neighbour and stored as a grayscale PNG. Extra
images are processed like the image, to the image's stored size. Boxes, ``[x0, y0, x1, y1]`` in
the source image's pixels, are checked to lie in it and scaled exactly as the image is.
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from ..errors import ImageError
from .imageheader import describe_non_image, sniff
from .imageproc import (
    ProcessedField,
    ProcessedImage,
    ProcessOptions,
    above_pixel_limit,
    process_image,
)

__all__ = ["FieldSources", "RESERVED_NAMES", "check_field_name", "read_mask", "encode_mask", "process_sample",
           "scale_boxes", "mask_shape"]

#: Names a sample's extra image cannot take: the sample's own parts and what readers return.
RESERVED_NAMES = frozenset({"image", "label", "key", "meta", "index", "mask", "boxes", "box_labels", "json", "cls"})
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


def check_field_name(name: str) -> str:
    """``name`` if it can name an extra image (a letter, then letters, digits or ``_``, at most
    32, not a reserved name: it becomes a tar member's extension and a feature name); ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"extra image name {name!r}: use a letter then letters, digits or '_' (at most 32)")
    if name in RESERVED_NAMES:
        raise ValueError(f"extra image name {name!r} is reserved ({', '.join(sorted(RESERVED_NAMES))})")
    return name


@dataclass(frozen=True)
class FieldSources:
    """What one sample has besides its image, as read from its source: the mask file's bytes,
    extra images' bytes by name, boxes in source pixels and their labels (class indices)."""

    mask: bytes | None = None
    images: tuple[tuple[str, bytes], ...] = ()
    boxes: Sequence[Sequence[float]] | None = None
    box_labels: Sequence[int] | None = None

    def __bool__(self) -> bool:
        return self.mask is not None or bool(self.images) or self.boxes is not None


def _gray_palette(data: bytes) -> bytes:
    """A palette PNG with its palette replaced by a gray ramp (entry i = (i, i, i)), so that a
    grayscale decode returns each pixel's palette index."""
    out, at = [data[:8]], 8
    while at + 12 <= len(data):
        (length,) = struct.unpack_from(">I", data, at)
        kind = data[at + 4:at + 8]
        end = at + 12 + length
        if kind == b"PLTE":
            ramp = bytes(v for i in range(length // 3) for v in (i, i, i))
            out.append(struct.pack(">I", len(ramp)) + b"PLTE" + ramp + struct.pack(">I", zlib.crc32(b"PLTE" + ramp)))
        else:
            out.append(data[at:end])
        at = end
    return b"".join(out)


def read_mask(data: bytes) -> np.ndarray:
    """A mask file's label map, H x W uint8 or uint16, values unchanged: a palette PNG's
    indices, a grayscale image's values, or a colour image whose three channels are equal.
    ImageError for anything else (a colour mask, two channels, not an image)."""
    info = sniff(data)
    if info is None:
        raise ImageError(describe_non_image(data))
    if info.format == "png" and data[25:26] == b"\x03":
        m = cv2.imdecode(np.frombuffer(_gray_palette(data), np.uint8), cv2.IMREAD_GRAYSCALE)
    else:
        m = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if m is None or m.size == 0:
        raise ImageError(f"OpenCV could not decode this {info.format} mask (corrupt or truncated)")
    if m.dtype not in (np.uint8, np.uint16):
        raise ImageError(f"mask of {m.dtype} values: a label map is 8- or 16-bit")
    if m.ndim == 3:
        if m.shape[2] == 3 and (m[:, :, 0] == m[:, :, 1]).all() and (m[:, :, 0] == m[:, :, 2]).all():
            return np.ascontiguousarray(m[:, :, 0])
        raise ImageError(f"mask has {m.shape[2]} channels of different values: give a label map (one channel, "
                         "or a palette PNG), not a colour image")
    return m


def encode_mask(mask: np.ndarray) -> bytes:
    """A label map as a grayscale PNG (8- or 16-bit, as the array), identical bytes for identical input."""
    ok, buf = cv2.imencode(".png", mask, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise ImageError("OpenCV could not encode the mask as PNG")
    return buf.tobytes()


def _source_size(data: bytes) -> tuple[int, int]:
    """The (width, height) a source image decodes to (EXIF orientation applied)."""
    info = sniff(data)
    if info is None:
        raise ImageError(describe_non_image(data))
    return (info.height, info.width) if info.orientation >= 5 else (info.width, info.height)


def scale_boxes(boxes: Any, source: tuple[int, int], stored: tuple[int, int]) -> np.ndarray:
    """Boxes ``[x0, y0, x1, y1]`` in a ``source`` (width, height) image, checked (finite, ordered,
    inside it) and scaled to the ``stored`` size: N x 4 float32. ImageError naming the box."""
    try:
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4) if len(boxes) else np.zeros((0, 4))
    except (TypeError, ValueError) as e:
        raise ImageError(f"boxes must be a list of [x0, y0, x1, y1]: {e}") from None
    sw, sh = source
    for i, (x0, y0, x1, y1) in enumerate(b):
        if not all(math.isfinite(v) for v in (x0, y0, x1, y1)):
            raise ImageError(f"box {i} {[x0, y0, x1, y1]} is not finite")
        if not (0 <= x0 <= x1 <= sw and 0 <= y0 <= y1 <= sh):
            raise ImageError(f"box {i} [{x0:g}, {y0:g}, {x1:g}, {y1:g}] is not an ordered box inside the "
                             f"{sw}x{sh} image")
    scale = np.array([stored[0] / sw, stored[1] / sh] * 2)
    return (b * scale).astype(np.float32)


def _box_labels(labels: Sequence[int] | None, n: int) -> tuple[int, ...] | None:
    if labels is None:
        return None
    out = tuple(int(v) for v in labels)
    if len(out) != n:
        raise ImageError(f"{len(out)} box labels for {n} boxes")
    if any(v < 0 for v in out):
        raise ImageError(f"box label {min(out)} is negative")
    return out


def _mask_field(data: bytes, source: tuple[int, int], stored: tuple[int, int], max_pixels: int) -> ProcessedField:
    info = sniff(data)  # the header first: a few kB of PNG can decode to gigabytes
    if info is not None and info.pixels > max_pixels:
        raise ImageError(f"mask: {above_pixel_limit(info, max_pixels)}")
    if info is not None and (info.width, info.height) != source:
        raise ImageError(f"mask is {info.width}x{info.height} but the image is {source[0]}x{source[1]}")
    try:
        m = read_mask(data)
    except ImageError as e:
        raise ImageError(f"mask: {e}") from None
    if (m.shape[1], m.shape[0]) != source:
        raise ImageError(f"mask is {m.shape[1]}x{m.shape[0]} but the image is {source[0]}x{source[1]}")
    if (m.shape[1], m.shape[0]) != stored:
        m = cv2.resize(m, stored, interpolation=cv2.INTER_NEAREST)
    return ProcessedField("mask", "png", encode_mask(m), stored[1], stored[0], 1, 8 * m.itemsize)


def _image_field(name: str, data: bytes, opts: ProcessOptions, stored: tuple[int, int]) -> ProcessedField:
    try:
        p = process_image(data, opts, size=stored)
    except ImageError as e:
        raise ImageError(f"image {name!r}: {e}") from None
    return ProcessedField(name, p.codec, p.payload, p.height, p.width, 3, 8)


def process_sample(data: bytes, opts: ProcessOptions, sources: FieldSources | None = None) -> ProcessedImage:
    """The image processed as :func:`~packer.images.imageproc.process_image` does, with its mask,
    extra images and boxes made to match it. ImageError (a skip) naming the field at fault."""
    image = process_image(data, opts)
    if not sources:
        return image
    source, stored = _source_size(data), (image.width, image.height)
    fields = []
    if sources.mask is not None:
        fields.append(_mask_field(sources.mask, source, stored, opts.max_pixels))
    fields.extend(_image_field(name, b, opts, stored) for name, b in sources.images)
    boxes = labels = None
    if sources.boxes is not None:
        scaled = scale_boxes(sources.boxes, source, stored)
        boxes = tuple(tuple(float(v) for v in row) for row in scaled)
        labels = _box_labels(sources.box_labels, len(boxes))
    elif sources.box_labels is not None:
        raise ImageError("box labels without boxes")
    return dataclasses.replace(image, fields=tuple(fields), boxes=boxes, box_labels=labels)



def mask_shape(data: bytes | memoryview) -> tuple[int, int, int, int] | None:
    """(height, width, channels, bits per channel) of a stored mask from its PNG header (a
    palette PNG's indices are one channel), or None when ``data`` is not a PNG."""
    info = sniff(bytes(data[:64]))
    if info is None or info.format != "png":
        return None
    channels = 1 if data[25] == 3 else info.channels or 1
    return info.height, info.width, channels, info.bit_depth or 8
