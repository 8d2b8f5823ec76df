"""``on_error="skip"``: what ``ds.errors`` counts when samples fail, and when the whole dataset does."""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest

import packer
from packer.datasets import open_dataset
from packer.description.manifest import read_manifest
from packer.errors import CorruptDataError
from packer.layouts.tar import unpack_index
from tests.helpers import forge_manifest_sizes

FORMATS = ["lmdb", "hdf5", "tar", "tfrecord"]


def _sample(i: int, shade: int = 0) -> dict:
    return {"image": np.full((6, 6, 3), (i * 20 + shade) % 256, np.uint8), "label": f"c{i % 2}"}


def _shaded(i: int) -> dict:
    return _sample(i, 7)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_dataset_whose_files_are_another_conversions_counts_no_more_skips(tmp_path, fmt):
    """Its payload file replaced by another conversion's: every read raises one error, and
    ``ds.errors`` stays as the first read left it (it grew by ``len(ds)`` per read)."""
    dst, other = str(tmp_path / "a"), str(tmp_path / "b")
    packer.pack(range(6), dst, fmt, fn=_sample, encode="png", workers=1, quiet=True, no_shuffle=True)
    packer.pack(range(6), other, fmt, fn=_shaded, encode="png", workers=1, quiet=True, no_shuffle=True)
    for f in read_manifest(dst).files:
        if f.name.endswith((".h5", ".mdb", ".tar", ".tfrecord")):
            shutil.copyfile(os.path.join(other, f.name), os.path.join(dst, f.name))
    ds = open_dataset(dst, on_error="skip", output="numpy")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(CorruptDataError, match="every sample of "):
            ds[0]
        first = ds.errors
        for _ in range(2):
            for i in range(len(ds)):
                with pytest.raises(CorruptDataError, match="every sample of "):
                    ds[i]
    # A file refused at open (HDF5): nothing skipped; files whose records all fail (the others):
    # each sample tried and counted once, by the first read.
    assert (first, ds.errors, len(seen)) == ((0, 0, 0) if fmt == "hdf5" else (6, 6, 6))


def test_once_every_sample_failed_later_reads_raise_without_counting_again(tmp_path):
    """Every record damaged: the first read tries (and counts) each sample once; later reads raise
    the same error at once, and ``ds.errors`` stays at ``len(ds)``."""
    dst = str(tmp_path / "t")
    packer.pack(range(5), dst, "tar", fn=_sample, encode="raw", workers=1, quiet=True, no_shuffle=True)
    idx = os.path.join(dst, "shard-000000.pkidx")
    _, entries, _ = unpack_index(open(idx, "rb").read(), idx)
    with open(os.path.join(dst, "shard-000000.tar"), "r+b") as f:
        for e in entries:  # flip the last pixel byte of every sample
            f.seek(int(e["offset"]) + int(e["size"]) - 1)
            byte = f.read(1)[0]
            f.seek(-1, 1)
            f.write(bytes([byte ^ 0xFF]))
    forge_manifest_sizes(dst)
    ds = open_dataset(dst, on_error="skip", output="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CorruptDataError, match="every sample of .* failed to read; the last"):
            ds[0]
        assert ds.errors == 5
        for _ in range(3):
            for i in range(len(ds)):
                with pytest.raises(CorruptDataError, match="every sample of .* failed to read"):
                    ds[i]
    assert ds.errors == 5
