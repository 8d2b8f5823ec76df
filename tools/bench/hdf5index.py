"""Section 13 of docs/benchmarks.md, ``scale-hdf5-index``: the memory of processes opening a real
HDF5 dataset (made by ``scale-data --format hdf5``) with its index read into memory against
mapped where it lies, side by side: each process alone, then ``--ranks`` at once as one node's."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from tools.bench.common import header, row
from tools.bench.scalenode import uss_kb


def _status_kb(*names: str) -> list[int]:
    with open("/proc/self/status") as f:
        got = {line.split(":")[0]: int(line.split()[1]) for line in f if line.split(":")[0] in names}
    return [got.get(n, 0) for n in names]


def _child(path: str, mapped: str, hold: str) -> dict[str, Any]:
    """Child: open the dataset, read sample 0 and the targets; its memory after that. ``hold``: a
    file to wait for before answering (so that every rank of a node has it open at once)."""
    import packer.datasets.formats.hdf5 as hdf5
    from packer.datasets import open_dataset

    hdf5.MAP_INDEX = mapped == "1"
    anon0, file0 = _status_kb("RssAnon", "RssFile")
    t0 = time.perf_counter()
    ds = open_dataset(path, output="numpy")
    ds[0]
    opened = time.perf_counter() - t0
    len(ds.targets)
    peak, rss, anon, file_rss = _status_kb("VmHWM", "VmRSS", "RssAnon", "RssFile")
    if hold:  # every rank has it open: the pages that they share are no longer private
        with open(hold + f".{os.getpid()}", "w"):
            pass
        while not os.path.exists(hold):
            time.sleep(0.05)
    uss = uss_kb()
    return {"open_s": opened, "peak_mb": peak / 1024, "rss_mb": rss / 1024, "anon_mb": (anon - anon0) / 1024,
            "file_mb": (file_rss - file0) / 1024, "uss_mb": uss / 1024,
            "mapped": bool(ds._meta is not None and ds._meta.mapped)}


def _run(path: str, mapped: bool, ranks: int, hold: str) -> list[dict[str, Any]]:
    procs = [subprocess.Popen([sys.executable, "-m", "tools.bench_parts", "scale-hdf5-index", "--child", path,
                               "1" if mapped else "0", hold if ranks > 1 else ""], stdout=subprocess.PIPE, text=True)
             for _ in range(ranks)]
    if ranks > 1:
        while len([n for n in os.listdir(os.path.dirname(hold)) if n.startswith(os.path.basename(hold) + ".")]) < ranks:
            if any(p.poll() not in (None, 0) for p in procs):
                raise SystemExit("a child failed")
            time.sleep(0.05)
        open(hold, "w").close()
    out = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"child failed with exit status {p.returncode}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    if ranks > 1:
        for n in os.listdir(os.path.dirname(hold)):
            if n.startswith(os.path.basename(hold)):
                os.remove(os.path.join(os.path.dirname(hold), n))
    return out


def scale_hdf5_index(a: Any) -> int:
    """The HDF5 index read into memory against mapped: peak RSS, anonymous RSS and USS per process.

    Anonymous and file RSS: what opening the dataset added to the process's (after its imports);
    USS: private memory once every process of the row has the dataset open.
    Fresh processes open the dataset (``open_dataset``, one read, ``targets``) with the index read
    whole (``MAP_INDEX = False``, as before) and mapped (the default for a local plain file),
    taking turns; first one process alone, then ``--ranks`` processes at once (one node's ranks),
    each holding the dataset open until all have opened it. Page cache warm (one open first)."""
    if a.child:
        print(json.dumps(_child(*a.child)))
        return 0
    hold = os.path.join(os.path.dirname(os.path.abspath(a.path)), ".hdf5index-hold")
    _run(a.path, True, 1, hold)  # warm the page cache
    header("index", "processes", "open + 1 read", "peak RSS", "anonymous RSS added by open", "file RSS added",
           "USS", "USS, all")
    for turn in range(a.rounds):
        for mapped in ((False, True) if turn % 2 == 0 else (True, False)):
            for ranks in (1, a.ranks):
                got = _run(a.path, mapped, ranks, hold)
                assert all(g["mapped"] == mapped for g in got)
                worst = max(got, key=lambda g: g["peak_mb"])
                row("mapped" if mapped else "read", ranks, f"{max(g['open_s'] for g in got) * 1000:.0f} ms",
                    f"{worst['peak_mb']:.0f} MB", f"{worst['anon_mb']:.0f} MB", f"{worst['file_mb']:.0f} MB",
                    f"{max(g['uss_mb'] for g in got):.0f} MB", f"{sum(g['uss_mb'] for g in got):.0f} MB")
    return 0


def _args(p: Any) -> None:
    p.add_argument("path", nargs="?", default="/tmp/packer-scale-data/hdf5-1000000", help="an HDF5 dataset")
    p.add_argument("--ranks", type=int, default=4, help="processes at once for the node's row")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)


SUBCOMMANDS = {"scale-hdf5-index": (scale_hdf5_index, _args)}
