"""Datasets at web scale for section 13 of docs/benchmarks.md (``python -m tools.bench_parts scale-data``).

Two kinds, each made once and kept under ``--root`` (not in the repository):

- **real**: every sample a real record (a tiny JPEG, 8x8 to 16x16, its own by a comment holding
  its number; 1,000 classes; 25-byte keys) written by packer's own conversion engine and format
  writer (``write_packed``: the writer, the sample table written as a stream, the journal and
  the manifest), only the image decode and processing left out (the bytes are stored as they
  are, as ``--encode keep`` would). LMDB at 10M is ~9 GB and about ten minutes here.
- **simulated** (100M, 1B: ``scale-plan`` and ``scale-index``): only what is measured exists,
  the shard sizes of a plan, or a sample table written by ``write_table`` from numpy rows; no
  record is written or read, so those figures are the plan's and the table's own costs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from tools.bench.common import jpeg_bytes

CLASSES = [f"n{c:08d}" for c in range(1000)]


def tiny_jpegs(seed: int = 0) -> list[bytes]:
    """Five distinct small JPEGs (8x8 .. 16x16), the bases of every generated sample."""
    rng = np.random.default_rng(seed)
    out = []
    for side in (8, 10, 12, 14, 16):
        y, x = np.mgrid[0:side, 0:side]
        img = np.stack([x * 16, y * 16, (x + y) * 8], axis=-1) + rng.integers(0, 32, (side, side, 3))
        out.append(jpeg_bytes(np.clip(img, 0, 255).astype(np.uint8), 90))
    return out


def sample_label(i: int) -> int:
    """Sample ``i``'s class: spread over the 1,000 classes (not in stored order)."""
    return (i * 7919) % len(CLASSES)


def sample_key(i: int) -> str:
    """Sample ``i``'s key, 25 bytes as ImageNet's relative paths are about."""
    return f"n{sample_label(i):08d}/{i:010d}.JPEG"


def _items(n: int, start: int) -> Iterator[tuple[str, int, Any, None]]:
    from packer.images.imageproc import ProcessedImage

    bases = tiny_jpegs()
    sides = (8, 10, 12, 14, 16)
    for i in range(start, n):
        b = i % len(bases)
        payload = bases[b][:2] + b"\xff\xfe\x00\x0c%010d" % i + bases[b][2:]  # COM segment: its own bytes
        yield sample_key(i), sample_label(i), ProcessedImage("jpeg", payload, sides[b], sides[b]), None


def build_real(fmt: str, n: int, dst: str) -> dict[str, Any]:
    """Write ``n`` real tiny records at ``dst`` with packer's engine and ``fmt``'s writer; seconds
    and files (the caller measures the memory)."""
    from packer import __version__
    from packer.description.manifest import Manifest
    from packer.images.imageproc import Encoding, ProcessOptions
    from packer.pipeline.engine import ConvertOptions, write_packed

    processing = ProcessOptions(encoding=Encoding("keep", 0))
    template = Manifest(format=fmt, num_samples=0, classes=list(CLASSES), processing=processing.to_json(), files=[],
                        source={"kind": "generated", "generator": "tools.bench.scalegen", "samples": n},
                        created_by=f"packer {__version__}")
    opts = ConvertOptions(processing=processing, overwrite=True)
    t0 = time.perf_counter()
    manifest = write_packed(dst, fmt, _items(n, 0), template, opts, total=n, source="generated")
    return {"seconds": time.perf_counter() - t0, "samples": manifest.num_samples, "files": len(manifest.files),
            "bytes": sum(f.bytes for f in manifest.files)}


def kept(dst: str, n: int) -> bool:
    """Whether ``dst`` already holds a finished dataset of ``n`` samples."""
    try:
        with open(os.path.join(dst, "manifest.json")) as f:
            return json.load(f).get("num_samples") == n
    except (OSError, ValueError):
        return False



def _measured_build(fmt: str, n: int, dst: str) -> dict[str, Any]:
    from tools.bench.scale import TreeMemory

    with TreeMemory(os.getpid()) as memory:
        got = build_real(fmt, n, dst)
    return {**got, "tree_peak_mb": memory.peak[0] / 1024, "tree_anon_mb": memory.peak[1] / 1024}


