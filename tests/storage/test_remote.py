"""Datasets in object storage: a real S3 server (moto's, on 127.0.0.1) read through s3fs, and the
node cache every process on a machine shares."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import numpy as np
import pytest
import torch

from packer.datasets import open_dataset
from packer.description.manifest import read_manifest
from packer.errors import CorruptDataError, DatasetChangedError, UnfinishedDatasetError
from packer.storage.nodecache import CacheFullError, NodeCache
from packer.storage.remote import (
    Remote,
    RemoteError,
    is_url,
    parse_storage_options,
    read_remote_manifest,
    upload_dataset,
)
from tests.helpers import import_optional, make_folder, moto_s3, pack

import_optional("s3fs", "s3:// tests need s3fs: pip install 'packer[s3]'")
moto_server = import_optional("moto.server", "s3:// tests need moto's server: pip install 'moto[server]'")

FORMATS = ["lmdb", "hdf5", "tar", "tfrecord"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 with one bucket; yields the storage_options to reach it."""
    with moto_s3("data") as endpoint:
        yield {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint,
                                                                         "region_name": "us-east-1"}}


@pytest.fixture(scope="module")
def local_sets(tmp_path_factory):
    base = tmp_path_factory.mktemp("remote")
    src = str(base / "src")
    make_folder(src, {c: [(f"{i}.png", 16 + i, 20) for i in range(8)] for c in ("a", "b", "c")})
    writer = {"shard_samples": 2}
    return {fmt: pack(src, str(base / fmt), fmt, encode="png", shuffle=False,
                      writer=writer if fmt in ("tar", "tfrecord") else None).output for fmt in FORMATS}


def _upload(s3, local, name):
    url = f"s3://data/{name}"
    upload_dataset(local, _remote(url, s3), read_manifest(local))
    return url


def _remote(url, s3):
    from packer.storage.remote import Remote

    return Remote(url, s3)


def _same(a, b):
    assert len(a) == len(b)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x[1] == y[1] and torch.equal(x[0], y[0]), i


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_dataset_in_s3_reads_like_its_local_copy(s3, local_sets, tmp_path, fmt):
    url = _upload(s3, local_sets[fmt], f"same/{fmt}")
    ds = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "cache"))
    assert ds.url == url and is_url(url)
    _same(ds, open_dataset(local_sets[fmt]))
    # Through a DataLoader with 2 workers, every sample once, the same pixels.
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, shuffle=False)
    local = open_dataset(local_sets[fmt])
    got = [(img, label) for img, label in loader]
    assert len(got) == len(local)
    for i, (img, label) in enumerate(got):
        assert label == local[i][1] and torch.equal(img, local[i][0])


def test_the_cache_is_shared_and_downloads_each_file_once(s3, local_sets, tmp_path):
    url = _upload(s3, local_sets["tar"], "once/tar")
    cache = str(tmp_path / "cache")
    first = open_dataset(url, storage_options=s3, cache_dir=cache, remote="whole")
    [first[i] for i in range(len(first))]
    view = first.root
    stamps = {n: os.stat(os.path.join(view, n)).st_ino for n in os.listdir(view) if not n.startswith(".")}
    second = open_dataset(url, storage_options=s3, cache_dir=cache, remote="whole")
    assert second.root == view
    [second[i] for i in range(len(second))]
    assert {n: os.stat(os.path.join(view, n)).st_ino for n in stamps} == stamps  # nothing fetched again


def test_cache_limit_holds_at_every_moment(s3, local_sets, tmp_path):
    local = local_sets["tar"]
    url = _upload(s3, local, "limit/tar")
    total = sum(f.bytes for f in read_manifest(local).files)
    limit = total // 4
    cache_dir = str(tmp_path / "cache")
    ds = open_dataset(url, storage_options=s3, cache_dir=cache_dir, cache_limit=limit, remote="whole")
    cache = NodeCache(cache_dir)
    peak, stop = [0], threading.Event()

    def poll():
        # Under the cache's lock, as its own accounting runs: a download renamed into place
        # between the scans of work/ and datasets/ would otherwise count twice.
        manifest = os.path.join(ds.root, "manifest.json")
        while not stop.is_set():
            with cache._locked():
                used = cache.usage() - (os.stat(manifest).st_blocks * 512 if os.path.exists(manifest) else 0)
            peak[0] = max(peak[0], used)
            time.sleep(0.001)

    t = threading.Thread(target=poll)
    t.start()
    try:
        ref = open_dataset(local)
        for i in range(len(ds)):
            img, label = ds[i]
            assert label == ref[i][1] and torch.equal(img, ref[i][0])
    finally:
        stop.set()
        t.join()
    assert 0 < peak[0] <= limit


def test_a_file_larger_than_the_limit_is_a_clear_error(s3, local_sets, tmp_path):
    url = _upload(s3, local_sets["lmdb"], "big/lmdb")
    with pytest.raises(CacheFullError, match="more than cache_limit"):
        open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"), cache_limit=1000)[0]


