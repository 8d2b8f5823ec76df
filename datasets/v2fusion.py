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

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .crops import Crop, area_or_linear

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

    def __init__(self, step: Any, output: str, quick: bool | None = None, resize: str = "torchvision") -> None:
        import torch
        from torchvision.transforms.v2 import functional

        self.step, self.output, self._f = step, output, functional
        self.name = type(step).__name__
        self.size = tuple(int(v) for v in step.size)
        #: ``"opencv"``: a bilinear RandomResizedCrop resizes the image as ``crop=`` does (faster; close pixels).
        self.resize = resize
        #: With ``"opencv"``, a bilinear RandomResizedCrop's JPEG window at least twice the output on
        #: both sides is decoded at reduced scale first, as ``crop=RandomResizedCrop`` does by default.
        self.reduces = resize == "opencv" and self._bilinear_resized_crop()
        if self.name == "RandomResizedCrop":  # what the step's __init__ computes, as floats
            self._log_ratio = tuple(float(v) for v in torch.log(torch.tensor(step.ratio)))
        #: Draw with :func:`_quick_draw` (the step's own torch calls on fewer tensors), where it was
        #: checked here to give the step's windows and leave torch's generator as the step does.
        self.quick = _quick_draws_match(self) if quick is None else quick

    def __reduce__(self) -> tuple[Any, ...]:  # the functional module is imported again where it is unpickled
        return V2Crop, (self.step, self.output, self.quick, self.resize)

    def _bilinear_resized_crop(self) -> bool:
        """True for a RandomResizedCrop step that resizes bilinearly."""
        return self.name == "RandomResizedCrop" and \
            getattr(self.step.interpolation, "value", self.step.interpolation) == "bilinear"

    def reduction(self, window: tuple[int, int, int, int], height: int, width: int) -> tuple[int, tuple[int, int, int, int]]:
        """(scale, window) of a JPEG's decode: reduced as ``crop=RandomResizedCrop``'s where
        :attr:`reduces` (the window widened to the scale's grid), else scale 1, the window as drawn."""
        if not self.reduces:
            return 1, window
        from packer.images.imageproc import reduced_window

        return reduced_window(window, height, width, *self.size)

    def window(self, height: int, width: int) -> tuple[int, int, int, int]:
        th, tw = self.size
        if self.name == "CenterCrop":  # no draw; an axis shorter than the crop is kept whole (padded in finish)
            top, h = (int(round((height - th) / 2.0)), th) if th <= height else (0, height)
            left, w = (int(round((width - tw) / 2.0)), tw) if tw <= width else (0, width)
            return top, left, h, w
        if self.quick and (self.name == "RandomResizedCrop" or (th <= height and tw <= width)):
            return _quick_draw(self, height, width)
        return self.step_window(height, width)

    def step_window(self, height: int, width: int) -> tuple[int, int, int, int]:
        """The window the step's own ``make_params`` draws for a ``height`` x ``width`` image."""
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
        if self.resize == "opencv" and self._bilinear_resized_crop():
            return _opencv_resized(pixels, self.size)
        if self.output == "pil":
            from PIL import Image

            return np.asarray(self._run(Image.fromarray(np.ascontiguousarray(pixels)), False))
        import torch

        if not (pixels.flags.writeable and pixels.flags.c_contiguous):
            # A window is a view of wider rows (or of a decoded cache, which torch cannot take):
            # torch resizes contiguous H x W x C rows about twice as fast, to the same pixels.
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


def _opencv_resized(pixels: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
    """A window resized to ``size`` as ``crop=RandomResizedCrop`` resizes it (INTER_AREA where
    it shrinks on both sides, else INTER_LINEAR)."""
    return area_or_linear(pixels, size[0], size[1])


def _quick_draw(crop: V2Crop, height: int, width: int) -> tuple[int, int, int, int]:
    """``crop.step_window(height, width)`` with the same torch generator calls, in the same
    order, made on two one-element tensors (a third of the time): ``torch.randint(0, n)`` is
    ``random_(0, n)`` on an int64 tensor, ``torch.empty(1).uniform_`` the same on a reused one."""
    import torch

    floats, ints = torch.empty(1), torch.empty(1, dtype=torch.int64)
    if crop.name == "RandomCrop":
        th, tw = crop.size
        top = int(ints.random_(0, height - th + 1)) if height > th else 0
        return top, int(ints.random_(0, width - tw + 1)) if width > tw else 0, th, tw
    scale, (low, high) = crop.step.scale, crop._log_ratio
    area = height * width
    for _ in range(10):
        target = area * floats.uniform_(scale[0], scale[1]).item()
        aspect = floats.uniform_(low, high).exp_().item()
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(ints.random_(0, height - h + 1)), int(ints.random_(0, width - w + 1)), h, w
    ratio = crop.step.ratio  # ten misses: the centred window within the ratio, drawing nothing
    if width / height < min(ratio):
        h, w = int(round(width / min(ratio))), width
    elif width / height > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def _quick_draws_match(crop: V2Crop) -> bool:
    """True when :func:`_quick_draw` gives the step's windows for a range of image sizes (the
    ten-miss fallback included) and leaves torch's generator where the step leaves it; drawn
    under a forked generator, so the caller's stays as it was."""
    import torch

    if crop.name == "CenterCrop":
        return False
    th, tw = crop.size
    sizes = [(th + 3 * k, tw + 5 * k) for k in range(12)] + [(th + 1, 40 * tw), (40 * th, tw + 2), (th, tw)]
    with torch.random.fork_rng(devices=[]):
        for seed, (h, w) in enumerate(sizes * 2):
            drawn = []
            for draw in (crop.step_window, lambda h, w: _quick_draw(crop, h, w)):
                torch.manual_seed(seed)
                drawn.append((draw(h, w), torch.rand(2).tolist()))
            if drawn[0] != drawn[1]:
                return False
    return True


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


def fuse_v2_crop(ds: Any, mode: bool | str = True) -> Fusion | None:
    """Fuse the first crop of ``ds``'s v2 pipeline into its decode: set ``ds.crop`` to a
    :class:`V2Crop` and ``ds.transform`` (or ``ds.transforms``) to the steps after it; return
    what was done, or None (nothing changed) where the pipeline or the samples do not allow it.
    ``mode``: True (torchvision's kernels), ``"opencv"`` (a bilinear resize by OpenCV) or False."""
    if mode not in (True, False, "opencv"):
        raise ValueError(f"fuse_crop must be True, False or 'opencv', not {mode!r}")
    if not mode or ds.crop is not None:
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
    crop = V2Crop(steps[0], ds.output, resize="opencv" if mode == "opencv" else "torchvision")
    ds.crop = crop
    setattr(ds, source, rest)
    return Fusion(source, pipeline, crop, rest)
