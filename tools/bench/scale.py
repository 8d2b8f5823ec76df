"""Section 8 of docs/benchmarks.md, ``scale``: what ImageNet-size metadata (1,281,167 samples) costs to
open, hold, plan and resume, each figure in a fresh child process."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

from tools.bench.common import FORMATS, Subcommand, header, jpeg_bytes, row, timed

IMAGENET = 1_281_167
SCALE_SMALL = 100_000
BASELINE = 1_000  # samples of the dataset whose worker memory is subtracted (index-free baseline)
CLASSES = [f"n{c:08d}" for c in range(1000)]
TARGETS = {"open_s": 1.0, "index_mb": 64.0, "plan_s": 0.5, "resume_s": 1.0}


class TinyItems(Sequence):
    """``n`` items ``(jpeg bytes, class name, None)`` made on demand: five distinct 8x8 .. 16x16
    JPEGs, each item's own by a JPEG comment holding its number (so every payload differs)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.n = n
        self.bases = []
        for side in (8, 10, 12, 14, 16):
            y, x = np.mgrid[0:side, 0:side]
            img = np.stack([x * 16, y * 16, (x + y) * 8], axis=-1) + rng.integers(0, 32, (side, side, 3))
            self.bases.append(jpeg_bytes(np.clip(img, 0, 255).astype(np.uint8), 90))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.n))]
        if not 0 <= i < self.n:
            raise IndexError(i)
        base = self.bases[i % len(self.bases)]
        comment = b"\xff\xfe\x00\x0c%010d" % i  # COM segment: length 12 = 2 + ten digits
        return base[:2] + comment + base[2:], CLASSES[(i * 7919) % len(CLASSES)], None


def scale_build(fmt: str, n: int, dst: str, workers: int) -> dict[str, Any]:
    """Child: convert ``n`` tiny items; seconds, size and the process tree's peak memory."""
    from packer.images.imageproc import Encoding, ProcessOptions
    from packer.pipeline.engine import ConvertOptions
    from packer.pipeline.items import convert_items

    opts = ConvertOptions(processing=ProcessOptions(encoding=Encoding("keep", 0)), workers=workers, overwrite=True)
    with TreeMemory(os.getpid()) as memory:
        t0 = time.perf_counter()
        report = convert_items(TinyItems(n), dst, fmt, opts, CLASSES)
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "samples": report.manifest.num_samples, "files": len(report.manifest.files),
            "bytes": sum(f.bytes for f in report.manifest.files), "tree_peak_mb": memory.peak[0] / 1024,
            "tree_anon_mb": memory.peak[1] / 1024}


def scale_open(path: str) -> dict[str, Any]:
    """Child: time to open, to read the last sample, per random read; resident memory."""
    import packer.datasets as pd

    opened, ds = timed(lambda: pd.open_dataset(path))
    first, _ = timed(lambda: ds.read_record(len(ds) - 1))
    t0 = time.perf_counter()
    for i in np.random.default_rng(0).integers(0, len(ds), 1000).tolist():
        ds.read_record(i)
    per_read = (time.perf_counter() - t0) / 1000
    return {"open_s": opened, "first_read_s": first, "read_us": per_read * 1e6, "rss_mb": _own_kb("VmRSS") / 1024}


class _Probe:
    """Reads sample i of the packed dataset and answers with this worker's PSS (kB)."""

    def __init__(self, path: str) -> None:
        import packer.datasets as pd

        self.ds = pd.open_dataset(path, output="numpy")

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[int, int]:
        self.ds[i]
        from torch.utils.data import get_worker_info

        return get_worker_info().id, _pss_kb()


def scale_pss(path: str, context: str, reads: int, workers: int) -> dict[str, Any]:
    """Child: each DataLoader worker's PSS after ``reads`` random reads."""
    probe = _Probe(path)
    order = np.random.default_rng(1).integers(0, len(probe), reads).tolist()
    loader = DataLoader(probe, batch_size=None, sampler=order, num_workers=workers, multiprocessing_context=context)
    last: dict[int, int] = {}
    t0 = time.perf_counter()
    for worker, pss in loader:
        last[int(worker)] = int(pss)
    return {"pss_mb": [last[w] / 1024 for w in sorted(last)], "seconds": time.perf_counter() - t0}