def test_a_shard_altered_on_the_server_is_detected(s3, local_sets, tmp_path):
    import s3fs

    url = _upload(s3, local_sets["tar"], "altered/tar")
    fs = s3fs.S3FileSystem(**s3)
    name = read_manifest(local_sets["tar"]).files[0].name
    data = bytearray(fs.cat(f"data/altered/tar/{name}"))
    data[700] ^= 0xFF
    fs.pipe(f"data/altered/tar/{name}", bytes(data))
    ds = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"), remote="whole")
    with pytest.raises(CorruptDataError, match="SHA-256"):
        ds[0]
    assert not [n for n in os.listdir(ds.root) if n.endswith(".partial")]


def test_missing_datasets_and_buckets_name_the_url(s3, tmp_path):
    with pytest.raises(UnfinishedDatasetError, match="s3://data/nothing/manifest.json does not exist"):
        open_dataset("s3://data/nothing", storage_options=s3, cache_dir=str(tmp_path))
    with pytest.raises((UnfinishedDatasetError, RemoteError), match="s3://no-such-bucket"):
        open_dataset("s3://no-such-bucket/x", storage_options=s3, cache_dir=str(tmp_path))


def test_storage_options_from_the_command_line():
    assert parse_storage_options(["anon=true", "client_kwargs.endpoint_url=http://h:1", "key=abc"]) == {
        "anon": True, "client_kwargs": {"endpoint_url": "http://h:1"}, "key": "abc"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_storage_options(["novalue"])
    assert not is_url("/data/x") and not is_url("file:///x") and is_url("gs://b/x")


def test_a_killed_download_leaves_nothing_that_breaks_the_next(s3, local_sets, tmp_path):
    url = _upload(s3, local_sets["hdf5"], "killed/hdf5")
    cache_dir = str(tmp_path / "c")
    ds = open_dataset(url, storage_options=s3, cache_dir=cache_dir, remote="whole")
    name = ds.manifest.files[0].name
    # What a downloader killed mid-file leaves: an allocated partial file and a lock file.
    work = os.path.join(cache_dir, "work", os.path.basename(ds.root))
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, name + ".partial"), "wb") as f:
        f.write(b"\0" * 100)
    open(os.path.join(work, name + ".fetch"), "wb").close()
    ref = open_dataset(local_sets["hdf5"])
    assert torch.equal(ds[3][0], ref[3][0])
    assert ref._meta.mapped and not ds._meta.mapped  # a URL's copy: its index read, as before
    assert np.array_equal(open(os.path.join(ds.root, name), "rb").read(),
                          open(os.path.join(local_sets["hdf5"], name), "rb").read())


def _cli(*args):
    from tests.helpers import run_cli

    return run_cli(*args)


def test_the_command_line_converts_to_reads_from_and_verifies_urls(s3, tmp_path):
    src = str(tmp_path / "src")
    make_folder(src, {c: [(f"{i}.png", 16, 16) for i in range(5)] for c in ("a", "b")})
    endpoint = s3["client_kwargs"]["endpoint_url"]
    opts = ["--storage-option", "key=testing", "--storage-option", "secret=testing",
            "--storage-option", f"client_kwargs.endpoint_url={endpoint}",
            "--storage-option", "client_kwargs.region_name=us-east-1", "--cache-dir", str(tmp_path / "cache")]
    url = "s3://data/cli/tar"
    r = _cli("convert", "imagefolder", "tar", src, url, "--encode", "png", "--shard-samples", "4", *opts)
    assert r.returncode == 0 and f"uploaded to {url}" in r.stdout, r.stderr
    r = _cli("convert", "imagefolder", "tar", src, url, "--encode", "png", *opts)
    assert r.returncode == 1 and "already holds a packed dataset" in r.stderr and "Traceback" not in r.stderr
    r = _cli("info", url, *opts)
    assert r.returncode == 0 and "samples     10" in r.stdout and f"path        {url}" in r.stdout, r.stderr
    r = _cli("verify", url, *opts)
    assert r.returncode == 0 and "3/3 files intact" not in r.stdout and "10/10 samples decoded" in r.stdout, r.stdout
    out = str(tmp_path / "back")
    r = _cli("convert", "tar", "lmdb", url, out, *opts)
    assert r.returncode == 0, r.stderr
    ref = open_dataset(out)
    remote = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "cache"))
    _same(ref, remote)
    # A shard altered on the server: verify names it and fails.
    import s3fs

    fs = s3fs.S3FileSystem(**s3)
    fs.pipe("data/cli/tar/shard-000000.tar", b"x" * 10240)
    r = _cli("verify", url, *opts[:-2], "--cache-dir", str(tmp_path / "cache2"))
    assert r.returncode == 1 and "shard-000000.tar" in r.stderr and "CORRUPT" in r.stdout, (r.stdout, r.stderr)
    r = _cli("info", "s3://data/cli/none", *opts)
    assert r.returncode == 1 and "s3://data/cli/none/manifest.json does not exist" in r.stderr, r.stderr


