"""Section 9 of docs/benchmarks.md, ``distributed``: conversion across torchrun ranks against one
process, the cost of ``merge``, and the scaling model."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys

import numpy as np

from tools.bench.common import FORMATS, Subcommand, header, jpeg_bytes, row, timed

ENV_DROP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
PROCESSING = ["--resize", "shorter:128", "--encode", "jpeg:90"]
ONE, TWO = "1 process x 2 workers", "2 ranks x 1 worker"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dist_source(root: str, images: int) -> str:
    """An image folder of ``images`` smooth 240 x 320 JPEGs in 10 classes (kept between runs)."""
    from tools.sample_images import make_folder

    src = os.path.join(root, f"src-{images}")
    if not os.path.isdir(src):
        per = images // 10
        make_folder(src + ".tmp", {f"c{c}": [(f"{c}-{i}.jpg", 240, 320) for i in range(per)] for c in range(10)})
        os.rename(src + ".tmp", src)
    return src


def timed_command(cmd: list[str]) -> float:
    """Wall seconds of ``cmd`` run outside any torchrun job this runs in."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    seconds, out = timed(lambda: subprocess.run(cmd, capture_output=True, text=True, env=env))
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return seconds


def conversions(srcs: list[str], root: str, fmt: str, repeats: int) -> dict[tuple[str, str], list[float]]:
    """Seconds of each run, per (configuration, source): one process with 2 workers, 2 torchrun
    ranks with 1 worker each, alternating."""
    dst = os.path.join(root, f"out.{fmt}")
    runs: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeats):
        for src in srcs:
            convert = ["-m", "packer", "convert", "imagefolder", fmt, src, dst, "--overwrite", "-q", *PROCESSING]
            runs.setdefault((ONE, src), []).append(
                timed_command([sys.executable, *convert, "--workers", "2", "--no-torchrun"]))
            runs.setdefault((TWO, src), []).append(
                timed_command([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                               f"--master_port={_port()}", *convert, "--workers", "1"]))
    shutil.rmtree(dst, ignore_errors=True)
    return runs


def merge_cost(root: str, fmt: str, parts: int, per_part: int, link: bool = False) -> tuple[float, float]:
    """(stored GB, seconds) of merging ``parts`` parts of ``per_part`` 256 x 256 JPEGs (~70 kB);
    ``link``: shards hard-linked, as a torchrun conversion merges."""
    from packer.images.imageproc import Encoding, ProcessOptions
    from packer.operations.merge import merge
    from packer.pipeline.engine import ConvertOptions
    from packer.pipeline.items import convert_items

    rng = np.random.default_rng(0)
    data = [jpeg_bytes(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8), 90) for _ in range(8)]
    opts = ConvertOptions(processing=ProcessOptions(encoding=Encoding("keep", 0)), overwrite=True)
    paths = []
    for p in range(parts):
        path = os.path.join(root, f"part-{fmt}-{p}")
        items = [(data[(p + i) % len(data)], f"c{i % 10}", None) for i in range(per_part)]
        paths.append(convert_items(items, path, fmt, opts, [f"c{c}" for c in range(10)]).output)
    dst = os.path.join(root, f"merged-{fmt}")
    shutil.rmtree(dst, ignore_errors=True)
    report = merge(paths, dst, link=link)
    gb = sum(f.bytes for f in report.manifest.files) / 1e9
    for path in [*paths, dst]:
        shutil.rmtree(path)
    return gb, report.seconds


