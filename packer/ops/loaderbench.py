"""``packer bench DST``: measure the data pipeline alone, over a grid of DataLoader settings.

The advice it automates: never guess ``num_workers`` or ``pin_memory``; comment the model out and
time the loader by itself. Each configuration reads the same random subset of samples (center
crop to a fixed size so batches collate); cached configurations are measured warm (the cache is
filled by one pass first), since that is their steady state from epoch 2 on. With workers, each
configuration runs with torch's ``default_collate`` and with ``packer.datasets.collate`` (batches
in reused shared memory), so the table shows what the latter buys on this machine.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from .preview import caption_text, write_png

__all__ = ["BenchRow", "CenterCropPad", "run_bench", "recommend", "format_table", "bench_series", "plot_bench"]


class CenterCropPad:
    """Center-crop a C x H x W tensor to ``size`` x ``size``, zero-padding images that are smaller."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        c, h, w = x.shape
        s = self.size
        if h < s or w < s:
            out = torch.zeros((c, max(h, s), max(w, s)), dtype=x.dtype)
            out[:, :h, :w] = x
            x, h, w = out, max(h, s), max(w, s)
        top, left = (h - s) // 2, (w - s) // 2
        return x[:, top : top + s, left : left + s]


@dataclass
class BenchRow:
    """One measured configuration."""

    num_workers: int
    pin_memory: bool
    batch_size: int
    cache: str
    images_per_s: float
    mb_per_s: float
    first_batch_s: float
    collate: str = "default"
    #: where the crop is made: ``"transform"`` (a center crop that pads small images) or
    #: ``"reader"`` (``open_dataset(..., crop=N)``: JPEGs decoded only in the crop's window)
    crop_in: str = "transform"


def _measure(ds: Any, indices: list[int], workers: int, pin: bool, batch: int,
             collate: str = "default") -> tuple[float, float, float]:
    from packer.datasets import collate as packer_collate

    loader = DataLoader(Subset(ds, indices), batch_size=batch, num_workers=workers, pin_memory=pin,
                        persistent_workers=False, shuffle=False,
                        collate_fn=packer_collate if collate == "packer" else None)
    t0 = time.perf_counter()
    n = nbytes = 0
    first = 0.0
    for images, _ in loader:
        if n == 0:
            first = time.perf_counter() - t0
        n += images.shape[0]
        nbytes += images.numel() * images.element_size()
    dt = time.perf_counter() - t0
    return n / dt, nbytes / dt / 1e6, first


def run_bench(
    path: str,
    *,
    workers: list[int] | None = None,
    pin: list[bool] | None = None,
    batch_sizes: list[int] | None = None,
    caches: list[str] | None = None,
    collates: list[str] | None = None,
    samples: int = 2000,
    crop: int = 224,
    crop_in: list[str] | None = None,
    progress: bool = True,
) -> list[BenchRow]:
    """Measure every combination of the grid; return one row per configuration.

    ``collates`` holds ``"packer"`` and/or ``"default"`` (the DataLoader's collate_fn); with
    ``num_workers=0`` both are the same function, so only ``"default"`` is measured there.
    ``crop_in`` holds ``"transform"`` (default: a center crop in ``transform``, zero-padding
    smaller images) and/or ``"reader"`` (the reader's ``crop=``, which decodes only the crop's
    window of each JPEG and raises ValueError for an image smaller than the crop).
    """
    from tqdm import tqdm

    from packer.datasets import open_dataset

    cores = os.cpu_count() or 1
    workers = workers if workers is not None else sorted({0, 1, 2, cores, min(2 * cores, 16)} - {1} | {1})
    pin = pin if pin is not None else ([False, True] if torch.cuda.is_available() else [False])
    batch_sizes = batch_sizes or [64, 256]
    caches = caches or ["none", "decoded"]
    collates = collates or ["packer", "default"]
    crop_in = crop_in or ["transform"]
    probe = open_dataset(path)
    n = len(probe)
    indices = np.random.default_rng(0).permutation(n)[: min(samples, n)].tolist()
    rows: list[BenchRow] = []
    grid = [(c, m, w, p, b, k)
            for c, m, w, p, b, k in itertools.product(caches, crop_in, workers, pin, batch_sizes, collates)
            if w > 0 or k == collates[-1]]
    bar = tqdm(grid, desc="bench", unit="cfg", disable=not progress, file=sys.stderr)
    datasets: dict[tuple[str, str], Any] = {}
    for cache, where, w, p, b, k in bar:
        if (cache, where) not in datasets:
            how: dict[str, Any] = {"crop": crop} if where == "reader" else {"transform": CenterCropPad(crop)}
            ds = open_dataset(path, cache=None if cache == "none" else cache, **how)
            if cache != "none":
                for i in indices:  # warm: the cached steady state is what epochs 2+ see
                    ds[i]
            datasets[(cache, where)] = ds
        bar.set_postfix_str(f"cache={cache} crop_in={where} workers={w} pin={p} batch={b} collate={k}")
        ips, mbs, first = _measure(datasets[(cache, where)], indices, w, p, b, k if w > 0 else "default")
        rows.append(BenchRow(w, p, b, cache, ips, mbs, first, k if w > 0 else "default", where))
    for ds in datasets.values():
        ds.close()
    return rows


