"""Side-by-side benchmark of packer against the tools users would pick instead (torchvision's
ImageFolder, webdataset, NVIDIA DALI's CPU pipeline, litdata, mosaicml-streaming, a bare decode
loop): each converts the same ImageFolder and is read through the same decode and crop. Its rows,
method and the commands that reproduce it: docs/benchmarks.md, section 1. Run from the repository
root as ``python -m tools.bench_peers``; the protocol, the systems, packer's rows and the report
are the ``peers_*`` modules of tools/bench/, and this module runs each system in a child process."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from tools.bench.peers_packer import packer_rows
from tools.bench.peers_protocol import (
    BenchConfig,
    decode_center_crop,
    make_row,
    one_line,
    one_thread_per_process,
    resize_encode,
    scan_source,
)
from tools.bench.peers_report import format_table, merge_runs, num, report_markdown, row_note
from tools.bench.peers_systems import (
    bench_bare_decode,
    bench_dali,
    bench_imagefolder,
    bench_litdata,
    bench_mosaicml,
    bench_webdataset,
)
from tools.bench.peers_training import TRAIN_SYSTEMS

__all__ = [
    "BenchConfig",
    "decode_center_crop",
    "resize_encode",
    "SYSTEMS",
    "packer_rows",
    "run_system",
    "format_table",
    "main",
]


# -- the table of systems ------------------------------------------------------------------------
def _single(
    fn: Callable[[BenchConfig], dict[str, Any]],
) -> Callable[[BenchConfig], list[dict[str, Any]]]:
    def rows(cfg: BenchConfig) -> list[dict[str, Any]]:
        return [fn(cfg)]

    rows.__doc__ = fn.__doc__
    return rows


#: name -> function(cfg) -> rows. Each entry runs in its own child process.
SYSTEMS: dict[str, Callable[[BenchConfig], list[dict[str, Any]]]] = {
    "imagefolder": _single(bench_imagefolder),
    "webdataset": _single(bench_webdataset),
    "dali": _single(bench_dali),
    "litdata": _single(bench_litdata),
    "mosaicml": _single(bench_mosaicml),
    "bare": _single(bench_bare_decode),
    "packer": packer_rows,
}
#: What a run measures unless ``--systems`` names others: the centre-crop read.
DEFAULT_SYSTEMS = list(SYSTEMS)
#: The training pipeline (RandomResizedCrop(224) + flip) at ``--store-side``: ``--systems train``.
SYSTEMS.update({name: fn if name in ("train-packer", "train-ffcv") else _single(fn)
                for name, fn in TRAIN_SYSTEMS.items()})



def _child(name: str, cfg: BenchConfig, result_path: str) -> int:
    """Run one system in this process and write its rows as JSON."""
    one_thread_per_process()
    try:
        rows = SYSTEMS[name](cfg)
    except Exception as exc:  # noqa: BLE001 - reported in the row
        import traceback

        traceback.print_exc()
        rows = [make_row(name, note=f"error: {one_line(exc)}")]
    with open(result_path, "w") as f:
        json.dump(rows, f)
    return 0


def wait_for_quiet(max_wait: float, threshold: float = 0.3) -> float:
    """Wait (at most ``max_wait`` s) until other processes use under ``threshold`` cores, measured
    over one second. Returns the load last seen, in cores. The benchmark shares its machine with
    whatever else runs there; rows measured under load say so in their note anyway."""
    import psutil

    deadline = time.monotonic() + max_wait
    while True:
        busy = psutil.cpu_percent(interval=1.0) * (os.cpu_count() or 1) / 100.0
        if busy < threshold or time.monotonic() >= deadline:
            return busy
        time.sleep(2.0)


def run_system(
    name: str, cfg: BenchConfig, timeout: float, python: str | None = None
) -> list[dict[str, Any]]:
    """Run ``SYSTEMS[name]`` in a child process of ``python`` (default: this interpreter);
    failures become a one-line error row."""
    python = python or sys.executable
    logs = os.path.join(cfg.work, "logs")
    os.makedirs(logs, exist_ok=True)
    stem = name if python == sys.executable else f"{name}-{_slug(python)}"
    result = os.path.join(logs, f"{stem}.json")
    log = os.path.join(logs, f"{stem}.log")
    if os.path.exists(result):
        os.remove(result)
    cmd = [
        python,
        "-m",
        "tools.bench_peers",
        "--_child",
        name,
        "--_result",
        result,
        "--src",
        cfg.src,
        "--work",
        cfg.work,
        "--bare-images",
        str(cfg.bare_images),
        "--store-side",
        str(cfg.side),
        *(["--ffcv-warm"] if cfg.ffcv_warm else []),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "w") as logf:
        # A session of its own, so a timeout can stop the child's workers too.
        proc = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return [make_row(name, note=f"error: timed out after {timeout:.0f}s (log: {log})")]
    if proc.returncode == 0 and os.path.exists(result):
        with open(result) as f:
            return list(json.load(f))
    return [
        make_row(
            name, note=f"error: child exited {proc.returncode}: {_last_line(log)} (log: {log})"
        )
    ]


def _slug(path: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in path).strip("_")


def interpreter_torch(python: str) -> str:
    """The torch version ``python`` imports (its metadata; nothing is imported), or a one-line
    reason it cannot run packer's rows. Raises ValueError when ``python`` does not run."""
    code = (
        "import importlib.metadata as m, importlib.util as u\n"
        "print(m.version('torch') if u.find_spec('packer') else 'no packer')"
    )
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"cannot run {python}: {one_line(exc)}") from None
    if done.returncode != 0:
        raise ValueError(f"{python} has no torch: {_last_text(done.stderr)}")
    version = done.stdout.strip()
    if version == "no packer":
        raise ValueError(f"{python} cannot import packer")
    return version