# Slow: the docs test runs every S3 example of README.md and docs/ with AWS_ENDPOINT_URL alone
# (convert to a URL, info, verify, a reader), so the default suite already covers this path.
@pytest.mark.slow
@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_the_standard_endpoint_variable_serves_every_command(s3, local_sets, tmp_path, variable):
    """The AWS tools' own endpoint variable, set once, reaches the server from a conversion to a URL,
    ``info``, ``verify`` and a reader: no ``--storage-option``, nothing packer-specific."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({variable: s3["client_kwargs"]["endpoint_url"], "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "PACKER_CACHE_DIR": str(tmp_path / "cache")})
    url = f"s3://data/variable/{variable}"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "packer", *args], capture_output=True, text=True, timeout=300,
                              env=env)

    r = cli("convert", "tar", "tar", local_sets["tar"], url, "-q")
    assert r.returncode == 0, r.stderr
    r = cli("info", url)
    assert r.returncode == 0 and "samples     24" in r.stdout, r.stderr
    r = cli("verify", url)
    assert r.returncode == 0 and "24/24 samples decoded" in r.stdout, r.stdout + r.stderr
    read = subprocess.run([sys.executable, "-c", f"from packer import open_dataset; print(len(open_dataset({url!r})))"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert read.returncode == 0 and read.stdout.split() == ["24"], read.stderr
    _same(open_dataset(local_sets["tar"]), open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c2")))


def test_a_server_that_stops_gives_a_clear_error_in_bounded_time(local_sets, tmp_path):
    import boto3

    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="gone")
    opts = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint,
                                                                      "region_name": "us-east-1"},
            "config_kwargs": {"retries": {"max_attempts": 2, "mode": "standard"}}}  # the defaults: 5
    from packer.storage.remote import Remote

    upload_dataset(local_sets["tar"], Remote("s3://gone/tar", opts), read_manifest(local_sets["tar"]))
    ds = open_dataset("s3://gone/tar", storage_options=opts, cache_dir=str(tmp_path / "c"))
    ds[0]  # the first shard is cached
    server.stop()
    start = time.monotonic()
    with pytest.raises(RemoteError, match=r"s3://gone/tar/shard-0000\d\d\.tar"):
        for i in range(len(ds)):
            ds[i]
    assert time.monotonic() - start < 60
    assert not [n for n in os.listdir(ds.root) if n.endswith(".partial")]


def _read_all(url, cache_dir):
    ds = open_dataset(url, cache_dir=cache_dir, remote="whole")
    return [int(ds[i][1]) for i in range(len(ds))]


def test_two_processes_on_one_node_download_each_file_once_over_http(local_sets, tmp_path):
    import multiprocessing

    server, gets = _counting_server(os.path.dirname(local_sets["tfrecord"]))
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/tfrecord"
        cache_dir = str(tmp_path / "cache")
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            labels = pool.starmap(_read_all, [(url, cache_dir), (url, cache_dir)])
    finally:
        server.shutdown()
    ref = open_dataset(local_sets["tfrecord"])
    assert labels[0] == labels[1] == [ref[i][1] for i in range(len(ref))]
    files = [f"/tfrecord/{f.name}" for f in read_manifest(local_sets["tfrecord"]).files]
    # every file an epoch reads once; the sample table is read only when labels, keys or metadata are asked for
    assert all(gets[f] == (not f.endswith("/samples.table")) for f in files), {f: gets[f] for f in files}


def test_streaming_from_s3_reads_every_sample_once(s3, local_sets, tmp_path):
    from packer.datasets import StreamingDataset

    url = _upload(s3, local_sets["tfrecord"], "stream/tfrecord")
    kwargs = {"shuffle": True, "seed": 3, "output": "numpy"}
    local = StreamingDataset(local_sets["tfrecord"], **kwargs)
    remote = StreamingDataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"), cache_limit="60kB", **kwargs)

    def pixels(ds):
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        return sorted((int(label), bytes(img.numpy().tobytes())) for img, label in loader)

    got = pixels(remote)
    assert len(got) == len(local) and got == pixels(local)


def test_streaming_downloads_the_next_shards_ahead_and_partitions_by_shard(s3, local_sets, tmp_path):
    from packer.datasets import StreamingDataset

    url = _upload(s3, local_sets["tar"], "ahead/tar")
    ds = StreamingDataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"), shuffle=False, prefetch_shards=2)
    assert ds.options.block_samples is None  # whole shards: a node downloads only what its ranks read
    assert StreamingDataset(local_sets["tar"]).options.block_samples == 4096
    it = iter(ds)
    next(it)
    root = ds.reader.root
    names = [os.path.basename(p) for p in ds.reader.shard_paths]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(os.path.exists(os.path.join(root, n)) for n in names[:3]):
        time.sleep(0.05)
    assert [os.path.exists(os.path.join(root, n)) for n in names[:4]] == [True, True, True, False]
    rest = list(it)
    assert len(rest) + 1 == len(ds)


def test_two_ranks_on_one_node_download_only_their_shards(s3, local_sets, tmp_path):
    from packer.datasets import StreamingDataset
    from packer.datasets.partition import World

    url = _upload(s3, local_sets["tar"], "ranks/tar")
    seen, fetched = [], []
    for rank in range(2):
        cache = str(tmp_path / f"node{rank}")  # one node per rank: count what each downloads
        ds = StreamingDataset(url, storage_options=s3, cache_dir=cache, world=World(rank, 2), seed=1)
        seen += [int(label) * 1000 + int(img.sum()) for img, label in ds]
        fetched.append({n for n in os.listdir(ds.reader.root) if n.endswith(".tar")})
    shards = {f.name for f in read_manifest(local_sets["tar"]).files if f.name.endswith(".tar")}
    assert fetched[0] | fetched[1] == shards and not fetched[0] & fetched[1]
    ref = open_dataset(local_sets["tar"])
    assert len(seen) >= len(ref)


class _FaultProxy:
    """A TCP proxy to a server that answers some HTTP requests itself with ``status`` instead of
    forwarding them: every request when ``every`` is 1, every second one when 2, ... Uploads
    (PUT requests) wait while ``uploads`` is clear."""

    def __init__(self, port, status, every, delay=0.0):
        self.target, self.status, self.every, self.requests = ("127.0.0.1", port), status, every, 0
        self.delay = delay
        self.uploads = threading.Event()
        self.uploads.set()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        server = socket.create_connection(self.target)
        threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()
        try:
            while True:
                data = client.recv(1 << 16)
                if not data:
                    break
                if data[:4] in (b"GET ", b"HEAD", b"PUT "):
                    self.requests += 1
                    if data.startswith(b"PUT "):
                        self.uploads.wait()
                    time.sleep(self.delay)
                    if self.requests % self.every == 0:
                        body = b"" if data.startswith(b"HEAD") else b"<Error><Code>Injected</Code></Error>"
                        client.sendall(b"HTTP/1.1 %d Injected\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                                       % (self.status, len(body), body))
                        break
                server.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, server):
                try:
                    s.close()
                except OSError:
                    pass

    @staticmethod
    def _pipe(src, dst):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass

    def options(self, s3):
        return {**s3, "client_kwargs": {**s3["client_kwargs"], "endpoint_url": f"http://127.0.0.1:{self.port}"}}


def test_transient_server_errors_are_retried(s3, local_sets, tmp_path):
    url = _upload(s3, local_sets["lmdb"], "flaky/lmdb")
    port = int(s3["client_kwargs"]["endpoint_url"].rsplit(":", 1)[1])
    proxy = _FaultProxy(port, 503, every=2)  # every second request fails
    ds = open_dataset(url, storage_options=proxy.options(s3), cache_dir=str(tmp_path / "c"))
    _same(ds, open_dataset(local_sets["lmdb"]))
    assert proxy.requests >= 4  # manifest and data, each failed once


def test_access_denied_fails_at_once_naming_the_url(s3, local_sets, tmp_path):
    url = _upload(s3, local_sets["tar"], "denied/tar")
    port = int(s3["client_kwargs"]["endpoint_url"].rsplit(":", 1)[1])
    proxy = _FaultProxy(port, 403, every=1)
    start = time.monotonic()
    with pytest.raises(RemoteError, match="s3://data/denied/tar/manifest.json: access denied"):
        open_dataset(url, storage_options=proxy.options(s3), cache_dir=str(tmp_path / "c"))
    assert time.monotonic() - start < 10 and proxy.requests <= 2



def test_a_stalled_server_fails_each_file_within_the_deadline(s3, local_sets, tmp_path, monkeypatch, capsys):
    """A server that stops answering (the proxy holds every request): with a 2 s deadline, reading
    a shard, then opening the dataset, then `packer info --remote-deadline 2` each fail naming the
    file's URL within seconds; botocore's timeouts and retries alone took minutes."""
    from packer.cli import main

    url = _upload(s3, local_sets["tar"], "stalled/tar")
    port = int(s3["client_kwargs"]["endpoint_url"].rsplit(":", 1)[1])
    proxy = _FaultProxy(port, 503, every=10**9)
    options = proxy.options(s3)
    monkeypatch.setenv("PACKER_REMOTE_DEADLINE", "2")
    ds = open_dataset(url, storage_options=options, cache_dir=str(tmp_path / "c"))
    proxy.delay = 3600  # the server stops answering
    start = time.monotonic()
    try:
        with pytest.raises(RemoteError, match=r"s3://data/stalled/tar/shard-000000\.\w+: no answer within 2 s"):
            ds[0]
        with pytest.raises(RemoteError, match=r"s3://data/stalled/tar/manifest\.json: no answer within 2 s"):
            open_dataset(url, storage_options=options, cache_dir=str(tmp_path / "c2"))
        monkeypatch.setenv("PACKER_REMOTE_DEADLINE", "600")  # the option wins
        cli = _cli_opts(options, str(tmp_path / "c3"))
        assert main(["info", url, *cli, "--remote-deadline", "2"]) == 1
        assert os.environ["PACKER_REMOTE_DEADLINE"] == "600"  # the option held for that command only
    finally:
        proxy.sock.shutdown(socket.SHUT_RDWR)  # wakes its accept(): the abandoned requests' retries
        proxy.sock.close()  # find no server, not a proxy to a stopped moto
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s3://data/stalled/tar/manifest.json: no answer within 2 s" in err[0], err
    assert time.monotonic() - start < 30

def test_a_server_that_answers_every_request_slowly_fails_the_file_within_its_deadline(s3, local_sets):
    """The deadline holds for a file, not for each request: a server answering each request in
    0.5 s passed a per-request bound of 2 s for ever, 16 MiB at a time; the file's read now ends
    within its 2 s, naming its URL."""
    url = _upload(s3, local_sets["tar"], "slow/tar")
    port = int(s3["client_kwargs"]["endpoint_url"].rsplit(":", 1)[1])
    proxy = _FaultProxy(port, 503, every=10**9, delay=0.5)
    try:
        remote = Remote(url, proxy.options(s3), deadline=2.0)
        shard = next(f for f in read_manifest(local_sets["tar"]).files if f.name.endswith(".tar"))
        stream = remote.open(shard.name, shard.bytes)
        start = time.monotonic()
        with pytest.raises(RemoteError, match=rf"s3://data/slow/tar/{shard.name}: (no answer|not read) within 2 s"):
            while stream.read(512):  # one request each
                pass
        assert time.monotonic() - start < 3
    finally:
        proxy.sock.shutdown(socket.SHUT_RDWR)
        proxy.sock.close()


def test_two_torchrun_ranks_stream_from_s3_every_sample_once(s3, tmp_path_factory, tmp_path):
    import collections
    import json
    import subprocess
    import sys

    from tests.datasets.test_ddp import free_port
    from tests.datasets.test_streaming import N, convert, expected

    data = convert(tmp_path_factory, "tar")
    url = _upload(s3, data, "ddp/tar")
    from tests.helpers import TESTS as here  # the folder of ddp_worker.py
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           os.path.join(here, "ddp_worker.py"), "--data", url, "--out", str(tmp_path), "--epochs", "auto,auto",
           "--batch-size", "3", "--workers", "2", "--storage-options", json.dumps(s3),
           "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in range(2):
        seen = collections.Counter()
        for r, rec in enumerate(ranks):
            ids = [p // 10 for p in rec["epochs"][epoch]["pixels"]]
            assert ids == expected(data, rank=r, world_size=2, epoch=epoch, block=None)  # the local plan
            seen.update(ids)
        assert set(seen) == set(range(N)) and sum(seen.values()) == N + ranks[0]["padded"]


def _cli_opts(s3, cache):
    endpoint = s3["client_kwargs"]["endpoint_url"]
    return ["--storage-option", "key=testing", "--storage-option", "secret=testing",
            "--storage-option", f"client_kwargs.endpoint_url={endpoint}",
            "--storage-option", "client_kwargs.region_name=us-east-1", "--cache-dir", cache]


def test_a_killed_upload_resumes_without_uploading_again(s3, tmp_path):
    import signal
    import subprocess
    import sys

    import s3fs

    src = str(tmp_path / "src")
    make_folder(src, {c: [(f"{i}.png", 32, 32) for i in range(40)] for c in ("a", "b")})
    url, key = "s3://data/resumed/tar", "data/resumed/tar"
    args = ["convert", "imagefolder", "tar", src, url, "--encode", "png", "--shard-samples", "4", "--workers", "1",
            "--no-shuffle"]  # not -q: the summary says where it uploaded
    fs = s3fs.S3FileSystem(**s3)
    port = int(s3["client_kwargs"]["endpoint_url"].rsplit(":", 1)[1])
    slow = _FaultProxy(port, 503, every=10**9, delay=0.1)  # 0.1 s per request: the upload takes seconds
    proc = subprocess.Popen([sys.executable, "-m", "packer", *args, *_cli_opts(slow.options(s3), str(tmp_path / "c"))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        fs.invalidate_cache()
        if fs.exists(f"{key}/.packer-upload.json") and len(fs.ls(key)) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    fs.invalidate_cache()
    assert not fs.exists(f"{key}/manifest.json")  # no dataset until every file is there
    first = {p: fs.info(p)["LastModified"] for p in fs.ls(key) if p.endswith(".tar")}
    assert first
    r = _cli(*args, *_cli_opts(s3, str(tmp_path / "c")), "--resume")
    assert r.returncode == 0 and f"uploaded to {url}" in r.stdout, r.stderr
    fs.invalidate_cache()
    assert {p: fs.info(p)["LastModified"] for p in first} == first  # kept, not uploaded again
    assert not fs.exists(f"{key}/.packer-upload.json")
    local = pack(src, str(tmp_path / "local"), "tar", encode="png", shuffle=False, writer={"shard_samples": 4})
    _same(open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c2")), open_dataset(local.output))


def _files_under(top):
    """{path: (size, mtime_ns)} of every file below ``top``, but the first run's claim on its local
    copy (``.dataset.packer-lock``): that run removes it itself once the copy is published, which
    can fall between two snapshots."""
    out = {}
    for folder, _, names in os.walk(top):
        for n in names:
            if n == ".dataset.packer-lock":
                continue
            st = os.stat(os.path.join(folder, n))
            out[os.path.relpath(os.path.join(folder, n), top)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("first_then", ["finishes", "is_killed_and_resumed"])
def test_a_second_conversion_to_a_url_being_uploaded_is_refused_and_touches_nothing(s3, tmp_path, first_then):
    """The first conversion has finished its local copy and waits on its uploads (the server
    holds every PUT): a second one to the same URL on this node exits 1 with one line naming the
    first's pid and leaves every file of the node-cache upload folder as it was. The first then
    completes, or (killed) its --resume does, and the URL holds the dataset."""
    import glob
    import signal
    import subprocess
    import sys

    src = str(tmp_path / "src")
    make_folder(src, {c: [(f"{i}.png", 24, 24) for i in range(6)] for c in ("a", "b")})
    url, cache = f"s3://data/claimed/{first_then}", str(tmp_path / "cache")
    args = ["convert", "imagefolder", "tar", src, url, "--encode", "png", "--shard-samples", "4", "--workers", "1",
            "--no-shuffle"]  # not -q: the summary says where it uploaded
    port = int(s3["client_kwargs"]["endpoint_url"].rsplit(":", 1)[1])
    held = _FaultProxy(port, 503, every=10**9)
    held.uploads.clear()
    first = subprocess.Popen([sys.executable, "-m", "packer", *args, *_cli_opts(held.options(s3), cache)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        finished = os.path.join(cache, "uploads", "*", "dataset", "manifest.json")
        deadline = time.monotonic() + 120
        while not glob.glob(finished) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert glob.glob(finished) and first.poll() is None, first.communicate() if first.poll() is not None else ""
        before = _files_under(os.path.join(cache, "uploads"))
        second = _cli(*args, *_cli_opts(s3, cache))
        assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
        assert len(second.stderr.strip().splitlines()) == 1, second.stderr
        assert f"{url} is being written by another conversion (pid {first.pid} " in second.stderr, second.stderr
        assert _files_under(os.path.join(cache, "uploads")) == before
        if first_then == "is_killed_and_resumed":
            first.send_signal(signal.SIGKILL)
            first.communicate()
            held.uploads.set()
            r = _cli(*args, *_cli_opts(s3, cache), "--resume")
            assert r.returncode == 0 and f"uploaded to {url}" in r.stdout, r.stderr
        else:
            held.uploads.set()
            out, err = first.communicate(timeout=120)
            assert first.returncode == 0 and f"uploaded to {url}" in out, err
    finally:
        held.uploads.set()
        if first.poll() is None:
            first.kill()
            first.communicate()
    local = pack(src, str(tmp_path / "local"), "tar", encode="png", shuffle=False, writer={"shard_samples": 4})
    _same(open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "reader")), open_dataset(local.output))
    assert not glob.glob(os.path.join(cache, "uploads", "*", "*"))  # the upload folder is gone once published


def test_overwrite_never_feeds_an_open_reader_a_mix(s3, tmp_path):
    import s3fs

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    make_folder(a, {"x": [(f"{i}.png", 16, 16) for i in range(12)]}, seed=1)
    make_folder(b, {"x": [(f"{i}.png", 16, 16) for i in range(6)]}, seed=2)
    url = "s3://data/overwritten/tar"
    opts = _cli_opts(s3, str(tmp_path / "cache"))
    common = ["--encode", "png", "--shard-samples", "2", "--no-shuffle", "-q", *opts]
    assert _cli("convert", "imagefolder", "tar", a, url, *common).returncode == 0
    old = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "reader"), remote="whole")
    first = old[0]
    fs = s3fs.S3FileSystem(**s3)
    r = _cli("convert", "imagefolder", "tar", b, url, "--overwrite", *common)
    assert r.returncode == 0, r.stderr
    fresh = read_remote_manifest(Remote(url, s3))[0]
    # every new file met a live name holding other bytes: none was written over, each got a new name
    assert not {f.name for f in fresh.files} & {f.name for f in old.manifest.files}
    assert fresh.files[0].name.startswith("shard-000000.g") and fresh.files[0].name.endswith(".tar")
    with pytest.raises(DatasetChangedError, match="replaced or removed after this reader opened it"):
        old[len(old) - 1]  # its shard was replaced or removed: an error, not another sample
    with pytest.raises(DatasetChangedError):
        old[4]  # a shard whose name the new dataset uses too: its bytes differ
    assert torch.equal(old[0][0], first[0])  # what it has cached is still its own dataset
    new = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "reader2"))
    assert len(new) == 6
    fs.invalidate_cache()
    names = {p.rsplit("/", 1)[1] for p in fs.ls("data/overwritten/tar")}
    assert names == {f.name for f in new.manifest.files} | {"manifest.json"}  # the old extra shards removed


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_overwrite_of_a_one_file_dataset_uploads_a_new_name(s3, tmp_path, fmt):
    """LMDB and HDF5 are one file: an overwrite uploads it under a new name, switches the manifest,
    then removes the old file; a reader opened before keeps what it downloaded."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    make_folder(a, {"x": [(f"{i}.png", 16, 16) for i in range(5)]}, seed=3)
    make_folder(b, {"y": [(f"{i}.png", 16, 16) for i in range(3)]}, seed=4)
    url = f"s3://data/overwritten1/{fmt}"
    common = ["--encode", "png", "--no-shuffle", "-q", *_cli_opts(s3, str(tmp_path / "cache"))]
    assert _cli("convert", "imagefolder", fmt, a, url, *common).returncode == 0
    old = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "reader"), remote="whole")
    before = [old[i][1] for i in range(len(old))]
    r = _cli("convert", "imagefolder", fmt, b, url, "--overwrite", *common)
    assert r.returncode == 0, r.stderr
    new = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "reader2"), fields=("key", "label"))
    assert new.data_file.startswith("data.g") and new.classes == ["y"]
    assert [new[i] for i in range(3)] == [(f"y/{i}.png", 0) for i in range(3)] and list(new.targets) == [0, 0, 0]
    assert [old[i][1] for i in range(len(old))] == before  # downloaded whole before: still its own dataset


