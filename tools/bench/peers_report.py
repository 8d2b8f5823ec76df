"""Section 1 of docs/benchmarks.md (the peers): the best of several runs, the Markdown table and the
report written to ``--out``."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Sequence
from typing import Any

from tools.bench.peers_protocol import (
    BUSY_CORES,
    CROP,
    JPEG_QUALITY,
    SHORT_SIDE,
    BenchConfig,
    is_error,
    join_notes,
)


# -- output ---------------------------------------------------------------------------------------
def num(v: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _mb(v: int | None) -> str:
    return "-" if v is None else f"{v / 1e6:,.1f}"


def row_note(row: dict[str, Any]) -> str:
    """The row's note plus, when the machine was shared, how busy other processes kept it."""
    busy = []
    for key, phase in (("others_convert_cores", "converting"), ("others_read_cores", "reading")):
        v = row.get(key)
        if v is not None and v >= BUSY_CORES:
            busy.append(f"{v:.1f} cores while {phase}")
    extra = f"other processes used {' and '.join(busy)}" if busy else ""
    return join_notes(str(row.get("note", "")), extra)


def merge_runs(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Best of several runs, per system: the highest rate of each column, the lowest outside
    load seen, the highest peak RSS; the read CPU per image is the median, and each run's best
    epoch and CPU per image are kept (``read_runs``, ``cpu_runs``) to show the spread. A system
    that failed in every run keeps its error row."""
    order: list[str] = []
    by_system: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for row in run:
            if row["system"] not in by_system:
                order.append(row["system"])
            by_system.setdefault(row["system"], []).append(row)
    merged = []
    for system in order:
        rows = by_system[system]
        good = [r for r in rows if not is_error(r)]
        if not good:
            merged.append(rows[-1])
            continue
        out = dict(good[-1])
        for key in ("convert_img_s", "read_e1_img_s", "read_e2_img_s"):
            out[key] = _pick(good, key, max)
        for key in ("others_convert_cores", "others_read_cores"):
            out[key] = _pick(good, key, min)
        out["peak_rss_bytes"] = _pick(good, "peak_rss_bytes", max)
        out["read_runs"] = [_best_epoch(r) for r in good if _best_epoch(r) is not None]
        out["cpu_runs"] = [r["read_cpu_us"] for r in good if r.get("read_cpu_us") is not None]
        out["read_cpu_us"] = _median(out["cpu_runs"]) if out["cpu_runs"] else None
        if len(good) < len(rows):
            failed = f"{len(rows) - len(good)} of {len(rows)} runs failed"
            out["note"] = join_notes(out.get("note", ""), failed)
        merged.append(out)
    return merged


def _best_epoch(row: dict[str, Any]) -> float | None:
    rates = [row[k] for k in ("read_e1_img_s", "read_e2_img_s") if row.get(k) is not None]
    return max(rates) if rates else None


def run_spread(row: dict[str, Any]) -> str:
    """The row's read rate over runs (each run's best epoch) as 'min-max (spread %)', the
    spread relative to the median run; '-' with fewer than two runs."""
    runs = sorted(row.get("read_runs") or [])
    if len(runs) < 2:
        return "-"
    return f"{runs[0]:,.0f}-{runs[-1]:,.0f} ({100 * (runs[-1] - runs[0]) / _median(runs):.0f}%)"


def cpu_cell(row: dict[str, Any]) -> str:
    """Read CPU us/img: one run's value, or the median over runs with their min-max."""
    runs = sorted(row.get("cpu_runs") or [])
    if len(runs) < 2:
        return num(row.get("read_cpu_us"))
    return f"{_median(runs):,.0f} ({runs[0]:,.0f}-{runs[-1]:,.0f})"


def _median(values: Sequence[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2



def _pick(rows: Sequence[dict[str, Any]], key: str, fn: Callable[[list[Any]], Any]) -> Any:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return fn(vals) if vals else None


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as a markdown table (sizes in MB = 10^6 bytes). With several runs, a column gives
    each row's read rate over the runs (best epoch of each run): min-max and spread."""
    runs = any(len(r.get("read_runs") or []) > 1 for r in rows)
    spread_head, spread_rule = (" read img/s over runs |", "---:|") if runs else ("", "")
    head = [
        "| system | convert img/s | read epoch 1 img/s | read epoch 2 img/s |"
        f"{spread_head} read CPU us/img | size MB | peak RSS MB | note |",
        f"|---|---:|---:|---:|{spread_rule}---:|---:|---:|---|",
    ]
    body = [
        f"| {r['system']} | {num(r['convert_img_s'])} | {num(r['read_e1_img_s'])} | "
        f"{num(r['read_e2_img_s'])} |{f' {run_spread(r)} |' if runs else ''} "
        f"{cpu_cell(r)} | {_mb(r['size_bytes'])} | {_mb(r['peak_rss_bytes'])} | "
        f"{row_note(r).replace('|', '/')} |"
        for r in rows
    ]
    return "\n".join(head + body)


def _versions() -> str:
    out = []
    for mod, label in (
        ("torch", "torch"),
        ("torchvision", "torchvision"),
        ("cv2", "opencv"),
        ("PIL", "pillow"),
        ("webdataset", "webdataset"),
        ("litdata", "litdata"),
        ("streaming", "mosaicml-streaming"),
        ("nvidia.dali", "nvidia-dali"),
    ):
        try:
            import importlib

            m = importlib.import_module(mod)
            out.append(f"{label} {getattr(m, '__version__', '?')}")
        except Exception:  # noqa: BLE001 - a missing library is reported in its row
            out.append(f"{label} missing")
    return ", ".join(out)


def report_markdown(
    rows: Sequence[dict[str, Any]],
    cfg: BenchConfig,
    n_images: int,
    argv: Sequence[str],
    seconds: float,
    repeat: int = 1,
    also: str = "",
) -> str:
    """The report written to ``--out``: command, protocol, machine, table. ``also`` says which
    second interpreter (and torch) ran packer's rows too."""
    best = f" Best of {repeat} runs per column." if repeat > 1 else ""
    best += f" packer's rows also ran under {also}, right after the main interpreter's." if also else ""
    return "\n".join(
        [
            "# Peer benchmark",
            "",
            f"Command: `{' '.join(argv)}`",
            "",
            f"{n_images} images from `{cfg.src}`; shorter side {SHORT_SIDE}, JPEG q{JPEG_QUALITY} (OpenCV) in every "
            f"writer; DataLoader(num_workers={cfg.workers}, batch_size={cfg.batch_size}), {cfg.epochs} epochs, "
            f"decode = cv2 imdecode -> RGB -> centre crop {CROP} -> uint8 CHW tensor (ImageFolder: PIL + "
            f"Resize({SHORT_SIDE}) + CenterCrop({CROP})). Peak RSS summed over the process tree.",
            "",
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; {_versions()}.",
            f"Total wall time: {seconds:.0f} s.{best}",
            "",
            format_table(rows),
            "",
        ]
    )
