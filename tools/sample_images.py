"""Small labelled image folders for tests and fault-injection tools: deterministic synthetic
pictures (smooth gradients with edges, so JPEG behaves as on photos) written as real files."""

from __future__ import annotations

import os

import cv2
import numpy as np

__all__ = ["draw", "write_image", "make_folder"]


def draw(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth RGB picture with some structure (compresses like a photo, not like noise)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    a, b, c = rng.uniform(0.02, 0.2, 3)
    img = np.stack([
        127 + 120 * np.sin(a * x + b * y),
        127 + 120 * np.cos(b * x - c * y),
        127 + 120 * np.sin(c * (x + y)),
    ], axis=-1)
    return np.clip(img + rng.normal(0, 4, img.shape), 0, 255).astype(np.uint8)


def write_image(path: str, rgb: np.ndarray, quality: int = 95) -> None:
    """Write an RGB array; the extension picks the codec."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ext = os.path.splitext(path)[1].lower()
    params = [cv2.IMWRITE_JPEG_QUALITY, quality] if ext in (".jpg", ".jpeg") else []
    bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR) if rgb.ndim == 3 and rgb.shape[2] == 3 else rgb
    ok, buf = cv2.imencode(ext if ext != ".jpeg" else ".jpg", bgr, params)
    assert ok
    with open(path, "wb") as f:
        f.write(buf.tobytes())


def make_folder(root: str, classes: dict[str, list[tuple[str, int, int]]], seed: int = 0) -> dict[str, np.ndarray]:
    """Write ``root/<class>/<name>`` images of the given (name, h, w); return relpath -> RGB pixels."""
    rng = np.random.default_rng(seed)
    out = {}
    for cls, files in classes.items():
        for name, h, w in files:
            rgb = draw(rng, h, w)
            rel = os.path.join(cls, name)
            write_image(os.path.join(root, rel), rgb)
            out[rel] = rgb
    return out
