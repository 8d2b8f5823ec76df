"""Section 6 of docs/benchmarks.md, ``remote``: object storage (loopback S3, with added latency)
against local disk, and the bytes each node downloads."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import time
from typing import Any

from torch.utils.data import DataLoader

from tools.bench.common import Subcommand, cpu_seconds, header, row
from tools.faultlib import LatencyProxy


def remote_epoch(ds) -> tuple[float, float]:  # noqa: ANN001
    """(images/s, CPU seconds of this process and its children) of one DataLoader epoch."""
    loader = DataLoader(ds, batch_size=64, num_workers=2, shuffle=False, collate_fn=lambda b: len(b))
    c, t = cpu_seconds(), time.perf_counter()
    n = sum(loader)
    return n / (time.perf_counter() - t), cpu_seconds() - c


def s3_server() -> tuple[Any, int]:
    """A started moto S3 server on a free loopback port with bucket ``bench``, and its port."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    creds = {"aws_access_key_id": "x", "aws_secret_access_key": "x", "region_name": "us-east-1"}
    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", **creds).create_bucket(Bucket="bench")
    return server, port


def _remote_rows(a: argparse.Namespace, local: str, proxies: dict[str, LatencyProxy]) -> list[tuple]:
    """(read, img/s, CPU s, bytes from the server) of local, then S3 map-style and streaming reads
    through each proxy, cold then warm node cache."""
    from packer.datasets import StreamingDataset, open_dataset

    remote_epoch(open_dataset(local))  # warm-up: page cache, imports, worker start-up paths
    rows = [("local disk", *remote_epoch(open_dataset(local)), 0),
            ("local disk, streaming", *remote_epoch(StreamingDataset(local, shuffle=False, batch_size=64)), 0)]
    for label, proxy in proxies.items():
        for kind in ("map-style", "streaming"):
            cache = os.path.join(a.work, f"cache-{len(rows)}")
            for which in ("epoch 1 (cold cache)", "epoch 2 (warm cache)"):
                before = proxy.down
                if kind == "streaming":  # read-ahead of the next shards, whole shards per worker
                    ds = StreamingDataset("s3://bench/ds", storage_options=proxy.options(), cache_dir=cache,
                                          shuffle=False, batch_size=64, prefetch_shards=a.prefetch_shards)
                else:
                    ds = open_dataset("s3://bench/ds", storage_options=proxy.options(), cache_dir=cache,
                                      remote="whole")
                rate, cpu = remote_epoch(ds)
                rows.append((f"S3 {kind}, latency {label}, {which}", rate, cpu, proxy.down - before))
    return rows


def remote(a: argparse.Namespace) -> int:
    """Object storage against local disk, side by side in one run.

    A tar dataset read through a DataLoader from the local folder, and from a loopback S3 server
    (moto's), cold and warm node cache, with and without latency added to every request by a
    small proxy. moto runs on the same cores as the loader, so the table also gives the bytes
    moved and the CPU seconds per MB downloaded. Then the bytes one node (whole or quarter-size
    cache) and each of N simulated nodes download per epoch (``--egress-only``: only these).
    """
    from packer.cli import main as cli
    from packer.datasets import open_dataset
    from packer.description.manifest import read_manifest
    from packer.storage.remote import Remote, upload_dataset

    shutil.rmtree(a.work, ignore_errors=True)
    local = os.path.join(a.work, "local.tar")
    cli(["convert", "imagefolder", "tar", a.src, local, "--resize", "shorter:160", "--shard-size", a.shard_size,
         "--workers", "2", "-q"])
    m = read_manifest(local)
    size = sum(f.bytes for f in m.files)
    server, port = s3_server()
    proxies = {"none": LatencyProxy(("127.0.0.1", port), 0.0)}
    if not a.egress_only:
        proxies[f"{a.latency_ms:g} ms"] = LatencyProxy(("127.0.0.1", port), a.latency_ms / 1000)
    upload_dataset(local, Remote("s3://bench/ds", proxies["none"].options()), m)
    rows = [] if a.egress_only else _remote_rows(a, local, proxies)
    egress = _egress(a, proxies["none"], size)
    server.stop()
    if not a.egress_only:
        rows.append(("local disk, again", *remote_epoch(open_dataset(local)), 0))
        _print_remote(rows, m, size)
    _print_egress(egress, size)
    return 0


def _print_remote(rows: list[tuple], m: Any, size: int) -> None:
    base = max(rows[0][1], rows[-1][1])
    shards = sum(1 for f in m.files if f.samples)
    print(f"{m.num_samples} images, {size / 1e6:.1f} MB in {shards} shards; DataLoader 2 workers, "
          f"batch 64, decode to tensors, no transform\n")
    header("read", "img/s", "vs local (best of 2)", "MB from server", "x dataset", "CPU s / MB")
    for name, rate, cpu, down in rows:
        per = f"{cpu / (down / 1e6):.3f}" if down > size / 100 else "-"
        row(name, f"{rate:.0f}", f"{rate / base:.2f}", f"{down / 1e6:.1f}", f"{down / size:.2f}", per)


def _print_egress(egress: list[tuple[str, float]], size: int) -> None:
    print()
    header("bytes from the server (streaming, shuffled, DataLoader 2 workers)", "MB", "x dataset")
    for name, down in egress:
        row(name, f"{down / 1e6:.1f}", f"{down / size:.2f}")


def _egress(a: argparse.Namespace, proxy: LatencyProxy, size: int) -> list[tuple[str, float]]:
    """Bytes downloaded per epoch (mean of 2 shuffled epochs) by one node with a cache that holds
    the dataset, by one node whose cache holds a quarter of it, and by each of N simulated nodes
    (one rank each, its own cache) reading its share of the shards."""
    from packer.datasets import StreamingDataset
    from packer.datasets.world import World

    def epochs(cache: str, limit: int | None, world: World | None, window: Any = "auto") -> list[float]:
        ds = StreamingDataset("s3://bench/ds", storage_options=proxy.options(), cache_dir=cache, cache_limit=limit,
                              shuffle=True, batch_size=64, prefetch_shards=1, world=world, shuffle_shards=window)
        out = []
        for e in range(2):
            before = proxy.down
            ds.set_epoch(e)
            remote_epoch(ds)
            out.append(proxy.down - before)
        return out

    rows = []
    full = epochs(os.path.join(a.work, "eg-full"), None, None)
    rows += [("1 node, cache holds the dataset, epoch 1", full[0]), ("... epoch 2", full[1])]
    quarter = epochs(os.path.join(a.work, "eg-quarter"), size // 4, None)
    rows += [("1 node, cache holds a quarter (shard window), epoch 1", quarter[0]), ("... epoch 2", quarter[1])]
    buffered = epochs(os.path.join(a.work, "eg-buffer"), size // 4, None, None)
    rows += [("1 node, a quarter, sample buffer instead (before), epoch 1", buffered[0]), ("... epoch 2", buffered[1])]
    for n in (2, 4):
        per = [epochs(os.path.join(a.work, f"eg-{n}-{r}"), None, World(r, n))[0] for r in range(n)]
        rows.append((f"{n} nodes, epoch 1, each (mean; max {max(per) / size:.2f}x)", sum(per) / n))
    return rows


def _remote_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src", required=True, help="an image folder")
    p.add_argument("--work", default="/tmp/bench-remote")
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--shard-size", default="4MB")
    p.add_argument("--prefetch-shards", type=int, default=2)
    p.add_argument("--egress-only", action="store_true", help="only the bytes-per-node table (no timings)")


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"remote": (remote, _remote_args)}