def _last_text(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no output"


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1][:200] if lines else "no output"


# -- command line ---------------------------------------------------------------------------------
def _parse_systems(text: str) -> list[str]:
    names = [s for s in text.replace(",", " ").split() if s]
    if "train" in names:  # every training-pipeline row
        at = names.index("train")
        names[at:at + 1] = [n for n in SYSTEMS if n.startswith("train-")]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system(s) {', '.join(unknown)}; known: {', '.join(SYSTEMS)}")
    return names


def _schedule(
    systems: Sequence[str], also_python: str | None, run: int
) -> list[tuple[str, str | None]]:
    """(system, interpreter) in the order one run measures them: with a second interpreter,
    packer runs twice in a row, the two interpreters taking turns at going first, so neither
    torch always gets the warmer or the quieter slot."""
    order: list[tuple[str, str | None]] = []
    for name in systems:
        if name == "packer" and also_python:
            pair = [(name, None), (name, also_python)]
            order.extend(pair if run % 2 == 0 else pair[::-1])
        else:
            order.append((name, None))
    return order


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Peer benchmark: convert + read with each peer system "
                                             "(method and rows: docs/benchmarks.md, section 1).")
    ap.add_argument("--src", help="ImageFolder source (root/<class>/<image>)")
    ap.add_argument("--work", help="scratch folder for converted data and logs (rewritten)")
    ap.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                    help=f"comma-separated subset of: {', '.join(SYSTEMS)}; 'train' = every train-* system")
    ap.add_argument("--store-side", type=int, default=256,
                    help="the train-* rows' storage size: packer converts the source to this shorter side")
    ap.add_argument("--ffcv-warm", action="store_true",
                    help="train-ffcv: a second row timed after one untimed epoch (numba's compile)")
    ap.add_argument("--out", help="write the markdown report here")
    ap.add_argument("--bare-images", type=int, default=2000, help="images held in memory for the bare decode loop")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per system")
    ap.add_argument("--quiet-wait", type=float, default=60.0,
                    help="before each system, wait up to this many seconds for other processes to go idle")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every system this many times and keep the best of each column")
    ap.add_argument("--also-python", metavar="PYTHON",
                    help="run packer's rows a second time with this interpreter (another torch version), "
                         "interleaved with the others; each packer row names its torch")
    ap.add_argument("--list", action="store_true", help="print the system names and exit")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    ap.add_argument("--_result", help=argparse.SUPPRESS)
    return ap


