"""Crops that a reader applies as it decodes (``open_dataset(path, crop=...)``).

A crop given to the reader instead of in ``transform`` lets it decode only the crop's window of
each JPEG (:func:`packer.images.imageproc.decode_payload_window`): libjpeg-turbo then skips the inverse
DCT, upsampling and colour conversion of what lies outside the window, and stops after its last
row. The pixels are those of a whole decode cut to the window. What it saves depends on the share
of the image the window leaves out (docs/benchmarks.md, section 7).

* ``crop=224`` or ``crop=(h, w)``: :class:`CenterCrop` (torchvision's ``CenterCrop`` window).
* :class:`RandomCrop`: a window of a fixed size at a random place (``RandomCrop``).
* :class:`RandomResizedCrop`: a window of random area and aspect ratio, resized to the output size
  (``RandomResizedCrop``'s window; the resize is OpenCV's, see the class). A JPEG window at least
  twice the output on both sides is decoded at 1/2, 1/4 or 1/8 scale first (``reduced_decode``).

The same window cuts the mask and extra images (:meth:`Crop.finish_mask` resizes masks by nearest
neighbour) and moves the boxes. The reader returns the cropped image to ``transform`` (which then no longer crops). Random windows
are drawn from Python's ``random`` module, which the DataLoader seeds in each worker from the
main process's torch seed (``torch.manual_seed`` makes them repeatable; packer's
``worker_init_fn`` seeds it too). An image smaller than a fixed-size crop raises ValueError naming
the sample.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import cv2
import numpy as np

from packer.fields.boxes import move_boxes
from packer.images.imageproc import Window, reduced_window, shrink_area

__all__ = ["Crop", "CenterCrop", "RandomCrop", "RandomResizedCrop", "as_crop"]


def _size(size: int | Sequence[int], what: str) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        pair = (int(size), int(size))
    elif isinstance(size, Sequence) and len(size) == 2 and all(isinstance(v, (int, np.integer)) for v in size):
        pair = (int(size[0]), int(size[1]))
    else:
        raise TypeError(f"{what}: size must be an int or (height, width), not {size!r}")
    if min(pair) <= 0:
        raise ValueError(f"{what}: size must be positive, not {size!r}")
    return pair


class Crop:
    """A crop the reader applies while decoding: :meth:`window` picks the rectangle of an image
    of a given size, :meth:`finish` turns the rectangle's pixels into the output."""

    #: Whether :meth:`reduction` may pick a reduced-scale decode (JPEG payloads only).
    reduces: bool = False

    def reduction(self, window: Window, height: int, width: int) -> tuple[int, Window]:
        """(scale, window) to decode a JPEG's ``window`` of a ``height`` x ``width`` image with:
        scale 1 and the window as it is, by default (see :class:`RandomResizedCrop`)."""
        return 1, window

    def window(self, height: int, width: int) -> Window:
        """(top, left, height, width) of the crop in a ``height`` x ``width`` image: integers
        (NumPy integers are taken as Python ints; anything else is a TypeError naming the sample)."""
        raise NotImplementedError

    def finish(self, pixels: np.ndarray) -> np.ndarray:
        """The output made of the window's H x W x 3 pixels (as they are, by default)."""
        return pixels

    def finish_mask(self, mask: np.ndarray) -> np.ndarray:
        """The output made of the window's H x W mask (a label map): as :meth:`finish`, but
        a resize is nearest-neighbour, so that no value appears that the mask does not hold."""
        return mask

    def output_size(self, window: Window) -> tuple[int, int]:
        """(height, width) of :meth:`finish`'s output for ``window`` (the window's, by default)."""
        return window[2], window[3]

    def move_boxes(self, boxes: np.ndarray, labels: np.ndarray, window: Window) -> tuple[np.ndarray, np.ndarray]:
        """N x 4 boxes and their labels in the output made of ``window``: shifted, clipped and
        scaled with it, a box left with no area dropped with its label (by default)."""
        return move_boxes(boxes, labels, window, self.output_size(window))


