"""The sharded readers' index reaches spawn and forkserver DataLoader workers in shared memory."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader

import packer.datasets.shards as shards
from packer.datasets import open_dataset
from tests.helpers import pack


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_index_is_shared_with_workers(tiny_folder, tmp_path, monkeypatch, fmt):
    """Workers started by forkserver read the same samples through the shared index (the parent's
    columns become read-only views of one region); a plain pickle is still a self-contained copy."""
    monkeypatch.setattr(shards, "SHARE_INDEX_BYTES", 1)
    pack(tiny_folder[0], str(tmp_path / "ds"), fmt)
    ds = open_dataset(tmp_path / "ds")
    want = [(ds[i][0], ds[i][1], ds.read_record(i).key) for i in range(len(ds))]
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="forkserver")
    got = list(loader)
    assert [(torch.equal(g[0], w[0]), g[1]) for g, w in zip(got, want)] == [(True, w[1]) for w in want]
    region, layout = ds._shared_index
    assert region.size >= sum(count for *_, count in layout) and "_offset" in [name for name, *_ in layout]
    assert not ds._offset.flags.writeable
    copy = pickle.loads(pickle.dumps(ds))
    assert "_shared_index" not in copy.__dict__
    assert [copy.read_record(i).key for i in range(len(copy))] == [w[2] for w in want]
