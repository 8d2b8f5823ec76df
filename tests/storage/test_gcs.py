"""Datasets in Google Cloud Storage: gcsfs against a real GCS JSON-API server (the pure-Python
emulator, in memory, on 127.0.0.1), written by the command line and read back through the node
cache."""

from __future__ import annotations

import http.client
import http.server
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch

from packer.datasets import StreamingDataset, open_dataset
from packer.description.manifest import read_manifest
from packer.errors import DatasetChangedError
from packer.storage.remote import Remote, RemoteError, read_remote_manifest
from tests.datasets.test_ddp import free_port
from tests.helpers import import_optional, make_folder, pack

gcsfs = import_optional("gcsfs", "gs:// tests need gcsfs: pip install 'packer[gcs]'")
emulator = import_optional("gcp_storage_emulator.server",
                           "gs:// tests need the GCS emulator: pip install gcp-storage-emulator")

BUCKET = "packed"
FIELDS = ("image", "label", "key")


@pytest.fixture(scope="module")
def gcs():
    """The emulator on a free port with one bucket; yields the storage_options that reach it."""
    port = free_port()
    server = emulator.create_server("127.0.0.1", port, in_memory=True)
    server.start()
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "token": "anon"}
    gcsfs.core.GCSFileSystem(**options).mkdir(BUCKET)
    yield options
    server.stop()


def _bucket(gcs):
    """A gcsfs client of the emulator that sees every change (no listing cache)."""
    fs = gcsfs.core.GCSFileSystem(**gcs, skip_instance_cache=True)
    fs.invalidate_cache()
    return fs


def _opts(gcs, cache):
    return ["--storage-option", f"endpoint_url={gcs['endpoint_url']}", "--storage-option", "token=anon",
            "--cache-dir", cache]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "packer", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("gcs") / "src")
    make_folder(folder, {c: [(f"{i}.png", 16 + i, 20) for i in range(6)] for c in ("a", "b", "c")})
    return folder


def _samples(ds):
    """Every sample of ``ds`` read through a DataLoader with 2 workers, in order."""
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, shuffle=False)
    return list(loader)


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_the_command_line_converts_to_gcs_and_it_reads_like_a_local_copy(gcs, src, tmp_path, fmt):
    url = f"gs://{BUCKET}/same/{fmt}"
    shards = ["--shard-samples", "4"] if fmt == "tar" else []
    r = _cli("convert", "imagefolder", fmt, src, url, "--encode", "png", "--no-shuffle", "-q", *shards,
             *_opts(gcs, str(tmp_path / "work")))
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr  # -q: no summary, no "uploaded to"
    local = pack(src, str(tmp_path / "local"), fmt, encode="png", shuffle=False,
                 writer={"shard_samples": 4} if fmt == "tar" else None).output
    remote = open_dataset(url, storage_options=gcs, cache_dir=str(tmp_path / "cache"), fields=FIELDS)
    assert remote.url == url and len(remote) == 18
    got, want = _samples(remote), _samples(open_dataset(local, fields=FIELDS))
    assert len(got) == len(want) == 18
    for i, ((img, label, key), (ref_img, ref_label, ref_key)) in enumerate(zip(got, want)):
        assert (key, label) == (ref_key, ref_label) and torch.equal(img, ref_img), i
    assert sorted(k for _, _, k in got) == sorted(f"{c}/{i}.png" for c in "abc" for i in range(6))
    # every object the manifest names, with its size, and the upload record gone
    fs = _bucket(gcs)
    sizes = {p.rsplit("/", 1)[1]: fs.info(p)["size"] for p in fs.ls(f"{BUCKET}/same/{fmt}")}
    assert sizes == {**{f.name: f.bytes for f in remote.manifest.files},
                     "manifest.json": sizes.get("manifest.json", -1)}


def test_info_and_verify_on_a_gcs_url(gcs, src, tmp_path):
    url = f"gs://{BUCKET}/checked/tar"
    opts = _opts(gcs, str(tmp_path / "cache"))
    r = _cli("convert", "imagefolder", "tar", src, url, "--encode", "png", "--shard-samples", "5", "-q", *opts)
    assert r.returncode == 0, r.stderr
    r = _cli("info", url, *opts)
    assert r.returncode == 0 and "samples     18" in r.stdout and f"path        {url}" in r.stdout, r.stderr
    r = _cli("verify", url, *opts)
    assert r.returncode == 0 and "18/18 samples decoded" in r.stdout, r.stdout + r.stderr
    # a shard altered on the server: verify names it and fails, without a traceback
    _bucket(gcs).pipe(f"{BUCKET}/checked/tar/shard-000000.tar", b"x" * 10240)
    r = _cli("verify", url, *opts[:-1], str(tmp_path / "cache2"))
    assert r.returncode == 1 and "shard-000000.tar" in r.stderr and "CORRUPT" in r.stdout, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    r = _cli("info", f"gs://{BUCKET}/checked/none", *opts)
    assert r.returncode == 1 and f"gs://{BUCKET}/checked/none/manifest.json does not exist" in r.stderr, r.stderr


