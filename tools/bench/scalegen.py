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
import sys
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


def build_simulated_tar(n: int, dst: str, shard_samples: int = 10_000, member: int = 2048) -> dict[str, Any]:
    """A tar dataset of ``n`` samples at ``dst`` whose shards are sparse files (the size the writer
    would give ``member``-byte samples, no bytes on disk) and whose per-shard index files and
    sample table are real: offsets, sizes, labels and 25-byte keys as the writer lays them out,
    the index files' CRCs real, the images' zero (there are no image bytes to check)."""
    from packer import __version__
    from packer.description.manifest import FileEntry, Manifest, write_manifest
    from packer.description.placement import file_id
    from packer.description.samples import TABLE_NAME, write_table
    from packer.images.codecs import CODEC_IDS
    from packer.layouts.tar import INDEX_ENTRY, INDEX_SUFFIX, final_size, pack_index

    t0 = time.perf_counter()
    os.makedirs(dst, exist_ok=True)
    files: list[FileEntry] = []
    spill = np.dtype([("value", "<i8"), ("keylen", "<u4"), ("metalen", "<u4")])  # the table's spill rows
    fixed = np.memmap(os.path.join(dst, ".fixed"), spill, mode="w+", shape=(n,))
    with open(os.path.join(dst, ".keys"), "wb") as keys_out:
        for s, first in enumerate(range(0, n, shard_samples)):
            i = np.arange(first, min(n, first + shard_samples), dtype=np.int64)
            labels = (i * 7919) % len(CLASSES)
            keys = np.char.add(np.char.add("n", np.char.zfill(labels.astype(str), 8)),
                               np.char.add("/", np.char.add(np.char.zfill(i.astype(str), 10), ".JPEG"))).astype("S25")
            e = np.zeros(len(i), INDEX_ENTRY)
            e["offset"] = 512 + (i - first) * (member + 512)  # each image member after its 512-byte header
            e["size"], e["label"], e["height"], e["width"] = member, labels, 16, 16
            e["key_end"] = np.arange(1, len(i) + 1) * 25
            e["codec"], e["channels"] = CODEC_IDS["jpeg"], 3
            name = f"shard-{s:06d}"
            size = final_size(len(i) * (member + 512))
            with open(os.path.join(dst, name + ".tar"), "wb") as f:
                f.truncate(size)
            index = pack_index(first, e, keys.tobytes())
            with open(os.path.join(dst, name + INDEX_SUFFIX), "wb") as f:
                f.write(index)
            fid = file_id(s, keys[0].decode(), bytes(member))  # as a writer names the shard (its first sample)
            files += [FileEntry(name + ".tar", len(i), size, "", first, fid),
                      FileEntry(name + INDEX_SUFFIX, 0, len(index), "", first)]
            sl = slice(first, first + len(i))
            fixed["value"][sl], fixed["keylen"][sl], fixed["metalen"][sl] = labels, 25, 0
            keys_out.write(keys.tobytes())
    fixed.flush()
    del fixed
    for part in ("meta", "multi"):
        open(os.path.join(dst, "." + part), "wb").close()
    parts = [os.path.join(dst, "." + p) for p in ("fixed", "keys", "meta", "multi")]
    path = os.path.join(dst, TABLE_NAME)
    tid = write_table(path, "class", *parts)
    for p in parts:
        os.remove(p)
    files.append(FileEntry(TABLE_NAME, 0, os.path.getsize(path), "", 0, tid))  # bound by its id, not hashed
    write_manifest(dst, Manifest(format="tar", num_samples=n, classes=list(CLASSES), processing={"encoding": "keep"},
                                 files=files, source={"kind": "simulated", "generator": "tools.bench.scalegen"},
                                 created_by=f"packer {__version__}"))
    return {"seconds": time.perf_counter() - t0, "samples": n, "shards": len(files) // 2}


def _sim_open(path: str, lazy: bool, reads: int) -> dict[str, Any]:
    """Child: open the simulated tar (its index read lazily or loaded whole), read one sample and
    ``reads`` random ones (records, not decoded: the payloads are zeros); seconds and memory."""
    import packer.datasets.formats.shardindex as shardindex
    from tools.bench.scale import rss_kb
    from tools.bench.scalenode import uss_kb

    shardindex.LAZY_INDEX_SAMPLES = 1 if lazy else 1 << 62  # either way whatever the size
    import packer.datasets as pd

    anon0, uss0 = rss_kb(os.getpid())[1], uss_kb()
    t0 = time.perf_counter()
    ds = pd.open_dataset(path, verify=False)
    opened = time.perf_counter() - t0
    ds.read_record(len(ds) - 1)
    first = time.perf_counter() - t0
    ds.targets  # noqa: B018 - the labels, as a sampler would take them
    picks = np.random.default_rng(0).integers(0, len(ds), reads).tolist()
    t1 = time.perf_counter()
    for i in picks:
        ds.read_record(i)
    per_read = (time.perf_counter() - t1) / max(1, reads)
    t1 = time.perf_counter()
    for i in picks:  # again: every shard's index now checked in this process
        ds.read_record(i)
    again = (time.perf_counter() - t1) / max(1, reads)
    return {"open_s": opened, "first_s": first, "read_us": per_read * 1e6, "again_us": again * 1e6,
            "anon_mb": (rss_kb(os.getpid())[1] - anon0) / 1024, "uss_mb": (uss_kb() - uss0) / 1024,
            "lazy": ds._lazy is not None}


def scale_tar(a: Any) -> int:
    """A simulated tar dataset at 10M and 100M samples: open and reads with the index read where it lies or loaded whole.

    Shards are sparse files, index files and the sample table real (``build_simulated_tar``); kept
    under ``--root``. Each figure from a fresh child: ``open_dataset``, then the last sample read
    (its shard's index checked), then ``--reads`` random records (no decode; the payloads are
    zeros) twice: the first pass checks each shard's index it meets, the second finds them
    checked; memory is the child's growth (anonymous: its heap; USS: all it holds privately)."""
    from tools.bench.common import header, row
    from tools.bench.scale import run_child

    if a.child:
        print(json.dumps(_sim_open(a.child[0], a.child[1] == "lazy", int(a.child[2]))))
        return 0
    header("samples", "shards", "index", "open_dataset", "+ first read", "random read (first pass / again)",
           "heap growth", "USS growth")
    for n in a.samples:
        dst = os.path.join(a.root, f"simtar-{n}")
        if not kept(dst, n):
            made = build_simulated_tar(n, dst)
            print(f"# made {dst} in {made['seconds']:.0f} s", file=sys.stderr)
        for mode in ("lazy", "loaded"):
            if mode == "loaded" and n > a.max_loaded:
                row(f"{n:,}", f"{n // 10_000:,}", "loaded whole", "not run (above --max-loaded)", "", "", "", "")
                continue
            got = run_child(dst, mode, a.reads, sub="scale-tar")
            row(f"{n:,}", f"{n // 10_000:,}", "read where it lies" if got["lazy"] else "loaded whole",
                f"{got['open_s'] * 1000:,.0f} ms", f"{got['first_s'] * 1000:,.0f} ms",
                f"{got['read_us']:.0f} / {got['again_us']:.0f} us",
                f"{got['anon_mb']:,.1f} MB", f"{got['uss_mb']:,.1f} MB")
    return 0


def _scale_tar_args(p: Any) -> None:
    p.add_argument("--root", default="/tmp/packer-scale-data", help="where the simulated datasets are made and kept")
    p.add_argument("--samples", type=int, nargs="+", default=[10_000_000, 100_000_000])
    p.add_argument("--reads", type=int, default=2000)
    p.add_argument("--max-loaded", type=int, default=20_000_000, help="largest dataset whose index is also loaded whole")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)


SUBCOMMANDS["scale-tar"] = (scale_tar, _scale_tar_args)