def scale_data(a: Any) -> int:
    """Make the real scale datasets (tiny records through the engine and the writer), kept under --root.

    Each is made once (kept by later runs unless ``--rebuild``) in a fresh child process, whose
    peak RSS and peak anonymous RSS (heap: the conversion's own memory, not the file pages an LMDB
    writer maps) are printed with its time, as JSON lines."""
    from tools.bench.scale import run_child

    if a.child:
        print(json.dumps(_measured_build(a.child[0], int(a.child[1]), a.child[2])))
        return 0
    os.makedirs(a.root, exist_ok=True)
    for n in a.samples:
        dst = os.path.join(a.root, f"{a.format}-{n}")
        if kept(dst, n) and not a.rebuild:
            print(json.dumps({"path": dst, "kept": True}))
            continue
        got = run_child(a.format, n, dst, sub="scale-data")
        print(json.dumps({"path": dst, **got}), flush=True)
    return 0


def _scale_data_args(p: Any) -> None:
    p.add_argument("--root", default="/tmp/packer-scale-data", help="where the datasets are made and kept")
    p.add_argument("--format", default="lmdb", choices=["lmdb", "tar", "tfrecord", "hdf5"])
    p.add_argument("--samples", type=int, nargs="+", default=[1_281_167, 10_000_000])
    p.add_argument("--rebuild", action="store_true", help="make the datasets again")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)


SUBCOMMANDS = {"scale-data": (scale_data, _scale_data_args)}


def _merge_child(parts_root: str, count: int, dst: str) -> dict[str, Any]:
    from packer.operations.merge import merge
    from tools.bench.scale import TreeMemory

    parts = [os.path.join(parts_root, f"part-{p:05d}") for p in range(count)]
    with TreeMemory(os.getpid()) as memory:
        t0 = time.perf_counter()
        report = merge(parts, dst, overwrite=True)
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "samples": report.manifest.num_samples, "tree_peak_mb": memory.peak[0] / 1024,
            "tree_anon_mb": memory.peak[1] / 1024}


def scale_merge(a: Any) -> int:
    """A merge of many parts (``--parts``, e.g. 100 and 1,000) in bounded memory: peak RSS and anonymous RSS.

    One part of ``--part-samples`` real tiny records is made with ``scale-data``'s generator and
    hard-linked into ``max(--parts)`` part folders (the same records in each: merge reads every
    part's files whole, so they are real parts to it); each merge runs in a fresh child."""
    from tools.bench.common import header, row
    from tools.bench.scale import run_child

    if a.child:
        print(json.dumps(_merge_child(a.child[0], int(a.child[1]), a.child[2])))
        return 0
    root = os.path.join(a.root, f"parts-{a.format}")
    one = os.path.join(root, "part-00000")
    if not kept(one, a.part_samples):
        build_real(a.format, a.part_samples, one)
    for p in range(1, max(a.parts)):
        dst = os.path.join(root, f"part-{p:05d}")
        if not os.path.exists(dst):
            os.makedirs(dst)
            for name in os.listdir(one):
                os.link(os.path.join(one, name), os.path.join(dst, name))
    header("format", "parts", "samples", "merge", "peak RSS", "peak anonymous RSS")
    for count in a.parts:
        got = run_child(root, count, os.path.join(a.root, f"merged-{a.format}"), sub="scale-merge")
        row(a.format, f"{count:,}", f"{got['samples']:,}", f"{got['seconds']:.0f} s", f"{got['tree_peak_mb']:.0f} MB",
            f"{got['tree_anon_mb']:.0f} MB")
    return 0


def _scale_merge_args(p: Any) -> None:
    p.add_argument("--root", default="/tmp/packer-scale-data", help="where the parts are made and kept")
    p.add_argument("--format", default="lmdb", choices=["lmdb", "tar", "tfrecord", "hdf5"])
    p.add_argument("--parts", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--part-samples", type=int, default=1000)
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)


SUBCOMMANDS["scale-merge"] = (scale_merge, _scale_merge_args)
