"""glibc malloc settings in DataLoader workers: freed image-sized buffers are reused, not re-faulted."""

from __future__ import annotations

import os
import resource

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packer.datasets import collate, open_dataset
from packer.datasets.shm import worker_memory
from packer.datasets.shm.worker_memory import _glibc, tune_worker_malloc
from tests.helpers import pack

pytestmark = pytest.mark.skipif(not _glibc(), reason="glibc only")


def _faults_per_round(rounds: int = 4) -> list[int]:
    """Page faults of rounds of 240 image-sized buffers (48 MB) alive at once, then freed: what a
    worker does per batch."""
    out = []
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        buffers = [np.empty(200_000, np.uint8) for _ in range(240)]
        for b in buffers:
            b.fill(1)
        del buffers
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return out


def _before_and_after_settings(batch):  # noqa: ANN001, ANN202
    return torch.tensor([_faults_per_round(), (worker_memory._apply(), _faults_per_round())[1]])


def test_settings_stop_the_faults(monkeypatch):
    """In a fresh worker with glibc's static defaults (its dynamic threshold depends on what the
    process freed before, so the control pins it), every round faults its 11,700 pages in again;
    after the settings only the first round does."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))
    loader = DataLoader(range(1), batch_size=1, num_workers=1, collate_fn=_before_and_after_settings,
                        multiprocessing_context="spawn")
    (before, after), = [t.tolist() for t in loader]
    assert min(before) > 11_000, before
    assert max(after[1:]) < 500, after


def _tuned_here(batch):  # noqa: ANN001, ANN202
    return worker_memory._tuned is not None and worker_memory._tuned[0] == os.getpid()


def _collate_then_tuned(batch):  # noqa: ANN001, ANN202
    collate(batch)
    return worker_memory._tuned is not None and worker_memory._tuned[0] == os.getpid()


def test_readers_and_collate_apply_them_in_workers(tiny_folder, tmp_path):
    dst = str(tmp_path / "lmdb")
    pack(tiny_folder[0], dst, "lmdb", resize="16x16")
    ds = open_dataset(dst)
    assert list(DataLoader(ds, batch_size=2, num_workers=1, collate_fn=_tuned_here, multiprocessing_context="spawn"))[0]
    assert not list(DataLoader(range(2), batch_size=2, num_workers=1, collate_fn=_tuned_here,
                               multiprocessing_context="spawn"))[0]
    probe = DataLoader([torch.zeros(3, 4, 4)] * 2, batch_size=2, num_workers=1, multiprocessing_context="spawn",
                       collate_fn=_collate_then_tuned)
    assert list(probe) == [True]


def test_main_process_is_never_changed():
    assert tune_worker_malloc() is False


def _tune(batch):  # noqa: ANN001, ANN202
    return tune_worker_malloc()


@pytest.mark.parametrize("env", ["PACKER_MALLOC_TUNING=0", "MALLOC_TRIM_THRESHOLD_=1000000"])
def test_opt_out_and_glibc_environment_win(monkeypatch, env):
    name, value = env.split("=")
    monkeypatch.setenv(name, value)
    assert list(DataLoader(range(2), batch_size=1, num_workers=1, collate_fn=_tune)) == [False, False]
    monkeypatch.delenv(name)
    assert list(DataLoader(range(2), batch_size=1, num_workers=1, collate_fn=_tune)) == [True, True]
