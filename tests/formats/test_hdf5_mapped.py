"""A local HDF5 file's index read where it lies (a map of the file, shared through the page cache),
the same samples as the index read into memory, and refused for the same damage."""

from __future__ import annotations

import functools
import os
import shutil

import crc32c
import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packer.datasets.formats.hdf5 as hdf5
from packer.datasets import open_dataset
from packer.datasets.formats.hdf5map import MappedColumn
from packer.errors import CorruptDataError
from tests.helpers import forge_manifest_sizes, make_folder, pack, write_fields_dataset


def _contiguous(dst) -> None:
    """Rewrite ``dst``'s data.h5 with every dataset contiguous (as h5repack -l CONTI, or another
    tool, may leave it), the manifest forged to match."""
    path = os.path.join(str(dst), "data.h5")
    os.rename(path, path + ".old")
    with h5py.File(path + ".old", "r") as old, h5py.File(path, "w") as new:
        new.attrs.update(old.attrs)

        def copy(name, obj):
            if isinstance(obj, h5py.Dataset):
                d = new.create_dataset(name, data=obj[()], dtype=obj.dtype)
                d.attrs.update(obj.attrs)
            else:
                new.require_group(name).attrs.update(obj.attrs)

        old.visititems(copy)
    os.remove(path + ".old")
    forge_manifest_sizes(dst)


def _everything(ds) -> list:
    return [(r.key, r.label, r.codec, r.height, r.width, bytes(r.payload),
             [(f.name, f.codec, f.height, f.width, f.depth, bytes(f.payload)) for f in r.fields],
             r.boxes, r.box_labels) for r in map(ds.read_record, range(len(ds)))]


def _make(kind, src, dst) -> None:
    if kind == "fields":
        write_fields_dataset(dst, "hdf5", n=9)
    else:
        pack(src, str(dst), "hdf5", **{"bytes": {"encode": "png"}, "raw": {"encode": "raw", "resize": "20x12"},
                                        "mixed": {"encode": "keep"}}[kind])


@pytest.mark.parametrize("layout", ["chunked", "contiguous"])
@pytest.mark.parametrize("kind", ["bytes", "raw", "mixed", "fields"])
def test_the_mapped_index_reads_the_samples_the_read_index_does(tiny_folder, tmp_path, monkeypatch, kind, layout):
    """Variable-size payloads, fixed raw arrays (/images rows), mixed codecs and fields: every record
    and decoded sample the same through the mapped columns as through the columns read whole."""
    dst = tmp_path / "ds"
    _make(kind, tiny_folder[0], dst)
    if layout == "contiguous":
        _contiguous(dst)
    mapped = open_dataset(dst, output="numpy")
    assert mapped._meta.mapped and isinstance(mapped._meta.labels, MappedColumn)
    assert isinstance(mapped._meta.offsets, MappedColumn) == (kind != "raw")
    monkeypatch.setattr(hdf5, "MAP_INDEX", False)
    read = open_dataset(dst, output="numpy")
    assert not read._meta.mapped and isinstance(read._meta.labels, np.ndarray)
    assert _everything(mapped) == _everything(read)
    for i in range(len(read)):
        (a, la), (b, lb) = mapped[i], read[i]
        assert la == lb and np.array_equal(a, b)
    assert np.array_equal(mapped.targets, read.targets) and mapped._labels_without_table().dtype == np.int64


def _worker_maps(worker_id: int) -> None:
    ds = torch.utils.data.get_worker_info().dataset
    meta = ds._meta
    assert meta is not None and meta.mapped, "the worker did not receive the parent's index"
    assert isinstance(meta.labels, MappedColumn) and not any(c.bound for c in meta.columns())
    ds._ensure_open()  # maps the file through this process's descriptor
    assert ds._meta.columns() and all(c.bound for c in ds._meta.columns())


def test_forkserver_workers_map_the_file_again_and_copy_no_column(tiny_folder, tmp_path):
    """A forkserver worker receives the columns' piece tables, not their rows (nothing of them in
    the shared region), maps the file through its own descriptor and reads the same samples."""
    pack(tiny_folder[0], str(tmp_path / "ds"), "hdf5", encode="png")
    ds = open_dataset(tmp_path / "ds")
    want = [ds[i] for i in range(len(ds))]
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="forkserver",
                        worker_init_fn=_worker_maps)
    got = list(loader)
    assert [(torch.equal(g[0], w[0]), g[1]) for g, w in zip(got, want)] == [(True, w[1]) for w in want]
    _, layout, small = ds._shared_meta
    assert not {name for name, *_ in layout} & {"labels", "shapes", "crcs", "key_crcs", "offsets"}
    assert all(isinstance(small[k], MappedColumn) for k in ("labels", "shapes", "crcs", "offsets"))


def _damage_offsets(dst, fix_crc: bool) -> None:
    """Sample 3's end offset made smaller than its start, in place in the stored chunk (and its
    checksum attribute updated when ``fix_crc``, so the order check is what refuses it)."""
    path = os.path.join(str(dst), "data.h5")
    with h5py.File(path, "r+") as f:
        d = f["offsets"]
        d[4] = int(d[3]) - 1
        if fix_crc:
            d.attrs["crc32c"] = np.uint32(crc32c.crc32c(d[()].astype("<u8").tobytes()))
    forge_manifest_sizes(dst)


@pytest.mark.parametrize("fix_crc", [False, True], ids=["checksum", "order"])
def test_a_damaged_offsets_column_is_refused_naming_the_file(tiny_folder, tmp_path, fix_crc):
    dst = tmp_path / "ds"
    pack(tiny_folder[0], str(dst), "hdf5", encode="png")
    _damage_offsets(dst, fix_crc)
    ds = open_dataset(dst)
    with pytest.raises(CorruptDataError, match="offsets inconsistent" if fix_crc else "/offsets checksum") as e:
        ds[0]
    assert e.value.path == os.path.join(str(dst), "data.h5") and "data.h5" in str(e.value)


@pytest.mark.parametrize("context", ["in-process", "forkserver"])
def test_a_file_replaced_under_the_reader_is_refused(tmp_path, context):
    """Another conversion's data.h5 moved over the file after the reader mapped its index: the
    reader (or a worker started then, which maps its own descriptor) refuses it, naming the file, as
    it does with the index read into memory."""
    a, b = tmp_path / "a", tmp_path / "b"
    for dst, n in ((a, 16), (b, 24)):
        src = tmp_path / f"src-{dst.name}"
        make_folder(str(src), {"x": [(f"{dst.name}{i}.png", 16 + i, n) for i in range(3)]})
        pack(str(src), str(dst), "hdf5", encode="png")
    ds = open_dataset(a)
    assert ds._meta.mapped
    shutil.copyfile(b / "data.h5", a / "data.h5.new")
    os.replace(a / "data.h5.new", a / "data.h5")
    with pytest.raises(CorruptDataError) as e:
        if context == "in-process":
            for i in range(len(ds)):
                ds[i]
        else:
            list(DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="forkserver",
                            worker_init_fn=functools.partial(_worker_maps)))
    assert e.value.path == os.path.join(str(a), "data.h5")
