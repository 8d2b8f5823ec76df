"""The shared cache wired into every reader: epoch 2 comes from RAM, bounded, shared by workers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packer.datasets import open_dataset
from packer.description.manifest import read_manifest
from packer.description.registry import format_names
from packer.pipeline.engine import ConvertOptions, convert_imagefolder
from tests.helpers import pack


def _packed(src, dst, fmt):
    pack(src, dst, fmt, "jpeg:90", "16x16")
    return dst


def _epoch(ds, ctx="fork"):
    loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context=ctx)
    images, labels = zip(*loader)
    return torch.cat(images), torch.cat(labels)


def _wreck_payload_files(path):
    """Overwrite every payload file with zeros, in place: any read from disk now fails."""
    for f in read_manifest(path).files:
        fp = os.path.join(path, f.name)
        with open(fp, "r+b") as fh:
            fh.write(b"\0" * os.path.getsize(fp))


@pytest.mark.parametrize("fmt", format_names())
@pytest.mark.parametrize("mode", ["encoded", "decoded"])
def test_second_epoch_reads_nothing_from_disk(tiny_folder, tmp_path, fmt, mode):
    src, pixels = tiny_folder
    path = _packed(src, tmp_path / "out", fmt)
    ds = open_dataset(path, cache=mode)
    first = _epoch(ds)
    assert len(ds.cache) == len(pixels)  # filled by the workers, visible in the parent
    _wreck_payload_files(path)
    with pytest.raises(Exception):  # noqa: B017 - proves the files are unreadable now
        open_dataset(path)[0]
    second = _epoch(ds)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert ds.cache.hits >= len(pixels)
    ds.close()


def test_cache_is_shared_with_spawned_workers(tiny_folder, tmp_path):
    src, pixels = tiny_folder
    ds = open_dataset(_packed(src, tmp_path / "out", "lmdb"), cache="decoded")
    first = _epoch(ds, "spawn")
    assert len(ds.cache) == len(pixels)
    direct = [ds[i] for i in range(len(ds))]  # main process: all hits now
    assert ds.cache.hits >= len(pixels)
    np.testing.assert_array_equal(torch.stack([d[0] for d in direct]).numpy(), first[0].numpy())
    ds.close()


def test_bound_is_honoured_and_beyond_it_reads_are_uncached(tiny_folder, tmp_path):
    src, pixels = tiny_folder
    path = _packed(src, tmp_path / "out", "lmdb")
    plain = open_dataset(path)
    ds = open_dataset(path, cache="decoded", cache_bytes=5 * (16 * 16 * 3 + 64))
    for _ in range(2):
        for i in range(len(ds)):
            assert torch.equal(ds[i][0], plain[i][0]) and ds[i][1] == plain[i][1]
    assert 0 < len(ds.cache) < len(pixels)
    assert ds.cache.nbytes <= ds.cache.capacity
    ds.close()
    assert ds.cache is None


def test_bad_cache_mode_is_refused(tiny_folder, tmp_path):
    src, _ = tiny_folder
    with pytest.raises(ValueError, match="cache must be"):
        open_dataset(_packed(src, tmp_path / "out", "lmdb"), cache="all")


@pytest.mark.parametrize("fmt", format_names())
def test_default_decoded_capacity_holds_the_whole_dataset(tiny_folder, tmp_path, fmt):
    src, pixels = tiny_folder
    convert_imagefolder(src, tmp_path / "out", fmt, ConvertOptions())  # sizes differ per image
    ds = open_dataset(tmp_path / "out", cache="decoded")
    for i in range(len(ds)):
        ds[i]
    assert len(ds.cache) == len(pixels) and ds.cache.rejected == 0
    ds.close()
