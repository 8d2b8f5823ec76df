"""Section 12 of docs/benchmarks.md, ``engines``: an image folder converted by Ray Data (a local
cluster of 2 CPUs, ``packer.ray.Sink``, one worker per write task) and by Spark local[2]
(``packer.spark.write``) against packer's own 2-worker conversion, side by side, alternating, as
speed ratios, with where Ray's time goes (until the first task runs, the tasks, the merge); the
results are checked equal. ``--baseline DIR`` also runs Ray with the packer tree in DIR (an
older checkout), in the same run, for a before/after."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

from tools.bench.common import Subcommand, header, row, timed

PROCESSING = {"resize": "shorter:256", "encode": "jpeg:90"}

#: Run first in every process of a baseline run (driver and Ray workers): the editable install's
#: finder is pointed at the baseline tree before packer is imported.
HOOK = """
import sys
ROOT = {root!r}


def use():
    for name, mod in list(sys.modules.items()):
        if name.startswith("__editable__") and hasattr(mod, "MAPPING"):
            mod.MAPPING.update({{"packer": ROOT + "/packer", "packer.datasets": ROOT + "/datasets",
                                "packer.converters": ROOT + "/converters"}})
"""

#: One Ray conversion, in a process of its own: cluster start, then the write timed alone; the
#: tasks report when they ran, the driver how long the merge took.
RAY_RUN = """
import json, os, sys, time
hook = sys.argv[3]
if hook:
    sys.path.insert(0, os.path.dirname(hook))
    import packer_baseline_hook
    packer_baseline_hook.use()
import ray
src, dst = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
env = {"worker_process_setup_hook": "packer_baseline_hook.use",
       "env_vars": {"PYTHONPATH": os.path.dirname(hook)}} if hook else None
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=env)
import packer
ctx = ray.data.DataContext.get_current()
ctx.execution_options.preserve_order = True
ctx.enable_progress_bars = False
if sys.argv[5]:  # as packer.ray.write() sets it
    ctx.op_resource_reservation_enabled = False
classes = sorted(os.listdir(src))
rows = [{"image": os.path.join(src, c, f), "label": c, "key": f"{c}/{f}"}
        for c in classes for f in sorted(os.listdir(os.path.join(src, c)))]
times = {}


class Timed(packer.ray.Sink):
    def write(self, blocks, ctx):
        import time as clock
        start = clock.time()
        out = super().write(blocks, ctx)
        out["ran"] = [start, clock.time(), packer.__file__]
        return out

    def on_write_complete(self, result):
        start = time.time()
        returns = result.write_returns if hasattr(result, "write_returns") else result
        times["tasks"] = [r.pop("ran") for r in returns if r]
        super().on_write_complete(result)
        times["merge"] = time.time() - start


if sys.argv[4]:  # warm: a small write first, so each worker has imported Ray Data and packer
    ray.data.from_items(rows[:4], override_num_blocks=2).write_datasink(
        packer.ray.Sink(dst + "-warm", "tar", classes=classes, overwrite=True, resize="shorter:256"))
t1, w1 = time.perf_counter(), time.time()
ray.data.from_items(rows, override_num_blocks=2).write_datasink(
    Timed(dst, "tar", classes=classes, overwrite=True, resize="shorter:256", encode="jpeg:90"))
t2, w2 = time.perf_counter(), time.time()
tasks = times["tasks"]
print(json.dumps({"write": t2 - t1, "total": t2 - t0, "to first task": min(s for s, _, _ in tasks) - w1,
                  "to last task": max(s for s, _, _ in tasks) - w1,
                  "tasks (longest)": max(e - s for s, e, _ in tasks),
                  "after last task": w2 - max(e for _, e, _ in tasks), "merge": times["merge"],
                  "code": tasks[0][2]}))
"""

#: Ray Data's own start on a fresh cluster, without packer: 2 tasks of a map that spins its core
#: for ``sys.argv[1]`` seconds, the reservation off as ``packer.ray.write`` sets it. Reports when
#: the tasks started after the call: what any Ray Data job pays before its first task runs.
RAY_BARE = """
import json, sys, time
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
import ray.data
ctx = ray.data.DataContext.get_current()
ctx.enable_progress_bars = False
ctx.op_resource_reservation_enabled = False
spin = float(sys.argv[1])


def busy(batch):
    import time as clock
    start = clock.time()
    while clock.time() - start < spin:
        pass
    batch["started"] = [start] * len(batch["x"])
    return batch


t1 = time.time()
rows = ray.data.from_items([{"x": i} for i in range(2)], override_num_blocks=2).map_batches(busy, batch_size=1).take_all()
t2 = time.time()
starts = [r["started"] for r in rows]
print(json.dumps({"write": t2 - t1, "to first task": min(starts) - t1, "to last task": max(starts) - t1}))
"""

#: One Spark local[2] conversion (rows of file paths, 2 partitions), the session's start apart.
SPARK_RUN = """
import json, os, sys, time
os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
import packer
src, dst = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.python.worker.reuse", "true").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
classes = sorted(os.listdir(src))
rows = [(os.path.join(src, c, f), c, f"{c}/{f}") for c in classes for f in sorted(os.listdir(os.path.join(src, c)))]
df = spark.sparkContext.parallelize(rows, 2).toDF(["image", "label", "key"])
t1 = time.perf_counter()
packer.spark.write(df, dst, "tar", key="key", classes=classes, overwrite=True, resize="shorter:256", encode="jpeg:90")
t2 = time.perf_counter()
spark.stop()
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


