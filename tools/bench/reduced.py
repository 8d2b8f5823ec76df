"""Section 10 of docs/benchmarks.md, ``reduced``: what reduced-size JPEG decoding at conversion costs
in pixels and saves in time."""

from __future__ import annotations

import argparse
import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import cv2
import numpy as np

from tools.bench.common import REPO, Subcommand, header, jpeg_bytes, timed

PHOTOS = os.path.join(REPO, "..", "shared", "data", "photos")
FACTORS = (1, 2, 4, 8)
_FLAGS = {1: cv2.IMREAD_COLOR_BGR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
          8: cv2.IMREAD_REDUCED_COLOR_8}
RULES = (1.0, 1.5, 2.0, 3.0)
CAMERA_SIZES = ((4000, 3000), (3024, 4032), (3000, 2000), (2448, 3264), (4032, 3024), (2000, 3000),
                (3264, 2448), (3000, 4000))



def load_photos(folder: str) -> list[np.ndarray]:
    """The folder's photos as BGR arrays, in name order."""
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith((".jpg", ".jpeg", ".png")))
    return [cv2.imread(os.path.join(folder, n), cv2.IMREAD_COLOR_BGR) for n in names]


def native_sources(folder: str, min_short: int = 320) -> list[bytes]:
    """Each photo with a shorter side >= ``min_short`` at its own resolution: JPEGs as they are,
    others encoded once as JPEG q95."""
    out = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.lower().endswith((".jpg", ".jpeg")):
            with open(path, "rb") as f:
                data = f.read()
        elif name.lower().endswith(".png"):
            data = jpeg_bytes(cv2.imread(path, cv2.IMREAD_COLOR_BGR), 95)
        else:
            continue
        h, w = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_REDUCED_COLOR_8).shape[:2]
        if min(h, w) * 8 >= min_short:
            out.append(data)
    return out


