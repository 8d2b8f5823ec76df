"""Section 6 of docs/benchmarks.md, ``stream-cost``: what streaming from a loopback S3 server
costs: requests and bytes per epoch against the target, the bytes two simulated nodes with
half-size caches download over three epochs (shards dealt anew each epoch, or stable), and the
time and requests to the first batch of a dataset of many shards."""

from __future__ import annotations

import argparse
import os
import shutil
import time

from torch.utils.data import DataLoader

from tools.bench.common import Subcommand, header, row
from tools.bench.remote import s3_server
from tools.faultlib import LatencyProxy


def _epoch(ds, epoch: int) -> int:  # noqa: ANN001
    ds.set_epoch(epoch)
    return sum(DataLoader(ds, batch_size=32, num_workers=2, collate_fn=len))


def _pack(a: argparse.Namespace, name: str, n: int, side: int, per_shard: int) -> str:
    from tests.helpers import make_folder, pack

    src = os.path.join(a.work, f"src-{name}")
    make_folder(src, {c: [(f"{i}.png", side, side) for i in range(n // 2)] for c in ("a", "b")})
    return pack(src, os.path.join(a.work, name), "tar", encode="raw", shuffle=False,
                writer={"shard_samples": per_shard}).output


def stream_cost(a: argparse.Namespace) -> int:
    """Requests per epoch, stable node shards, cold start; see the module docstring."""
    from packer.datasets import StreamingDataset
    from packer.datasets.world import World
    from packer.description.manifest import read_manifest
    from packer.storage.nodecache import NodeCache
    from packer.storage.remote import Remote, upload_dataset

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    server, port = s3_server()
    proxy = LatencyProxy(("127.0.0.1", port), 0.0)
    opts = proxy.options()
    local = _pack(a, "ds", a.images, 256, a.images // a.shards)  # raw 256 x 256: 40 a shard is 7.9 MB
    m = read_manifest(local)
    upload_dataset(local, Remote("s3://bench/ds", opts), m)
    shards = [f for f in m.files if f.samples]
    data = sum(f.bytes for f in shards)
    ds = StreamingDataset("s3://bench/ds", storage_options=opts, cache_dir=os.path.join(a.work, "c1"), batch_size=32)
    proxy.reset()
    opened = ds.remote_traffic()  # the index files, at open
    _epoch(ds, 0)
    req, got = (x - y for x, y in zip(ds.remote_traffic(), opened))
    print(f"{m.num_samples} images, {len(shards)} shards, {data / 1e6:.1f} MB of shards\n")
    header("one streaming epoch, empty node cache", "requests (proxy)", "requests (node count)", "MB",
           "target 1.05 x MB/8 + shards")
    row("StreamingDataset, 2 workers", proxy.requests, req, f"{got / 1e6:.1f}",
        f"{1.05 * data / 8e6 + len(shards):.1f}")
    cache = NodeCache(os.path.join(a.work, "sizes"))
    small = cache.disk_bytes([*(f.bytes for f in m.files if not f.samples), 4096])
    limit = cache.disk_bytes(f.bytes for f in shards) // 2 + small
    print()
    header("2 nodes, cache_limit = half the shards + index files", "epoch 1 MB", "epoch 2 MB", "epoch 3 MB")
    for stable in (False, True):
        nodes = [StreamingDataset("s3://bench/ds", storage_options=opts, cache_dir=os.path.join(a.work, f"n{stable}{r}"),
                                  cache_limit=limit, world=World(r, 2), batch_size=32, stable_shards=stable)
                 for r in range(2)]
        per = []
        for e in range(3):
            before = sum(n.remote_traffic()[1] for n in nodes)
            for n in nodes:
                _epoch(n, e)
            per.append(sum(n.remote_traffic()[1] for n in nodes) - before)
        row("stable_shards=True" if stable else "default (dealt anew)", *(f"{b / 1e6:.1f}" for b in per))
    server_cold(a, opts, proxy)
    server.stop()
    return 0


def server_cold(a: argparse.Namespace, opts: dict, proxy: LatencyProxy) -> None:
    """Time and requests from StreamingDataset(url) to its first batch, a dataset of many shards."""
    from packer.datasets import StreamingDataset
    from packer.description.manifest import read_manifest
    from packer.storage.remote import Remote, upload_dataset

    local = _pack(a, "many", a.cold_shards, 8, 1)
    upload_dataset(local, Remote("s3://bench/many", opts), read_manifest(local))
    proxy.reset()
    t = time.perf_counter()
    ds = StreamingDataset("s3://bench/many", storage_options=opts, cache_dir=os.path.join(a.work, "cold"),
                          batch_size=32, shuffle=True)
    next(iter(DataLoader(ds, batch_size=32, num_workers=0, collate_fn=len)))
    print()
    header("cold start", "shards", "s to first batch", "requests before it")
    row("StreamingDataset(url), empty cache", a.cold_shards, f"{time.perf_counter() - t:.1f}", proxy.requests)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work", default="/tmp/bench-stream-cost")
    p.add_argument("--images", type=int, default=640)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--cold-shards", type=int, default=10000)


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"stream-cost": (stream_cost, _args)}
