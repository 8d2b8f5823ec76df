"""``__getitems__``: the DataLoader's batched read returns exactly ``[ds[i] for i in indices]``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packer.datasets import collate, open_dataset
from packer.datasets.encoded import center_crop
from packer.errors import CorruptDataError
from tests.helpers import pack

FORMATS = ["lmdb", "tar", "tfrecord", "hdf5"]


def crop(image: torch.Tensor) -> torch.Tensor:
    return center_crop(image, 24)


def assert_items_equal(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert type(x) is type(y) and len(x) == len(y)
        for u, v in zip(x, y):
            if isinstance(u, torch.Tensor):
                assert torch.equal(u, v)
            elif isinstance(u, np.ndarray):
                assert np.array_equal(u, v)
            else:
                assert u == v


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("options", [{}, {"output": "numpy"}, {"transform": crop, "target_transform": str},
                                     {"cache": "decoded"}, {"output": "encoded"}])
def test_getitems_equals_a_list_of_getitem(tiny_folder, tmp_path, fmt, options):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", fmt)
    ds = open_dataset(tmp_path / "out", **options)
    indices = [5, 0, -1, 13, 5, np.int64(2)]
    assert_items_equal(ds.__getitems__(indices), [ds[i] for i in indices])
    assert ds.__getitems__([]) == []


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_loader_batches_are_unchanged(tiny_folder, tmp_path, fmt):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", fmt)
    ds = open_dataset(tmp_path / "out", transform=crop)
    assert hasattr(ds, "__getitems__")
    for workers in (0, 2):
        batches = list(DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=collate))
        want = [collate([ds[i] for i in range(b, min(b + 4, len(ds)))]) for b in range(0, len(ds), 4)]
        for (images, labels), (w_images, w_labels) in zip(batches, want):
            assert torch.equal(images, w_images) and torch.equal(labels, w_labels)


def test_bad_indices_raise_as_getitem_does(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "lmdb")
    ds = open_dataset(tmp_path / "out")
    with pytest.raises(IndexError, match="sample 14 out of range"):
        ds.__getitems__([0, 1, 14, 2])
    with pytest.raises(TypeError, match="must be integers"):
        ds.__getitems__([0, 1.5])


def damage(ds, index: int, where: str, monkeypatch) -> None:
    """Make sample ``index`` fail to read (a checksum error) or to decode (a damaged payload)."""
    if where == "read":
        real_read = type(ds)._read

        def read(self, i):  # noqa: ANN001, ANN202
            if i == index:
                raise CorruptDataError("image data checksum mismatch", path=self.root, sample=i)
            return real_read(self, i)

        monkeypatch.setattr(type(ds), "_read", read)
        return
    real = type(ds).decode

    def decode(self, rec, i=None):  # noqa: ANN001, ANN202
        if i == index:
            raise CorruptDataError("cannot decode jpeg payload", path=self.root, sample=i)
        return real(self, rec, i)

    monkeypatch.setattr(type(ds), "decode", decode)


@pytest.mark.parametrize("fmt,cache", [("lmdb", None), ("tar", None), ("lmdb", "decoded"), ("tar", "encoded")])
@pytest.mark.parametrize("where", ["read", "decode"])
def test_skip_and_raise_policies_match(tiny_folder, tmp_path, fmt, cache, where, monkeypatch):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", fmt)
    raising = open_dataset(tmp_path / "out", cache=cache)
    damage(raising, 3, where, monkeypatch)
    with pytest.raises(CorruptDataError, match="sample 3"):
        raising.__getitems__([1, 3, 4])
    # sizing a decoded cache reads samples too: a damaged one among them is left to the reads
    one, batched = (open_dataset(tmp_path / "out", on_error="skip", cache=cache) for _ in range(2))
    indices = [2, 3, 3, 13]
    with warnings.catch_warnings(record=True) as singles:
        warnings.simplefilter("always")
        want = [one[i] for i in indices]
    with warnings.catch_warnings(record=True) as batch:
        warnings.simplefilter("always")
        got = batched.__getitems__(indices)
    assert_items_equal(got, want)
    assert [str(w.message) for w in batch] == [str(w.message) for w in singles] and len(batch) == 2
    assert batched.errors == one.errors == 2
    if cache is not None:
        assert [i for i in range(14) if i in batched.cache] == [2, 4, 13]  # 4 read in place of 3


@pytest.mark.parametrize("mode", ["decoded", "encoded"])
def test_a_cached_batch_holds_the_cache_lock_a_fixed_number_of_times(tiny_folder, tmp_path, mode):
    src, pixels = tiny_folder
    pack(src, tmp_path / "out", "lmdb")
    ds = open_dataset(tmp_path / "out", cache=mode, transform=crop)
    plain = open_dataset(tmp_path / "out", transform=crop)
    ds._ensure_cache()
    holds = 0
    real_hold = ds.cache._lock.hold

    def counting_hold():  # noqa: ANN202
        nonlocal holds
        holds += 1
        return real_hold()

    ds.cache._lock.hold = counting_hold
    batch = [7, 1, 12, 3, 0, 9]
    assert_items_equal(ds.__getitems__(batch), [plain[i] for i in batch])
    assert holds == 3 and len(ds.cache) == 6, "one lookup for the batch, one reservation, one publication"
    holds = 0
    everything = list(range(len(pixels)))
    assert_items_equal(ds.__getitems__(everything), [plain[i] for i in everything])
    assert holds == 3 and len(ds.cache) == len(pixels)
    assert ds.cache.hits == 6 and ds.cache.misses == 6 + len(pixels) - 6
    holds = 0
    assert_items_equal(ds.__getitems__(batch), [plain[i] for i in batch])
    assert holds == 1, "all hits: the lookup alone"