def _mosaic(photos: list[np.ndarray], h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """An ``h`` x ``w`` canvas of native-resolution crops of ``photos``, flipped at random."""
    canvas = np.empty((h, w, 3), np.uint8)
    y = 0
    while y < h:
        rows = min(h - y, int(rng.integers(300, 900)))
        x = 0
        while x < w:
            col = min(w - x, int(rng.integers(300, 900)))
            p = photos[int(rng.integers(len(photos)))]
            if p.shape[0] < rows or p.shape[1] < col:  # a small photo: tile it
                p = np.tile(p, (-(-rows // p.shape[0]), -(-col // p.shape[1]), 1))
            py, px = int(rng.integers(p.shape[0] - rows + 1)), int(rng.integers(p.shape[1] - col + 1))
            tile = p[py:py + rows, px:px + col]
            canvas[y:y + rows, x:x + col] = tile[:, ::-1] if rng.random() < 0.5 else tile
            x += col
        y += rows
    return canvas


def camera_sources(photos: list[np.ndarray], count: int, seed: int = 0) -> list[bytes]:
    """``count`` camera-size mosaics (8-12 MP) of native-resolution crops, with sensor-like noise
    (sigma 2.5), as JPEG q92: every pixel has native detail, as a camera image has."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        w, h = CAMERA_SIZES[k % len(CAMERA_SIZES)]
        canvas = _mosaic(photos, h, w, rng)
        noisy = canvas.astype(np.float32) + rng.normal(0, 2.5, canvas.shape).astype(np.float32)
        out.append(jpeg_bytes(np.clip(noisy, 0, 255).astype(np.uint8), 92))
    return out


def upsampled_sources(photos: list[np.ndarray], count: int, seed: int = 0) -> list[bytes]:
    """``count`` crops of one photo each, enlarged to a shorter side of 2000-3000 px, JPEG q90."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        p = photos[k % len(photos)]
        s = rng.uniform(0.35, 1.0)
        ch, cw = max(16, int(p.shape[0] * s)), min(p.shape[1], max(16, int(p.shape[1] * s)))
        y, x = int(rng.integers(p.shape[0] - ch + 1)), int(rng.integers(p.shape[1] - cw + 1))
        short = int(rng.integers(2000, 3001))
        ar = rng.uniform(0.75, 1.333)
        h, w = (short, int(short * ar)) if k % 2 else (int(short * ar), short)
        out.append(jpeg_bytes(cv2.resize(p[y:y + ch, x:x + cw], (w, h), interpolation=cv2.INTER_LINEAR), 90))
    return out


def mad_mse(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Mean absolute difference (0-255 levels) and mean squared difference of two uint8 arrays."""
    d = a.astype(np.float64) - b.astype(np.float64)
    return float(np.mean(np.abs(d))), float(np.mean(d * d))


def psnr(mse: float) -> str:
    """PSNR in dB of a mean squared difference, or "exact"."""
    return "exact" if mse == 0 else f"{10 * np.log10(255.0**2 / mse):.1f}"


def decode_resize(data: bytes, factor: int, size: tuple[int, int]) -> np.ndarray:
    """packer's conversion path: decode at 1/``factor``, then INTER_AREA to ``size`` (w, h)."""
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), _FLAGS[factor])
    if (bgr.shape[1], bgr.shape[0]) == size:
        return bgr
    return cv2.resize(bgr, size, interpolation=cv2.INTER_AREA)


def pillow_thumbnail(data: bytes, size: tuple[int, int], reducing_gap: float | None) -> np.ndarray:
    """Pillow's ``thumbnail`` (BICUBIC; ``reducing_gap=2.0`` is its default, with draft mode) as BGR."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.thumbnail(size, reducing_gap=reducing_gap)
        return cv2.cvtColor(np.asarray(im.convert("RGB")), cv2.COLOR_RGB2BGR)


def best_time(f: Callable[[], np.ndarray], repeat: int) -> tuple[float, np.ndarray]:
    """The best of ``repeat`` calls' seconds, and the result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        seconds, out = timed(f)
        best = min(best, seconds)
    assert out is not None
    return best, out


@dataclass
class Cell:
    """Totals of one method over some images."""

    seconds: float = 0.0
    full_seconds: float = 0.0  # the full decode's time over the same images
    mad: list[float] = field(default_factory=list)
    mse: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)  # decoded shorter side / target shorter side

    def add(self, seconds: float, full: float, diff: tuple[float, float], ratio: float) -> None:
        """Count one image."""
        self.seconds += seconds
        self.full_seconds += full
        self.mad.append(diff[0])
        self.mse.append(diff[1])
        self.ratio.append(ratio)

    def row(self, label: str) -> str:
        """The table row of this method."""
        n = len(self.mad)
        return (f"| {label} | {n} | {min(self.ratio):.2f}-{max(self.ratio):.2f} | {n / self.seconds:.1f} | "
                f"{self.full_seconds / self.seconds:.2f} | {np.mean(self.mad):.2f} | {psnr(float(np.mean(self.mse)))} | "
                f"{psnr(max(self.mse))} |")


def reduced_measure(kind: str, sources: list[bytes], target: str, repeat: int) -> list[str]:
    """The table rows of one source kind and target."""
    from packer.images.imageproc import (
        REDUCED_DECODE_MARGIN,
        parse_resize,
        reduction_factor,
        target_size,
    )

    resize = parse_resize(target)
    factors = {f: Cell() for f in FACTORS}
    rules = {k: Cell() for k in RULES}
    pil, q90 = Cell(), []
    for data in sources:
        full_h, full_w = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_BGR).shape[:2]
        size = target_size(full_w, full_h, resize)
        short = min(size)
        runs = {f: best_time(lambda f=f, data=data, size=size: decode_resize(data, f, size), repeat)
                for f in FACTORS if full_w // f >= size[0] and full_h // f >= size[1]}
        t_pil, img_pil = best_time(lambda data=data, size=size: pillow_thumbnail(data, size, 2.0), repeat)
        t_fair, img_fair = best_time(lambda data=data, size=size: pillow_thumbnail(data, size, None), repeat)
        full_t, ref = runs[1]
        for f, (t, img) in runs.items():
            factors[f].add(t, full_t, mad_mse(img, ref), min(full_w, full_h) // f / short)
        for k in RULES:
            f = reduction_factor(full_w, full_h, size[0], size[1], k)
            rules[k].add(runs[f][0], full_t, mad_mse(runs[f][1], ref), min(full_w, full_h) // f / short)
        draft = max((f for f in FACTORS if full_w // f >= 2 * size[0] and full_h // f >= 2 * size[1]), default=1)
        pil.add(t_pil, t_fair, mad_mse(img_pil, img_fair), min(full_w, full_h) // draft / short)
        q90.append(mad_mse(cv2.imdecode(np.frombuffer(jpeg_bytes(ref, 90), np.uint8), cv2.IMREAD_COLOR_BGR), ref)[1])
    rows = [f"| **{kind}, {target}** (storing the reference as JPEG q90: {psnr(float(np.mean(q90)))} dB, "
            f"worst {psnr(max(q90))}) | | | | | | | |"]
    rows += [factors[f].row("full decode" if f == 1 else f"factor {f}") for f in FACTORS if factors[f].mad]
    rows += [rules[k].row(f"rule k={k:g}" + (" (packer)" if k == REDUCED_DECODE_MARGIN else " (old default)" if k == 1 else ""))
             for k in RULES]
    rows.append(pil.row("Pillow thumbnail, draft (vs its fair resize)"))
    return rows


def reduced(a: argparse.Namespace) -> int:
    """What reduced-size JPEG decoding at conversion costs in pixels and what it saves in time.

    libjpeg can decode a JPEG at 1/2, 1/4 or 1/8 of its size (OpenCV's ``IMREAD_REDUCED_COLOR_*``);
    packer then resizes the result to the target with INTER_AREA as usual. For each source kind
    and target this prints, per reduction factor (over the images where the reduced decode still
    covers the target) and per selection rule (the largest factor that keeps the decoded image
    >= k x the target on both sides, over every image), the decode+resize speed and the
    difference to a full decode + the same resize (mean absolute difference in 0-255 levels and
    PSNR), with Pillow's ``Image.thumbnail`` (draft mode, ``reducing_gap`` 2) as the anchor,
    measured against Pillow's own fair resize without draft. The last column is what storing the
    reference as JPEG q90 loses anyway, as a yardstick.

    Source kinds, made from the workplace's photos (``--photos``): ``native`` (every photo with a
    shorter side >= 320 px at its own resolution, PNGs encoded once as JPEG q95), ``camera``
    (8-12 MP mosaics of native-resolution crops with sensor-like noise, JPEG q92) and
    ``upsampled`` (a crop of one photo enlarged to a shorter side of 2000-3000 px, JPEG q90:
    smoother than any camera image, so it understates the cost). Times are the best of
    ``--repeat`` per image and method, methods interleaved image by image, in one process.
    """
    photos = load_photos(a.photos)
    kinds = {"native": native_sources(a.photos), "camera": camera_sources(photos, a.images),
             "upsampled": upsampled_sources(photos, a.images)}
    print(f"OpenCV {cv2.__version__}; best of {a.repeat}; difference to a full decode + INTER_AREA to the same size "
          f"(Pillow: to its own thumbnail without draft); decoded / target = shorter sides\n")
    header("method", "images", "decoded / target", "img/s", "speed vs full decode", "MAD", "PSNR dB (pooled)",
           "worst image PSNR dB")
    for kind, sources in kinds.items():
        for target in a.targets:
            for line in reduced_measure(kind, sources, target, a.repeat):
                print(line, flush=True)
    return 0


def _reduced_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--photos", default=PHOTOS)
    p.add_argument("--images", type=int, default=8, help="camera and upsampled images each")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--targets", nargs="+", default=["shorter:256", "shorter:160"])


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"reduced": (reduced, _reduced_args)}
