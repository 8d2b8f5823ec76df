"""Conversion across processes: 2 torchrun ranks x 1 worker against 1 process x 2 workers on the
same image folder, the cost of ``merge`` per GB of stored bytes, and the scaling model of
docs/distributed.md filled in with both.

    python -m tools.bench_distributed --root /tmp/packer-dist

Runs alternate (one process, torchrun, one process, ...) so drift on a shared machine hits both
alike; the table (docs/benchmarks.md, section 9) gives medians and the ratio of rates.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

import cv2
import numpy as np

from tools.sample_images import make_folder

ENV_DROP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
PROCESSING = ["--resize", "shorter:128", "--encode", "jpeg:90"]
ONE, TWO = "1 process x 2 workers", "2 ranks x 1 worker"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def source(root: str, images: int) -> str:
    """An image folder of ``images`` smooth 240 x 320 JPEGs in 10 classes (kept between runs)."""
    src = os.path.join(root, f"src-{images}")
    if not os.path.isdir(src):
        per = images // 10
        make_folder(src + ".tmp", {f"c{c}": [(f"{c}-{i}.jpg", 240, 320) for i in range(per)] for c in range(10)})
        os.rename(src + ".tmp", src)
    return src


def timed(cmd: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
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
                timed([sys.executable, *convert, "--workers", "2", "--no-torchrun"]))
            runs.setdefault((TWO, src), []).append(
                timed([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_port()}",
                       *convert, "--workers", "1"]))
    shutil.rmtree(dst, ignore_errors=True)
    return runs


def merge_cost(root: str, fmt: str, parts: int, per_part: int, link: bool = False) -> tuple[float, float]:
    """(stored GB, seconds) of merging ``parts`` parts of ``per_part`` 256 x 256 JPEGs (~70 kB);
    ``link``: shards hard-linked, as a torchrun conversion merges."""
    from packer.imageproc import Encoding, ProcessOptions
    from packer.ops.engine import ConvertOptions
    from packer.ops.items import convert_items
    from packer.ops.merge import merge

    rng = np.random.default_rng(0)
    data = []
    for _ in range(8):
        ok, buf = cv2.imencode(".jpg", rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
                               [cv2.IMWRITE_JPEG_QUALITY, 90])
        data.append(buf.tobytes())
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


def main(argv: list[str] | None = None) -> int:
    """Measure and print the section 9 tables."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="/tmp/packer-dist")
    p.add_argument("--images", type=int, default=12000)
    p.add_argument("--small", type=int, default=600, help="the small run that gives the fixed cost")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--format", default="tar", choices=["lmdb", "hdf5", "tar", "tfrecord"])
    p.add_argument("--merge-formats", nargs="+", default=["tar", "lmdb"])
    p.add_argument("--merge-samples", type=int, default=3000, help="samples per part (2 parts)")
    args = p.parse_args(argv)
    os.makedirs(args.root, exist_ok=True)
    small, big = source(args.root, args.small), source(args.root, args.images)
    runs = conversions([small, big], args.root, args.format, args.repeats)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"### {args.format}: 240 x 320 JPEGs -> {' '.join(PROCESSING)}; alternating runs, median of "
          f"{args.repeats}\n")
    print(f"| configuration | {args.small} images: seconds | {args.images} images: seconds | images/s, whole run | "
          f"images/s, past the fixed cost |\n|---|---|---|---|---|")
    rates = {}
    for conf in (ONE, TWO):
        whole = args.images / med[(conf, big)]
        rates[conf] = (args.images - args.small) / (med[(conf, big)] - med[(conf, small)])
        print(f"| {conf} | {', '.join(f'{x:.2f}' for x in runs[(conf, small)])} | "
              f"{', '.join(f'{x:.2f}' for x in runs[(conf, big)])} | {whole:.0f} | {rates[conf]:.0f} |")
    one, two = rates[ONE], rates[TWO]
    # Per round (the two configurations ran back to back): ratios of rates, whole run and past the
    # fixed cost; their medians are steadier than ratios of medians on a machine whose load drifts.
    past = [(b1 - s1) / (b2 - s2) for s1, b1, s2, b2 in
            zip(runs[(ONE, small)], runs[(ONE, big)], runs[(TWO, small)], runs[(TWO, big)])]
    whole = [a / b for a, b in zip(runs[(ONE, big)], runs[(TWO, big)])]
    print(f"\n2 ranks x 1 worker / 1 process x 2 workers, per round: past the fixed cost "
          f"{', '.join(f'{x:.2f}' for x in past)} (median **{statistics.median(past):.2f}x**); whole "
          f"{args.images}-image run {', '.join(f'{x:.2f}' for x in whole)} (median "
          f"{statistics.median(whole):.2f}x). Fixed cost (start of torchrun, ranks and gloo; rank 0's merge): "
          f"{med[(TWO, small)] - args.small / two:.1f} s with torchrun, {med[(ONE, small)] - args.small / one:.1f} s "
          f"without\n")
    merges = {}
    print("| merge of 2 parts | stored GB | seconds | seconds per GB |\n|---|---|---|---|")
    for fmt in args.merge_formats:
        for link in (False, True) if fmt in ("tar", "tfrecord") else (False,):
            gb, seconds = merge_cost(args.root, fmt, 2, args.merge_samples, link)
            merges[(fmt, link)] = seconds / gb
            print(f"| {fmt}{', shards hard-linked (torchrun)' if link else ', copied'} | {gb:.3f} | {seconds:.2f} | "
                  f"{seconds / gb:.1f} |")
    # The model of docs/distributed.md for ImageNet-1k at this run's stored size per image, one node
    # being this machine (2 ranks x 1 worker), the scan left out (seconds on a local disk).
    items = 1_281_167
    stored = 110e3  # bytes per image at shorter:256, jpeg:90: about ImageNet's mean
    per_node = two
    fixed_h = max(0.0, med[(TWO, small)] - args.small / two) / 3600
    print(f"\nModel: {items:,} images of {stored / 1e3:.0f} kB stored, a node = this machine "
          f"({per_node:.0f} images/s), merge at the measured cost of a torchrun {args.format} merge\n")
    print("| nodes | convert (h) | merge (h) | total with the fixed cost (h) | speed-up |\n|---|---|---|---|---|")
    merge_h = merges.get((args.format, True), max(merges.values())) * items * stored / 1e9 / 3600
    base = fixed_h + items / per_node / 3600 + merge_h
    for nodes in (1, 2, 4, 8, 16, 32, 64):
        conv_h = items / (nodes * per_node) / 3600
        print(f"| {nodes} | {conv_h:.2f} | {merge_h:.2f} | {fixed_h + conv_h + merge_h:.2f} | {base / (fixed_h + conv_h + merge_h):.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