def test_streaming_from_gcs_reads_every_sample_once(gcs, src, tmp_path):
    url = f"gs://{BUCKET}/stream/tar"
    local = pack(src, str(tmp_path / "local"), "tar", encode="png", shuffle=False, writer={"shard_samples": 4})
    r = _cli("convert", "imagefolder", "tar", src, url, "--encode", "png", "--shard-samples", "4", "--no-shuffle",
             "-q", *_opts(gcs, str(tmp_path / "work")))
    assert r.returncode == 0, r.stderr
    kwargs = {"shuffle": True, "seed": 5, "output": "numpy"}
    remote = StreamingDataset(url, storage_options=gcs, cache_dir=str(tmp_path / "c"), cache_limit="200kB", **kwargs)

    def pixels(ds):
        return sorted((int(label), img.numpy().tobytes()) for img, label in _samples(ds))

    got = pixels(remote)
    assert len(got) == 18 and got == pixels(StreamingDataset(local.output, **kwargs))


def test_overwrite_on_gcs_uploads_new_names_and_never_feeds_an_open_reader_a_mix(gcs, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    make_folder(a, {"x": [(f"{i}.png", 16, 16) for i in range(8)]}, seed=1)
    make_folder(b, {"x": [(f"{i}.png", 16, 16) for i in range(4)]}, seed=2)
    url = f"gs://{BUCKET}/overwritten/tar"
    common = ["--encode", "png", "--shard-samples", "2", "--no-shuffle", "-q", *_opts(gcs, str(tmp_path / "work"))]
    r = _cli("convert", "imagefolder", "tar", a, url, *common)
    assert r.returncode == 0, r.stderr
    old = open_dataset(url, storage_options=gcs, cache_dir=str(tmp_path / "reader"), remote="whole")
    first = old[0]
    r = _cli("convert", "imagefolder", "tar", b, url, *common)
    assert r.returncode == 1 and "already holds a packed dataset" in r.stderr and "Traceback" not in r.stderr
    r = _cli("convert", "imagefolder", "tar", b, url, "--overwrite", *common)
    assert r.returncode == 0, r.stderr
    # each new file met a live name holding other bytes: none was written over, all got one generation
    names = [f.name for f in read_remote_manifest(Remote(url, gcs))[0].files]
    gens = {n.split(".")[1] for n in names}
    assert len(gens) == 1 and re.fullmatch(r"g[0-9a-f]{8}", gen := gens.pop()), names
    assert {n.replace(f".{gen}.", ".", 1) for n in names} < {f.name for f in old.manifest.files}
    with pytest.raises(DatasetChangedError, match="replaced or removed after this reader opened it"):
        old[len(old) - 1]  # its shard was removed: an error, not another sample
    with pytest.raises(DatasetChangedError):
        old[2]  # a shard whose name the new dataset uses too, for other bytes
    assert torch.equal(old[0][0], first[0])  # what it has cached is still its own dataset
    new = open_dataset(url, storage_options=gcs, cache_dir=str(tmp_path / "reader2"), fields=("key", "label"))
    assert [new[i] for i in range(len(new))] == [(f"x/{i}.png", 0) for i in range(4)]
    fs = _bucket(gcs)
    names = {p.rsplit("/", 1)[1] for p in fs.ls(f"{BUCKET}/overwritten/tar")}
    assert names == {f.name for f in new.manifest.files} | {"manifest.json"}  # the old files removed


def test_overwrite_with_the_same_bytes_keeps_the_names(gcs, src, tmp_path):
    url = f"gs://{BUCKET}/again/lmdb"
    common = ["--encode", "png", "--no-shuffle", "-q", *_opts(gcs, str(tmp_path / "work"))]
    assert _cli("convert", "imagefolder", "lmdb", src, url, *common).returncode == 0
    before = read_remote_manifest(Remote(url, gcs))[0]
    r = _cli("convert", "imagefolder", "lmdb", src, url, "--overwrite", *common)
    assert r.returncode == 0, r.stderr
    after = read_remote_manifest(Remote(url, gcs))[0]
    assert [(f.name, f.sha256) for f in after.files] == [(f.name, f.sha256) for f in before.files]
    ds = open_dataset(url, storage_options=gcs, cache_dir=str(tmp_path / "c"), fields=("key",))
    assert len(ds) == 18 and ds[0][0] == "a/0.png"


def test_missing_objects_and_buckets_name_the_url(gcs, tmp_path):
    from packer.errors import UnfinishedDatasetError

    with pytest.raises(UnfinishedDatasetError, match=f"gs://{BUCKET}/nothing/manifest.json does not exist"):
        open_dataset(f"gs://{BUCKET}/nothing", storage_options=gcs, cache_dir=str(tmp_path))
    with pytest.raises((UnfinishedDatasetError, RemoteError), match="gs://no-such-bucket/x"):
        open_dataset("gs://no-such-bucket/x", storage_options=gcs, cache_dir=str(tmp_path))


class _Gate:
    """An HTTP server in front of the emulator that answers some requests itself with ``status``
    (every ``every``-th one) and forwards the others unchanged."""

    def __init__(self, endpoint, status, every):
        host, port = endpoint.rsplit("//", 1)[1].split(":")
        self.status, self.every, self.count = status, every, 0
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                gate.count += 1
                if gate.count % gate.every == 0:
                    self.send_response(gate.status)
                    payload = b'{"error": {"code": %d, "message": "injected"}}' % gate.status
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def options(self, gcs):
        return {**gcs, "endpoint_url": f"http://127.0.0.1:{self.server.server_address[1]}"}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def uploaded(gcs, src, tmp_path_factory):
    """``src`` as LMDB at a gs:// URL, and its local conversion."""
    local = pack(src, str(tmp_path_factory.mktemp("gcs-lmdb") / "lmdb"), "lmdb", encode="png", shuffle=False).output
    from packer.storage.remote import upload_dataset

    url = f"gs://{BUCKET}/uploaded/lmdb"
    upload_dataset(local, Remote(url, gcs), read_manifest(local))
    return url, local


@pytest.mark.slow
def test_transient_gcs_errors_are_retried(gcs, uploaded, tmp_path):
    url, local = uploaded
    gate = _Gate(gcs["endpoint_url"], 503, every=2)  # every second request fails
    try:
        ds = open_dataset(url, storage_options=gate.options(gcs), cache_dir=str(tmp_path / "c"))
        ref = open_dataset(local)
        assert len(ds) == len(ref)
        for i in range(len(ref)):
            assert ds[i][1] == ref[i][1] and torch.equal(ds[i][0], ref[i][0]), i
    finally:
        gate.close()
    assert gate.count >= 4  # the manifest and the data, each failed once


def test_access_denied_on_gcs_fails_at_once_naming_the_url(gcs, uploaded, tmp_path):
    url, _ = uploaded
    gate = _Gate(gcs["endpoint_url"], 403, every=1)
    start = time.monotonic()
    try:
        with pytest.raises(RemoteError, match=f"{url}/manifest.json: access denied"):
            open_dataset(url, storage_options=gate.options(gcs), cache_dir=str(tmp_path / "c"))
    finally:
        gate.close()
    # gcsfs asks for the object, then whether the name is a folder (two listings); no retries
    assert time.monotonic() - start < 10 and gate.count <= 3


def test_gcs_requests_have_bounded_waits(gcs):
    fs, path = Remote(f"gs://{BUCKET}/x/", gcs).filesystem()
    assert path == f"{BUCKET}/x" and fs.requests_timeout.sock_read == 30
    fs, _ = Remote(f"gs://{BUCKET}/x", {**gcs, "requests_timeout": 5}).filesystem()
    assert fs.requests_timeout == 5


def test_the_emulator_host_variable_reaches_the_server(gcs, uploaded, tmp_path, monkeypatch):
    url, local = uploaded
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs["endpoint_url"])
    ds = open_dataset(url, storage_options={"token": "anon"}, cache_dir=str(tmp_path / "c"))
    assert ds.manifest == read_manifest(local)
    assert ds[len(ds) - 1][1] == open_dataset(local)[len(ds) - 1][1]
    assert os.path.exists(os.path.join(ds.root, ds.manifest.files[0].name))


def test_a_refused_request_is_one_line_without_gcsfs_tracebacks(gcs, uploaded, tmp_path):
    url, _ = uploaded
    gate = _Gate(gcs["endpoint_url"], 400, every=1)  # gcsfs does not retry a 400, and logs it with a traceback
    try:
        r = _cli("info", url, *_opts(gate.options(gcs), str(tmp_path / "c")))
    finally:
        gate.close()
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [f"packer: error: {url}/manifest.json: HttpError: injected, 400"]


@pytest.mark.slow
def test_a_gcs_server_that_stops_gives_a_clear_error_in_bounded_time(tmp_path):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens: every connection is refused
    start = time.monotonic()
    r = _cli("info", f"gs://{BUCKET}/gone", *_opts({"endpoint_url": endpoint}, str(tmp_path / "c")))
    assert time.monotonic() - start < 60  # gcsfs retries 6 times, about half a minute of back-off
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"gs://{BUCKET}/gone/manifest.json: ClientConnectorError: Cannot connect to host" in r.stderr
