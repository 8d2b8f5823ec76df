"""``python -m packer demo``: the main job end to end on a sample made on the spot.

Draws a small labelled image folder (each class a different shape, so labels mean something),
converts it to LMDB with the default pipeline, reads it back through a multi-worker DataLoader and
prints what happened and how fast. Needs no data and no network.
"""

from __future__ import annotations

import os
import tempfile
import time

import cv2
import numpy as np

from ..wording import plural

__all__ = ["make_sample_folder", "run_demo"]

_SHAPES = ("circle", "square", "triangle", "cross", "ring", "bars", "dots", "diamond")


def _draw(shape: str, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A BGR picture of ``shape`` over a random gradient background."""
    top, bottom = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    t = np.linspace(0.0, 1.0, height)[:, None, None]
    img = np.ascontiguousarray(np.broadcast_to(top * (1 - t) + bottom * t, (height, width, 3)).astype(np.uint8))
    color = tuple(int(c) for c in rng.integers(0, 256, 3))
    cx, cy = int(rng.integers(width // 3, 2 * width // 3)), int(rng.integers(height // 3, 2 * height // 3))
    r = int(min(height, width) * rng.uniform(0.15, 0.3))
    if shape == "circle":
        cv2.circle(img, (cx, cy), r, color, -1, cv2.LINE_AA)
    elif shape == "square":
        cv2.rectangle(img, (cx - r, cy - r), (cx + r, cy + r), color, -1)
    elif shape == "triangle":
        pts = np.array([[cx, cy - r], [cx - r, cy + r], [cx + r, cy + r]], np.int32)
        cv2.fillPoly(img, [pts], color, cv2.LINE_AA)
    elif shape == "cross":
        cv2.line(img, (cx - r, cy - r), (cx + r, cy + r), color, max(2, r // 4), cv2.LINE_AA)
        cv2.line(img, (cx - r, cy + r), (cx + r, cy - r), color, max(2, r // 4), cv2.LINE_AA)
    elif shape == "ring":
        cv2.circle(img, (cx, cy), r, color, max(2, r // 5), cv2.LINE_AA)
    elif shape == "bars":
        for k in range(-2, 3):
            x = cx + k * r // 2
            cv2.rectangle(img, (x - r // 8, cy - r), (x + r // 8, cy + r), color, -1)
    elif shape == "dots":
        for _ in range(12):
            p = (int(rng.integers(0, width)), int(rng.integers(0, height)))
            cv2.circle(img, p, max(2, r // 4), color, -1, cv2.LINE_AA)
    else:  # diamond
        pts = np.array([[cx, cy - r], [cx + r, cy], [cx, cy + r], [cx - r, cy]], np.int32)
        cv2.fillPoly(img, [pts], color, cv2.LINE_AA)
    noise = rng.integers(-8, 9, img.shape, dtype=np.int16)
    return np.clip(img.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def make_sample_folder(root: str, classes: int = 8, per_class: int = 64, seed: int = 0) -> str:
    """Write ``root/<shape>/<shape>_NNNN.jpg`` (classes x per_class JPEGs of 240-480 px); return root."""
    if not 1 <= classes <= len(_SHAPES):
        raise ValueError(f"classes must be 1..{len(_SHAPES)}")
    rng = np.random.default_rng(seed)
    for shape in _SHAPES[:classes]:
        folder = os.path.join(root, shape)
        os.makedirs(folder, exist_ok=True)
        for i in range(per_class):
            h, w = (int(v) for v in rng.integers(240, 481, 2))
            img = _draw(shape, rng, h, w)
            cv2.imwrite(os.path.join(folder, f"{shape}_{i:04d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 92])
    return root


class _CenterCrop:
    """Center-crop a C x H x W tensor (picklable, so it works with spawn workers)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, x):  # noqa: ANN001, ANN204
        h, w = x.shape[-2:]
        top, left = (h - self.size) // 2, (w - self.size) // 2
        return x[..., top : top + self.size, left : left + self.size]


def run_demo(workdir: str | None = None, classes: int = 8, per_class: int = 64, workers: int = 2) -> int:
    """Run the demo and print a short report; returns a process exit status."""
    import torch
    from torch.utils.data import DataLoader

    from packer.datasets import collate, open_dataset
    from packer.datasets.collation import slots_available
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.pipeline.engine import ConvertOptions, convert_imagefolder

    slots, why = slots_available()
    print("packer demo (`python -m packer doctor` says what this machine gives packer: torch, "
          "decoders, shared memory)")
    with tempfile.TemporaryDirectory(prefix="packer-demo-") as tmp:
        base = workdir or tmp
        src, dst = os.path.join(base, "sample"), os.path.join(base, "sample.lmdb")
        t0 = time.perf_counter()
        make_sample_folder(src, classes, per_class)
        n = classes * per_class
        print(f"1. made a sample ImageFolder: {plural(n, 'JPEG')} in {plural(classes, 'class')} at {src} "
              f"({time.perf_counter() - t0:.1f} s)")
        opts = ConvertOptions(
            processing=ProcessOptions(resize=parse_resize("shorter:128"), encoding=parse_encoding("jpeg:90")),
            workers=workers, overwrite=True,
        )
        report = convert_imagefolder(src, dst, "lmdb", opts)
        m = report.manifest
        size = sum(f.bytes for f in m.files)
        print(f"2. converted to LMDB (resize shorter:128, jpeg:90, {plural(workers, 'worker')}): "
              f"{plural(m.num_samples, 'image')} "
              f"in {report.seconds:.2f} s = {report.rate:.0f} img/s, {size / 1e6:.1f} MB at {dst}")
        ds = open_dataset(dst, transform=_CenterCrop(128))
        loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers, pin_memory=False,
                            generator=torch.Generator().manual_seed(0), collate_fn=collate)
        seen: list[int] = []
        t0 = time.perf_counter()
        for images, labels in loader:  # noqa: B007 - the last batch is described below
            seen.extend(labels.tolist())
        dt = time.perf_counter() - t0
        counts = np.bincount(seen, minlength=classes).tolist()
        batches = "in reused shared memory" if slots else f"by torch's default_collate: slots are off, {why}"
        print(f"3. read one epoch through DataLoader(batch_size=64, num_workers={workers}, "
              f"collate_fn=packer.datasets.collate; batches {batches}): {plural(len(seen), 'image')} "
              f"in {dt:.2f} s = {len(seen) / dt:.0f} img/s (includes worker start-up), "
              f"batches of {tuple(images.shape)} {images.dtype}")
        print(f"   images per class: {dict(zip(ds.classes, counts))}")
        ok = len(seen) == n and counts == [per_class] * classes
        print("4. every image came back exactly once with its label" if ok else "4. MISMATCH: see counts above")
        return 0 if ok else 1
