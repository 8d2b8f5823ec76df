"""What streaming from object storage costs: requests and bytes per epoch (counted by the node
cache, checked against a proxy that counts what the server answers), stable node shard sets with
a node cache of half the dataset, and range answers cut short (a stalled or dead server: test_remote.py, test_range_reads.py). A real S3 server (moto's, on
127.0.0.1) started by the module."""

from __future__ import annotations

import contextlib
import os
import socket
import time

import numpy as np
import pytest
import torch

from packer.datasets import StreamingDataset, open_dataset
from packer.datasets.partition import World, epoch_plan
from packer.description.manifest import read_manifest
from packer.errors import CorruptDataError
from packer.storage.nodecache import NodeCache
from packer.storage.remote import Remote, RemoteError, streaming_cost, upload_dataset
from tests.helpers import import_optional, make_folder, pack
from tools.faultlib import LatencyProxy

import_optional("s3fs", "s3:// tests need s3fs: pip install 'packer[s3]'")
import_optional("moto.server", "s3:// tests need moto's server: pip install 'moto[server]'")

EIGHT_MB = 8 * 10**6


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """32 raw 40 x 40 images (every record the same size) as tar in 8 shards of 4."""
    base = tmp_path_factory.mktemp("cost")
    src = str(base / "src")
    make_folder(src, {c: [(f"{i}.png", 40, 40) for i in range(16)] for c in ("a", "b")})
    return pack(src, str(base / "tar"), "tar", encode="raw", shuffle=False, writer={"shard_samples": 4}).output


def _upload(s3, local, name):
    url = f"s3://data/cost/{name}"  # moto keeps one store per process: names apart from other modules'
    upload_dataset(local, Remote(url, s3), read_manifest(local))
    return url


def _labels(batch):
    return [int(label) for _, label in batch]


def _epoch(ds, epoch, workers=0):
    ds.set_epoch(epoch)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=_labels)
    return [lab for labels in loader for lab in labels]


def test_a_streaming_epoch_is_one_get_per_shard_counted_on_the_node(s3, proxy, local, tmp_path):
    """Through an empty node cache, an epoch is one GET per shard (no HEAD, no request per
    sample), and the first epoch on a node one more per shard for its index (read with the
    shard, never at open); the node cache's count (over DataLoader workers) is what the server
    answered and what ``streaming_cost`` (``packer info``) predicts."""
    url = _upload(s3, local, "epoch")
    m = read_manifest(local)
    proxy.reset()
    ds = StreamingDataset(url, storage_options=proxy.options("testing"), cache_dir=str(tmp_path / "c"),
                          prefetch_shards=1, seed=2, batch_size=4)
    assert proxy.requests == 2 and ds.remote_traffic() == (0, 0)  # the manifest (a HEAD, a GET): nothing else
    proxy.reset()
    before = ds.remote_traffic()
    labels = _epoch(ds, 0, workers=2)
    requests, nbytes = (a - b for a, b in zip(ds.remote_traffic(), before))
    assert sorted(labels) == sorted(open_dataset(local).targets.tolist())
    shards = [f for f in m.files if f.samples]
    index = [f for f in m.files if f.name.endswith(".pkidx")]
    (once, _), epoch = streaming_cost(m)
    assert epoch == (len(shards), sum(f.bytes for f in shards))
    assert (requests, nbytes) == (epoch[0] + len(index), epoch[1] + sum(f.bytes for f in index))
    assert requests <= once - 2 + epoch[0]  # the model's once-per-node files (the table is not read here)
    assert proxy.requests == requests, (proxy.requests, requests)
    assert epoch[0] <= 1.05 * epoch[1] / EIGHT_MB + len(shards)  # the target, at any shard size
    again = ds.remote_traffic()
    _epoch(ds, 1, workers=2)  # new workers read the index files from the node cache
    assert ds.remote_traffic() == again  # the cache holds the dataset: epoch 2 asks nothing


