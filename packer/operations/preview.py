"""``packer preview DST --out grid.png``: a contact sheet of seeded samples with their class names,
to see at a glance that labels and orientation are right."""

from __future__ import annotations

import math
import os
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

__all__ = ["Preview", "contact_sheet", "write_png", "caption_text"]

_FONT = cv2.FONT_HERSHEY_SIMPLEX
_BACKGROUND = (32, 32, 32)  # RGB around the images and under the captions
_CAPTION = 22  # pixels of caption strip under each tile


@dataclass
class Preview:
    """A contact sheet (RGB, H x W x 3 uint8) and what is on it: the sample indices, their labels as
    the captions show them, and the samples that could not be read (index, reason)."""

    image: np.ndarray
    indices: list[int]
    captions: list[str]
    unreadable: list[tuple[int, str]] = field(default_factory=list)


def caption_text(label: Any, classes: Sequence[str]) -> str:
    """A label as a caption: ``"dog (3)"`` for a class number, names joined by ``+`` for a list of
    classes, the value for a number that is no class. Letters outside ASCII (which OpenCV's fonts
    lack) lose their accents (``ému`` -> ``emu``); others become ``?``."""
    if hasattr(label, "tolist"):  # a tensor or an array
        label = label.tolist()
    if isinstance(label, (list, tuple)):
        text = "+".join(caption_text(x, classes) for x in label)
    elif isinstance(label, int) and not isinstance(label, bool):
        text = f"{classes[label]} ({label})" if 0 <= label < len(classes) else str(label)
    elif isinstance(label, float):
        text = f"{label:g}"
    else:
        text = str(label)
    return "".join("" if unicodedata.combining(c) else c if c.isascii() and c.isprintable() else "?"
                   for c in unicodedata.normalize("NFKD", text))


def _fit(rgb: np.ndarray, tile: int) -> np.ndarray:
    """``rgb`` shrunk or enlarged to fit a ``tile`` x ``tile`` square, centred on the background."""
    h, w = rgb.shape[:2]
    scale = tile / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    small = cv2.resize(rgb, (nw, nh), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    out = np.empty((tile, tile, 3), np.uint8)
    out[:] = _BACKGROUND
    top, left = (tile - nh) // 2, (tile - nw) // 2
    out[top : top + nh, left : left + nw] = small
    return out


def _put_caption(strip: np.ndarray, text: str) -> None:
    """Draw ``text`` into the caption strip, shortened with ``..`` to fit its width."""
    width = strip.shape[1] - 6
    scale = 0.45
    shown = text
    while shown and cv2.getTextSize(shown, _FONT, scale, 1)[0][0] > width:
        shown = shown[:-3] + ".." if len(shown) > 3 else shown[:-1]
    cv2.putText(strip, shown, (3, strip.shape[0] - 7), _FONT, scale, (255, 255, 255), 1, cv2.LINE_AA)


def contact_sheet(ds: Any, n: int = 16, seed: int = 0, tile: int = 160) -> Preview:
    """Read ``n`` samples of the map-style dataset ``ds`` (opened with ``output="numpy"``), chosen
    by ``seed`` without repeats, and lay them out in a near-square grid of ``tile``-pixel squares,
    each with its caption (:func:`caption_text`; a multi-label sample's classes joined by ``+``)
    underneath. A sample that cannot be read is a dark
    tile captioned ``unreadable`` and listed in :attr:`Preview.unreadable`."""
    from ..errors import PackerError

    if n < 1 or tile < 16:
        raise ValueError(f"a preview needs n >= 1 and tile >= 16 (got n={n}, tile={tile})")
    total = len(ds)
    if total == 0:
        raise ValueError("the dataset holds no samples")
    indices = sorted(np.random.default_rng(seed).choice(total, size=min(n, total), replace=False).tolist())
    cols = math.ceil(math.sqrt(len(indices)))
    rows = math.ceil(len(indices) / cols)
    gap = 4
    sheet = np.empty((rows * (tile + _CAPTION + gap) + gap, cols * (tile + gap) + gap, 3), np.uint8)
    sheet[:] = (0, 0, 0)
    captions: list[str] = []
    unreadable: list[tuple[int, str]] = []
    classes = list(getattr(ds, "classes", []))
    multi = getattr(ds, "label_kind", "class") == "multi"  # labels are multi-hot vectors: show the names
    for k, i in enumerate(indices):
        try:
            image, label = ds[i][:2]
            if multi:
                label = [j for j, v in enumerate(np.asarray(label).ravel().tolist()) if v]
            picture = _fit(np.asarray(image), tile)
            text = f"#{i}: {caption_text(label, classes)}"
        except (PackerError, OSError, ValueError) as e:
            unreadable.append((i, str(e)))
            picture = np.full((tile, tile, 3), _BACKGROUND, np.uint8)
            text = f"#{i}: unreadable"
        r, c = divmod(k, cols)
        top, left = gap + r * (tile + _CAPTION + gap), gap + c * (tile + gap)
        sheet[top : top + tile, left : left + tile] = picture
        strip = sheet[top + tile : top + tile + _CAPTION, left : left + tile]
        strip[:] = _BACKGROUND
        _put_caption(strip, text)
        captions.append(text)
    return Preview(sheet, indices, captions, unreadable)


def write_png(path: str, rgb: np.ndarray) -> None:
    """Write an RGB array as a PNG file; OSError naming ``path`` when it cannot be written."""
    ok, buf = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    if not ok:
        raise OSError(f"cannot encode the image for {path}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OSError(f"cannot write {path}: folder {folder} does not exist")
    with open(path, "wb") as f:
        f.write(buf.tobytes())
