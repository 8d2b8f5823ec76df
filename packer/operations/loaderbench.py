"""``packer bench DST``: measure the data pipeline alone, over a grid of DataLoader settings.

The advice it automates: never guess ``num_workers`` or ``pin_memory``; comment the model out and
time the loader by itself. Each configuration reads the same random subset of samples (center
crop to a fixed size so batches collate); cached configurations are measured warm (the cache is
filled by one pass first), since that is their steady state from epoch 2 on. With workers, each
configuration runs with torch's ``default_collate`` and with ``packer.datasets.collate`` (batches
in reused shared memory), so the table shows what the latter buys on this machine; where that
collate is torch's own (:func:`collate_slots`), the two are one configuration.

Every configuration runs several rounds, interleaved, and :func:`decide` names a winner only when
its lead over the others is larger than the spread of the rounds (their interquartile range).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from ..wording import plural
from .preview import caption_text, write_png

__all__ = ["BenchRow", "CenterCropPad", "Decision", "MIN_ROUNDS", "SAME_COLLATE", "collate_slots", "round_order",
           "run_bench", "decide", "format_table", "format_report", "to_json", "bench_series", "plot_bench"]

#: Rounds per configuration below which the spread is unknown and no winner is named.
MIN_ROUNDS = 3
#: The ``collate`` of a configuration where ``packer.datasets.collate`` is torch's ``default_collate``
#: in this process: the two collates ran the same code, so they are one row.
SAME_COLLATE = "default=packer"


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
    """One measured configuration: medians over its rounds, and every round's images/s."""

    num_workers: int
    pin_memory: bool
    batch_size: int
    cache: str
    #: median over the rounds
    images_per_s: float
    mb_per_s: float
    first_batch_s: float
    #: ``"packer"``, ``"default"`` or :data:`SAME_COLLATE`
    collate: str = "default"
    #: where the crop is made: ``"transform"`` (a center crop that pads small images) or
    #: ``"reader"`` (``open_dataset(..., crop=N)``: JPEGs decoded only in the crop's window)
    crop_in: str = "transform"
    #: images/s of each round, in the order the rounds ran (empty: :attr:`images_per_s` alone)
    images_per_s_rounds: list[float] = field(default_factory=list)

    @property
    def samples(self) -> list[float]:
        """The images/s of every round (the median alone for a row built without rounds)."""
        return self.images_per_s_rounds or [self.images_per_s]

    @property
    def quartiles(self) -> tuple[float, float]:
        """The lower and upper quartile of the rounds' images/s (inclusive method: with three rounds,
        the midpoints between the median and the slowest and the fastest round)."""
        if len(self.samples) == 1:
            return self.samples[0], self.samples[0]
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q1, q3

    @property
    def spread(self) -> float:
        """The spread of the rounds: their interquartile range (upper minus lower quartile). With
        three rounds it is half the range; with more, one stray round moves it little, and it
        narrows where the range only widens."""
        q1, q3 = self.quartiles
        return q3 - q1


def collate_slots() -> tuple[bool, str]:
    """Whether ``packer.datasets.collate`` builds batches in shared memory in this process
    (``(True, "")``), or is torch's ``default_collate`` here, and why (``(False, reason)``): the
    result of its import-time self-test."""
    from packer.datasets.collation import slots_available

    return slots_available()


def _measure(ds: Any, indices: list[int], workers: int, pin: bool, batch: int,
             collate: str = "default") -> tuple[float, float, float]:
    from packer.datasets import collate as packer_collate

    loader = DataLoader(Subset(ds, indices), batch_size=batch, num_workers=workers, pin_memory=pin,
                        persistent_workers=False, shuffle=False,
                        collate_fn=None if collate == "default" else packer_collate)
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


def _collate_settings(collates: list[str], workers: int, slots: bool) -> list[str]:
    """The collates to measure: one (``"default"``) without workers, where the DataLoader calls it
    in this process; one (:data:`SAME_COLLATE`) where packer's is torch's here and both are asked
    for or packer's alone."""
    if workers == 0:
        return ["default"]
    if slots or collates == ["default"]:
        return collates
    return [SAME_COLLATE]