def recommend(rows: list[BenchRow]) -> BenchRow:
    """The fastest row, preferring no cache, fewer workers and torch's own collate within 5% of it."""
    best = max(r.images_per_s for r in rows)
    close = [r for r in rows if r.images_per_s >= 0.95 * best]
    return min(close, key=lambda r: (r.cache != "none", r.num_workers, r.collate != "default",
                                     not r.pin_memory, -r.images_per_s))


def format_table(rows: list[BenchRow]) -> str:
    """A markdown table of the rows."""
    out = ["| cache | crop in | num_workers | pin_memory | batch_size | collate_fn | images/s | MB/s | first batch s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.cache} | {r.crop_in} | {r.num_workers} | {r.pin_memory} | {r.batch_size} | {r.collate} | "
                   f"{r.images_per_s:.0f} | {r.mb_per_s:.0f} | {r.first_batch_s:.2f} |")
    return "\n".join(out)


def to_json(rows: list[BenchRow], best: BenchRow) -> str:
    """Rows and the recommendation as JSON."""
    return json.dumps({"rows": [asdict(r) for r in rows], "recommended": asdict(best)}, indent=1)


# -- packer bench --plot ----------------------------------------------------------------------------
_FONT = cv2.FONT_HERSHEY_SIMPLEX
_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]  # RGB


def bench_series(rows: list[BenchRow]) -> dict[str, list[tuple[int, float]]]:
    """The rows as lines to plot: one per configuration besides ``num_workers`` (cache, batch size,
    pin_memory, collate, where the crop is made), each a list of (num_workers, images/s), named by the settings that differ
    between lines. ``num_workers=0`` has one collate (the DataLoader calls it in this process), so
    its point joins the lines of both."""
    collates = sorted({r.collate for r in rows if r.num_workers > 0}) or ["default"]
    configs = {}
    for r in rows:
        for k in collates if r.num_workers == 0 else [r.collate]:
            config = (("cache", r.cache), ("batch", r.batch_size), ("pin", r.pin_memory), ("collate", k),
                      ("crop_in", r.crop_in))
            configs.setdefault(config, []).append((r.num_workers, r.images_per_s))
    varying = [i for i in range(5) if len({c[i][1] for c in configs}) > 1]
    return {" ".join(f"{c[i][0]}={c[i][1]}" for i in varying) or "all": points for c, points in configs.items()}


