"""Section 7 of docs/benchmarks.md, ``window-decode``: decoding only the crop's window of a JPEG,
its pixels and its time against full decodes."""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Callable
from types import ModuleType

import cv2
import numpy as np

from tools.bench.common import Subcommand, header, row, timed, turns

Window = tuple[int, int, int, int]  # top, left, height, width


def decode_window(lib: ModuleType, payload: bytes, window: Window) -> np.ndarray | None:
    """The window's RGB pixels (a view of the decoded rows), or None where the module refuses the
    payload (damaged, CMYK, ...)."""
    import simplejpeg

    top, left, height, width = window
    w_img = simplejpeg.decode_jpeg_header(payload)[1]
    out = np.empty((height, min(w_img, width + 96), 3), np.uint8)
    shift = lib.decode_window(payload, out, top, left, width)
    return None if shift is None else out[:, shift:shift + width]


def center_window(h: int, w: int, size: int = 224) -> Window:
    """The benchmarks' 224 center crop (rounded as torchvision's CenterCrop)."""
    return int(round((h - size) / 2.0)), int(round((w - size) / 2.0)), size, size


def random_window(h: int, w: int, rng: random.Random, size: int = 224) -> Window:
    """``RandomCrop(size)``'s window."""
    return rng.randint(0, h - size), rng.randint(0, w - size), size, size