def _node_limit(local):
    """Half the dataset's disk bytes, plus the small files every node keeps (index files,
    the sample table, the manifest)."""
    m = read_manifest(local)
    cache = NodeCache(os.path.dirname(local) + "/sizes")
    shards = cache.disk_bytes(f.bytes for f in m.files if f.samples)
    small = cache.disk_bytes([*(f.bytes for f in m.files if not f.samples),
                              os.path.getsize(os.path.join(local, "manifest.json"))])
    return shards // 2 + small


@pytest.mark.parametrize("stable", [True, False])
def test_stable_node_shards_with_half_size_caches_download_nothing_after_epoch_one(s3, proxy, local, tmp_path,
                                                                                   stable):
    url = _upload(s3, local, f"nodes-{stable}")
    limit = _node_limit(local)
    nodes = [StreamingDataset(url, storage_options=proxy.options("testing"), cache_dir=str(tmp_path / f"n{r}"),
                              cache_limit=limit, world=World(r, 2), seed=4, batch_size=4, prefetch_shards=1,
                              stable_shards=stable) for r in range(2)]
    want = sorted(open_dataset(local).targets.tolist())
    downloaded = []
    for epoch in range(3):
        before = [ds.remote_traffic()[1] for ds in nodes]
        seen = [lab for ds in nodes for lab in _epoch(ds, epoch)]
        assert sorted(seen) == want, epoch  # every sample once over the two nodes
        downloaded.append([ds.remote_traffic()[1] - b for ds, b in zip(nodes, before)])
    m = read_manifest(local)
    share = sum(f.bytes for f in m.files if f.samples) // 2
    index = sum(f.bytes for f in m.files if f.name.endswith(".pkidx"))  # each node reads its shards' index files
    assert all(share < got < share + index for got in downloaded[0]), (downloaded[0], share, index)
    if stable:
        assert downloaded[1] == downloaded[2] == [0, 0], downloaded
    else:  # shards dealt anew each epoch: a half-size cache downloads again
        assert sum(downloaded[1]) + sum(downloaded[2]) > share, downloaded