def round_order(settings: int, repeats: int) -> list[int]:
    """The order in which :func:`run_bench` measures ``settings`` configurations ``repeats`` times:
    round 1 of every configuration, then round 2 in the reverse order, then round 3 in the first
    order, and so on, so a steady drift over the run reaches every configuration alike."""
    forward = list(range(settings))
    return [i for r in range(repeats) for i in (forward if r % 2 == 0 else forward[::-1])]


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
    repeats: int = MIN_ROUNDS,
    progress: bool = True,
) -> list[BenchRow]:
    """Measure every combination of the grid ``repeats`` times; return one row per configuration.

    The rounds are interleaved (round 1 of every configuration, then round 2 in the reverse order,
    and so on), so a drift over the run (other load, heat, a filling page cache) reaches every
    configuration alike. A row holds the median of its rounds and every round's images/s.

    ``collates`` holds ``"packer"`` and/or ``"default"`` (the DataLoader's collate_fn); with
    ``num_workers=0`` both are the same function, so only ``"default"`` is measured there, and
    where :func:`collate_slots` says packer's is torch's ``default_collate`` in this process, the
    two are measured once as :data:`SAME_COLLATE`.
    ``crop_in`` holds ``"transform"`` (default: a center crop in ``transform``, zero-padding
    smaller images) and/or ``"reader"`` (the reader's ``crop=``, which decodes only the crop's
    window of each JPEG and raises ValueError for an image smaller than the crop).
    """
    from tqdm import tqdm

    from packer.datasets import open_dataset

    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    cores = os.cpu_count() or 1
    workers = workers if workers is not None else sorted({0, 1, 2, cores, min(2 * cores, 16)} - {1} | {1})
    pin = pin if pin is not None else ([False, True] if torch.cuda.is_available() else [False])
    batch_sizes = batch_sizes or [64, 256]
    caches = caches or ["none", "decoded"]
    collates = collates or ["packer", "default"]
    crop_in = crop_in or ["transform"]
    slots, _ = collate_slots()
    probe = open_dataset(path)
    n = len(probe)
    indices = np.random.default_rng(0).permutation(n)[: min(samples, n)].tolist()
    grid = [(c, m, w, p, b, k)
            for c, m, w, p, b in itertools.product(caches, crop_in, workers, pin, batch_sizes)
            for k in _collate_settings(collates, w, slots)]
    bar = tqdm(round_order(len(grid), repeats), desc="bench", unit="run", disable=not progress, file=sys.stderr)
    datasets: dict[tuple[str, str], Any] = {}
    measured: list[list[tuple[float, float, float]]] = [[] for _ in grid]
    for i in bar:
        cache, where, w, p, b, k = grid[i]
        if (cache, where) not in datasets:
            how: dict[str, Any] = {"crop": crop} if where == "reader" else {"transform": CenterCropPad(crop)}
            ds = open_dataset(path, cache=None if cache == "none" else cache, **how)
            if cache != "none":
                for j in indices:  # warm: the cached steady state is what epochs 2+ see
                    ds[j]
            datasets[(cache, where)] = ds
        bar.set_postfix_str(f"cache={cache} crop_in={where} workers={w} pin={p} batch={b} collate={k}")
        measured[i].append(_measure(datasets[(cache, where)], indices, w, p, b, k))
    for ds in datasets.values():
        ds.close()
    rows = []
    for (cache, where, w, p, b, k), m in zip(grid, measured):
        ips, mbs, first = (statistics.median(x) for x in zip(*m))
        rows.append(BenchRow(w, p, b, cache, ips, mbs, first, k, where, [x[0] for x in m]))
    return rows


@dataclass
class Decision:
    """What :func:`decide` recommends, and why."""

    #: the setting to use
    recommended: BenchRow
    #: True when the fastest setting's median leads every other's by more than their two spreads added
    clear: bool
    #: the settings that cannot be told from the fastest on this machine, fastest first ([fastest] when clear)
    tied: list[BenchRow]
    #: the highest median, and the next one (None with a single setting)
    fastest: BenchRow
    runner_up: BenchRow | None
    #: one sentence for the user
    reason: str


