"""Helpers shared by the tests: converting a folder, comparing images, forging manifests."""

from __future__ import annotations

import os

import numpy as np

from tools.sample_images import draw, make_folder, write_image

__all__ = ["draw", "write_image", "make_folder", "need_optional", "import_optional", "psnr", "pack", "forge_manifest_sizes", "records_by_key", "place_seed_by_spec", "fixed_image",
           "tree"]


def need_optional(available: bool, reason: str) -> None:
    """Skip the calling test with ``reason`` when an optional part of packer (a built C module,
    torch's shared-memory batches, an importable extra) is absent here. Under
    ``PACKER_REQUIRE_OPTIONAL=1`` (set by CI, which installs everything) the absence is a failure
    instead, so no optional part can silently drop out of CI."""
    import pytest

    if available:
        return
    if os.environ.get("PACKER_REQUIRE_OPTIONAL") == "1":
        pytest.fail(f"PACKER_REQUIRE_OPTIONAL=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_optional(name: str, reason: str):  # noqa: ANN201 - a module
    """``pytest.importorskip`` for an optional dependency, through :func:`need_optional`: the
    module, or a skip with ``reason`` (a failure under ``PACKER_REQUIRE_OPTIONAL=1``)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        need_optional(False, f"{reason} ({exc})")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB between two uint8 arrays of the same shape."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def pack(src, dst, fmt, encode="jpeg:90", resize="none", writer=None, **options):
    """Convert ``src`` to ``fmt`` at ``dst``: image options as CLI strings, ``writer`` as a dict of
    WriterOptions fields, anything else as ConvertOptions fields (workers, seed, shuffle, ...)."""
    from packer.converters.base import WriterOptions
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.ops.engine import ConvertOptions, convert_imagefolder

    opts = ConvertOptions(processing=ProcessOptions(resize=parse_resize(resize), encoding=parse_encoding(encode)),
                          writer=WriterOptions(**(writer or {})), **options)
    return convert_imagefolder(src, dst, fmt, opts)


def forge_manifest_sizes(path) -> None:
    """Record the files' current sizes and checksums in the manifest of the dataset at ``path``:
    a tampered file with a manifest forged to match, so a test reaches the checks behind the
    reader's size check at open."""
    from packer.description.manifest import file_sha256, read_manifest, write_manifest

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


def tree(root) -> dict[str, bytes]:
    """relpath -> bytes of every file under root."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            p = os.path.join(folder, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out