@pytest.mark.parametrize("partition", ["pad", "drop", "exact"])
@pytest.mark.parametrize(("world_size", "node_ranks"), [(2, 1), (4, 2), (3, 1), (6, 3)])
def test_stable_node_shards_keep_each_nodes_shards_and_read_every_sample_once(partition, world_size, node_ranks):
    sizes = np.array([7, 9, 8, 8, 10, 6, 8, 8, 5, 11, 8, 8])
    starts = np.cumsum(sizes) - sizes
    shard_sets, orders = [], []
    for epoch in range(3):
        seen, sets = [], {}
        for rank in range(world_size):
            idx = np.asarray(epoch_plan(sizes, World(rank, world_size), seed=3, epoch=epoch, shuffle=True,
                                        partition=partition, buffer_size=16, batch_size=1, window_shards=2,
                                        stable_nodes=(node_ranks, 0)))
            seen += idx.tolist()
            sets.setdefault(rank // node_ranks, set()).update(np.searchsorted(starts, idx, side="right") - 1)
            if rank == 0:
                orders.append(idx.tolist())
        values, counts = np.unique(seen, return_counts=True)
        if partition != "drop":  # every sample read; "pad" repeats a few, "exact" none
            assert len(values) == sizes.sum()
        if partition != "pad":
            assert (counts == 1).all()
        shard_sets.append(sets)
    assert shard_sets[0] == shard_sets[1] == shard_sets[2]
    assert orders[0] != orders[1]  # shuffled inside the node's share
    dealt = {e: np.asarray(epoch_plan(sizes, World(0, 2), seed=3, epoch=e, shuffle=True, partition="pad",
                                      buffer_size=16, batch_size=1, stable_nodes=(1, 2))) for e in (0, 1, 2)}
    shard = {e: set((np.searchsorted(starts, v, side="right") - 1).tolist()) for e, v in dealt.items()}
    assert shard[0] == shard[1] and shard[2] != shard[0]  # every 2 epochs: dealt anew when asked


def test_stable_shards_refuse_a_subset_and_bad_values(local):
    with pytest.raises(ValueError, match="one whole dataset"):
        StreamingDataset(local, stable_shards=True, subset=8)
    with pytest.raises(ValueError, match="stable_shards must be"):
        StreamingDataset(local, stable_shards=0)
    ds = StreamingDataset(local, stable_shards=True, world=World(1, 2), batch_size=4)
    assert ds._layout()["stable_shards"] == [0, 1]  # a saved state resumes only in the same mode
    assert "stable_shards" not in StreamingDataset(local, world=World(1, 2), batch_size=4)._layout()


class _ShortProxy(LatencyProxy):
    """A proxy whose answers to ranged GETs carry ``cut`` bytes fewer than asked: well-formed
    (``mode="short"``: Content-Length says so) or cut off mid-body (``mode="drop"``)."""

    def __init__(self, target, mode):
        super().__init__(target, 0.0)
        self.mode, self.cut, self.armed = mode, 100, False

    def _pipe(self, src, dst, upstream):
        if upstream or not self.armed:
            return super()._pipe(src, dst, upstream)
        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                data = src.recv(1 << 16)
                if not data:
                    return
                buf += data
            head, body = buf.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            length = next((int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length:")), None)
            if length is None or b" 206 " not in lines[0]:
                dst.sendall(buf)
                return super()._pipe(src, dst, upstream)
            while len(body) < length:
                data = src.recv(1 << 16)
                if not data:
                    break
                body += data
            keep = max(0, length - self.cut)
            if self.mode == "short":
                lines = [x if not x.lower().startswith(b"content-length:") else b"Content-Length: %d" % keep
                         for x in lines]
                dst.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body[:keep])
                return super()._pipe(src, dst, upstream)
            dst.sendall(head + b"\r\n\r\n" + body[:keep])  # then the connection closes mid-answer
        except OSError:
            pass
        finally:
            for end in (src, dst):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)


@pytest.mark.parametrize("mode", ["short", pytest.param("drop", marks=pytest.mark.slow)])  # drop: retried, ~6 s
def test_a_truncated_range_answer_is_an_error_naming_the_url_never_other_bytes(s3, local, tmp_path, monkeypatch,
                                                                               mode):
    monkeypatch.setenv("PACKER_REMOTE_DEADLINE", "10")
    url = _upload(s3, local, f"short-{mode}")
    p = _ShortProxy(("127.0.0.1", int(s3["client_kwargs"]["endpoint_url"].rsplit(":", 1)[1])), mode)
    try:
        ds = open_dataset(url, storage_options=p.options("testing"), cache_dir=str(tmp_path / "c"), remote="range")
        ref = open_dataset(local)
        assert torch.equal(ds[0][0], ref[0][0])
        p.armed = True
        start = time.monotonic()
        with pytest.raises((CorruptDataError, RemoteError)) as e:
            ds[5]  # shard 1's index, fetched with the shard's first read, cut short
        assert f"{url}/shard-000001.pkidx" in str(e.value) and len(str(e.value).splitlines()) == 1
        assert time.monotonic() - start < 15
        p.armed = False
        assert torch.equal(ds[5][0], ref[5][0])  # a failed fetch is tried again at the next read
        p.armed = True
        start = time.monotonic()
        with pytest.raises((CorruptDataError, RemoteError)) as e:
            ds[6]  # the record's own range
        assert f"{url}/shard-000001.tar" in str(e.value) and len(str(e.value).splitlines()) == 1
        assert time.monotonic() - start < 15
        p.armed = False
        whole = open_dataset(url, storage_options=p.options("testing"), cache_dir=str(tmp_path / "w"), remote="whole")
        whole[0]
        whole.load_indexes()  # read now, so that the shard's own download is the one cut short
        p.armed = True
        with pytest.raises((CorruptDataError, RemoteError)) as e:
            whole[9]  # a whole-shard download cut short: refused, nothing kept in the cache
        assert f"{url}/shard-000002.tar" in str(e.value)
        assert not os.path.exists(os.path.join(whole.root, "shard-000002.tar"))
    finally:
        p.sock.close()