def scale_plan(path: str, world_size: int, workers: int, epochs: int) -> dict[str, Any]:
    """Child: time to construct a ``StreamingDataset`` and to plan each epoch."""
    from packer.datasets import StreamingDataset
    from packer.datasets.world import World

    build, ds = timed(lambda: StreamingDataset(path, world=World(0, world_size, 0, workers), seed=1))
    times = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        times.append(timed(lambda: iter(ds))[0])  # the plan is made when the iterator is
    return {"construct_s": build, "plan_s": sorted(times)[len(times) // 2], "plan_max_s": max(times),
            "per_worker": len(ds) // workers}


def scale_resume(path: str, at: int, ranks: int = 1) -> dict[str, Any]:
    """Child: rank 0 of ``ranks`` resumes at sample ``at`` of its epoch and reads it; seconds, and
    whether it is the sample the epoch plan (the one ``StreamingDataset`` follows) puts there."""
    from packer.datasets import StreamingDataset
    from packer.datasets.partition import epoch_plan
    from packer.datasets.world import World

    world = World(0, ranks, 0, 1)
    state = StreamingDataset(path, world=world, seed=1).state_dict(samples_consumed=at)
    t0 = time.perf_counter()
    ds = StreamingDataset(path, world=world, seed=1, output="numpy")
    ds.load_state_dict(state)
    image, label = next(iter(ds))
    seconds = time.perf_counter() - t0
    o = ds.options
    want = int(epoch_plan(ds._sizes, world, seed=1, epoch=0, shuffle=True, partition=o.partition,
                          buffer_size=o.shuffle_buffer, batch_size=1).take(at, at + 1)[0])
    rec = ds.reader.read_record(want)
    return {"resume_s": seconds, "same_sample": bool(label == rec.label and image.shape[:2] == (rec.height, rec.width))}


def _own_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _pss_kb(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def rss_kb(pid: int) -> tuple[int, int]:
    """(resident kB, of which anonymous: heap and stacks, not file pages such as an mmapped LMDB)."""
    out = {"VmRSS": 0, "RssAnon": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in out:
                    out[key] = int(line.split()[1])
    except OSError:
        pass
    return out["VmRSS"], out["RssAnon"]


class TreeMemory:
    """Peak RSS and peak anonymous RSS (kB) of a process and its descendants while the ``with``
    block runs, sampled every 20 ms by a thread (the conversion alone: not the interpreter's exit)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.done = pid, [0, 0], threading.Event()

    def _watch(self) -> None:
        while not self.done.wait(0.02):
            sizes = [rss_kb(p) for p in _tree(self.pid)]
            self.peak[0] = max(self.peak[0], sum(r for r, _ in sizes))
            self.peak[1] = max(self.peak[1], sum(a for _, a in sizes))

    def __enter__(self) -> TreeMemory:
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def _uss_kb() -> int:
    """This process's private memory (USS, kB)."""
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean:", "Private_Dirty:")))


def simulated_plan(samples: int, ranks: int, workers: int, order: int, skip: int) -> dict[str, Any]:
    """Child: worker 0 of rank 0's plan of epoch 0 over ``samples`` simulated samples in shards of
    1,000 (shard sizes only: no records), made and its first 4,096 indices computed; seconds and
    the growth of peak RSS and of USS over the process before it."""
    import resource

    from packer.datasets.partition import World, epoch_plan, plan

    sizes = np.full(-(-samples // 1000), 1000, dtype=np.int64)
    sizes[-1] = samples - 1000 * (len(sizes) - 1)
    world = World(0, ranks, 0, workers)
    args = dict(seed=1, epoch=0, shuffle=True, partition="pad", buffer_size=65536, batch_size=64, skip=skip)
    rss0, uss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, _uss_kb()
    t0 = time.perf_counter()
    if order == 1:
        got = plan(sizes, world, order=1, **args)
        first = got[:4096]
    else:
        got = epoch_plan(sizes, world, **args)
        first = got.take(0, 4096)
    seconds = time.perf_counter() - t0
    assert len(first) == min(4096, len(got))
    return {"plan_s": seconds, "rss_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024,
            "uss_mb": (_uss_kb() - uss0) / 1024, "per_worker": len(got)}


def simulated_table(samples: int, path: str) -> dict[str, Any]:
    """Child: a sample table of ``samples`` class labels (1,000 classes in stored order) and 25-byte
    keys, written by ``write_table`` from spill files made with numpy (no records, no images)."""
    from packer.description.samples import write_table

    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    spill = np.dtype([("value", "<i8"), ("keylen", "<u4"), ("metalen", "<u4")])  # the spill rows' layout
    fixed = np.memmap(os.path.join(folder, "fixed"), spill, mode="w+", shape=(samples,))
    t0 = time.perf_counter()
    with open(os.path.join(folder, "keys"), "wb") as keys:
        for a in range(0, samples, 1 << 22):
            i = np.arange(a, min(samples, a + (1 << 22)))
            fixed["value"][a:len(i) + a], fixed["keylen"][a:len(i) + a], fixed["metalen"][a:len(i) + a] = i * 1000 // samples, 25, 0
            keys.write(np.char.add(np.char.add("n", np.char.zfill((i * 1000 // samples).astype(str), 8)),
                                   np.char.add("/", np.char.add(np.char.zfill(i.astype(str), 10), ".JPEG"))).astype("S25").tobytes())
    fixed.flush()
    del fixed
    for name in ("meta", "multi"):
        open(os.path.join(folder, name), "wb").close()
    parts = [os.path.join(folder, name) for name in ("fixed", "keys", "meta", "multi")]
    write_table(path, "class", *parts)
    for part in parts:
        os.remove(part)
    return {"seconds": time.perf_counter() - t0, "bytes": os.path.getsize(path)}


def table_open(path: str, samples: int) -> dict[str, Any]:
    """Child: open the sample table, take ``targets`` and read 1,000 random keys; seconds, and the
    growth of this process's anonymous memory (heap: what it holds of its own) and its mapped table
    pages (the file's RSS here: page cache, one copy for every process of the node)."""
    from packer.description.samples import SampleTable

    anon0 = rss_kb(os.getpid())[1]
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    table = SampleTable(fd, path, samples)
    os.close(fd)
    opened = time.perf_counter() - t0
    seconds, targets = timed(lambda: table.targets)
    counts = np.bincount(targets[:: max(1, samples // 1_000_000)], minlength=1000)  # touches a sample of the labels
    keys_s, _ = timed(lambda: [table.keys[i] for i in np.random.default_rng(0).integers(0, samples, 1000).tolist()])
    return {"open_s": opened, "checked_here": table.checked_here, "targets_s": seconds, "keys_ms": keys_s * 1000,
            "anon_mb": (rss_kb(os.getpid())[1] - anon0) / 1024, "mapped_mb": mapped_kb(path) / 1024, "classes": int((counts > 0).sum())}


def mapped_kb(path: str) -> int:
    """Resident kB of this process's mappings of ``path`` (its pages in the page cache)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0]:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


SCALE_CHILDREN: dict[str, Callable[[list[str]], dict[str, Any]]] = {
    "simplan": lambda r: simulated_plan(*map(int, r)),
    "simtable": lambda r: simulated_table(int(r[0]), r[1]),
    "tableopen": lambda r: table_open(r[0], int(r[1])),
    "build": lambda r: scale_build(r[0], int(r[1]), r[2], int(r[3])),
    "open": lambda r: scale_open(r[0]),
    "pss": lambda r: scale_pss(r[0], r[1], int(r[2]), int(r[3])),
    "plan": lambda r: scale_plan(r[0], int(r[1]), int(r[2]), int(r[3])),
    "resume": lambda r: scale_resume(r[0], int(r[1])),
}


def run_child(*args: Any, sub: str = "scale") -> dict[str, Any]:
    """Run ``SUB --child args`` in a fresh interpreter; its JSON answer."""
    out = subprocess.run([sys.executable, "-m", "tools.bench_parts", sub, "--child", *map(str, args)],
                         stdout=subprocess.PIPE, text=True)
    if out.returncode:
        raise SystemExit(f"child {args} failed with exit status {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _scale_dataset(root: str, fmt: str, n: int, workers: int, rebuild: bool) -> tuple[str, dict[str, Any] | None]:
    """The dataset of ``n`` samples under ``root`` (built unless kept from an earlier run)."""
    path = os.path.join(root, f"{fmt}-{n}")
    if not rebuild and os.path.exists(os.path.join(path, "manifest.json")):
        with open(os.path.join(path, "manifest.json")) as f:
            if json.load(f).get("num_samples") == n:
                return path, None
    shutil.rmtree(path, ignore_errors=True)
    built = run_child("build", fmt, n, path, workers)
    print(f"# built {path}: {built['samples']} samples, {built['files']} files, {built['bytes'] / 2**20:.0f} MiB "
          f"in {built['seconds']:.0f} s, process tree peak RSS {built['tree_peak_mb']:.0f} MB "
          f"(anonymous {built['tree_anon_mb']:.0f} MB)", file=sys.stderr)
    return path, built


def scale_measure(root: str, fmt: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one format."""
    small, small_built = _scale_dataset(root, fmt, args.small, args.workers, args.rebuild)
    big, big_built = _scale_dataset(root, fmt, args.samples, args.workers, args.rebuild)
    base, _ = _scale_dataset(root, fmt, BASELINE, args.workers, args.rebuild)
    got: dict[str, Any] = {"format": fmt}
    if small_built and big_built:
        got["convert_mb"] = (small_built["tree_peak_mb"], big_built["tree_peak_mb"])
        got["convert_anon_mb"] = (small_built["tree_anon_mb"], big_built["tree_anon_mb"])
        got["convert_rate"] = big_built["samples"] / big_built["seconds"]
    opened = run_child("open", big)
    got.update(open_s=opened["open_s"], first_read_s=opened["first_read_s"], read_us=opened["read_us"])
    for ctx in ("fork", "forkserver"):
        pss_big = run_child("pss", big, ctx, args.reads, args.loader_workers)["pss_mb"]
        pss_base = run_child("pss", base, ctx, args.reads, args.loader_workers)["pss_mb"]
        got[f"pss_{ctx}"] = (max(pss_big), max(b - a for a, b in zip(pss_base, pss_big)))
    planned = run_child("plan", big, 1, args.loader_workers, 3)
    got.update(construct_s=planned["construct_s"], plan_s=planned["plan_max_s"])
    resumed = run_child("resume", big, args.resume_at)
    if not resumed["same_sample"]:
        raise SystemExit(f"{fmt}: the resumed iteration did not start at sample {args.resume_at} of the plan")
    got["resume_s"] = resumed["resume_s"]
    print(f"# {json.dumps(got)}", file=sys.stderr)
    return got


def _pair(mb: tuple[float, float] | None) -> str:
    return f"{mb[0]:.0f} -> {mb[1]:.0f} MB" if mb else "kept from an earlier run"


def _mark(value: float, target: float) -> str:
    return "" if value < target else " (over)"


def scale_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Print the table of every format's figures, each marked where it is over its target."""
    header("format", "open_dataset", "first read", "index PSS per worker, fork (worker PSS)",
           "index PSS per worker, forkserver (worker PSS)", "StreamingDataset()", "plan per epoch per worker",
           f"resume at {args.resume_at:,}", f"conversion peak RSS {args.small // 1000}k -> {args.samples / 1e6:.2f}M",
           "of which anonymous")
    for r in rows:
        row(r["format"], f"{r['open_s'] * 1000:.0f} ms{_mark(r['open_s'], TARGETS['open_s'])}",
            f"{r['first_read_s'] * 1000:.0f} ms",
            f"{r['pss_fork'][1]:.1f} MB{_mark(r['pss_fork'][1], TARGETS['index_mb'])} ({r['pss_fork'][0]:.0f} MB)",
            f"{r['pss_forkserver'][1]:.1f} MB{_mark(r['pss_forkserver'][1], TARGETS['index_mb'])} "
            f"({r['pss_forkserver'][0]:.0f} MB)",
            f"{r['construct_s'] * 1000:.0f} ms", f"{r['plan_s'] * 1000:.0f} ms{_mark(r['plan_s'], TARGETS['plan_s'])}",
            f"{r['resume_s'] * 1000:.0f} ms{_mark(r['resume_s'], TARGETS['resume_s'])}",
            _pair(r.get("convert_mb")), _pair(r.get("convert_anon_mb")))


def scale(a: argparse.Namespace) -> int:
    """ImageNet-size metadata: what 1,281,167 samples cost to open, hold, plan and resume.

    A dataset of 1,281,167 tiny samples made through ``convert_items`` from generated bytes, and
    what its size costs to open, to hold in DataLoader workers, to plan and to resume, and what
    the conversion's memory does between 100k and 1.28M samples. Every figure is measured in a
    fresh child process (``--child``), so one measure's memory or open handles never reach the
    next. The datasets are kept under ``--root`` and reused by a later run (``--rebuild`` makes
    them again); run from the repository root (the children run ``python -m tools.bench_parts``).
    """
    if a.child:
        print(json.dumps(SCALE_CHILDREN[a.child[0]](a.child[1:])))
        return 0
    os.makedirs(a.root, exist_ok=True)
    scale_table([scale_measure(a.root, fmt, a) for fmt in a.formats], a)
    return 0


PLAN_GRID = [(10_000_000, 64, 8), (100_000_000, 64, 8), (100_000_000, 8, 8), (100_000_000, 1, 8),
             (1_000_000_000, 64, 8)]


def scale_plan_table(a: argparse.Namespace) -> int:
    """A billion samples: one worker's plan, order 1 (materialised) against order 2 (computed),
    at 10M, 100M and 1B simulated samples (shard sizes only, shards of 1,000), each figure in a
    fresh child; order 1 is skipped where it would take more than ``--max-old`` samples per rank."""
    if a.child:
        print(json.dumps(SCALE_CHILDREN[a.child[0]](a.child[1:])))
        return 0
    header("samples", "ranks x workers", "order", "plan + first 4,096 indices", "peak RSS growth", "USS growth",
           f"resume at {a.resume_at:,}: plan + first 4,096")
    for samples, ranks, workers in PLAN_GRID:
        for order in (1, 2):
            if order == 1 and samples // ranks > a.max_old:
                row(f"{samples:,}", f"{ranks} x {workers}", "1", "not run (see below)", "", "", "")
                continue
            got = run_child("simplan", samples, ranks, workers, order, 0)
            at = min(a.resume_at, -(-samples // ranks) // 2)  # a rank of 64 holds fewer than 5M
            resumed = run_child("simplan", samples, ranks, workers, order, at)
            row(f"{samples:,}", f"{ranks} x {workers}", str(order), f"{got['plan_s'] * 1000:.0f} ms",
                f"{got['rss_mb']:.1f} MB", f"{got['uss_mb']:.1f} MB", f"{resumed['plan_s'] * 1000:.0f} ms (at {at:,})")
    return 0


def _scale_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--resume-at", type=int, default=5_000_000)
    p.add_argument("--max-old", type=int, default=20_000_000, help="largest rank (samples) order 1 is run for")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)


def _scale_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="/tmp/packer-scale", help="where the datasets are made and kept")
    p.add_argument("--formats", nargs="+", default=["lmdb", "tar"], choices=FORMATS)
    p.add_argument("--samples", type=int, default=IMAGENET)
    p.add_argument("--small", type=int, default=SCALE_SMALL, help="the smaller dataset of the conversion-memory check")
    p.add_argument("--workers", type=int, default=1, help="conversion worker processes")
    p.add_argument("--loader-workers", type=int, default=2, help="DataLoader workers of the memory and plan checks")
    p.add_argument("--reads", type=int, default=4000, help="random samples the DataLoader reads per memory check")
    p.add_argument("--resume-at", type=int, default=1_000_000)
    p.add_argument("--rebuild", action="store_true", help="make the datasets again")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)


def scale_index_table(a: argparse.Namespace) -> int:
    """The sample table per node: the first open on a node (checks the whole file) against every
    later one (ranks and workers: the node's stamp), at 10M and 100M simulated samples.

    Each table is written once under ``--root`` (labels and 25-byte keys; no records) and kept;
    each open is a fresh child with a fresh stamp folder for the first and the same for the
    others. The page cache is warm (the table was just written or read)."""
    if a.child:
        print(json.dumps(SCALE_CHILDREN[a.child[0]](a.child[1:])))
        return 0
    header("samples", "table", "open", "checked here", "targets", "1,000 random keys", "anonymous memory growth",
           "table pages mapped")
    for samples in a.samples:
        path = os.path.join(a.root, f"table-{samples}", "samples.table")
        if not os.path.exists(path):
            made = run_child("simtable", samples, path)
            print(f"# wrote {path}: {made['bytes'] / 2**20:,.0f} MiB in {made['seconds']:.0f} s", file=sys.stderr)
        os.environ["PACKER_CHECKED_DIR"] = stamps = os.path.join(a.root, f"stamps-{samples}")
        shutil.rmtree(stamps, ignore_errors=True)
        os.utime(path, ns=(time.time_ns() - 10**10,) * 2)  # settled: a table written seconds ago is stamped too
        time.sleep(2.1)  # its change time, which utime set to now, must settle as well
        for when in ("first on the node", "every later one"):
            got = run_child("tableopen", path, samples)
            row(f"{samples:,}", f"{os.path.getsize(path) / 2**20:,.0f} MiB", f"{got['open_s'] * 1000:,.1f} ms ({when})",
                str(got["checked_here"]), f"{got['targets_s'] * 1000:.2f} ms", f"{got['keys_ms']:.1f} ms",
                f"{got['anon_mb']:.1f} MB", f"{got['mapped_mb']:,.1f} MB")
    return 0


def _scale_index_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="/tmp/packer-scale-index", help="where the tables are written and kept")
    p.add_argument("--samples", type=int, nargs="+", default=[10_000_000, 100_000_000])
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"scale": (scale, _scale_args), "scale-plan": (scale_plan_table, _scale_plan_args),
                                      "scale-index": (scale_index_table, _scale_index_args)}
