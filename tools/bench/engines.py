"""Section 10 of docs/benchmarks.md, ``engines``: an image folder converted by Ray Data (a local
cluster of 2 CPUs, ``packer.ray.Sink``, one worker per write task) against packer's own 2-worker
conversion, side by side, alternating, as a speed ratio; the two results are checked equal."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys

from tools.bench.common import Subcommand, header, row, timed

PROCESSING = {"resize": "shorter:256", "encode": "jpeg:90"}

#: One Ray conversion, in a process of its own: cluster start, then the write timed alone.
RAY_RUN = """
import json, os, sys, time
import ray, packer
src, dst = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
ctx = ray.data.DataContext.get_current()
ctx.execution_options.preserve_order = True
ctx.enable_progress_bars = False
classes = sorted(os.listdir(src))
rows = [{"image": os.path.join(src, c, f), "label": c, "key": f"{c}/{f}"}
        for c in classes for f in sorted(os.listdir(os.path.join(src, c)))]
t1 = time.perf_counter()
ray.data.from_items(rows, override_num_blocks=2).write_datasink(
    packer.ray.Sink(dst, "tar", classes=classes, overwrite=True, resize="shorter:256", encode="jpeg:90"))
t2 = time.perf_counter()
print(json.dumps({"write": t2 - t1, "total": t2 - t0}))
"""


def _packer(src: str, dst: str) -> float:
    """Wall seconds of ``packer convert`` with 2 workers (the process's start included)."""
    cmd = [sys.executable, "-m", "packer", "convert", "imagefolder", "tar", src, dst, "--workers", "2",
           "--no-shuffle", "--overwrite", "-q", "--resize", PROCESSING["resize"], "--encode", PROCESSING["encode"],
           "--no-torchrun"]
    seconds, out = timed(lambda: subprocess.run(cmd, capture_output=True, text=True))
    if out.returncode:
        raise SystemExit(f"packer convert failed:\n{out.stderr[-2000:]}")
    return seconds


def _ray(src: str, dst: str) -> dict[str, float]:
    """The Ray run's seconds: ``write`` (the conversion) and ``total`` (cluster start included)."""
    import json

    out = subprocess.run([sys.executable, "-c", RAY_RUN, src, dst], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the Ray conversion failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _same(a: str, b: str) -> bool:
    """Whether two datasets hold the same samples in the same order (key, label, stored bytes)."""
    import packer

    x, y = packer.open_dataset(a), packer.open_dataset(b)
    if len(x) != len(y):
        return False
    for i in range(len(x)):
        p, q = x.read_record(i), y.read_record(i)
        if (p.key, p.label, bytes(p.payload)) != (q.key, q.label, bytes(q.payload)):
            return False
    return True


def engines(a: argparse.Namespace) -> int:
    """Ray Data (2 local CPUs) against packer's own 2-worker conversion of one image folder.

    SRC: an image folder (e.g. ``python ../shared/tools/make_imagefolder.py SRC --classes 4
    --per-class 500``). Each repeat runs ``packer convert --workers 2 --no-shuffle`` and a Ray
    conversion (rows of file paths, 2 write tasks of 1 worker each) to tar shards with
    ``--resize shorter:256 --encode jpeg:90``, alternating. Prints the median seconds and the
    speed ratio (packer's seconds / Ray's): for Ray's write alone, and with the cluster's start.
    """
    work = a.work or os.path.join(os.path.dirname(os.path.abspath(a.src)), "bench-engines")
    os.makedirs(work, exist_ok=True)
    own, by_ray = os.path.join(work, "own.tar"), os.path.join(work, "ray.tar")
    runs: dict[str, list[float]] = {"packer": [], "ray write": [], "ray total": []}
    for _ in range(a.repeats):
        runs["packer"].append(_packer(a.src, own))
        r = _ray(a.src, by_ray)
        runs["ray write"].append(r["write"])
        runs["ray total"].append(r["total"])
    n = len(packer_keys(own))
    base = statistics.median(runs["packer"])
    header("conversion", "images", "median s", "speed vs packer 2 workers")
    for name, seconds in runs.items():
        med = statistics.median(seconds)
        row(name, n, f"{med:.2f}", f"{base / med:.2f}x")
    print(f"\nsamples equal, in the same order: {_same(own, by_ray)}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def packer_keys(path: str) -> list[str]:
    """The dataset's sample keys."""
    import packer

    ds = packer.open_dataset(path)
    return [ds.read_record(i).key for i in range(len(ds))]


def _engines_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="an image folder")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", help="scratch folder (default: bench-engines beside SRC)")


SUBCOMMANDS: dict[str, Subcommand] = {"engines": (engines, _engines_args)}
