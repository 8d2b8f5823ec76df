"""Reading through damage in long runs: skips counted across workers and epochs, errors that keep
their fields across a DataLoader worker, clear index and path errors, malloc tuning failures told."""

from __future__ import annotations

import os
import shutil

import pytest

from packer.description.registry import format_names
from tests.datasets.test_dataset_identity import _two_datasets
from tests.helpers import make_folder, pack

FORMATS = format_names()


# -- skipping corrupt samples in long runs ------------------------------------------------------------
def _damaged_tar(tmp_path, n, bad):
    """A raw tar dataset of ``n`` samples whose first ``bad`` samples fail their checksum."""
    from packer.layouts.tar import unpack_index
    from tests.helpers import forge_manifest_sizes

    src = str(tmp_path / "src")
    make_folder(src, {"a": [(f"{i:05d}.png", 2, 2) for i in range(n)]})
    dst = str(tmp_path / "out")
    pack(src, dst, "tar", encode="raw", shuffle=False)
    idx = os.path.join(dst, "shard-000000.pkidx")
    _, entries, _ = unpack_index(open(idx, "rb").read(), idx)
    with open(os.path.join(dst, "shard-000000.tar"), "r+b") as f:
        for e in entries[:bad]:
            f.seek(int(e["offset"]) + int(e["size"]) - 1)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xFF]))
    forge_manifest_sizes(dst)
    return dst


def test_skips_are_counted_across_workers_and_never_exhaust_over_epochs(tmp_path):
    import torch

    from packer.datasets import open_dataset
    from packer.datasets.shm.skips import SkippedSampleWarning

    dst = _damaged_tar(tmp_path, 4, 1)
    ds = open_dataset(dst, on_error="skip", output="numpy")
    with pytest.warns(SkippedSampleWarning, match="sample 0"):
        ds[0]
    for _ in range(10):  # one bad sample in four, for more epochs than the dataset has samples
        for i in range(len(ds)):
            ds[i]
    assert ds.errors == 11
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=list)
    for _ in range(3):
        assert sum(len(b) for b in loader) == 4
    assert ds.errors == 14  # counted in the workers, seen here


def test_a_thousand_consecutive_bad_samples_are_skipped_without_recursion(tmp_path):
    import warnings

    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    dst = _damaged_tar(tmp_path, 1100, 1050)
    ds = open_dataset(dst, on_error="skip", output="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, label = ds[0]  # sample 1050 is the first good one
        assert ds.errors == 1050
    all_bad = _damaged_tar(tmp_path / "b", 5, 5)
    ds = open_dataset(all_bad, on_error="skip", output="numpy")
    with warnings.catch_warnings(), pytest.raises(CorruptDataError, match="every sample"):
        warnings.simplefilter("ignore")
        ds[2]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_dataset_file_that_fails_its_open_check_is_opened_once_per_process(tmp_path, fmt, monkeypatch):
    """on_error="skip" over a dataset whose payload file was replaced by another conversion's: the
    open check fails, and later samples raise the same error without opening the file again (it
    was opened and its index read once per sample: O(n^2) per epoch)."""
    import warnings

    from packer.datasets import open_dataset
    from packer.description.manifest import read_manifest
    from packer.errors import CorruptDataError
    from packer.storage import datasetdir

    dst, _ = _two_datasets(tmp_path, fmt)
    _two_datasets(tmp_path / "b", fmt)[1]()  # another conversion, its files in tmp_path/b/out
    data = [e.name for e in read_manifest(dst).files if e.name.endswith((".h5", ".mdb", ".tar", ".tfrecord"))]
    for name in data:
        shutil.copyfile(os.path.join(tmp_path, "b", "out", name), os.path.join(dst, name))
    opened = []  # every open of a dataset file, through the reader's one checked path
    real_open = datasetdir.open_regular
    monkeypatch.setattr(datasetdir, "open_regular", lambda name, *a, **k: opened.append(name) or real_open(name, *a, **k))
    ds = open_dataset(dst, on_error="skip", output="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):  # two epochs
            for i in range(len(ds)):
                with pytest.raises(CorruptDataError, match="every sample"):
                    ds[i]
    assert len(ds) == 12 and ds.errors == (0 if fmt == "hdf5" else 12)  # the first read counts, no later one
    assert len([n for n in opened if n in data]) <= len(data), opened

def test_corrupt_data_error_keeps_its_fields_across_a_dataloader_worker(tmp_path):
    import torch

    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    dst = _damaged_tar(tmp_path, 4, 4)
    loader = torch.utils.data.DataLoader(open_dataset(dst), batch_size=1, num_workers=1)
    with pytest.raises(CorruptDataError) as info:
        next(iter(loader))
    e = info.value
    assert e.path == os.path.join(dst, "shard-000000.tar") and e.sample == 0 and isinstance(e.offset, int)


@pytest.mark.parametrize("bad", [1.0, "a", slice(0, 2), None, True])
def test_non_integer_indices_are_a_clear_type_error(tmp_path, bad):
    from packer.datasets import open_dataset

    dst, _ = _two_datasets(tmp_path, "lmdb")
    ds = open_dataset(dst)
    with pytest.raises(TypeError, match="indices must be integers"):
        ds[bad]
    import numpy as np

    assert (ds[np.int64(1)][0] == ds[1][0]).all() and (ds[-1][0] == ds[len(ds) - 1][0]).all()
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]


def test_home_relative_paths_are_expanded(tmp_path, monkeypatch):
    from packer.datasets import StreamingDataset, open_dataset

    dst, _ = _two_datasets(tmp_path, "tar")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert len(open_dataset("~/out")) == len(StreamingDataset("~/out", shuffle=False)) == 12
    assert open_dataset("~/out").root == dst


def _malloc_outcomes(_):
    from packer.datasets.shm import worker_memory

    return [worker_memory.tune_worker_malloc(), worker_memory.tune_worker_malloc()]


class _Probe:
    def __len__(self):
        return 1

    def __getitem__(self, i):
        return _malloc_outcomes(i)


def _fail_apply(_):
    from packer.datasets.shm import worker_memory

    worker_memory._apply = lambda: False


def test_malloc_tuning_reports_a_failure_every_time_not_only_the_first():
    import torch

    loader = torch.utils.data.DataLoader(_Probe(), batch_size=None, num_workers=1, worker_init_fn=_fail_apply,
                                         multiprocessing_context="fork")
    assert next(iter(loader)) == [False, False]