def resized_crop_window(h: int, w: int, rng: random.Random, scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> Window:
    """A window drawn as ``RandomResizedCrop`` draws one (10 tries, then the central square)."""
    area = h * w
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw
    side = min(h, w)
    return (h - side) // 2, (w - side) // 2, side, side


def jpeg_payloads(path: str, count: int) -> list[bytes]:
    """Up to ``count`` stored JPEG payloads of the packed dataset at ``path``, spread over it."""
    from packer.datasets import open_dataset

    with open_dataset(path) as ds:
        step = max(1, len(ds) // count)
        out = [bytes(ds.read_record(i).payload) for i in range(0, len(ds), step)][:count]
    return [p for p in out if p[:2] == b"\xff\xd8"]


def window_check(lib: ModuleType, data: list[bytes], per_image: int = 3, seed: int = 0) -> dict[str, int]:
    """Windows of random size and place against full decodes: the counts of windows checked,
    of those that differ from simplejpeg's and from OpenCV's pixels, and of refused payloads."""
    import simplejpeg

    rng = random.Random(seed)
    counts = {"windows": 0, "differ_simplejpeg": 0, "differ_opencv": 0, "refused": 0}
    for payload in data:
        full = simplejpeg.decode_jpeg(payload, colorspace="rgb")
        ocv = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR_RGB)
        h, w = full.shape[:2]
        for _ in range(per_image):
            wh, ww = rng.randint(1, h), rng.randint(1, w)
            window = (rng.randint(0, h - wh), rng.randint(0, w - ww), wh, ww)
            got = decode_window(lib, payload, window)
            counts["windows"] += 1
            if got is None:
                counts["refused"] += 1
                continue
            t, left = window[0], window[1]
            counts["differ_simplejpeg"] += not np.array_equal(got, full[t:t + wh, left:left + ww])
            counts["differ_opencv"] += not np.array_equal(got, ocv[t:t + wh, left:left + ww])
    return counts


def _decode_methods(lib: ModuleType, data: list[bytes], windows: dict[str, list[Window]]) -> dict[str, Callable]:
    """One pass over ``data`` per method: each window set through the module, then simplejpeg's and
    OpenCV's full decodes."""
    import simplejpeg

    def windowed(ws: list[Window]) -> Callable[[], None]:
        def run() -> None:
            for p, w in zip(data, ws):
                decode_window(lib, p, w)  # each result dropped at once, as a reader's batch is
        return run

    def simple() -> None:
        for p in data:
            simplejpeg.decode_jpeg(p, colorspace="rgb", strict=True)

    def opencv() -> None:
        for p in data:
            cv2.imdecode(np.frombuffer(p, np.uint8), cv2.IMREAD_COLOR_RGB)

    methods: dict[str, Callable[[], None]] = {name: windowed(ws) for name, ws in windows.items()}
    methods["full, simplejpeg (the readers')"] = simple
    methods["full, cv2.imdecode to RGB"] = opencv
    return methods


def window_timings(lib: ModuleType, data: list[bytes], rounds: int, seed: int = 0) -> dict[str, float]:
    """Median over ``rounds`` of each method's mean microseconds per payload in one pass over all
    payloads; the methods take turns pass by pass, in an order that rotates each round."""
    import simplejpeg

    rng = random.Random(seed)
    sizes = [simplejpeg.decode_jpeg_header(p)[:2] for p in data]
    windows = {
        "full, packer.images._jpegwindow": [(0, 0, h, w) for h, w in sizes],
        "224 center crop window": [center_window(h, w) for h, w in sizes],
        "RandomCrop(224) window": [random_window(h, w, rng) for h, w in sizes],
        "RandomResizedCrop window": [resized_crop_window(h, w, rng) for h, w in sizes],
    }
    methods = _decode_methods(lib, data, windows)
    passes: dict[str, list[float]] = {name: [] for name in methods}
    for r in range(rounds):
        for name in turns(list(methods), r):
            passes[name].append(timed(methods[name])[0] / len(data) * 1e6)
    out = {name: statistics.median(v) for name, v in passes.items()}
    out["RandomResizedCrop mean area"] = statistics.fmean(
        hh * ww / (h * w) for (_, _, hh, ww), (h, w) in zip(windows["RandomResizedCrop window"], sizes))
    return out


def window_decode(a: argparse.Namespace) -> int:
    """Would decoding only the crop window make the JPEG read cheaper? Measured, not assumed.

    libjpeg-turbo's libjpeg API can leave out part of a decode: ``jpeg_skip_scanlines`` skips rows
    (still entropy-decoded, but no inverse DCT, upsampling or colour conversion),
    ``jpeg_crop_scanline`` narrows every row to a column range (rounded out to iMCU columns), and
    a decode can stop after the last row it needs. packer's C module ``packer.images._jpegwindow`` does
    this (built at install where a C compiler and libjpeg-turbo's headers are there), and the
    readers' ``crop=`` uses it. Measured on the stored payloads of a packed JPEG dataset:

    - the pixel check: windows of random size and place, each against the same rectangle of a
      full decode by simplejpeg (the readers' decoder) and by ``cv2.imdecode``;
    - the time per image, in one process: each method decodes every payload once per round (a
      pass, as an epoch does), the methods taking turns pass by pass, median of ``--rounds``
      passes, with the malloc settings readers have in DataLoader workers: a full decode through
      the same module, windows as the 224 center crop, as ``RandomCrop(224)`` and as
      ``RandomResizedCrop`` (area 8-100%, aspect 3/4-4/3) take them; with simplejpeg's and
      OpenCV's full decodes for reference.
    """
    cv2.setNumThreads(1)
    from packer.datasets.shm import worker_memory
    from packer.images import imageproc

    worker_memory._apply()  # the malloc settings of a DataLoader worker, where readers decode
    data = jpeg_payloads(a.dataset, a.images)
    if not data:
        print(f"error: {a.dataset} holds no JPEG payloads", file=sys.stderr)
        return 2
    lib = imageproc._jpegwindow
    if lib is None:
        print("error: packer was installed without its C module packer.images._jpegwindow (no C compiler or no "
              "libjpeg-turbo headers at install; see setup.py)", file=sys.stderr)
        return 2
    counts = window_check(lib, data)
    times = window_timings(lib, data, a.rounds)
    area = times.pop("RandomResizedCrop mean area")
    print(f"{len(data)} payloads of {a.dataset}; pixel check: {counts['windows']} random windows, "
          f"{counts['differ_simplejpeg']} differ from simplejpeg's full decode, {counts['differ_opencv']} from "
          f"OpenCV's, {counts['refused']} refused\n")
    base, readers = times["full, packer.images._jpegwindow"], times["full, simplejpeg (the readers')"]
    header("decode", "us/image", "/ full, same library", "/ simplejpeg's full decode")
    for name, us in times.items():
        row(name, f"{us:.0f}", f"{us / base:.2f}", f"{us / readers:.2f}")
    print(f"\nRandomResizedCrop windows cover {area:.0%} of the image on average.")
    return 0


def _window_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", help="a packed dataset of JPEG payloads")
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"window-decode": (window_decode, _window_decode_args)}
