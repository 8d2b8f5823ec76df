"""Section 3 of docs/benchmarks.md, ``versions``: two revisions of packer side by side, conversion and
read speed."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from tools.bench.common import FORMATS, REPO, Subcommand, export, header, in_revision, row

VERSIONS_CONVERT = r'''
import json, sys, time
try:
    from packer.pipeline.engine import ConvertOptions, convert_imagefolder
except ImportError:  # revisions before packer/ops (0.1), where the engine was packer.engine
    from packer.engine import ConvertOptions, convert_imagefolder
from packer.images.imageproc import ProcessOptions, parse_resize
src, fmt, dst = sys.argv[1:4]
t = time.perf_counter()
rep = convert_imagefolder(src, dst, fmt, ConvertOptions(processing=ProcessOptions(resize=parse_resize("shorter:160")),
                                                        workers=2, progress=False))
print(json.dumps({"img_s": rep.manifest.num_samples / (time.perf_counter() - t)}))
'''

VERSIONS_READ = r'''
import json, sys, time
from packer.datasets import open_dataset
ds = open_dataset(sys.argv[1], output="numpy")
for i in range(len(ds)):
    ds.read_record(i)
rec = get = 1e9
for _ in range(3):
    t = time.perf_counter()
    for i in range(len(ds)):
        ds.read_record(i)
    rec = min(rec, time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(len(ds)):
        ds[i]
    get = min(get, time.perf_counter() - t)
import torch
loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2, collate_fn=len)
sum(loader)  # warm-up: worker start-up paths, page cache
epoch = 1e9
for _ in range(3):
    t = time.perf_counter()
    sum(loader)
    epoch = min(epoch, time.perf_counter() - t)
print(json.dumps({"rec_us": rec / len(ds) * 1e6, "get_us": get / len(ds) * 1e6, "loader_img_s": len(ds) / epoch}))
'''


def _versions_table(res: dict[tuple[str, str], list[dict]]) -> None:
    header("format", "convert img/s, old / new", "read_record us, old / new", "ds[i] us, old / new",
           "DataLoader (2 workers) img/s, old / new")
    for fmt in FORMATS:
        o, n = res[(fmt, "old")], res[(fmt, "new")]
        co, cn = max(r["img_s"] for r in o), max(r["img_s"] for r in n)
        ro, rn = min(r["rec_us"] for r in o), min(r["rec_us"] for r in n)
        go, gn = min(r["get_us"] for r in o), min(r["get_us"] for r in n)
        lo, ln = max(r["loader_img_s"] for r in o), max(r["loader_img_s"] for r in n)
        row(fmt, f"{co:.0f} / {cn:.0f} ({cn / co:.2f}x)", f"{ro:.1f} / {rn:.1f}",
            f"{go:.0f} / {gn:.0f} ({go / gn:.2f}x speed)", f"{lo:.0f} / {ln:.0f} ({ln / lo:.2f}x)")


def versions(a: argparse.Namespace) -> int:
    """Compare two revisions of packer side by side in one run: conversion speed and read speed.

    Each revision is exported with ``git archive`` into a temporary folder laid out as the
    installed package and run in subprocesses with that folder first on PYTHONPATH, so both run
    against the same Python and libraries. Conversions (ImageFolder of real photos from the
    workplace's shared photo set, ``shorter:160``, JPEG 90, 2 workers) and reads (``read_record``
    and ``ds[i]`` over every sample, and DataLoader epochs with 2 workers, best of 3) alternate
    between the revisions, round by round; the table gives the best of the rounds and the
    new/old ratio (machines drift 10-20% between runs, so only the ratio of one run means anything).
    """
    work = tempfile.mkdtemp(prefix="packer-versions-")
    try:
        libs = {v: export(rev, os.path.join(work, v)) for v, rev in (("old", a.old), ("new", a.new))}
        src = os.path.join(work, "src")
        subprocess.run([sys.executable, os.path.join(REPO, "..", "shared", "tools", "make_imagefolder.py"), src,
                        "--classes", "4", "--per-class", str(a.per_class)], check=True, capture_output=True)
        res: dict[tuple[str, str], list[dict]] = {}
        for rnd in range(a.rounds):
            for fmt in FORMATS:
                for v in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
                    dst = os.path.join(work, f"{v}-{fmt}")
                    shutil.rmtree(dst, ignore_errors=True)
                    got = in_revision(libs[v], "-c", VERSIONS_CONVERT, src, fmt, dst) | \
                        in_revision(libs[v], "-c", VERSIONS_READ, dst)
                    res.setdefault((fmt, v), []).append(got)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"old {a.old}, new {a.new}; {4 * a.per_class} images; best of {a.rounds} rounds\n")
    _versions_table(res)
    return 0


def _versions_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("old")
    p.add_argument("new", nargs="?", default="HEAD")
    p.add_argument("--per-class", type=int, default=100, help="images per class (4 classes)")
    p.add_argument("--rounds", type=int, default=2)


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"versions": (versions, _versions_args)}