def _checked(args: argparse.Namespace) -> tuple[list[str], str]:
    """The systems to run and the description of ``--also-python``; ValueError saying what is wrong."""
    if not args.src or not args.work:
        raise ValueError("--src and --work are required")
    systems = _parse_systems(args.systems)
    if not os.path.isdir(args.src):
        raise ValueError(f"source folder not found: {args.src}")
    also = ""
    if args.also_python:
        try:
            also = f"{args.also_python} (torch {interpreter_torch(args.also_python)})"
        except ValueError as exc:
            raise ValueError(f"--also-python: {exc}") from None
        if "packer" not in systems:
            raise ValueError("--also-python needs the packer system")
    return systems, also


def _run_all(args: argparse.Namespace, cfg: BenchConfig, systems: list[str]) -> list[dict[str, Any]]:
    """Every system, ``--repeat`` times (packer's rows also under ``--also-python``): the rows."""
    runs: list[list[dict[str, Any]]] = []
    for run in range(args.repeat):
        if args.repeat > 1:
            print(f"run {run + 1} of {args.repeat}", flush=True)
        rows: list[dict[str, Any]] = []
        for name, python in _schedule(systems, args.also_python, run):
            if args.quiet_wait > 0:
                busy = wait_for_quiet(args.quiet_wait)
                if busy >= 0.3:
                    print(f"  (machine busy: others use {busy:.1f} cores; running {name} anyway)")
            t0 = time.perf_counter()
            new = run_system(name, cfg, args.timeout, python)
            for r in new:
                print(f"  {r['system']:30s} convert {num(r['convert_img_s']):>6s}  "
                      f"read e1 {num(r['read_e1_img_s']):>6s}  e2 {num(r['read_e2_img_s']):>6s} img/s  "
                      f"{row_note(r)}", flush=True)
            print(f"  [{name}: {time.perf_counter() - t0:.0f} s]", flush=True)
            rows.extend(new)
        runs.append(rows)
    return merge_runs(runs) if len(runs) > 1 else runs[0]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (``--help``); returns a process exit status."""
    args = _parser().parse_args(argv)
    if args.list:
        for name, fn in SYSTEMS.items():
            print(f"{name:12s} {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    try:
        systems, also = _checked(args)
    except ValueError as exc:
        print(f"bench_peers: error: {exc}", file=sys.stderr)
        return 2
    cfg = BenchConfig(src=os.path.abspath(args.src), work=os.path.abspath(args.work), bare_images=args.bare_images,
                      side=args.store_side, ffcv_warm=args.ffcv_warm)
    if args._child:
        return _child(args._child, cfg, args._result)
    os.makedirs(cfg.work, exist_ok=True)
    n_images = len(scan_source(cfg.src)[0])
    print(f"{n_images} images, systems: {', '.join(systems)}; work folder {cfg.work}", flush=True)
    if also:
        print(f"packer's rows also run under {also}", flush=True)
    t_all = time.perf_counter()
    rows = _run_all(args, cfg, systems)
    seconds = time.perf_counter() - t_all
    shown_argv = [sys.executable, "-m", "tools.bench_peers", *(argv if argv is not None else sys.argv[1:])]
    text = report_markdown(rows, cfg, n_images, shown_argv, seconds, args.repeat, also)
    print()
    print(format_table(rows))
    print(f"\ntotal {seconds:.0f} s")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
