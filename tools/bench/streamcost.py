"""Section 6 of docs/benchmarks.md, ``stream-cost``: what streaming from a loopback S3 server
costs: requests and bytes per epoch against the target, the bytes two simulated nodes with
half-size caches download over three epochs (shards dealt anew each epoch, or stable), and the
time and requests to the first batch of a dataset of many shards, now (each shard's index with
its first read) against every index read at open as before (``load_indexes()``), side by side."""

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


def _pack_many(a: argparse.Namespace, many: str, shards: int) -> None:
    """A dataset of ``shards`` one-sample shards at ``many``: parts of at most 1,000 shards merged
    (a conversion journals its finished shards at each checkpoint, a cost that grows with the
    shards already written: one conversion of 10,000 tiny shards would take most of an hour)."""
    from packer.operations.merge import merge

    sizes = [min(1000, shards - k) for k in range(0, shards, 1000)]
    if len(sizes) == 1:
        _pack(a, os.path.basename(many), shards, 8, 1)
        return
    parts = []
    for j, n in enumerate(sizes):
        part = os.path.join(a.work, f"many-part-{j}")
        shutil.rmtree(part, ignore_errors=True)
        shutil.rmtree(os.path.join(a.work, f"src-many-part-{j}"), ignore_errors=True)
        parts.append(_pack(a, os.path.basename(part), n, 8, 1))
    merge(parts, many)
    for part in parts:
        shutil.rmtree(part, ignore_errors=True)


def stream_cost(a: argparse.Namespace) -> int:
    """Requests per epoch, stable node shards, cold start; see the module docstring."""
    from packer.datasets import StreamingDataset
    from packer.datasets.world import World
    from packer.description.manifest import read_manifest
    from packer.storage.nodecache import NodeCache
    from packer.storage.remote import Remote, upload_dataset

    many = os.path.join(a.work, "many")
    kept = a.cold_only and _packed(many, a.cold_shards)
    for name in os.listdir(a.work) if os.path.isdir(a.work) else ():
        if not (kept and name in ("many", "src-many")):
            shutil.rmtree(os.path.join(a.work, name), ignore_errors=True)
    os.makedirs(a.work, exist_ok=True)
    server, port = s3_server()
    proxy = LatencyProxy(("127.0.0.1", port), 0.0)
    opts = proxy.options()
    if a.cold_only:
        server_cold(a, opts, proxy)
        server.stop()
        return 0
    local = _pack(a, "ds", a.images, 256, a.images // a.shards)  # raw 256 x 256: 40 a shard is 7.9 MB
    m = read_manifest(local)
    upload_dataset(local, Remote("s3://bench/ds", opts), m)
    shards = [f for f in m.files if f.samples]
    data = sum(f.bytes for f in shards)
    ds = StreamingDataset("s3://bench/ds", storage_options=opts, cache_dir=os.path.join(a.work, "c1"), batch_size=32)
    proxy.reset()
    opened = ds.remote_traffic()
    _epoch(ds, 0)
    req, got = (x - y for x, y in zip(ds.remote_traffic(), opened))
    print(f"{m.num_samples} images, {len(shards)} shards, {data / 1e6:.1f} MB of shards\n")
    header("one streaming epoch, empty node cache", "requests (proxy)", "requests (node count)", "MB",
           "of which index files", "target 1.05 x MB/8 + shards")
    index = [f for f in m.files if f.name.endswith(".pkidx")]
    row("StreamingDataset, 2 workers", proxy.requests, req, f"{got / 1e6:.1f}",
        f"{len(index)} ({sum(f.bytes for f in index) / 1e3:.1f} kB)", f"{1.05 * data / 8e6 + len(shards):.1f}")
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


def _packed(path: str, n: int) -> bool:
    """Whether ``path`` holds a finished dataset of ``n`` samples (kept between ``--cold-only`` runs)."""
    from packer.description.manifest import read_manifest
    from packer.errors import PackerError

    try:
        return read_manifest(path).num_samples == n
    except (PackerError, OSError):
        return False


def _upload_all(local: str, url: str, opts: dict) -> None:
    """The dataset in ``local`` at ``url``: every file by one concurrent ``put``, the manifest last."""
    from packer.description.manifest import MANIFEST_NAME, read_manifest
    from packer.storage.remote import Remote

    fs, path = Remote(url, opts).filesystem()
    names = [f.name for f in read_manifest(local).files]
    fs.put([os.path.join(local, n) for n in names], [f"{path}/{n}" for n in names])
    fs.put_file(os.path.join(local, MANIFEST_NAME), f"{path}/{MANIFEST_NAME}")


def server_cold(a: argparse.Namespace, opts: dict, proxy: LatencyProxy) -> None:
    """Time and requests from the open of a dataset of many shards at a URL to its first batch
    (streaming) or first sample (map-style, by range), empty node cache: as it is now (each shard's
    index with its first read) against every index read at open, as before (``load_indexes()``)."""
    from packer.datasets import StreamingDataset, open_dataset

    many = os.path.join(a.work, "many")
    if not _packed(many, a.cold_shards):
        shutil.rmtree(many, ignore_errors=True)
        _pack_many(a, many, a.cold_shards)
    t = time.perf_counter()
    _upload_all(many, "s3://bench/many", opts)
    print(f"\n{a.cold_shards} shards uploaded in {time.perf_counter() - t:.0f} s\n")
    header("cold start, empty node cache", "shards", "s to first batch / sample", "requests before it",
           "ratio of times (before / now)")
    for what in ("StreamingDataset(url), first batch of 32", "open_dataset(url), first ds[i] by range"):
        got = []
        for eager in (False, True):
            cache = os.path.join(a.work, f"cold-{len(got)}-{what[:4]}")
            shutil.rmtree(cache, ignore_errors=True)
            proxy.reset()
            t = time.perf_counter()
            if what.startswith("Streaming"):
                ds = StreamingDataset("s3://bench/many", storage_options=opts, cache_dir=cache, batch_size=32,
                                      shuffle=True)
                if eager:
                    ds.reader.load_indexes()
                next(iter(DataLoader(ds, batch_size=32, num_workers=0, collate_fn=len)))
            else:
                ds = open_dataset("s3://bench/many", storage_options=opts, cache_dir=cache)
                if eager:
                    ds.load_indexes()
                ds[a.cold_shards // 2]
            got.append((time.perf_counter() - t, proxy.requests))
        (now, now_req), (old, old_req) = got
        row(f"{what}, each shard's index with its first read", a.cold_shards, f"{now:.2f}", now_req, "")
        row(f"{what}, every index at open (before)", a.cold_shards, f"{old:.1f}", old_req, f"{old / now:.0f}x")


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work", default="/tmp/bench-stream-cost")
    p.add_argument("--images", type=int, default=640)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--cold-shards", type=int, default=10000)
    p.add_argument("--cold-only", action="store_true",
                   help="only the cold start (its packed dataset is kept in --work for the next run)")


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"stream-cost": (stream_cost, _args)}
