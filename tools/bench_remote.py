"""Object storage against local disk, side by side in one run: a tar dataset read through a
DataLoader from the local folder, and from a loopback S3 server (moto's), cold and warm node
cache, with and without latency added to every request by a small proxy.

    python tools/bench_remote.py --src IMAGEFOLDER [--work /tmp/bench-remote] [--latency-ms 50]

moto runs on the same cores as the loader, so the table also gives the bytes moved and the CPU
seconds per MB downloaded. Results go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import threading
import time
from typing import Any


class LatencyProxy:
    """A TCP proxy to ``target`` that waits ``delay`` seconds before forwarding each HTTP request
    (each client chunk that starts with a method name) and counts the bytes sent back."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target, self.delay, self.down = target, delay, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.sock.accept()
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if upstream and data[:4] in (b"GET ", b"HEAD", b"PUT ", b"POST"):
                    time.sleep(self.delay)
                if not upstream:
                    self.down += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def epoch(ds) -> tuple[float, float]:
    """(images/s, CPU seconds of this process and its children) of one DataLoader epoch."""
    import torch

    def cpu() -> float:
        r = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        return sum(x.ru_utime + x.ru_stime for x in r)

    loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2, shuffle=False,
                                         collate_fn=lambda b: len(b))
    c, t = cpu(), time.perf_counter()
    n = sum(loader)
    return n / (time.perf_counter() - t), cpu() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, help="an image folder")
    ap.add_argument("--work", default="/tmp/bench-remote")
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--shard-size", default="4MB")
    ap.add_argument("--prefetch-shards", type=int, default=2)
    ap.add_argument("--egress-only", action="store_true", help="only the bytes-per-node table (no timings)")
    a = ap.parse_args()

    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    from packer.datasets import StreamingDataset, open_dataset
    from packer.manifest import read_manifest
    from packer.ops.cli import main as cli
    from packer.storage import Remote, upload_dataset

    shutil.rmtree(a.work, ignore_errors=True)
    local = os.path.join(a.work, "local.tar")
    cli(["convert", "imagefolder", "tar", a.src, local, "--resize", "shorter:160", "--shard-size", a.shard_size,
         "--workers", "2", "-q"])
    m = read_manifest(local)
    size = sum(f.bytes for f in m.files)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    creds = {"aws_access_key_id": "x", "aws_secret_access_key": "x", "region_name": "us-east-1"}
    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", **creds).create_bucket(Bucket="bench")
    proxies = {"none": LatencyProxy(("127.0.0.1", port), 0.0),
               f"{a.latency_ms:g} ms": LatencyProxy(("127.0.0.1", port), a.latency_ms / 1000)}

    def options(proxy: LatencyProxy) -> dict:
        return {"key": "x", "secret": "x", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}",
                                                              "region_name": "us-east-1"}}

    upload_dataset(local, Remote("s3://bench/ds", options(proxies["none"])), m)
    if a.egress_only:
        proxies = {"none": proxies["none"]}
        egress = _egress(a, options(proxies["none"]), proxies["none"], size)
        server.stop()
        _print_egress(egress, size)
        return
    epoch(open_dataset(local))  # warm-up: page cache, imports, worker start-up paths
    rows = [("local disk", *epoch(open_dataset(local)), 0),
            ("local disk, streaming", *epoch(StreamingDataset(local, shuffle=False, batch_size=64)), 0)]
    for label, proxy in proxies.items():
        for kind in ("map-style", "streaming"):
            cache = os.path.join(a.work, f"cache-{len(rows)}")
            for which in ("epoch 1 (cold cache)", "epoch 2 (warm cache)"):
                before = proxy.down
                if kind == "streaming":  # read-ahead of the next shards, whole shards per worker
                    ds = StreamingDataset("s3://bench/ds", storage_options=options(proxy), cache_dir=cache,
                                          shuffle=False, batch_size=64, prefetch_shards=a.prefetch_shards)
                else:
                    ds = open_dataset("s3://bench/ds", storage_options=options(proxy), cache_dir=cache)
                rate, cpu = epoch(ds)
                rows.append((f"S3 {kind}, latency {label}, {which}", rate, cpu, proxy.down - before))
    egress = _egress(a, options(proxies["none"]), proxies["none"], size)
    server.stop()
    rows.append(("local disk, again", *epoch(open_dataset(local)), 0))
    base = max(rows[0][1], rows[-1][1])
    shards = sum(1 for f in m.files if f.samples)
    print(f"{m.num_samples} images, {size / 1e6:.1f} MB in {shards} shards; DataLoader 2 workers, "
          f"batch 64, decode to tensors, no transform\n")
    print("| read | img/s | vs local (best of 2) | MB from server | x dataset | CPU s / MB |")
    print("|---|---|---|---|---|---|")
    for name, rate, cpu, down in rows:
        per = f"{cpu / (down / 1e6):.3f}" if down > size / 100 else "-"
        print(f"| {name} | {rate:.0f} | {rate / base:.2f} | {down / 1e6:.1f} | {down / size:.2f} | {per} |")
    _print_egress(egress, size)


def _print_egress(egress: list[tuple[str, float]], size: int) -> None:
    print("\n| bytes from the server (streaming, shuffled, DataLoader 2 workers) | MB | x dataset |")
    print("|---|---|---|")
    for name, down in egress:
        print(f"| {name} | {down / 1e6:.1f} | {down / size:.2f} |")


def _egress(a: argparse.Namespace, storage: dict, proxy: LatencyProxy, size: int) -> list[tuple[str, float]]:
    """Bytes downloaded per epoch (mean of 2 shuffled epochs) by one node with a cache that holds
    the dataset, by one node whose cache holds a quarter of it, and by each of N simulated nodes
    (one rank each, its own cache) reading its share of the shards."""
    from packer.datasets import StreamingDataset
    from packer.datasets.world import World

    def epochs(cache: str, limit: int | None, world: World | None, window: Any = "auto") -> list[float]:
        ds = StreamingDataset("s3://bench/ds", storage_options=storage, cache_dir=cache, cache_limit=limit,
                              shuffle=True, batch_size=64, prefetch_shards=1, world=world, shuffle_shards=window)
        out = []
        for e in range(2):
            before = proxy.down
            ds.set_epoch(e)
            epoch(ds)
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


if __name__ == "__main__":
    main()