def _cost(r: BenchRow) -> tuple:
    """Orders settings from the cheapest: no cache, fewer workers, pin_memory off, torch's collate,
    the crop in the transform; then the faster."""
    return (r.cache != "none", r.num_workers, r.pin_memory, r.collate == "packer", r.crop_in != "transform",
            -r.images_per_s)


def _label(r: BenchRow, rows: list[BenchRow]) -> str:
    """The settings of ``r`` that differ between ``rows``."""
    fields = [("cache", "cache"), ("crop_in", "crop_in"), ("num_workers", "workers"), ("pin_memory", "pin_memory"),
              ("batch_size", "batch"), ("collate", "collate")]
    varying = [(f, name) for f, name in fields if len({getattr(x, f) for x in rows}) > 1]
    return " ".join(f"{name}={getattr(r, f)}" for f, name in varying) or "the only setting"


def _iqr(r: BenchRow) -> str:
    """The interquartile range of the rounds, as text."""
    q1, q3 = r.quartiles
    return f"{q1:.0f}-{q3:.0f}"


def decide(rows: list[BenchRow]) -> Decision:
    """Recommend a setting only when the measurements tell it from the rest.

    A setting's spread is the interquartile range (IQR) of its rounds. The fastest setting (highest
    median) leads another clearly when the difference of their medians is larger than their two
    spreads added, and it wins when it leads every other setting clearly. Otherwise the settings it
    does not lead clearly are tied with it, and the cheapest of the tied is recommended (no cache,
    fewest workers, pin_memory off, torch's collate, the crop in the transform). With
    fewer than :data:`MIN_ROUNDS` rounds the spread is unknown: no winner is named, and the
    cheapest setting within 5% of the fastest is recommended.
    """
    if not rows:
        raise ValueError("no measurements to decide from")
    ranked = sorted(rows, key=lambda r: -r.images_per_s)
    best, nxt = ranked[0], (ranked[1] if len(ranked) > 1 else None)
    rounds = min(len(r.samples) for r in rows)
    if rounds < MIN_ROUNDS:
        tied = [r for r in ranked if r.images_per_s >= 0.95 * best.images_per_s]
        pick = min(tied, key=_cost)
        reason = (f"{plural(rounds, 'round')} per setting, so the spread is unknown and no setting is shown to be faster; "
                  f"this is the cheapest of the {len(tied)} within 5% of the fastest single pass "
                  f"(use --repeats {MIN_ROUNDS} or more)")
        return Decision(pick, False, tied, best, nxt, reason)
    if nxt is None:
        return Decision(best, False, [best], best, None, "one setting measured: nothing to compare it with")
    tied = [r for r in ranked if best.images_per_s - r.images_per_s <= best.spread + r.spread]
    if len(tied) == 1:
        reason = (f"{_label(best, rows)} is the fastest, {best.images_per_s / nxt.images_per_s:.2f}x the next "
                  f"({_label(nxt, rows)}): its median leads by {best.images_per_s - nxt.images_per_s:.0f} img/s, "
                  f"more than their two spreads added ({best.spread:.0f} + {nxt.spread:.0f} img/s, interquartile "
                  f"ranges over {rounds} rounds)")
        return Decision(best, True, tied, best, nxt, reason)
    pick = min(tied, key=_cost)
    reason = (f"{len(tied)} settings are indistinguishable on this machine: the fastest ({_label(best, rows)}, "
              f"median {best.images_per_s:.0f} img/s, interquartile range {_iqr(best)} over {rounds} rounds) does "
              f"not lead any of them by more than their two spreads added, so this is the cheapest of them (no "
              f"cache, fewest workers, pin_memory off, torch's collate and the crop in the transform come first); "
              f"more --repeats or an idle machine narrow the spreads")
    return Decision(pick, False, tied, best, nxt, reason)


