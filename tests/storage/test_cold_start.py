"""Opening a dataset of many shards at a URL: the manifest names the shards, so the first sample
costs a few requests whatever their number (no listing, no index file per shard at open), and
each shard's index, read with the shard's first read, still refuses an object replaced on the
server. A real S3 server (moto's, on 127.0.0.1) behind the counting proxy."""

from __future__ import annotations

import os
import time

import pytest
import torch

from packer.datasets import StreamingDataset, open_dataset
from packer.description.manifest import read_manifest
from packer.errors import CorruptDataError, DatasetChangedError
from packer.storage.remote import Remote, RemoteError, upload_dataset
from tests.helpers import import_optional, make_folder, pack

import_optional("s3fs", "s3:// tests need s3fs: pip install 'packer[s3]'")
import_optional("moto.server", "s3:// tests need moto's server: pip install 'moto[server]'")

SHARDS = 200
#: TFRecord's cases are marked slow: packing its 200 shards takes as long as tar's (~5-10 s).
FORMATS = ["tar", pytest.param("tfrecord", marks=pytest.mark.slow)]
#: The samples the tests read (map-style and streaming): the server holds only their shards.
READ = (0, 1, 5, SHARDS - 1)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    base = tmp_path_factory.mktemp("cold")
    make_folder(str(base / "src"), {"a": [(f"{i}.png", 8, 8) for i in range(SHARDS // 2)],
                                    "b": [(f"{i}.png", 8, 8) for i in range(SHARDS // 2)]})
    return base


def _many(base, fmt: str) -> str:
    return pack(str(base / "src"), str(base / fmt), fmt, encode="png", shuffle=False,
                writer={"shard_samples": 1}).output


@pytest.fixture(scope="module")
def tar(base):
    """200 images of 8 x 8 as tar, one a shard."""
    return _many(base, "tar")


@pytest.fixture(scope="module")
def tfrecord(base):
    """The same as TFRecord, one a file."""
    return _many(base, "tfrecord")


@pytest.fixture(scope="module")
def other(base):
    """Another tar dataset (other pixels, 8 shards): what replaces the first at its URL."""
    make_folder(str(base / "other-src"), {"a": [(f"{i}.png", 9, 9) for i in range(8)]})
    return pack(str(base / "other-src"), str(base / "other"), "tar", encode="png", shuffle=False,
                writer={"shard_samples": 1}).output


def _put_some(s3, local: str, url: str, samples=READ) -> None:
    """Upload the manifest, the sample table and only the shards of ``samples`` with their index
    files: a request for any other file would fail (and the proxy counts every request)."""
    m = read_manifest(local)
    stems = {f.name.split(".", 1)[0] for f in m.files if f.samples and f.first in samples}
    fs, path = Remote(url, s3).filesystem()
    for f in m.files:
        if not f.samples and not f.name.startswith("shard-") or f.name.split(".", 1)[0] in stems:
            fs.put_file(os.path.join(local, f.name), f"{path}/{f.name}")
    fs.put_file(os.path.join(local, "manifest.json"), f"{path}/manifest.json")


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_first_sample_of_many_shards_costs_a_few_requests(s3, proxy, request, tmp_path, fmt):
    """Map-style (by range, and whole shards) and streaming: the open is the manifest's two
    requests, the first sample its shard's index, the record (and a HEAD by range): a constant,
    where reading every index at open, as before, is one request per shard."""
    url = f"s3://data/cold/few-{fmt}"
    local = request.getfixturevalue(fmt)
    _put_some(s3, local, url)
    ref = open_dataset(local)
    opts = proxy.options("testing")
    for mode, first_read in (("range", 3), ("whole", 2)):  # index + HEAD + ranged GET; index + shard
        proxy.reset()
        ds = open_dataset(url, storage_options=opts, cache_dir=str(tmp_path / mode), remote=mode)
        assert proxy.requests == 2, (mode, proxy.requests)  # the manifest: a HEAD and a GET, no listing
        image, label = ds[0]
        assert label == ref[0][1] and torch.equal(image, ref[0][0])
        assert proxy.requests == 2 + first_read, (mode, proxy.requests)
        for i in READ:  # each shard's index is read once, with the shard
            assert torch.equal(ds[i][0], ref[i][0]), (mode, i)
        assert ds.index_names(SHARDS - 1) == [] and len(ds.index_names(2)) == 1  # read; not read yet
    proxy.reset()
    stream = StreamingDataset(url, storage_options=opts, cache_dir=str(tmp_path / "stream"), shuffle=False,
                              batch_size=2, prefetch_shards=0)
    first = next(iter(torch.utils.data.DataLoader(stream, batch_size=2, collate_fn=lambda b: [s[1] for s in b])))
    assert first == [ref[0][1], ref[1][1]]
    assert proxy.requests == 2 + 2 * 2, proxy.requests  # the manifest; two shards with their index files
    proxy.reset()
    eager = open_dataset(url, storage_options=opts, cache_dir=str(tmp_path / "eager"))
    with pytest.raises(RemoteError, match="does not exist"):
        eager.load_indexes()  # what opening read before: every index file (most are not on this server)


def test_streaming_workers_read_only_their_shards_indexes(s3, proxy, tar, tmp_path):
    """Two DataLoader workers, read-ahead on: the first batch still asks a few requests, the
    index files coming with (and ahead of) the shards each worker reads."""
    url = "s3://data/cold/workers"
    _put_some(s3, tar, url, range(48))  # each worker's first batches and the shards it reads ahead
    proxy.reset()
    stream = StreamingDataset(url, storage_options=proxy.options("testing"), cache_dir=str(tmp_path / "c"),
                              shuffle=False, batch_size=4, prefetch_shards=2)
    loader = torch.utils.data.DataLoader(stream, batch_size=4, num_workers=2, prefetch_factor=1,
                                         collate_fn=lambda b: [s[1] for s in b])
    assert len(next(iter(loader))) == 4
    # the manifest, then per worker a batch or two of 4 shards and 2 read ahead, each with its index
    # (how far the workers got when the first batch arrives varies): a constant, not one per shard
    assert proxy.requests <= 2 + 2 * (2 * 4 + 2) * 2 + 18 < SHARDS // 3, proxy.requests


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_index_replaced_on_the_server_is_refused_at_its_first_read(s3, request, tmp_path, fmt):
    """The index file read with a shard's first read, after the open, no longer the manifest's:
    an error naming its URL, never other samples; the shards read before still read."""
    url = f"s3://data/cold/replaced-{fmt}"
    local = request.getfixturevalue(fmt)
    m = read_manifest(local)
    _put_some(s3, local, url, (0, 5, 6))
    ref = open_dataset(local)
    ds = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"))
    assert torch.equal(ds[0][0], ref[0][0])
    index = [f.name for f in m.files if not f.samples and f.name.startswith("shard-")]
    fs, path = Remote(url, s3).filesystem()
    fs.pipe_file(f"{path}/{index[5]}", fs.cat_file(f"{path}/{index[6]}"))  # shard 6's index in shard 5's place
    with pytest.raises(CorruptDataError) as e:
        ds[5]
    assert f"{url}/{index[5]}" in str(e.value) and len(str(e.value).splitlines()) == 1
    assert torch.equal(ds[0][0], ref[0][0])


def test_a_dataset_replaced_after_open_is_refused_by_the_lazy_index_read(s3, tar, other, tmp_path):
    """Another dataset uploaded at the URL after the open (map-style by range, and streaming):
    the first read of a shard whose index is not read yet raises DatasetChangedError naming the
    URL, never a sample of the other dataset."""
    url = "s3://data/cold/swapped"
    _put_some(s3, tar, url, (0,))
    ds = open_dataset(url, storage_options=s3, cache_dir=str(tmp_path / "c"))
    stream = StreamingDataset(url, storage_options=s3, cache_dir=str(tmp_path / "s"), shuffle=False, batch_size=1,
                              prefetch_shards=0)
    ds[0]
    upload_dataset(other, Remote(url, s3), read_manifest(other))  # the same names, other bytes
    with pytest.raises(DatasetChangedError) as e:
        ds[3]
    assert url in str(e.value) and "open the dataset again" in str(e.value)
    with pytest.raises(DatasetChangedError) as e:
        next(iter(stream))
    assert url in str(e.value)


def test_a_server_that_stops_answering_fails_the_lazy_index_read_within_the_deadline(s3, proxy, tar, tmp_path,
                                                                                     monkeypatch):
    """The first read of a shard whose index is not read yet, the server holding every request:
    RemoteError naming the index file's URL, within the deadline (and the manifest's check after
    it), never a hang."""
    monkeypatch.setenv("PACKER_REMOTE_DEADLINE", "2")
    url = "s3://data/cold/stalled"
    _put_some(s3, tar, url, (0, 5))
    ds = open_dataset(url, storage_options=proxy.options("testing"), cache_dir=str(tmp_path / "c"))
    ds[0]
    proxy.delay = 3600
    start = time.monotonic()
    with pytest.raises(RemoteError, match="within 2 s") as e:
        ds[5]
    assert time.monotonic() - start < 10 and f"{url}/shard-000005.pkidx" in str(e.value), str(e.value)