@pytest.mark.parametrize("window", ["auto", None])
def test_shuffled_streaming_with_a_quarter_size_cache_downloads_each_shard_once_per_epoch(local_sets, tmp_path,
                                                                                          window):
    """A shuffle that reaches across the whole rank sequence (the sample buffer) makes a cache
    smaller than the dataset download shards again and again; the shard window that
    ``shuffle_shards="auto"`` picks from ``cache_limit`` downloads each shard once per epoch."""
    from packer.datasets import StreamingDataset

    local = local_sets["tar"]
    m = read_manifest(local)
    shards = [f.name for f in m.files if f.samples]
    limit = sum(f.bytes for f in m.files) // 4
    server, gets = _counting_server(os.path.dirname(local))
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/tar"
        ds = StreamingDataset(url, cache_dir=str(tmp_path / "c"), cache_limit=limit, seed=5, batch_size=2,
                              prefetch_shards=0, shuffle_shards=window)
        loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=_labels_of)
        seen = []
        for epoch in range(2):
            ds.set_epoch(epoch)
            seen.append(sorted(lab for labels in loader for lab in labels))
    finally:
        server.shutdown()
    assert seen[0] == seen[1] == sorted(open_dataset(local).targets.tolist())
    got = sum(gets[f"/tar/{s}"] for s in shards)
    if window == "auto":
        assert ds.options.shuffle_shards == 1 and got <= 2 * len(shards), dict(gets)
    else:  # the sample buffer: a worker's next sample is in any shard of the rank's epoch
        assert got > 2 * len(shards), dict(gets)


