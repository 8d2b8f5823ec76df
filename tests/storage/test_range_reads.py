"""Records of a dataset at a URL read by byte range: a real S3 server (moto's, on 127.0.0.1) behind
a proxy that counts the bytes and requests it answers (the benchmarks' proxy)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from packer.cli import main
from packer.datasets import StreamingDataset, open_dataset
from packer.description.manifest import read_manifest
from packer.errors import CorruptDataError, DatasetChangedError
from packer.storage.remote import Remote, RemoteError, upload_dataset
from tests.helpers import import_optional, make_folder, pack

import_optional("s3fs", "s3:// tests need s3fs: pip install 'packer[s3]'")
import_optional("moto.server", "s3:// tests need moto's server: pip install 'moto[server]'")

RANGED = ["tar", "tfrecord", "hdf5"]
#: The issue's target: 20 random reads after open fetch at most 2x their records + 64 KiB each.
SLACK = 64 << 10


@pytest.fixture(scope="module")
def local_sets(tmp_path_factory):
    """120 photos of 96 x 96 as JPEG, tar and TFRecord in 12 shards of 10, HDF5 and LMDB."""
    base = tmp_path_factory.mktemp("ranges")
    src = str(base / "src")
    make_folder(src, {c: [(f"{i}.png", 96, 96) for i in range(40)] for c in ("a", "b", "c")})
    return {fmt: pack(src, str(base / fmt), fmt, encode="jpeg:90", shuffle=False,
                      writer={"shard_samples": 10} if fmt in ("tar", "tfrecord") else None).output
            for fmt in [*RANGED, "lmdb"]}


def _upload(s3, local, name):
    url = f"s3://data/ranges/{name}"  # moto keeps one store per process: names apart from other modules'
    upload_dataset(local, Remote(url, s3), read_manifest(local))
    return url


def _put(s3, url, data: bytes) -> None:
    """Replace the object at ``url`` on the server."""
    fs, path = Remote(url, s3).filesystem()
    fs.pipe_file(path, data)


def _get(s3, url) -> bytes:
    fs, path = Remote(url, s3).filesystem()
    return fs.cat_file(path)


@pytest.mark.parametrize("fmt", RANGED)
def test_twenty_random_reads_fetch_their_records_and_little_else(s3, proxy, local_sets, tmp_path, fmt):
    url = _upload(s3, local_sets[fmt], f"twenty/{fmt}")
    local = open_dataset(local_sets[fmt])
    ds = open_dataset(url, storage_options=proxy.options("testing"), cache_dir=str(tmp_path / "c"))
    opened = proxy.down
    proxy.reset()
    picks = np.random.default_rng(0).choice(len(ds), 20, replace=False).tolist()
    for i in picks:
        (img, label), (want, wlabel) = ds[i], local[i]
        assert label == wlabel and torch.equal(img, want), i
    records = sum(len(local.read_record(i).payload) for i in picks)
    total = sum(f.bytes for f in read_manifest(local_sets[fmt]).files)
    assert proxy.down <= 2 * records + 20 * SLACK, (proxy.down, records)
    assert proxy.down < total / 2 and opened < total / 2, (proxy.down, opened, total)  # whole shards: ~total
    shards = len([f for f in read_manifest(local_sets[fmt]).files if f.samples])
    assert proxy.requests <= 20 + 2 * shards  # one GET per record; a HEAD and its index per shard first read


def test_whole_mode_downloads_whole_files_as_before(s3, proxy, local_sets, tmp_path):
    url = _upload(s3, local_sets["tar"], "whole/tar")
    ds = open_dataset(url, storage_options=proxy.options("testing"), cache_dir=str(tmp_path / "c"), remote="whole")
    proxy.reset()
    ds[0]
    shard = next(f for f in read_manifest(local_sets["tar"]).files if f.samples)
    assert os.path.getsize(os.path.join(ds.root, shard.name)) == shard.bytes  # in the node cache
    assert proxy.down >= shard.bytes
    streaming = StreamingDataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"))
    assert not streaming.reader._ranged  # streaming reads whole shards


@pytest.mark.parametrize("fmt", RANGED)
def test_a_flipped_byte_on_the_server_is_an_error_naming_the_url_and_sample(s3, local_sets, tmp_path, fmt):
    url = _upload(s3, local_sets[fmt], f"flip/{fmt}")
    local = open_dataset(local_sets[fmt])
    k = 13
    payload = bytes(local.read_record(k).payload)
    middle = payload[len(payload) // 2 : len(payload) // 2 + 64]
    name = next(f.name for f in read_manifest(local_sets[fmt]).files if f.samples and f.first <= k < f.first + f.samples)
    data = bytearray(_get(s3, f"{url}/{name}"))
    at = bytes(data).find(middle)
    assert at > 0 and bytes(data).find(middle, at + 1) < 0
    data[at + 10] ^= 0xFF
    _put(s3, f"{url}/{name}", bytes(data))
    ds = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"))
    ds[k - 1]  # its neighbours read
    with pytest.raises(CorruptDataError) as e:
        ds[k]
    assert f"{url}/{name}" in str(e.value) and f"sample {k}" in str(e.value) and "checksum" in str(e.value)


@pytest.mark.parametrize("fmt", ["tar", "hdf5"])
def test_an_object_replaced_with_another_size_fails_naming_the_url(s3, local_sets, tmp_path, fmt):
    url = _upload(s3, local_sets[fmt], f"resized/{fmt}")
    name = next(f.name for f in read_manifest(local_sets[fmt]).files if f.samples)
    ds = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"))
    ds[0]
    original = _get(s3, f"{url}/{name}")
    _put(s3, f"{url}/{name}", original + b"\0" * 4096)  # replaced under the open reader
    with pytest.raises((DatasetChangedError, CorruptDataError)) as e:
        ds[1]
    assert f"{url}/{name}" in str(e.value) and "ETag" in str(e.value)
    # A reader opened now finds the size other than the manifest's at its first read.
    with pytest.raises(CorruptDataError) as e:
        open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"))[2]
    assert f"{url}/{name}" in str(e.value) and "the manifest says" in str(e.value)


def _cli_options(proxy, tmp_path) -> list[str]:
    return ["--storage-option", "key=testing", "--storage-option", "secret=testing",
            "--storage-option", f"client_kwargs.endpoint_url=http://127.0.0.1:{proxy.port}",
            "--storage-option", "client_kwargs.region_name=us-east-1", "--cache-dir", str(tmp_path / "cache")]


@pytest.mark.parametrize("fmt", ["tar", "hdf5"])
def test_info_and_preview_of_a_url_download_only_ranges(s3, proxy, local_sets, tmp_path, capsys, fmt):
    url = _upload(s3, local_sets[fmt], f"cli/{fmt}")
    manifest = read_manifest(local_sets[fmt])
    total = sum(f.bytes for f in manifest.files)
    proxy.reset()
    assert main(["info", url, *_cli_options(proxy, tmp_path)]) == 0
    assert "remote reads" in capsys.readouterr().out
    assert proxy.down < 4 * os.path.getsize(os.path.join(local_sets[fmt], "manifest.json")) + SLACK
    proxy.reset()
    out = tmp_path / "sheet.png"
    assert main(["preview", url, "--out", str(out), "--n", "4", *_cli_options(proxy, tmp_path)]) == 0
    # open included (HDF5's index: a few chunks of 64 KiB), against all the files below
    assert out.exists() and proxy.down < total / 2, (proxy.down, total)
    ranged = proxy.down
    proxy.reset()
    assert main(["preview", url, "--out", str(out), "--n", "4", "--remote", "whole",
                 *_cli_options(proxy, tmp_path / "other")]) == 0
    assert proxy.down > 2 * ranged  # whole files, as before


def test_lmdb_at_a_url_says_it_is_read_whole(s3, local_sets, tmp_path):
    url = _upload(s3, local_sets["lmdb"], "whole/lmdb")
    with pytest.raises(ValueError, match="read whole"):
        open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"), remote="range")
    ds = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"))  # the default: whole
    assert torch.equal(ds[3][0], open_dataset(local_sets["lmdb"])[3][0])
    assert os.path.exists(os.path.join(ds.root, ds.data_file))
    with pytest.raises(ValueError, match="remote must be one of"):
        open_dataset(url, storage_options=s3, remote="ranges")


def test_range_reads_in_dataloader_workers_match_the_local_dataset(s3, local_sets, tmp_path):
    url = _upload(s3, local_sets["tfrecord"], "workers/tfrecord")
    ds = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"))
    local = open_dataset(local_sets["tfrecord"])
    subset = torch.utils.data.Subset(ds, list(range(0, len(ds), 7)))
    loader = torch.utils.data.DataLoader(subset, batch_size=None, num_workers=2)
    for i, (img, label) in zip(subset.indices, loader):
        assert label == local[i][1] and torch.equal(img, local[i][0])


@pytest.mark.slow  # waits out a deadline; the whole-file reads' own is in the default suite (test_remote.py)
def test_a_server_that_stops_answering_fails_a_range_read_within_the_deadline(s3, proxy, local_sets, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("PACKER_REMOTE_DEADLINE", "5")  # the open's small reads too: room for a loaded machine
    url = _upload(s3, local_sets["tar"], "stalled/tar")
    ds = open_dataset(url, storage_options=proxy.options("testing"), cache_dir=str(tmp_path / "c"))
    ds[0]
    proxy.delay = 3600
    start = time.monotonic()
    with pytest.raises(RemoteError, match="within 5 s") as e:
        ds[1]
    assert time.monotonic() - start < 20 and f"{url}/" in str(e.value)
