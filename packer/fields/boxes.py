"""Boxes ``[x0, y0, x1, y1]`` with optional class labels: given in the source image's pixels,
checked to lie in it and scaled exactly as the image is; kept in the sample table, not as a
payload; moved with a reader's crop (shifted, clipped, scaled; a box left with no area dropped
with its label, as torchvision's ``SanitizeBoundingBoxes`` drops it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ImageError
from ..images.imageproc import Window
from .base import FieldKind, tv_tensor_types

__all__ = ["BOXES", "BoxesKind", "scale_boxes", "box_labels", "move_boxes"]


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


def box_labels(labels: Sequence[int] | None, n: int) -> tuple[int, ...] | None:
    """``labels`` (class indices) checked for ``n`` boxes, or None; ImageError otherwise."""
    if labels is None:
        return None
    out = tuple(int(v) for v in labels)
    if len(out) != n:
        raise ImageError(f"{len(out)} box labels for {n} boxes")
    if any(v < 0 for v in out):
        raise ImageError(f"box label {min(out)} is negative")
    return out


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


class BoxesKind(FieldKind):
    """The boxes and their labels (:mod:`packer.fields.boxes`); readers return ``boxes`` and ``box_labels``."""

    name = field_name = "boxes"
    stored = False
    #: The readers' name of the boxes' labels, returned after the boxes.
    labels_output = "box_labels"

    def outputs(self, name: str) -> tuple[str, ...]:
        return (name, self.labels_output)

    def per_sample(self, output: str) -> bool:
        return True

    def declare(self, name: str, **facts: Any) -> dict[str, Any]:
        return {"name": name, "kind": self.name, "labels": bool(facts.get("labels"))}

    def output(self, name: str, value: np.ndarray, output: str, canvas: tuple[int, int]) -> Any:
        if output != "tv_tensors" or name == self.labels_output:
            return super().output(name, value, output, canvas)
        import torch

        return tv_tensor_types().BoundingBoxes(torch.from_numpy(value), format="XYXY", canvas_size=canvas)


BOXES = BoxesKind()
