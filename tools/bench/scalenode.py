"""Section 13 of docs/benchmarks.md, ``scale-node``: one 8-GPU node's ranks reading real datasets of
1.28M and 10M tiny records (made by ``scale-data``), each rank a process with its own ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, all started together as torchrun would."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from tools.bench.common import header, row

TARGETS = {"uss_ratio": 1.25, "uss_add_mb": 8.0, "first_ratio": 1.5, "first_add_s": 0.2, "resume_s": 1.0}


def uss_kb(pid: int | str = "self") -> int:
    """A process's private memory (USS: private clean + dirty pages, kB); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean:", "Private_Dirty:")))
    except OSError:
        return 0


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def _count(batch: list[Any]) -> int:
    return len(batch)


def rank_child(path: str, workers: int, batches: int, batch_size: int) -> dict[str, Any]:
    """Child: this rank (from the environment) reads ``batches`` batches through a DataLoader;
    seconds to the first batch (from constructing the dataset), and each worker's USS at the end."""
    from torch.utils.data import DataLoader

    from packer.datasets import StreamingDataset

    t0 = time.perf_counter()
    ds = StreamingDataset(path, seed=1, output="numpy")
    loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=_count, prefetch_factor=2)
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    for _ in range(batches - 1):
        next(it)
    seconds = time.perf_counter() - t0
    uss = [uss_kb(p) / 1024 for p in _children(os.getpid())]
    return {"first_s": first, "seconds": seconds, "worker_uss_mb": uss, "rank_uss_mb": uss_kb() / 1024,
            "samples": len(ds)}


def resume_child(path: str, ranks: int, at: int) -> dict[str, Any]:
    """Child: rank 0 of ``ranks`` resumes at sample ``at`` of its epoch (:func:`tools.bench.scale.scale_resume`)."""
    from tools.bench.scale import scale_resume

    return scale_resume(path, at, ranks)


def open_child(path: str) -> dict[str, Any]:
    """Child: ``open_dataset``, ``targets`` and the first record; seconds and whether this process
    checked the sample table (the first open on the node) or found it stamped."""
    import packer.datasets as pd

    t0 = time.perf_counter()
    ds = pd.open_dataset(path)
    opened = time.perf_counter() - t0
    targets = ds.targets
    ds.read_record(len(ds) - 1)
    table = ds.sample_table()
    return {"open_s": opened, "ready_s": time.perf_counter() - t0, "checked_here": table.checked_here,
            "labels": len(targets), "uss_mb": uss_kb() / 1024}


def index_sizes(path: str) -> dict[str, Any]:
    """What a node holds for image + label training (page cache, shared): the sample table's
    labels section and the LMDB B-tree's branch pages, and what it does not need (keys)."""
    import lmdb

    env = lmdb.open(os.path.join(path, "data.mdb"), subdir=False, readonly=True, lock=False)
    st = env.stat()
    env.close()
    with open(os.path.join(path, "manifest.json")) as f:
        m = json.load(f)
    table = next(f for f in m["files"] if f["name"].endswith(".table"))
    n = m["num_samples"]
    return {"branch_mb": st["branch_pages"] * st["psize"] / 2**20, "labels_mb": 8 * n / 2**20,
            "table_mb": table["bytes"] / 2**20, "leaf_pages": st["leaf_pages"]}


CHILDREN = {
    "rank": lambda r: rank_child(r[0], int(r[1]), int(r[2]), int(r[3])),
    "resume": lambda r: resume_child(r[0], int(r[1]), int(r[2])),
    "open": lambda r: open_child(r[0]),
}


def _run(args: list[Any], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tools.bench_parts", "scale-node", "--child", *map(str, args)],
                            stdout=subprocess.PIPE, text=True, env=env)


