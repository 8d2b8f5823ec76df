"""Section 13 of docs/benchmarks.md, ``scale-table``: the sample table's first open on a node and
the labels a node holds, table version 1 (one CRC over the whole file, int64 labels) against
version 3 (a CRC per section, labels checked at open, the narrowest label column), side by side in
one run: 10M real samples (an LMDB dataset made by ``scale-data``, and the same dataset with its
table rewritten as version 3) and 100M simulated ones (tables written from numpy rows)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Any

import numpy as np

from tools.bench.common import Subcommand, header, row, timed
from tools.bench.scale import mapped_kb, run_child

#: Pages of the LMDB B-tree's branch level that image + label training reads, per node (section 13,
#: ``scale-node``: 38.7 MB at 10M samples, ~4 bytes a sample).
BRANCH_MB = {10_000_000: 38.7, 100_000_000: 387.0}


def retable(src: str, dst: str) -> str:
    """``dst``: the dataset ``src`` (table version 1) with its sample table written again as the
    current version (its payload file hard-linked, the manifest's table entry updated). Reads the
    version 1 layout of docs/FORMATS.md with numpy; returns the new table's path."""
    from packer.description.manifest import file_sha256
    from packer.description.sections import SPILL_ROW, write_table

    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if name not in ("samples.table", "manifest.json") and not os.path.exists(os.path.join(dst, name)):
            os.link(os.path.join(src, name), os.path.join(dst, name))
    old = os.path.join(src, "samples.table")
    head = np.fromfile(old, "<u8", 5, offset=0)
    n, k, e = int(head[1]), int(head[3]), int(head[4])
    values = np.memmap(old, "<i8", "r", 48, (n,))
    key_ends = np.memmap(old, "<u8", "r", 48 + 8 * n, (n,))
    meta_ends = np.memmap(old, "<u8", "r", 48 + 16 * n, (n,))
    spill = {p: os.path.join(dst, f".{p}") for p in ("fixed", "keys", "meta", "multi")}
    fixed = np.memmap(spill["fixed"], SPILL_ROW, "w+", shape=(n,))
    for a in range(0, n, 1 << 22):
        b = min(n, a + (1 << 22))
        fixed["value"][a:b] = values[a:b]
        for column, ends in (("keylen", key_ends), ("metalen", meta_ends)):
            fixed[column][a:b] = np.diff(ends[a:b].astype(np.int64), prepend=int(ends[a - 1]) if a else 0)
    fixed.flush()
    del fixed
    with open(old, "rb") as f, open(spill["keys"], "wb") as keys, open(spill["meta"], "wb") as meta:
        f.seek(48 + 24 * n)
        for out, size in ((keys, k), (meta, e)):
            while size:
                data = f.read(min(size, 1 << 24))
                out.write(data)
                size -= len(data)
    open(spill["multi"], "wb").close()
    path = os.path.join(dst, "samples.table")
    tid = write_table(path, "class", spill["fixed"], spill["keys"], spill["meta"], spill["multi"])
    for p in spill.values():
        os.remove(p)
    with open(os.path.join(src, "manifest.json")) as f:
        manifest = json.load(f)
    entry = next(f for f in manifest["files"] if f["name"] == "samples.table")
    entry.update(bytes=os.path.getsize(path), sha256=file_sha256(path), id=tid)
    with open(os.path.join(dst, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return path


def first_open(path: str, samples: int) -> dict[str, Any]:
    """Child: open ``path`` (a dataset folder: ``open_dataset`` and its ``targets``; or a table
    file: ``SampleTable``), then read every label (their maximum: each label page touched);
    seconds, whether this process checked the table, and the table's pages this process maps."""
    from packer.datasets import open_dataset
    from packer.description.samples import SampleTable

    t0 = time.perf_counter()
    if os.path.isdir(path):
        ds = open_dataset(path)
        targets = ds.targets
        table, tpath = ds.sample_table(), os.path.join(path, "samples.table")
    else:
        fd = os.open(path, os.O_RDONLY)
        table, tpath = SampleTable(fd, path, samples), path
        os.close(fd)
        targets = table.targets
    opened = time.perf_counter() - t0
    # every label page touched, no cast (np.bincount would copy a narrow column to int64 first)
    counted, top = timed(lambda: int(targets.max()))
    return {"open_s": opened, "count_s": counted, "checked_here": table.checked_here, "dtype": str(targets.dtype),
            "labels_mb": mapped_kb(tpath) / 1024, "top": top}


def _evict(path: str) -> None:
    """Drop ``path``'s pages from the page cache (this file only: a cold first open)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def scale_table(a: argparse.Namespace) -> int:
    """The sample table's first open on a node, version 1 against version 3, and the labels a node
    holds for image + label training, at 10M real and 100M simulated samples, side by side.

    Version 1 is the datasets kept under ``--data`` (``lmdb-10000000`` made by ``scale-data``,
    ``table-100000000/samples.table`` by ``scale-index``), read only. Version 3 is written once under
    ``--root`` and kept: the 10M dataset with its table rewritten (payload hard-linked), and a 100M
    table from the same numpy rows as ``scale-index``'s. Each open is a fresh child: cold (the
    table's pages dropped from the page cache, a fresh stamp folder), warm first on the node (fresh
    stamps), and later (the stamps of the warm one); versions alternate within each."""
    if a.child:
        print(json.dumps(first_open(a.child[0], int(a.child[1]))))
        return 0
    cases = []
    for samples in a.samples:
        if samples == 10_000_000:
            old = os.path.join(a.data, f"lmdb-{samples}")
            new = os.path.join(a.root, f"lmdb3-{samples}")
            if not os.path.exists(os.path.join(new, "manifest.json")):
                seconds, _ = timed(lambda o=old, d=new: retable(o, d))
                print(f"# rewrote {old}'s table as version 3 in {seconds:.0f} s", file=sys.stderr)
            cases.append((samples, "real LMDB", [(1, old, os.path.join(old, "samples.table")),
                                                 (3, new, os.path.join(new, "samples.table"))]))
        else:
            old = os.path.join(a.data, f"table-{samples}", "samples.table")
            new = os.path.join(a.root, f"table3-{samples}", "samples.table")
            if not os.path.exists(new):
                made = run_child("simtable", samples, new, sub="scale-index")
                print(f"# wrote {new} in {made['seconds']:.0f} s", file=sys.stderr)
            cases.append((samples, "sim. table", [(1, old, old), (3, new, new)]))
    for _, _, versions in cases:  # settled, so that the first open leaves a stamp
        for version, _, table in versions:
            if version == 3 and time.time_ns() - os.stat(table).st_mtime_ns < 10**10:
                os.utime(table, ns=(time.time_ns() - 10**10,) * 2)
    time.sleep(2.1)
    header("samples", "table version", "table", "open", "checked here", "labels column", "read every label (max)",
           "labels mapped", "index per node, image + label")
    for samples, what, versions in cases:
        for when in ("cold, first on the node", "warm, first on the node", "later"):
            for version, path, table in versions:
                stamps = os.path.join(a.root, f"stamps-{samples}-{version}")
                if when != "later":
                    shutil.rmtree(stamps, ignore_errors=True)
                if when.startswith("cold"):
                    _evict(table)
                os.environ["PACKER_CHECKED_DIR"] = stamps
                got = run_child(path, samples, sub="scale-table")
                index = got["labels_mb"] + BRANCH_MB.get(samples, 0.0)
                row(f"{samples:,} ({what})", version, f"{os.path.getsize(table) / 2**20:,.0f} MiB",
                    f"{got['open_s'] * 1000:,.1f} ms ({when})", str(got["checked_here"]), got["dtype"],
                    f"{got['count_s'] * 1000:,.0f} ms", f"{got['labels_mb']:,.1f} MB",
                    f"{index:,.0f} MB (+ LMDB branch pages {BRANCH_MB.get(samples, 0.0):,.0f})")
    return 0


def _scale_table_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="/tmp/packer-scale-data", help="the version 1 datasets (scale-data, scale-index)")
    p.add_argument("--root", default="/tmp/packer-scale-table3", help="where the version 3 copies are written and kept")
    p.add_argument("--samples", type=int, nargs="+", default=[10_000_000, 100_000_000])
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"scale-table": (scale_table, _scale_table_args)}
