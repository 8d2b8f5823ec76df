"""Fixtures: tiny image folders written on the spot, in the ImageFolder layout."""

from __future__ import annotations

import os
import sys

import cv2
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # spawn workers import helper modules from tests/


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


@pytest.fixture
def tiny_folder(tmp_path):
    """3 classes, 14 images: jpg/JPEG/png, portrait and landscape, a space and unicode in names."""
    root = str(tmp_path / "src")
    pixels = make_folder(root, {
        "cat": [("c0.jpg", 48, 64), ("c1.JPEG", 64, 48), ("c 2.png", 40, 40), ("c3.jpg", 50, 70), ("c4.png", 33, 47)],
        "dog": [("d0.jpg", 60, 80), ("d1.png", 80, 60), ("hund_\u00e9\u00e8.jpg", 45, 45), ("d3.jpeg", 64, 64)],
        "ému bird": [("e0.png", 32, 48), ("e1.jpg", 48, 32), ("e2.png", 70, 50), ("e3.jpg", 40, 60), ("e4.png", 36, 36)],
    })
    return root, pixels


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB between two uint8 arrays of the same shape."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture
def messy_folder(tmp_path):
    """Good images plus every kind of bad file that carries an image extension."""
    root = tmp_path / "messy"
    make_folder(str(root), {"a": [("ok1.jpg", 20, 20), ("ok2.png", 20, 20)], "b": [("ok3.jpg", 20, 20)]})
    good = (root / "a" / "ok1.jpg").read_bytes()
    (root / "a" / "zero.jpg").write_bytes(b"")
    (root / "a" / "text.png").write_text("not an image")
    (root / "b" / "trunc.jpg").write_bytes(good[: len(good) // 2])
    (root / "b" / "garbage.jpg").write_bytes(good[:200] + bytes(range(256)) * 4)
    return str(root)


def pack(src, dst, fmt, encode="jpeg:90", resize="none", writer=None, **options):
    """Convert ``src`` to ``fmt`` at ``dst``: image options as CLI strings, ``writer`` as a dict of
    WriterOptions fields, anything else as ConvertOptions fields (workers, seed, shuffle, ...)."""
    from packer.converters.base import WriterOptions
    from packer.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.ops.engine import ConvertOptions, convert_imagefolder

    opts = ConvertOptions(processing=ProcessOptions(resize=parse_resize(resize), encoding=parse_encoding(encode)),
                          writer=WriterOptions(**(writer or {})), **options)
    return convert_imagefolder(src, dst, fmt, opts)


def forge_manifest_sizes(path) -> None:
    """Record the files' current sizes and checksums in the manifest of the dataset at ``path``:
    a tampered file with a manifest forged to match, so a test reaches the checks behind the
    reader's size check at open."""
    from packer.manifest import file_sha256, read_manifest, write_manifest

    m = read_manifest(path)
    for f in m.files:
        full = os.path.join(str(path), f.name)
        f.bytes, f.sha256 = os.path.getsize(full), file_sha256(full)
    write_manifest(str(path), m)


def records_by_key(ds):
    """key -> (RGB array, label) for every sample, read through read_record (keys are in records)."""
    out = {}
    for i in range(len(ds)):
        rec = ds.read_record(i)
        out[rec.key] = (ds.decode(rec, i), rec.label)
    return out


def place_seed_by_spec(ordinal: int, first_key: str, first_payload: bytes, position: int) -> tuple[str, int]:
    """(file id, seed) as docs/FORMATS.md specifies them, written out here independently of packer."""
    import hashlib
    import struct

    import crc32c

    fid = hashlib.sha256(b"packer file" + struct.pack("<Q", ordinal) + first_key.encode() + b"\0"
                         + first_payload).hexdigest()[:16]
    return fid, crc32c.crc32c(b"PKPL" + bytes.fromhex(fid) + struct.pack("<Q", position))


def fixed_image() -> np.ndarray:
    """A fixed 8x8 RGB array, for exact-bytes tests of the on-disk layouts."""
    return (np.arange(8 * 8 * 3, dtype=np.uint16).reshape(8, 8, 3) * 5 % 256).astype(np.uint8)


@pytest.fixture
def one_image(tmp_path):
    """One 8x8 PNG made from fixed_image(), in class folder ``cls``; returns the source root."""
    os.makedirs(tmp_path / "src" / "cls")
    ok, buf = cv2.imencode(".png", cv2.cvtColor(fixed_image(), cv2.COLOR_RGB2BGR))
    assert ok
    (tmp_path / "src" / "cls" / "img.png").write_bytes(buf.tobytes())
    return str(tmp_path / "src")