def _conversion_table(a: argparse.Namespace, runs: dict[tuple[str, str], list[float]], small: str,
                      big: str) -> dict[str, float]:
    """Print the conversion table and the per-round ratios; the rates past the fixed cost."""
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"### {a.format}: 240 x 320 JPEGs -> {' '.join(PROCESSING)}; alternating runs, median of {a.repeats}\n")
    header("configuration", f"{a.small} images: seconds", f"{a.images} images: seconds", "images/s, whole run",
           "images/s, past the fixed cost")
    rates = {}
    for conf in (ONE, TWO):
        rates[conf] = (a.images - a.small) / (med[(conf, big)] - med[(conf, small)])
        row(conf, ", ".join(f"{x:.2f}" for x in runs[(conf, small)]), ", ".join(f"{x:.2f}" for x in runs[(conf, big)]),
            f"{a.images / med[(conf, big)]:.0f}", f"{rates[conf]:.0f}")
    # Per round (the two configurations ran back to back): ratios of rates, whole run and past the
    # fixed cost; their medians are steadier than ratios of medians on a machine whose load drifts.
    past = [(b1 - s1) / (b2 - s2) for s1, b1, s2, b2 in
            zip(runs[(ONE, small)], runs[(ONE, big)], runs[(TWO, small)], runs[(TWO, big)])]
    whole = [x / y for x, y in zip(runs[(ONE, big)], runs[(TWO, big)])]
    rates["fixed"] = max(0.0, med[(TWO, small)] - a.small / rates[TWO])
    print(f"\n2 ranks x 1 worker / 1 process x 2 workers, per round: past the fixed cost "
          f"{', '.join(f'{x:.2f}' for x in past)} (median **{statistics.median(past):.2f}x**); whole "
          f"{a.images}-image run {', '.join(f'{x:.2f}' for x in whole)} (median "
          f"{statistics.median(whole):.2f}x). Fixed cost (start of torchrun, ranks and gloo; rank 0's merge): "
          f"{med[(TWO, small)] - a.small / rates[TWO]:.1f} s with torchrun, "
          f"{med[(ONE, small)] - a.small / rates[ONE]:.1f} s without\n")
    return rates


def _model_table(a: argparse.Namespace, rates: dict[str, float], merges: dict[tuple[str, bool], float]) -> None:
    """The model of docs/distributed.md for ImageNet-1k at this run's stored size per image, one
    node being this machine (2 ranks x 1 worker), the scan left out (seconds on a local disk)."""
    items = 1_281_167
    stored = 110e3  # bytes per image at shorter:256, jpeg:90: about ImageNet's mean
    per_node = rates[TWO]
    fixed_h = rates["fixed"] / 3600
    print(f"\nModel: {items:,} images of {stored / 1e3:.0f} kB stored, a node = this machine "
          f"({per_node:.0f} images/s), merge at the measured cost of a torchrun {a.format} merge\n")
    header("nodes", "convert (h)", "merge (h)", "total with the fixed cost (h)", "speed-up")
    merge_h = merges.get((a.format, True), max(merges.values())) * items * stored / 1e9 / 3600
    base = fixed_h + items / per_node / 3600 + merge_h
    for nodes in (1, 2, 4, 8, 16, 32, 64):
        conv_h = items / (nodes * per_node) / 3600
        row(nodes, f"{conv_h:.2f}", f"{merge_h:.2f}", f"{fixed_h + conv_h + merge_h:.2f}",
            f"{base / (fixed_h + conv_h + merge_h):.1f}x")


def distributed(a: argparse.Namespace) -> int:
    """Conversion across processes: 2 torchrun ranks x 1 worker against 1 process x 2 workers.

    On the same image folder, runs alternating (one process, torchrun, one process, ...) so drift
    on a shared machine hits both alike; medians and the ratio of rates. Then the cost of
    ``merge`` per GB of stored bytes, and the scaling model of docs/distributed.md filled in with
    both. Run from the repository root (it imports ``tools.sample_images``).
    """
    os.makedirs(a.root, exist_ok=True)
    small, big = dist_source(a.root, a.small), dist_source(a.root, a.images)
    rates = _conversion_table(a, conversions([small, big], a.root, a.format, a.repeats), small, big)
    merges = {}
    header("merge of 2 parts", "stored GB", "seconds", "seconds per GB")
    for fmt in a.merge_formats:
        for link in (False, True) if fmt in ("tar", "tfrecord") else (False,):
            gb, seconds = merge_cost(a.root, fmt, 2, a.merge_samples, link)
            merges[(fmt, link)] = seconds / gb
            row(f"{fmt}{', shards hard-linked (torchrun)' if link else ', copied'}", f"{gb:.3f}", f"{seconds:.2f}",
                f"{seconds / gb:.1f}")
    _model_table(a, rates, merges)
    return 0


def _distributed_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="/tmp/packer-dist")
    p.add_argument("--images", type=int, default=12000)
    p.add_argument("--small", type=int, default=600, help="the small run that gives the fixed cost")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--format", default="tar", choices=FORMATS)
    p.add_argument("--merge-formats", nargs="+", default=["tar", "lmdb"])
    p.add_argument("--merge-samples", type=int, default=3000, help="samples per part (2 parts)")


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"distributed": (distributed, _distributed_args)}
