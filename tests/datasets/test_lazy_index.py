"""A large local tar or TFRecord dataset reads its shard indexes where they lie: nothing of them is
loaded at open, every process checks each index file it uses once, and reads only its entries."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader

import packer.datasets.formats.shardindex as shardindex
from packer.datasets import open_dataset
from packer.errors import CorruptDataError
from tests.helpers import pack


def _samples(ds):
    return [(ds[i][0], ds[i][1], ds.read_record(i).key) for i in range(len(ds))]


def _same(got, want):
    return len(got) == len(want) and all(torch.equal(g[0], w[0]) and g[1:] == w[1:] for g, w in zip(got, want))


@pytest.mark.parametrize("fmt, gzip", [("tar", False), ("tfrecord", False), ("tfrecord", True)])
def test_lazy_index_reads_what_the_loaded_one_does(tiny_folder, tmp_path, monkeypatch, fmt, gzip):
    pack(tiny_folder[0], str(tmp_path / "ds"), fmt, writer={"shard_samples": 4, "gzip": gzip})
    want = _samples(open_dataset(tmp_path / "ds"))
    monkeypatch.setattr(shardindex, "LAZY_INDEX_SAMPLES", 1)
    ds = open_dataset(tmp_path / "ds")
    assert ds._in_place is not None and "_offset" not in ds.__dict__  # no column loaded at open
    assert _same(_samples(ds), want)
    assert len(ds._in_place._open) == len(ds.shard_sizes)  # every shard's index checked and in use
    copy = pickle.loads(pickle.dumps(ds))  # small: the shard table, no index, no descriptors
    assert "_open" not in copy._in_place.__dict__ and _same(_samples(copy), want)
    assert ds.targets.tolist() == [w[1] for w in want]


def test_lazy_index_in_forkserver_workers(tiny_folder, tmp_path, monkeypatch):
    """Workers get the shard table only (no index travels), and open what they read themselves."""
    pack(tiny_folder[0], str(tmp_path / "ds"), "tar", writer={"shard_samples": 4})
    want = _samples(open_dataset(tmp_path / "ds"))
    monkeypatch.setattr(shardindex, "LAZY_INDEX_SAMPLES", 1)
    ds = open_dataset(tmp_path / "ds")
    ds[0]  # the parent's own descriptors stay its own
    got = list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="forkserver"))
    assert [(torch.equal(g[0], w[0]), g[1]) for g, w in zip(got, want)] == [(True, w[1]) for w in want]
    assert len(pickle.dumps(ds)) < 20_000


def test_a_damaged_index_fails_when_its_shard_is_read(tiny_folder, tmp_path, monkeypatch):
    """Open succeeds (nothing read); the first read of the damaged shard names its index file;
    the other shards still read."""
    pack(tiny_folder[0], str(tmp_path / "ds"), "tar", writer={"shard_samples": 4})
    monkeypatch.setattr(shardindex, "LAZY_INDEX_SAMPLES", 1)
    ds = open_dataset(tmp_path / "ds")
    name = ds._in_place.names[1]
    path = tmp_path / "ds" / name
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF  # an entry's byte: the CRC no longer matches
    path.write_bytes(bytes(data))
    assert ds.read_record(0).label == ds.targets[0]
    with pytest.raises(CorruptDataError, match="checksum mismatch") as e:
        ds.read_record(5)
    assert name in str(e.value)
    assert ds.read_record(len(ds) - 1).label == ds.targets[-1]
