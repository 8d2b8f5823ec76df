"""The mask: a label map read unchanged (one channel, 8 or 16 bits; a palette PNG's indices are
its values), resized with the image only by nearest neighbour, stored as a grayscale PNG."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import cv2
import numpy as np

from ..errors import CorruptDataError, ImageError
from ..images.imageheader import describe_non_image, sniff
from ..images.imageproc import ProcessedField, ProcessOptions, above_pixel_limit
from .base import FieldKind, Reading, tv_tensor_types

__all__ = ["MASK", "MASK_DTYPES", "MaskKind", "read_mask", "encode_mask", "mask_shape", "decode_mask", "cut_mask"]

#: The dtype a version 4 manifest declares for masks whose widest stored PNG has these bits.
MASK_DTYPES = {8: "uint8", 16: "uint16"}


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


def mask_shape(data: bytes | memoryview) -> tuple[int, int, int, int] | None:
    """(height, width, channels, bits per channel) of a stored mask from its PNG header (a
    palette PNG's indices are one channel), or None when ``data`` is not a PNG."""
    info = sniff(bytes(data[:64]))
    if info is None or info.format != "png":
        return None
    channels = 1 if data[25] == 3 else info.channels or 1
    return info.height, info.width, channels, info.bit_depth or 8


def decode_mask(field: ProcessedField, path: str, sample: int, dtype: str | None = None) -> np.ndarray:
    """A stored mask's label map, H x W, values unchanged: as ``dtype`` (the manifest's declared
    ``uint8`` or ``uint16``), or as stored (8 or 16 bits) for None (a version 3 dataset).
    CorruptDataError when the payload is not a one-channel image of the size its header gives,
    or is wider than ``dtype``."""
    mask = cv2.imdecode(np.frombuffer(field.payload, np.uint8), cv2.IMREAD_UNCHANGED)
    if mask is None or mask.ndim != 2 or mask.shape != (field.height, field.width):
        got = "undecodable" if mask is None else f"shaped {mask.shape}"
        raise CorruptDataError(f"mask {field.name!r} is {got}, not a one-channel {field.height}x{field.width} "
                               f"image", path=path, sample=sample)
    if dtype is None or mask.dtype == dtype:
        return mask
    if mask.itemsize > np.dtype(dtype).itemsize:
        raise CorruptDataError(f"mask {field.name!r} is stored as {mask.dtype}, wider than the manifest's "
                               f"{dtype}", path=path, sample=sample)
    return mask.astype(dtype)


def cut_mask(mask: np.ndarray, crop: Any, window: tuple[int, int, int, int] | None) -> np.ndarray:
    """A mask cut to the crop's window and finished as the crop finishes masks."""
    if crop is None or window is None:
        return mask
    top, left, h, w = window
    return np.ascontiguousarray(crop.finish_mask(mask[top:top + h, left:left + w]))


class MaskKind(FieldKind):
    """The mask (:mod:`packer.fields.mask`)."""

    name = field_name = "mask"
    channels, codec, dtyped = 1, "png", True

    def check(self, entry: dict[str, Any], dtyped: bool) -> None:
        if dtyped and entry.get("dtype") not in MASK_DTYPES.values():
            raise ValueError(f"the mask field's dtype is {entry.get('dtype')!r}, not one of "
                             f"{', '.join(MASK_DTYPES.values())}")

    def describe(self, entry: dict[str, Any]) -> str:
        return f"mask, {entry['dtype']}" if "dtype" in entry else "mask, uint8 or uint16 as each is stored"

    def shape(self, payload: bytes | memoryview) -> tuple[int, int, int, int] | None:
        return mask_shape(payload)

    def process(self, name: str, data: bytes, source: tuple[int, int], stored: tuple[int, int],
                opts: ProcessOptions) -> ProcessedField:
        info = sniff(data)  # the header first: a few kB of PNG can decode to gigabytes
        if info is not None and info.pixels > opts.max_pixels:
            raise ImageError(f"mask: {above_pixel_limit(info, opts.max_pixels)}")
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

    def verify(self, f: ProcessedField, size: tuple[int, int], where: dict[str, Any]) -> None:
        if (f.height, f.width) != size or f.channels != 1 or f.depth not in (8, 16):
            raise CorruptDataError(f"field {f.name!r} is {f.width}x{f.height}, {f.channels} channels of {f.depth} "
                                   f"bits; the image is {size[1]}x{size[0]} and a mask has 1", **where)
        png = f.codec == "png" and len(f.payload) > 0
        a = cv2.imdecode(np.frombuffer(f.payload, np.uint8), cv2.IMREAD_UNCHANGED) if png else None
        if a is None or a.shape != size or a.dtype != (np.uint16 if f.depth == 16 else np.uint8):
            got = "not decodable" if a is None else f"{a.dtype} {a.shape}"
            raise CorruptDataError(f"field {f.name!r} ({f.codec}) decodes to {got}, its header says "
                                   f"{f.width}x{f.height}", **where)

    def load(self, f: ProcessedField, at: Reading) -> np.ndarray:
        return cut_mask(decode_mask(f, at.path, at.sample, at.entry.get("dtype")), at.crop, at.window)

    def output(self, name: str, value: np.ndarray, output: str, canvas: tuple[int, int]) -> Any:
        if output == "pil":
            from PIL import Image

            return Image.fromarray(value)
        if output == "tv_tensors":
            import torch

            return tv_tensor_types().Mask(torch.from_numpy(value))
        return super().output(name, value, output, canvas)


MASK = MaskKind()