def _run(code: str, what: str, *args: str, cwd: str | None = None) -> dict[str, float]:
    """A conversion script's JSON line of seconds (run in ``cwd``: away from a source tree, the
    installed packer, or the baseline's, is the one imported)."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd)
    if out.returncode:
        raise SystemExit(f"the {what} conversion failed:\n{out.stderr[-3000:]}")
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
    """Ray Data and Spark (2 local CPUs each) against packer's own 2-worker conversion of one
    image folder.

    SRC: an image folder (e.g. ``python ../shared/tools/make_imagefolder.py SRC --classes 4
    --per-class 500``). Each repeat runs, alternating: ``packer convert --workers 2
    --no-shuffle``; a Ray conversion (rows of file paths, 2 write tasks of 1 worker each); with
    ``--baseline DIR`` the same Ray conversion with the packer tree in DIR; with ``--warm`` the
    Ray conversion after an untimed small write on the same cluster, and a Ray Data job without
    packer on a fresh cluster ("ray bare": 2 tasks that spin 1 s, Ray's own start until its
    tasks run, for comparison with the conversion's); with ``--spark`` a
    Spark local[2] conversion (2 partitions of file paths); all to tar shards with ``--resize
    shorter:256 --encode jpeg:90``. Prints the median seconds and the speed ratio (packer's
    seconds / the engine's): for the write alone and with the engine's start, and Ray's write
    split into the time until its first and last task started, its longest task, and the time
    after the last task ended (the merge among it).
    """
    src = a.src = os.path.abspath(a.src)
    work = os.path.abspath(a.work or os.path.join(os.path.dirname(src), "bench-engines"))
    os.makedirs(work, exist_ok=True)
    hook = ""
    if a.baseline:
        hook = os.path.join(work, "packer_baseline_hook.py")
        with open(hook, "w") as f:
            f.write(HOOK.format(root=os.path.abspath(a.baseline)))
    own = os.path.join(work, "own.tar")
    runs: dict[str, list[dict[str, float]]] = {"packer": []}
    outs = {"ray": os.path.join(work, "ray.tar"), "ray baseline": os.path.join(work, "base.tar"),
            "ray warm": os.path.join(work, "warm.tar"), "ray write()": os.path.join(work, "write.tar"),
            "spark": os.path.join(work, "spark.tar")}
    codes: dict[str, str] = {}
    for _ in range(a.repeats):
        runs["packer"].append({"write": _packer(a.src, own)})
        r = _run(RAY_RUN, "Ray", a.src, outs["ray"], "", "", "", cwd=work)
        codes["ray"] = str(r.pop("code"))
        runs.setdefault("ray", []).append(r)
        r = _run(RAY_RUN, "Ray write()", a.src, outs["ray write()"], "", "", "write", cwd=work)
        codes["ray write()"] = str(r.pop("code"))
        runs.setdefault("ray write()", []).append(r)
        if a.warm:
            r = _run(RAY_RUN, "Ray (warm)", a.src, outs["ray warm"], "", "warm", "write", cwd=work)
            codes["ray warm"] = str(r.pop("code"))
            runs.setdefault("ray warm", []).append(r)
            runs.setdefault("ray bare", []).append(_run(RAY_BARE, "Ray Data alone", "1.0", cwd=work))
        if hook:
            r = _run(RAY_RUN, "Ray baseline", a.src, outs["ray baseline"], hook, "", "", cwd=work)
            codes["ray baseline"] = str(r.pop("code"))
            runs.setdefault("ray baseline", []).append(r)
        if a.spark:
            runs.setdefault("spark", []).append(_run(SPARK_RUN, "Spark", a.src, outs["spark"], cwd=work))
    n = len(packer_keys(own))
    base = statistics.median(r["write"] for r in runs["packer"])
    header("conversion", "images", "median s", "speed vs packer 2 workers")
    for name, results in runs.items():
        for part in results[0]:
            med = statistics.median(r[part] for r in results)
            label = name if part == "write" else f"{name}: {part}"
            ratio = part in ("write", "total") and name != "ray bare"
            row(label, n if name != "ray bare" else 2, f"{med:.2f}", f"{base / med:.2f}x" if ratio else "")
    for name in runs:
        if name not in ("packer", "ray bare"):
            print(f"{name}: samples equal to packer's, in the same order: {_same(own, outs[name])}"
                  + (f" (packer from {os.path.dirname(codes[name])})" if name in codes else ""))
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
    p.add_argument("--spark", action="store_true", help="also convert with Spark local[2]")
    p.add_argument("--warm", action="store_true",
                   help="also time a Ray write on warm workers (a small write first, untimed), and Ray Data alone")
    p.add_argument("--baseline", help="also run Ray with the packer source tree in this folder (an older checkout)")
    p.add_argument("--work", help="scratch folder (default: bench-engines beside SRC)")


SUBCOMMANDS: dict[str, Subcommand] = {"engines": (engines, _engines_args)}