def _labels_of(batch):
    return [int(label) for _, label in batch]


def _counting_server(root):
    """A read-only HTTP server of ``root`` on 127.0.0.1, started, and a Counter of its GETs by path."""
    import collections
    import functools
    import http.server

    gets: collections.Counter = collections.Counter()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            gets[self.path] += 1
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=root))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, gets


def test_verify_of_a_url_with_a_cache_limit_below_the_dataset_says_the_limit_it_needs(s3, local_sets, tmp_path):
    """verify fetched every file through a cache that evicted the first ones before it read them,
    and failed a healthy dataset with 'tar index file is missing'."""
    url = _upload(s3, local_sets["tar"], "verify-small-cache")
    cache = str(tmp_path / "c")
    largest = max(f.bytes for f in read_manifest(local_sets["tar"]).files)
    r = _cli("verify", url, *_cli_opts(s3, cache), "--cache-limit", str(4 * largest))
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "missing" not in err[0] and f"{url}: a local copy" in err[0] and "raise --cache-limit to at least" in err[0]
    need = int(err[0].rsplit("at least ", 1)[1].split()[0].replace(",", ""))
    r = _cli("verify", url, *_cli_opts(s3, cache), "--cache-limit", str(need))
    assert r.returncode == 0 and "24/24 samples decoded" in r.stdout and "CORRUPT" not in r.stdout, (r.stdout, r.stderr)


