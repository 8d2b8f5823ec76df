"""What the benchmark sections share: timing, turns of interleaved rounds, Markdown tables, CPU
time, revisions of packer exported to run side by side, and the benchmarks' crop and JPEG bytes."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import cv2
import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORMATS = ("lmdb", "hdf5", "tar", "tfrecord")


# -- shared timing and reporting ----------------------------------------------------------------------
def timed(f: Callable[[], Any]) -> tuple[float, Any]:
    """(wall seconds, result) of one call of ``f``."""
    t0 = time.perf_counter()
    out = f()
    return time.perf_counter() - t0, out


def turns(items: Sequence[Any], turn: int) -> list[Any]:
    """``items`` rotated by ``turn``: methods that take turns start in a different place each
    time, so that no method is always first or last when the machine's load drifts."""
    k = turn % len(items)
    return list(items[k:]) + list(items[:k])


def usage(who: int) -> tuple[float, int]:
    """(user + system CPU seconds, minor page faults) of ``resource.getrusage(who)``."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (a DataLoader's exited workers)."""
    return usage(resource.RUSAGE_SELF)[0] + usage(resource.RUSAGE_CHILDREN)[0]


def header(*columns: str) -> None:
    """Print a Markdown table's header row and its separator."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def row(*cells: Any) -> None:
    """Print one Markdown table row at once (long runs show their progress)."""
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def name_of(path: str) -> str:
    """A dataset's folder name, for a table's first column."""
    return os.path.basename(path.rstrip("/"))


def export(rev: str, dest: str) -> str:
    """Git revision ``rev`` laid out as the installed package under ``dest``; returns the
    PYTHONPATH root (packer/, packer/converters, packer/datasets)."""
    src = os.path.join(dest, "src")
    os.makedirs(src)
    archive = subprocess.run(["git", "-C", REPO, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    lib = os.path.join(dest, "lib")
    shutil.copytree(os.path.join(src, "packer"), os.path.join(lib, "packer"))
    for sub in ("converters", "datasets"):
        shutil.copytree(os.path.join(src, sub), os.path.join(lib, "packer", sub))
    return lib


def in_revision(lib: str, *argv: str, tools: bool = False) -> dict:
    """``python argv`` in a fresh process importing packer from ``lib`` (and this script's
    package from this tree with ``tools``), run outside the tree; the JSON it prints last."""
    env = {**os.environ, "PYTHONPATH": lib + (os.pathsep + REPO if tools else "")}
    r = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if r.returncode:
        raise SystemExit(f"{lib}: {r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def revisions(revs: list[str], work: str) -> dict[str, str]:
    """Each of ``revs`` (a git revision, or a folder laid out as the installed package) -> its
    PYTHONPATH root, exported under ``work``."""
    return {rev: rev if os.path.isdir(rev) else export(rev, os.path.join(work, str(k))) for k, rev in enumerate(revs)}


def crop224(image: torch.Tensor) -> torch.Tensor:
    """The benchmarks' 224 center crop, as a transform."""
    from packer.datasets.encoded import center_crop

    return center_crop(image, 224)


def jpeg_bytes(bgr: np.ndarray, quality: int) -> bytes:
    """``bgr`` encoded as a JPEG of ``quality``."""
    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


#: A subcommand of ``python -m tools.bench_parts``: (what it runs, what adds its arguments); its
#: help is the first line of the runner's docstring.
Subcommand = tuple[Callable[[argparse.Namespace], int], Callable[[argparse.ArgumentParser], None]]