class _FixedSize(Crop):
    """A window of a fixed ``size`` (an int for a square, or (height, width))."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _size(size, type(self).__name__)

    def _room(self, height: int, width: int) -> tuple[int, int]:
        """How far the window can move down and right in a ``height`` x ``width`` image."""
        th, tw = self.size
        if th > height or tw > width:
            raise ValueError(f"the {height}x{width} image is smaller than the {th}x{tw} crop")
        return height - th, width - tw

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size})"


class CenterCrop(_FixedSize):
    """The centred ``size`` window, placed as torchvision's ``CenterCrop`` places it
    (``round((H - h) / 2)``)."""

    def window(self, height: int, width: int) -> Window:
        down, right = self._room(height, width)
        return int(round(down / 2.0)), int(round(right / 2.0)), *self.size


class RandomCrop(_FixedSize):
    """A ``size`` window at a uniformly random place (torchvision's ``RandomCrop`` without
    padding)."""

    def window(self, height: int, width: int) -> Window:
        down, right = self._room(height, width)
        return random.randint(0, down), random.randint(0, right), *self.size


class RandomResizedCrop(Crop):
    """A window of random area (``scale`` of the image's) and aspect ratio (``ratio``, drawn
    log-uniformly), resized to ``size``: the window torchvision's ``RandomResizedCrop`` draws
    (10 tries, then the largest centred window within ``ratio``).

    The resize is OpenCV's ``INTER_AREA`` where the window shrinks on both sides (an average over
    each output pixel's footprint, as packer's conversion resizes; its bytes computed by
    :func:`packer.images.imageproc.shrink_area`) and ``INTER_LINEAR`` otherwise; torchvision's
    bilinear resize with antialiasing gives close but not equal pixels.

    ``reduced_decode`` (on by default): a JPEG window at least twice ``size`` on both sides is
    decoded at the largest of 1/8, 1/4 and 1/2 of the image's scale that keeps it at least
    ``size`` (libjpeg-turbo's reduced-size inverse DCT, much less work), then shrunk by
    ``INTER_AREA``. The pixels are then those of the scaled decode, not of the whole decode
    resized (close: see docs/datasets.md); the window is widened to the scale's pixel grid (each
    edge moves outwards by less than the scale, in image pixels), and masks, extra images and
    boxes are cut by that same window, so they stay aligned. ``reduced_decode=False``: every
    window is decoded at full size. Other codecs, a decoded cache's pixels and windows under twice
    the output are never reduced.

    ``interpolation="antialias"``: torch's antialiased bilinear resize (``interpolate(...,
    mode="bilinear", antialias=True)``, the kernel torchvision's ``RandomResizedCrop`` runs on
    uint8 tensors): about the cost of packer's ``INTER_AREA`` where a window shrinks (half of
    OpenCV's, which runs where the C module is not built), more than ``INTER_LINEAR``'s where it
    is enlarged. ``interpolation="linear"``: OpenCV's ``INTER_LINEAR`` for every window, the
    cheapest, without antialiasing where the window shrinks (some aliasing).
    docs/benchmarks.md, section 14.
    Masks are resized by nearest neighbour in every case.
    """

    reduces = True

    def __init__(self, size: int | Sequence[int], scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), reduced_decode: bool = True,
                 interpolation: str = "area") -> None:
        self.size = _size(size, "RandomResizedCrop")
        if not (0 < scale[0] <= scale[1] <= 1) or not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"RandomResizedCrop: need 0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= "
                             f"ratio[1], not scale={scale}, ratio={ratio}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.reduces = bool(reduced_decode)
        if interpolation not in ("area", "antialias", "linear"):
            raise ValueError(f"RandomResizedCrop: interpolation must be 'area', 'antialias' or 'linear', "
                             f"not {interpolation!r}")
        self.interpolation = interpolation

    def reduction(self, window: Window, height: int, width: int) -> tuple[int, Window]:
        if not self.reduces:
            return 1, window
        return reduced_window(window, height, width, *self.size)

    def window(self, height: int, width: int) -> Window:
        area = height * width
        low, high = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            target = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(low, high))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return random.randint(0, height - h), random.randint(0, width - w), h, w
        aspect = width / height
        if aspect < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif aspect > self.ratio[1]:
            h, w = height, int(round(height * self.ratio[1]))
        else:
            h, w = height, width
        return (height - h) // 2, (width - w) // 2, h, w

    def finish(self, pixels: np.ndarray) -> np.ndarray:
        th, tw = self.size
        h, w = pixels.shape[:2]
        if (h, w) == (th, tw):
            return pixels
        if self.interpolation == "antialias":
            import torch
            from torch.nn.functional import interpolate

            planes = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1)[None]  # contiguous rows: faster
            out = interpolate(planes, size=(th, tw), mode="bilinear", antialias=True, align_corners=False)
            return out[0].permute(1, 2, 0).numpy()
        if self.interpolation == "area":
            return area_or_linear(pixels, th, tw)
        return cv2.resize(pixels, (tw, th), interpolation=cv2.INTER_LINEAR)

    def finish_mask(self, mask: np.ndarray) -> np.ndarray:
        th, tw = self.size
        if mask.shape[:2] == (th, tw):
            return mask
        return cv2.resize(mask, (tw, th), interpolation=cv2.INTER_NEAREST)

    def output_size(self, window: Window) -> tuple[int, int]:
        return self.size

    def __repr__(self) -> str:
        more = ("" if self.reduces else ", reduced_decode=False") + (
            "" if self.interpolation == "area" else f", interpolation={self.interpolation!r}")
        return f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}{more})"


def area_or_linear(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """``pixels`` resized to ``height`` x ``width`` as :class:`RandomResizedCrop` resizes by
    default: ``INTER_AREA`` where they shrink on both sides (:func:`shrink_area`), else
    OpenCV's ``INTER_LINEAR``."""
    if pixels.shape[0] >= height and pixels.shape[1] >= width:
        return shrink_area(pixels, width, height)
    return cv2.resize(pixels, (width, height), interpolation=cv2.INTER_LINEAR)


def as_crop(crop: Crop | int | Sequence[int] | None) -> Crop | None:
    """A reader's ``crop`` argument as a :class:`Crop`: an int or (height, width) is a
    :class:`CenterCrop`."""
    if crop is None or isinstance(crop, Crop):
        return crop
    return CenterCrop(crop)