# -- the node cache trusts no size, name or folder it did not make ----------------------------------

def _disk_use(top):
    """Bytes the files under ``top`` take on disk, counted independently of the cache."""
    total = 0
    for folder, _, names in os.walk(top):
        for n in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(folder, n)).st_blocks * 512
    return total


def _forged_manifest(s3, url, edit):
    """Rewrite the manifest at ``url`` with ``edit(dict)`` applied."""
    import json

    import s3fs

    fs = s3fs.S3FileSystem(**s3)
    key = url.removeprefix("s3://") + "/manifest.json"
    data = json.loads(fs.cat(key))
    edit(data)
    fs.pipe(key, json.dumps(data).encode())
    return fs


def test_a_forged_file_size_reserves_nothing_and_names_the_url(s3, local_sets, tmp_path):
    url = _upload(s3, local_sets["tar"], "forged-size/tar")
    shard = next(f for f in read_manifest(local_sets["tar"]).files if f.name.endswith(".tar"))

    def forge(data):
        next(f for f in data["files"] if f["name"] == shard.name)["bytes"] = 600_000_000

    _forged_manifest(s3, url, forge)
    cache_dir = str(tmp_path / "cache")
    ds = open_dataset(url, storage_options=s3, cache_dir=cache_dir, remote="whole")  # no cache_limit
    peak, stop = [0], threading.Event()

    def poll():
        while not stop.is_set():
            peak[0] = max(peak[0], _disk_use(cache_dir))
            time.sleep(0.001)

    t = threading.Thread(target=poll)
    t.start()
    try:
        with pytest.raises(CorruptDataError, match=f"server holds {shard.bytes:,} bytes, the manifest says "
                                                   f"600,000,000") as info:
            [ds[i] for i in range(len(ds))]
    finally:
        stop.set()
        t.join()
    assert info.value.path == f"{url}/{shard.name}"
    assert peak[0] < 10 * 2**20, f"{peak[0] / 2**20:.0f} MiB reserved for a {shard.bytes:,}-byte object"


