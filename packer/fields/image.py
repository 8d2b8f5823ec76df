"""An extra image: processed like the sample's image, to the image's stored size, and decoded
and cut like it by the readers."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptDataError, ImageError
from ..images.imageproc import ProcessedField, ProcessOptions, decode_payload, process_image
from .base import FieldKind, Reading, tv_tensor_types

__all__ = ["IMAGE", "ImageKind"]


class ImageKind(FieldKind):
    """Extra images, named by their source (:mod:`packer.fields.image`)."""

    name = "image"

    def process(self, name: str, data: bytes, source: tuple[int, int], stored: tuple[int, int],
                opts: ProcessOptions) -> ProcessedField:
        try:
            p = process_image(data, opts, size=stored)
        except ImageError as e:
            raise ImageError(f"image {name!r}: {e}") from None
        return ProcessedField(name, p.codec, p.payload, p.height, p.width, 3, 8)

    def verify(self, f: ProcessedField, size: tuple[int, int], where: dict[str, Any]) -> None:
        if (f.height, f.width) != size or f.channels != 3 or f.depth != 8:
            raise CorruptDataError(f"field {f.name!r} is {f.width}x{f.height}, {f.channels} channels of {f.depth} "
                                   f"bits; the image is {size[1]}x{size[0]} and a image has 3", **where)
        a = decode_payload(f.payload, f.codec, f.height, f.width, path=where["path"], sample=where["sample"])
        if a.shape[:2] != size:
            raise CorruptDataError(f"field {f.name!r} ({f.codec}) decodes to {a.dtype} {a.shape}, its header says "
                                   f"{f.width}x{f.height}", **where)

    def load(self, f: ProcessedField, at: Reading) -> np.ndarray:
        return at.decode_image(f.payload, f.codec, f.height, f.width)

    def output(self, name: str, value: np.ndarray, output: str, canvas: tuple[int, int]) -> Any:
        if output == "numpy":
            return value
        import torch

        chw = torch.from_numpy(value).permute(2, 0, 1)
        if output == "pil":
            from PIL import Image

            return Image.fromarray(value, mode="RGB")
        return tv_tensor_types().Image(chw) if output == "tv_tensors" else chw


IMAGE = ImageKind()
