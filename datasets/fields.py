"""A sample's fields besides the image, as the readers return them: masks, extra images, boxes.

A mask is decoded from its stored PNG, values unchanged, as the dtype the manifest declares for
every mask of the dataset (H x W uint8 or uint16; a version 3 dataset's as each is stored); an
extra image like the image; boxes (N x 4 float32, ``[x0, y0, x1, y1]`` in stored pixels) and their labels (N int64, -1
where a box has none) come from the sample table. Nothing is decoded unless it is asked for. A
reader's crop cuts the image, the mask and the extra images with one window and moves the boxes
with it: shifted, clipped to the window, scaled with a resizing crop; a box left with no area is
dropped with its label (as torchvision's ``SanitizeBoundingBoxes`` drops it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
import torch

from packer.description.manifest import Manifest
from packer.errors import CorruptDataError
from packer.images.imageproc import ProcessedField, Window

from .crops import Crop

__all__ = ["dataset_fields", "check_fields", "decode_mask", "move_boxes", "field_output", "tv_tensor_types",
           "PER_SAMPLE", "FieldTuple", "apply_transforms"]

#: Fields with a count per sample (boxes), which ``collate`` returns as a list per batch.
PER_SAMPLE = frozenset({"boxes", "box_labels"})


class FieldTuple(tuple):
    """A reader's sample as a tuple that knows which of its positions hold a field with a count
    per sample (:data:`PER_SAMPLE`), so that ``collate`` lists them instead of stacking them."""

    per_sample: frozenset[int] = frozenset()

    @classmethod
    def of(cls, item: Sequence[Any], names: Sequence[str]) -> tuple[Any, ...]:
        """``item`` (the values of ``names``) as a FieldTuple where a name is in :data:`PER_SAMPLE`,
        else as the plain tuple."""
        listed = frozenset(k for k, name in enumerate(names) if name in PER_SAMPLE)
        if not listed:
            return tuple(item)
        out = cls(item)
        out.per_sample = listed
        return out


def dataset_fields(manifest: Manifest) -> tuple[str, ...]:
    """The names a dataset's samples hold besides the image and label, for ``fields=``: its mask,
    extra images and boxes as the manifest lists them, and ``box_labels`` after ``boxes``."""
    out: list[str] = []
    for name in manifest.field_names:
        out.append(name)
        if manifest.field_kind(name) == "boxes":
            out.append("box_labels")
    return tuple(out)


def check_fields(fields: Any, common: Sequence[str], manifest: Manifest, root: str) -> tuple[str, ...]:
    """``fields`` as a tuple, or ValueError naming what the dataset at ``root`` has."""
    own = dataset_fields(manifest)
    names = (*common, *own)
    if isinstance(fields, str) or not fields or any(f not in names for f in fields):
        has = f"its fields: {', '.join(own)}" if own else "no mask, extra images or boxes"
        raise ValueError(f"fields must be a non-empty sequence of {names}, not {fields!r} ({root} has {has})")
    return tuple(fields)


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


def cut_mask(mask: np.ndarray, crop: Crop | None, window: Window | None) -> np.ndarray:
    """A mask cut to the crop's window and finished as the crop finishes masks."""
    if crop is None or window is None:
        return mask
    top, left, h, w = window
    return np.ascontiguousarray(crop.finish_mask(mask[top:top + h, left:left + w]))


def move_boxes(boxes: np.ndarray, labels: np.ndarray, window: Window,
               size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Boxes (and their labels) in a crop's output of ``size`` (height, width) made of
    ``window``: shifted to the window, clipped to it, scaled to ``size``; boxes left with no
    area are dropped with their labels."""
    top, left, h, w = window
    moved = boxes - np.array([left, top, left, top], np.float32)
    np.clip(moved[:, 0::2], 0, w, out=moved[:, 0::2])
    np.clip(moved[:, 1::2], 0, h, out=moved[:, 1::2])
    keep = (moved[:, 2] > moved[:, 0]) & (moved[:, 3] > moved[:, 1])
    moved, labels = moved[keep], labels[keep]
    if size != (h, w):
        moved *= np.array([size[1] / w, size[0] / h] * 2, np.float32)
    return np.ascontiguousarray(moved, np.float32), labels


def apply_transforms(transforms: Any, item: tuple[Any, ...] | dict[str, Any], names: Sequence[str]) -> Any:
    """A sample through a whole-sample ``transforms``: a dict as its one argument (its result
    returned as it is), a tuple's values as its arguments (the result a tuple of ``names``)."""
    if transforms is None or isinstance(item, dict):
        return item if transforms is None else transforms(item)
    out = transforms(*item)
    return FieldTuple.of((out,) if len(item) == 1 else tuple(out), names)


def tv_tensor_types() -> Any:
    """torchvision's ``tv_tensors`` module, or ImportError saying what needs it."""
    try:
        from torchvision import tv_tensors
    except ImportError as e:
        raise ImportError(f"output='tv_tensors' needs torchvision (pip install torchvision): {e}") from None
    return tv_tensors


def field_output(kind: str, value: np.ndarray, output: str, canvas: tuple[int, int]) -> Any:
    """One decoded field as ``output`` returns it: ``kind`` ``"mask"`` (H x W label map),
    ``"image"`` (H x W x 3 RGB), ``"boxes"`` (N x 4) or ``"box_labels"`` (N); ``canvas`` the
    (height, width) the boxes lie in."""
    if output == "numpy":
        return value
    if kind == "image":
        chw = torch.from_numpy(value).permute(2, 0, 1)
        if output == "pil":
            from PIL import Image

            return Image.fromarray(value, mode="RGB")
        return tv_tensor_types().Image(chw) if output == "tv_tensors" else chw
    if kind == "mask" and output == "pil":
        from PIL import Image

        return Image.fromarray(value)
    tensor = torch.from_numpy(value)
    if output != "tv_tensors" or kind == "box_labels":
        return tensor
    tv = tv_tensor_types()
    if kind == "mask":
        return tv.Mask(tensor)
    return tv.BoundingBoxes(tensor, format="XYXY", canvas_size=canvas)