def _answer(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = p.communicate()
    if p.returncode:
        raise SystemExit(f"child {p.args} failed with exit status {p.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def node(path: str, a: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one dataset: opens, 8 ranks together, resume."""
    stamps = os.path.join(a.root, "stamps")
    shutil.rmtree(stamps, ignore_errors=True)
    env = {**os.environ, "PACKER_CHECKED_DIR": stamps}
    got: dict[str, Any] = {"first_open": _answer(_run(["open", path], env)), "later_open": _answer(_run(["open", path], env))}
    ranks = [_run(["rank", path, a.workers, a.batches, a.batch_size],
                  {**env, "RANK": str(r), "WORLD_SIZE": str(a.ranks), "LOCAL_RANK": str(r),
                   "LOCAL_WORLD_SIZE": str(a.ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
             for r in range(a.ranks)]
    got["ranks"] = [_answer(p) for p in ranks]
    n = got["first_open"]["labels"]
    at = min(a.resume_at, n // a.ranks // 2)
    got["resume"] = {**_answer(_run(["resume", path, a.ranks, at], env)), "at": at}
    if not got["resume"]["same_sample"]:
        raise SystemExit(f"{path}: the resumed iteration did not start at sample {at} of the plan")
    got["index"] = index_sizes(path)
    print(f"# {json.dumps(got)}", file=sys.stderr)
    return got


def scale_node(a: argparse.Namespace) -> int:
    """One node of 8 ranks on real LMDB datasets of 1.28M and 10M tiny records (``scale-data``'s).

    Each rank is a process started with torchrun's variables (all at once, as on a node), reading
    ``--batches`` batches of ``--batch-size`` through a DataLoader of ``--workers`` workers (fork);
    the first batch is timed from constructing the ``StreamingDataset``, each worker's USS
    (private memory: what it holds of its own) is taken after the last batch. Opens: fresh
    processes, the first with a fresh stamp folder (it checks the sample table), then another.
    Resume: rank 0 of 8 halfway through its share (at most ``--resume-at``), checked against the plan."""
    if a.child:
        print(json.dumps(CHILDREN[a.child[0]](a.child[1:])))
        return 0
    rows = [(n, node(os.path.join(a.root, f"lmdb-{n}"), a)) for n in a.samples]
    header("samples", "open, first on the node / later (with targets and a read)",
           "index per node for image + label (table labels + LMDB branch pages; keys not read)",
           "first batch (slowest rank)", "worker USS (largest)", "resume (rank 0 of 8)")
    for n, g in rows:
        ix = g["index"]
        fo, lo = g["first_open"], g["later_open"]
        row(f"{n:,}", f"{fo['open_s'] * 1000:.0f} / {lo['open_s'] * 1000:.0f} ms ({fo['ready_s'] * 1000:.0f} / "
            f"{lo['ready_s'] * 1000:.0f} ms)",
            f"{ix['labels_mb'] + ix['branch_mb']:.0f} MB ({ix['labels_mb']:.0f} + {ix['branch_mb']:.1f}; table {ix['table_mb']:.0f} MB)",
            f"{max(r['first_s'] for r in g['ranks']):.2f} s",
            f"{max(max(r['worker_uss_mb']) for r in g['ranks']):.1f} MB",
            f"{g['resume']['resume_s'] * 1000:.0f} ms (at {g['resume']['at']:,})")
    if len(rows) >= 2:
        (_, s), (_, b) = rows[0], rows[-1]
        uss = [max(max(r["worker_uss_mb"]) for r in g["ranks"]) for g in (s, b)]
        first = [max(r["first_s"] for r in g["ranks"]) for g in (s, b)]
        ok_uss = uss[1] <= TARGETS["uss_ratio"] * uss[0] + TARGETS["uss_add_mb"]
        ok_first = first[1] <= TARGETS["first_ratio"] * first[0] + TARGETS["first_add_s"]
        print(f"\nworker USS {uss[0]:.1f} -> {uss[1]:.1f} MB (target <= {TARGETS['uss_ratio'] * uss[0] + TARGETS['uss_add_mb']:.1f}: "
              f"{'met' if ok_uss else 'over'}); first batch {first[0]:.2f} -> {first[1]:.2f} s (target <= "
              f"{TARGETS['first_ratio'] * first[0] + TARGETS['first_add_s']:.2f}: {'met' if ok_first else 'over'}); resume "
              f"{'met' if all(g['resume']['resume_s'] < TARGETS['resume_s'] for g in (s, b)) else 'over'} (< 1 s)")
    return 0


def _scale_node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="/tmp/packer-scale-data", help="scale-data's folder")
    p.add_argument("--samples", type=int, nargs="+", default=[1_281_167, 10_000_000])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--resume-at", type=int, default=500_000)
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)


SUBCOMMANDS = {"scale-node": (scale_node, _scale_node_args)}