def format_table(rows: list[BenchRow], decision: Decision | None = None) -> str:
    """A markdown table of the rows: median images/s and the spread (the interquartile range of the
    rounds), and with ``decision`` a column that marks the recommended and the tied settings."""
    out = ["| cache | crop in | num_workers | pin_memory | batch_size | collate_fn | images/s (median) "
           "| spread (IQR) | MB/s | first batch s |" + (" decision |" if decision else ""),
           "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if decision else "")]
    for r in rows:
        spread = f"{_iqr(r)} ({r.spread / r.images_per_s:.0%})" if r.images_per_s else "-"
        line = (f"| {r.cache} | {r.crop_in} | {r.num_workers} | {r.pin_memory} | {r.batch_size} | {r.collate} | "
                f"{r.images_per_s:.0f} | {spread} | {r.mb_per_s:.0f} | {r.first_batch_s:.2f} |")
        if decision:
            tied = len(decision.tied) > 1 and any(r is t for t in decision.tied)
            pick = "recommended" if decision.clear else "cheapest of the tied"
            marks = ([pick] if r is decision.recommended else []) + (["tied"] if tied and r is not decision.recommended else [])
            line += f" {', '.join(marks)} |"
        out.append(line)
    return "\n".join(out)


def _slots_note(slots: tuple[bool, str]) -> str:
    return ("" if slots[0] else
            f"packer.datasets.collate: shared-memory batches are off in this process ({slots[1]}); it is torch's "
            f"default_collate here, so the two collates are one setting, shown as {SAME_COLLATE}")


def format_report(rows: list[BenchRow], decision: Decision, *, crop: int, slots: tuple[bool, str] = (True, "")) -> str:
    """What ``packer bench`` prints: a note when packer's collate is torch's here, the table, the
    recommended DataLoader call and the reason for it."""
    best = decision.recommended
    collate_arg = ", collate_fn=packer.datasets.collate" if best.collate == "packer" else ""
    reader = [f"cache={best.cache!r}"] if best.cache != "none" else []
    reader += [f"crop={crop}"] if best.crop_in == "reader" else []
    note = _slots_note(slots)
    rounds = min(len(r.samples) for r in rows)
    return "\n".join(
        ([note, ""] if note else [])
        + [f"{plural(rounds, 'round')} per setting, interleaved; images/s is the median of the rounds, spread their "
           f"interquartile range (IQR)", "", format_table(rows, decision), "",
           ("recommended" if decision.clear else "no setting is shown faster; the cheapest of the tied")
           + f": DataLoader(num_workers={best.num_workers}, pin_memory={best.pin_memory}, "
           f"batch_size={best.batch_size}{collate_arg})"
           + (f" with open_dataset(..., {', '.join(reader)})" if reader else "")
           + f": {best.images_per_s:.0f} images/s (median)",
           f"why: {decision.reason}"])


def to_json(rows: list[BenchRow], decision: Decision, slots: tuple[bool, str] = (True, "")) -> str:
    """Rows (median, quartiles, spread, min, max and every round), the decision (rows named by their index in
    ``rows``), the recommended row itself and the collate's shared-memory state as JSON."""
    def at(r: BenchRow | None) -> int | None:
        return None if r is None else next(i for i, x in enumerate(rows) if x is r)

    out = [{**asdict(r), "images_per_s_q1": r.quartiles[0], "images_per_s_q3": r.quartiles[1],
            "images_per_s_min": min(r.samples), "images_per_s_max": max(r.samples), "spread": r.spread} for r in rows]
    return json.dumps({
        "rounds": min(len(r.samples) for r in rows),
        "spread": "interquartile range of the rounds (inclusive quartiles)",
        "collate_slots": {"on": slots[0], "reason": slots[1]},
        "rows": out,
        "recommended": out[at(decision.recommended)],
        "decision": {"clear": decision.clear, "reason": decision.reason, "recommended": at(decision.recommended),
                     "fastest": at(decision.fastest), "runner_up": at(decision.runner_up),
                     "tied": [at(r) for r in decision.tied]},
    }, indent=1)


# -- packer bench --plot ----------------------------------------------------------------------------
_FONT = cv2.FONT_HERSHEY_SIMPLEX
_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]  # RGB


def bench_series(rows: list[BenchRow]) -> dict[str, list[tuple[int, float]]]:
    """The rows as lines to plot: one per configuration besides ``num_workers`` (cache, batch size,
    pin_memory, collate, where the crop is made), each a list of (num_workers, median images/s), named by the
    settings that differ between lines. ``num_workers=0`` has one collate (the DataLoader calls it in this process), so
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
