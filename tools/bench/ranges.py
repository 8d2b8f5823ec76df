"""Section 6 of docs/benchmarks.md, ``ranges``: what 20 random ``ds[i]`` of a dataset at a URL
download, by byte range and by whole files, and the latency of one ``ds[i]`` by range."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time

import numpy as np

from tools.bench.common import Subcommand, header, row
from tools.bench.remote import s3_server
from tools.faultlib import LatencyProxy


def ranges(a: argparse.Namespace) -> int:
    """Bytes and requests of 20 random ``ds[i]`` at a URL, by range and by whole files.

    Each format is converted from ``--src`` (``shorter:256``, ``--shard-size``), uploaded to moto's
    S3 server on 127.0.0.1 and opened through a proxy that counts what the server answers; with an
    empty node cache, 20 random samples (seed 0) are read after ``open_dataset(url)``. Then the
    median of ``--latency-reads`` random ``ds[i]`` by range against the median of as many 1 KiB
    ranged GETs of the same objects by s3fs, through the same proxy.
    """
    from packer.cli import main as cli
    from packer.datasets import open_dataset
    from packer.description.manifest import read_manifest
    from packer.storage.remote import Remote, upload_dataset

    shutil.rmtree(a.work, ignore_errors=True)
    server, port = s3_server()
    proxy = LatencyProxy(("127.0.0.1", port), 0.0)
    header("format", "mode", "opened (MiB)", "20 reads (MiB)", "requests", "the 20 records (MiB)",
           "whole dataset (MiB)", "p50 ds[i] (ms)", "p50 1 KiB GET (ms)")
    mib = 1 << 20
    for fmt in a.formats.split(","):
        local = os.path.join(a.work, fmt)
        shard = ["--shard-size", a.shard_size] if fmt in ("tar", "tfrecord") else []
        cli(["convert", "imagefolder", fmt, a.src, local, "--resize", "shorter:256", *shard, "--workers", "2", "-q"])
        m = read_manifest(local)
        url = f"s3://bench/{fmt}"
        upload_dataset(local, Remote(url, proxy.options()), m)
        total = sum(f.bytes for f in m.files)
        ref = open_dataset(local)
        picks = np.random.default_rng(0).choice(len(ref), 20, replace=False).tolist()
        records = sum(len(ref.read_record(i).payload) for i in picks)
        for mode in ("range", "whole") if fmt != "lmdb" else ("whole",):
            proxy.reset()
            ds = open_dataset(url, storage_options=proxy.options(), cache_dir=os.path.join(a.work, f"c-{fmt}-{mode}"),
                              remote=mode)
            opened = proxy.down
            proxy.reset()
            for i in picks:
                ds[i]
            got, requests = proxy.down, proxy.requests
            p50 = p50_get = "-"
            if mode == "range":
                p50, p50_get = _latencies(ds, proxy, url, m, a.latency_reads)
            row(fmt, mode, f"{opened / mib:.2f}", f"{got / mib:.2f}", requests, f"{records / mib:.2f}",
                f"{total / mib:.1f}", p50, p50_get)
    server.stop()
    return 0


def _latencies(ds, proxy: LatencyProxy, url: str, m, n: int) -> tuple[str, str]:  # noqa: ANN001
    """Median ms of ``n`` random ``ds[i]`` (not read before) and of ``n`` 1 KiB ranged GETs."""
    from packer.storage.remote import Remote

    rng = np.random.default_rng(1)
    times = []
    for i in rng.choice(len(ds), n, replace=False).tolist():
        t = time.perf_counter()
        ds[i]
        times.append(time.perf_counter() - t)
    fs, path = Remote(url, proxy.options()).filesystem()
    names = [f.name for f in m.files if f.samples]
    gets = []
    for _ in range(n):
        name = names[int(rng.integers(len(names)))]
        t = time.perf_counter()
        fs.cat_file(f"{path}/{name}", start=0, end=1024)
        gets.append(time.perf_counter() - t)
    return f"{statistics.median(times) * 1000:.1f}", f"{statistics.median(gets) * 1000:.1f}"


def _ranges_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src", required=True, help="an image folder")
    p.add_argument("--work", default="/tmp/bench-ranges")
    p.add_argument("--formats", default="tar,tfrecord,hdf5,lmdb")
    p.add_argument("--shard-size", default="8MB")
    p.add_argument("--latency-reads", type=int, default=100)


SUBCOMMANDS: dict[str, Subcommand] = {"ranges": (ranges, _ranges_args)}
