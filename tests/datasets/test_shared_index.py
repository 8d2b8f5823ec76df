"""The sharded readers' index reaches spawn and forkserver DataLoader workers in shared memory."""

from __future__ import annotations

import functools
import os
import pickle

import pytest
import torch
from torch.utils.data import DataLoader

import packer.datasets.formats.hdf5 as hdf5
import packer.datasets.formats.shards as shards
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


def _index_arrived(context: str, worker_id: int) -> None:
    meta = torch.utils.data.get_worker_info().dataset._meta
    assert meta is not None, "the worker did not receive the parent's index"
    assert context == "fork" or not meta.labels.flags.writeable, "the index is not a view of the shared region"


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_hdf5_index_is_loaded_once_and_shared_with_workers(tiny_folder, tmp_path, monkeypatch, context):
    """The HDF5 reader loads its index when it is built; forked workers use the parent's arrays
    (no second load), forkserver workers get them in one shared region; a plain pickle loads its own.
    (The index read into memory, as for a remote or compressed file: a local plain one is mapped,
    tests/formats/test_hdf5_mapped.py.)"""
    monkeypatch.setattr(hdf5, "SHARE_INDEX_BYTES", 1)
    monkeypatch.setattr(hdf5, "MAP_INDEX", False)
    pack(tiny_folder[0], str(tmp_path / "ds"), "hdf5")
    ref = open_dataset(tmp_path / "ds")
    want = [(ref[i][0], ref[i][1], ref.read_record(i).key) for i in range(len(ref))]
    ds = open_dataset(tmp_path / "ds")  # read first by the workers
    assert ds._meta is not None and ds._pid is None  # the index, and no handle left open
    loads = tmp_path / "loads"
    loads.mkdir()
    original = hdf5._Meta.__init__

    def counting_init(self, *a, **kw):  # each load leaves a file named after its process
        (loads / str(os.getpid())).touch()
        original(self, *a, **kw)

    monkeypatch.setattr(hdf5._Meta, "__init__", counting_init)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context,
                        worker_init_fn=functools.partial(_index_arrived, context))
    got = list(loader)
    assert [(torch.equal(g[0], w[0]), g[1]) for g, w in zip(got, want)] == [(True, w[1]) for w in want]
    assert list(loads.iterdir()) == []  # no forked worker loaded the index again
    if context == "forkserver":
        region, layout, _ = ds._shared_meta
        assert {name for name, *_ in layout} >= {"labels", "shapes", "crcs"}
        assert not ds._meta.labels.flags.writeable
        ds[0]  # the parent reads too, then a second epoch's workers start: still the one region
        assert len(list(loader)) == len(want) and ds._shared_meta[0] is region
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._meta is None and [copy.read_record(i).key for i in range(len(copy))] == [w[2] for w in want]
    assert len(list(loads.iterdir())) == 1