def _add_files(s3, url, files):
    """Upload ``files`` (name -> bytes) beside the dataset at ``url`` and list them in its manifest."""
    import hashlib

    def add(data):
        data["files"] += [{"name": n, "samples": 0, "bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                          for n, b in files.items()]

    fs = _forged_manifest(s3, url, add)
    for n, b in files.items():
        fs.pipe(url.removeprefix("s3://") + "/" + n, b)


def test_every_file_in_the_cache_counts_against_the_limit_whatever_its_name(tmp_path):
    """Files whose names end like the cache's own bookkeeping (.fetch, .partial, .ahead) were
    neither counted nor evicted: 254 kB on disk while usage() said 70 kB under a 150 kB limit."""
    import hashlib
    import io

    limit = 150_000
    cache_dir = str(tmp_path / "cache")
    cache = NodeCache(cache_dir, limit)
    view = cache.view("s3://data/names/tar", b"{}")
    for i, suffix in enumerate([".fetch", ".fetch", ".partial", ".ahead", ".fetch", ".tar"]):
        data = os.urandom(60_000)
        name = f"x{i}{suffix}"
        os.close(cache.fetch(os.path.join(view, name), len(data), hashlib.sha256(data).hexdigest(),
                             lambda data=data: io.BytesIO(data), f"s3://data/names/tar/{name}"))
        on_disk = _disk_use(os.path.join(cache_dir, "datasets")) + _disk_use(os.path.join(cache_dir, "work"))
        assert cache.usage() == on_disk
        assert _disk_use(cache_dir) <= limit, f"{_disk_use(cache_dir):,} bytes on disk under a {limit:,}-byte limit"


def test_a_symlink_planted_as_a_dataset_folder_is_not_followed(s3, local_sets, tmp_path):
    url = _upload(s3, local_sets["tar"], "planted/tar")
    cache_dir = str(tmp_path / "cache")
    view = open_dataset(url, storage_options=s3, cache_dir=cache_dir).root
    outside = tmp_path / "outside"
    outside.mkdir()
    for n in os.listdir(view):
        os.remove(os.path.join(view, n))
    os.rmdir(view)
    os.symlink(outside, view)  # a dataset folder of the cache, planted as a link out of it
    ds = open_dataset(url, storage_options=s3, cache_dir=cache_dir)
    _same(ds, open_dataset(local_sets["tar"]))
    assert os.listdir(outside) == [], "nothing written outside the cache"
    assert not os.path.islink(view) and os.path.isdir(view)


_KILLED_DOWNLOADER = """
import sys, time
from packer.storage.nodecache import NodeCache

class Stalls:  # a server that sends one chunk, then nothing
    size = int(sys.argv[2])
    sent = False
    def read(self, n):
        if self.sent:
            print("downloading", flush=True)
            time.sleep(600)
        self.sent = True
        return bytes(min(n, 1000))
    def close(self):
        pass
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        pass

cache = NodeCache(sys.argv[1], cache_limit=int(sys.argv[2]) * 3 // 2)
view = cache.view("s3://b/killed", b"{}")
cache.fetch(view + "/big.bin", int(sys.argv[2]), "0" * 64, Stalls, "s3://b/killed/big.bin")
"""


def test_a_killed_downloaders_partial_is_reclaimed_for_another_file(tmp_path):
    import hashlib
    import signal
    import subprocess
    import sys

    size = 4 * 2**20
    cache_dir = str(tmp_path / "cache")
    child = subprocess.Popen([sys.executable, "-c", _KILLED_DOWNLOADER, cache_dir, str(size)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "downloading"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
    assert _disk_use(cache_dir) >= size, "the killed download's partial file is left"
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(size))
    cache = NodeCache(cache_dir, cache_limit=size * 3 // 2, wait_s=2)
    view = cache.view("s3://b/other", b"{}")
    fd = cache.fetch(os.path.join(view, "other.bin"), size, hashlib.sha256(other.read_bytes()).hexdigest(),
                     lambda: open(other, "rb"), "s3://b/other/other.bin")
    os.close(fd)
    assert cache.usage() <= size * 3 // 2 and _disk_use(cache_dir) <= size * 3 // 2


def test_read_ahead_larger_than_the_cache_limit_reads_every_sample(s3, local_sets, tmp_path):
    """2 workers, each reading ahead 2 shards, under a limit of 3 shards: each worker's current
    shard fits, and read-ahead uses what is left."""
    from packer.datasets import StreamingDataset

    local = local_sets["tar"]
    m = read_manifest(local)
    biggest = max(f.bytes for f in m.files)
    limit = 3 * biggest
    assert limit < 0.4 * sum(f.bytes for f in m.files)
    url = _upload(s3, local, "ahead-limit/tar")
    kwargs = {"shuffle": True, "seed": 3, "output": "numpy"}
    remote = StreamingDataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"), cache_limit=limit,
                              prefetch_shards=2, **kwargs)
    loader = torch.utils.data.DataLoader(remote, batch_size=None, num_workers=2)
    got = sorted((int(label), np.asarray(img).tobytes()) for img, label in loader)
    want = sorted((int(label), img.tobytes()) for img, label in StreamingDataset(local, **kwargs))
    assert got == want
