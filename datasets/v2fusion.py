"""torchvision v2 crops fused into the decode (``fuse_crop=True``, the readers' default).

When a reader's ``transform`` (or, without one, its ``transforms``) is a ``v2.Compose`` whose
first step is a v2 ``RandomResizedCrop``, ``RandomCrop`` (no padding) or ``CenterCrop``, or is
that step alone, :func:`fuse_v2_crop` hands the step to the reader as its crop (a
:class:`V2Crop`) and leaves the rest of the pipeline as the transform. The window is drawn by the
step's own ``make_params`` (the same torch generator calls, in the same order), JPEGs are decoded
only in it, and the window's pixels go through the same torchvision kernels the step would run
(its resize, a ``CenterCrop``'s padding), so the result equals the unfused pipeline's where the
window decode gives a whole decode's pixels. Masks and boxes are cut, resized and clamped by
torchvision's own kernels too (boxes kept as v2 keeps them). :func:`fusable_reason` says why a
pipeline is run unfused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .crops import Crop

__all__ = ["V2Crop", "Fusion", "fuse_v2_crop", "fusable_reason", "FUSED_STEPS"]

#: The v2 steps fused into the decode (exactly these classes, not subclasses).
FUSED_STEPS = ("RandomResizedCrop", "RandomCrop", "CenterCrop")
_V2 = "torchvision.transforms.v2"


def _is_v2(obj: Any, name: str) -> bool:
    """True when ``obj``'s class is torchvision v2's ``name`` itself (torchvision is never imported here)."""
    cls = type(obj)
    return cls.__name__ == name and cls.__module__.startswith(_V2)


class V2Crop(Crop):
    """A torchvision v2 crop step run by the reader: its window drawn by the step, the window's
    pixels finished by the step's kernels for the reader's output (``"pil"`` or a tensor kind)."""

    def __init__(self, step: Any, output: str) -> None:
        from torchvision.transforms.v2 import functional

        self.step, self.output, self._f = step, output, functional
        self.name = type(step).__name__
        self.size = tuple(int(v) for v in step.size)

    def __reduce__(self) -> tuple[Any, ...]:  # the functional module is imported again where it is unpickled
        return V2Crop, (self.step, self.output)

    def window(self, height: int, width: int) -> tuple[int, int, int, int]:
        th, tw = self.size
        if self.name == "CenterCrop":  # no draw; an axis shorter than the crop is kept whole (padded in finish)
            top, h = (int(round((height - th) / 2.0)), th) if th <= height else (0, height)
            left, w = (int(round((width - tw) / 2.0)), tw) if tw <= width else (0, width)
            return top, left, h, w
        import torch

        stand_in = torch.empty((1, 1), dtype=torch.uint8).expand(height, width)  # query_size reads its shape
        p = self.step.make_params([stand_in])
        return int(p["top"]), int(p["left"]), int(p["height"]), int(p["width"])

    def _run(self, value: Any, mask: bool) -> Any:
        """``value`` (a window's pixels or mask as a tensor, tv_tensor or PIL image) through the
        step's kernel for what remains after the cut."""
        if self.name == "RandomResizedCrop":
            if mask:
                return self._f.resize(value, size=list(self.size))
            return self._f.resize(value, size=list(self.size), interpolation=self.step.interpolation,
                                  antialias=self.step.antialias)
        if self.name == "CenterCrop":
            return self._f.center_crop(value, output_size=list(self.size))
        return value

    def finish(self, pixels: np.ndarray) -> np.ndarray:
        if self.name == "RandomCrop" or pixels.shape[:2] == self.size:
            return pixels
        if self.output == "pil":
            from PIL import Image

            return np.asarray(self._run(Image.fromarray(np.ascontiguousarray(pixels)), False))
        import torch

        if not pixels.flags.writeable:  # a decoded cache's view: torch takes no read-only memory
            pixels = pixels.copy()
        return self._run(torch.from_numpy(pixels).permute(2, 0, 1), False).permute(1, 2, 0).numpy()

    def finish_mask(self, mask: np.ndarray) -> np.ndarray:
        if self.name == "RandomCrop" or mask.shape[:2] == self.size:
            return mask
        import torch
        from torchvision import tv_tensors

        return self._run(tv_tensors.Mask(torch.from_numpy(np.ascontiguousarray(mask))), True).numpy()

    def output_size(self, window: tuple[int, int, int, int]) -> tuple[int, int]:
        return self.size  # type: ignore[return-value]

    def move_boxes(self, boxes: np.ndarray, labels: np.ndarray,
                   window: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray]:
        """The boxes as the step moves them (shifted, clamped, scaled by torchvision's kernels;
        none dropped: v2 leaves that to ``SanitizeBoundingBoxes``), their labels unchanged."""
        import torch
        from torchvision import tv_tensors

        top, left, h, w = window
        th, tw = self.size
        if self.name == "CenterCrop":  # an axis kept whole is placed as v2 places the crop on it
            top = top if h == th else int(round((h - th) / 2.0))
            left = left if w == tw else int(round((w - tw) / 2.0))
            h, w = th, tw
        bbox = tv_tensors.BoundingBoxes(torch.from_numpy(np.ascontiguousarray(boxes, np.float32)), format="XYXY",
                                        canvas_size=(max(top, 0) + h, max(left, 0) + w))
        if self.name == "RandomResizedCrop":
            out = self._f.resized_crop(bbox, top=top, left=left, height=h, width=w, size=list(self.size))
        else:
            out = self._f.crop(bbox, top=top, left=left, height=h, width=w)
        return np.ascontiguousarray(out.as_subclass(torch.Tensor).numpy(), np.float32), labels

    def __repr__(self) -> str:
        return f"V2Crop({self.step!r})"


@dataclass(frozen=True)
class Fusion:
    """A fused pipeline: where it came from (``"transform"`` or ``"transforms"``), the user's
    pipeline as given, the crop the reader now makes, and what the reader still calls after it."""

    source: str
    pipeline: Any
    crop: V2Crop
    rest: Any


def _steps(pipeline: Any) -> list[Any] | None:
    """A v2 pipeline's steps (a ``Compose``'s list, or the step alone), or None."""
    if _is_v2(pipeline, "Compose"):
        return list(pipeline.transforms)
    return [pipeline] if type(pipeline).__module__.startswith(_V2) else None


def fusable_reason(pipeline: Any) -> str | None:
    """Why ``pipeline`` is not fused whatever the reader (None when its first step can be)."""
    steps = _steps(pipeline)
    if not steps:
        return "not a torchvision v2 transform or Compose"
    first = steps[0]
    if not any(_is_v2(first, name) for name in FUSED_STEPS):
        return f"its first step, {type(first).__name__}, is not one of {', '.join(FUSED_STEPS)}"
    if _is_v2(first, "RandomCrop") and (first.padding is not None or first.pad_if_needed):
        return "its RandomCrop pads"
    if not hasattr(first, "make_params"):
        return "this torchvision has no make_params"
    return None


def _sample_reason(ds: Any, source: str) -> str | None:
    """Why the reader's samples keep ``source``'s crop out of the decode (None when they do not)."""
    if ds.output not in ("tensor", "pil", "tv_tensors"):
        return f"output={ds.output!r}"
    if "image" not in ds.fields:
        return "no image in fields"
    if ds._own and (source == "transform" or ds.output != "tv_tensors"):
        # transform sees the image alone; transforms over tensors or PIL images would not cut them all
        return f"{source} with {', '.join(ds._own)} and output={ds.output!r}"
    before = ds.fields[:ds.fields.index("image")]
    if source == "transforms" and ds.output == "tensor" and "label" in before and ds.label_kind == "multi":
        return "a multi-hot label tensor before the image"  # v2 would crop the first plain tensor
    return None


def fuse_v2_crop(ds: Any) -> Fusion | None:
    """Fuse the first crop of ``ds``'s v2 pipeline into its decode: set ``ds.crop`` to a
    :class:`V2Crop` and ``ds.transform`` (or ``ds.transforms``) to the steps after it; return
    what was done, or None (nothing changed) where the pipeline or the samples do not allow it."""
    if ds.crop is not None:
        return None  # the reader's own crop comes first
    source = "transform" if ds.transform is not None else "transforms"
    pipeline = getattr(ds, source)
    if pipeline is None or fusable_reason(pipeline) is not None or _sample_reason(ds, source) is not None:
        return None
    steps = _steps(pipeline)
    assert steps is not None
    rest = None
    if len(steps) > 1:
        rest = type(pipeline)(steps[1:])
    crop = V2Crop(steps[0], ds.output)
    ds.crop = crop
    setattr(ds, source, rest)
    return Fusion(source, pipeline, crop, rest)