def plot_bench(rows: list[BenchRow], path: str, title: str = "") -> str:
    """Draw images/s against num_workers, one line per configuration (:func:`bench_series`), into
    the PNG ``path``. With matplotlib installed it draws the chart; without, OpenCV does. Returns
    which one drew it: ``"matplotlib"`` or ``"opencv"``."""
    series = bench_series(rows)
    if not series:
        raise ValueError("no measurements to plot")
    try:
        import matplotlib
    except ImportError:
        write_png(path, _plot_cv2(series, title))
        return "opencv"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for k, (name, points) in enumerate(series.items()):
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, marker="o", label=name, color=[c / 255 for c in _COLORS[k % len(_COLORS)]])
    ax.set_xticks(sorted({x for points in series.values() for x, _ in points}))
    ax.set_xlabel("num_workers")
    ax.set_ylabel("images/s")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return "matplotlib"


def _plot_cv2(series: dict[str, list[tuple[int, float]]], title: str, width: int = 800, height: int = 500) -> np.ndarray:
    """The same chart drawn with OpenCV: axes with ticks, one coloured polyline per series, a legend."""
    img = np.full((height, width, 3), 255, np.uint8)
    left, right, top, bottom = 70, width - 230, 40, height - 50
    xs = sorted({x for pts in series.values() for x, _ in pts})
    top_y = max(y for pts in series.values() for _, y in pts) or 1.0
    step = min(m * 10 ** math.floor(math.log10(top_y / 5)) for m in (1, 2, 5, 10)
               if m * 10 ** math.floor(math.log10(top_y / 5)) >= top_y / 5)  # 1, 2 or 5 x 10^k
    ticks = math.ceil(top_y * 1.05 / step)
    ymax = ticks * step
    x0, x1 = xs[0], xs[-1] if xs[-1] > xs[0] else xs[0] + 1

    def at(x: float, y: float) -> tuple[int, int]:
        return (round(left + (x - x0) / (x1 - x0) * (right - left)), round(bottom - y / ymax * (bottom - top)))

    black, grey = (0, 0, 0), (200, 200, 200)
    for k in range(ticks + 1):  # y grid and ticks
        y = step * k
        p = at(x0, y)
        cv2.line(img, (left, p[1]), (right, p[1]), grey, 1)
        cv2.putText(img, f"{y:.0f}", (5, p[1] + 4), _FONT, 0.4, black, 1, cv2.LINE_AA)
    for x in xs:  # x ticks at the measured worker counts
        p = at(x, 0)
        cv2.line(img, (p[0], bottom), (p[0], bottom + 5), black, 1)
        cv2.putText(img, str(x), (p[0] - 4, bottom + 20), _FONT, 0.45, black, 1, cv2.LINE_AA)
    cv2.rectangle(img, (left, top), (right, bottom), black, 1)
    cv2.putText(img, "num_workers", ((left + right) // 2 - 45, height - 10), _FONT, 0.5, black, 1, cv2.LINE_AA)
    cv2.putText(img, "images/s", (5, top - 15), _FONT, 0.5, black, 1, cv2.LINE_AA)
    if title:
        cv2.putText(img, caption_text(title, []), (left + 20, 22), _FONT, 0.5, black, 1, cv2.LINE_AA)
    for k, (name, points) in enumerate(series.items()):
        color = _COLORS[k % len(_COLORS)]
        pts = np.array([at(x, y) for x, y in sorted(points)], np.int32)
        cv2.polylines(img, [pts], False, color, 2, cv2.LINE_AA)
        for p in pts:
            cv2.circle(img, (int(p[0]), int(p[1])), 4, color, -1, cv2.LINE_AA)
        ly = top + 10 + 18 * k
        cv2.line(img, (right + 10, ly), (right + 30, ly), color, 2)
        legend = caption_text(name, [])
        while legend and cv2.getTextSize(legend, _FONT, 0.38, 1)[0][0] > width - right - 40:
            legend = legend[:-1]
        cv2.putText(img, legend, (right + 35, ly + 4), _FONT, 0.38, black, 1, cv2.LINE_AA)
    return img
