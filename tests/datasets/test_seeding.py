"""Tests for packer.datasets.seeding: distinct, reproducible streams per worker, epoch and rank."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from packer.datasets.seeding import (
    reseed_dataset_generators,
    seed_everything,
    seed_worker,
    worker_rng,
)

# Four forked workers on a two-core machine are fine for these tiny loaders.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

# Columns of a RandomDataset sample after the index and worker id.
COLUMNS = ("random", "numpy", "torch", "worker_rng", "own_numpy", "own_random", "own_torch")


class RandomDataset(Dataset):
    """Draws from every kind of RNG a dataset uses; defined at module level for spawn."""

    def __init__(self, n: int, torch_generator: bool = True) -> None:
        self.n = n
        # Generators made in __init__: cloned identically into every worker unless re-seeded.
        self.rng = np.random.default_rng(0)
        self.pyrng = random.Random(0)
        # torch 2.13 cannot send a torch.Generator to a spawned worker (its pickled state tensor
        # dies before the worker opens it: "unable to resize file"), so spawn tests go without.
        self.tgen = torch.Generator().manual_seed(0) if torch_generator else None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple:
        info = get_worker_info()
        return (
            index,
            -1 if info is None else info.id,
            random.random(),
            float(np.random.rand()),
            torch.rand(1).item(),
            float(worker_rng().random()),
            float(self.rng.random()),
            self.pyrng.random(),
            None if self.tgen is None else torch.rand(1, generator=self.tgen).item(),
        )


def run_epochs(
    seed: int,
    *,
    workers: int = 4,
    epochs: int = 2,
    n: int = 16,
    persistent: bool = False,
    context: str = "fork",
    init_fn=seed_worker,
) -> list[list[tuple]]:
    """Every sample of every epoch, in delivery order, from a seeded DataLoader."""
    loader = DataLoader(
        RandomDataset(n, torch_generator=context != "spawn"),
        batch_size=None,
        shuffle=True,
        num_workers=workers,
        worker_init_fn=init_fn,
        generator=torch.Generator().manual_seed(seed),
        persistent_workers=persistent,
        multiprocessing_context=context,
    )
    result = [[tuple(sample) for sample in loader] for _ in range(epochs)]
    del loader
    return result


def check_streams(run_a: list[list[tuple]], run_b: list[list[tuple]], workers: int) -> None:
    """Distinct across workers and epochs in each column; identical between the two runs."""
    assert run_a == run_b, "same generator seed must reproduce every value"
    for epoch in run_a:
        assert {sample[1] for sample in epoch} == set(range(workers))
    for column, name in enumerate(COLUMNS, start=2):
        per_epoch = [[sample[column] for sample in epoch] for epoch in run_a]
        if per_epoch[0][0] is None:
            continue
        for values in per_epoch:
            assert len(set(values)) == len(values), f"{name}: workers repeat each other"
        assert not set(per_epoch[0]) & set(per_epoch[1]), f"{name}: epochs repeat each other"


def test_fork_workers_and_epochs_differ_and_runs_repeat() -> None:
    check_streams(run_epochs(7), run_epochs(7), workers=4)


def test_fork_persistent_workers_epochs_still_differ() -> None:
    check_streams(run_epochs(7, persistent=True), run_epochs(7, persistent=True), workers=4)


def test_spawn_persistent_workers_match_fork() -> None:
    """Spawned workers get the same streams as forked ones: only the seeds decide."""
    spawned = run_epochs(11, workers=2, n=8, persistent=True, context="spawn")
    forked = run_epochs(11, workers=2, n=8, persistent=True, context="fork")
    without_torch_generator = [[sample[:-1] + (None,) for sample in epoch] for epoch in forked]
    check_streams(spawned, without_torch_generator, workers=2)


def test_different_loader_seeds_differ() -> None:
    a = run_epochs(1, workers=2, epochs=1)[0]
    b = run_epochs(2, workers=2, epochs=1)[0]
    for column, name in enumerate(COLUMNS, start=2):
        assert not {s[column] for s in a} & {s[column] for s in b}, name


def test_without_seed_worker_dataset_generators_repeat() -> None:
    """The pitfall seed_worker fixes: a Generator made in __init__ is the same in every worker."""
    epoch = run_epochs(3, workers=2, epochs=1, n=8, init_fn=None)[0]
    own = [sample[COLUMNS.index("own_numpy") + 2] for sample in epoch]
    assert len(set(own)) < len(own)


def test_ranks_differ_with_the_same_loader_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    rank0 = run_epochs(5, workers=2, epochs=1)[0]
    monkeypatch.setenv("RANK", "1")
    rank1 = run_epochs(5, workers=2, epochs=1)[0]
    assert [s[0] for s in rank0] == [s[0] for s in rank1], "the sampler order is rank-independent"
    for column, name in enumerate(COLUMNS, start=2):
        assert not {s[column] for s in rank0} & {s[column] for s in rank1}, name


def test_explicit_rank_overrides_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    torch.manual_seed(99)
    seed_worker(0)
    from_env = np.random.rand()
    torch.manual_seed(99)
    seed_worker(0, rank=3)
    assert np.random.rand() == from_env
    torch.manual_seed(99)
    seed_worker(0, rank=4)
    assert np.random.rand() != from_env


def test_numpy_seed_uses_all_bits() -> None:
    """Worker seeds that differ only above bit 32 must not collide (no ``seed % 2**32``)."""
    torch.manual_seed(12345)
    seed_worker(0, rank=0)
    low = np.random.rand(4)
    torch.manual_seed(12345 + 2**32)
    seed_worker(0, rank=0)
    assert not np.array_equal(low, np.random.rand(4))


def test_seed_worker_validates_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="worker_id"):
        seed_worker(-1)
    with pytest.raises(TypeError, match="rank"):
        seed_worker(0, rank="1")  # type: ignore[arg-type]
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK must be an integer, got 'zero'"):
        seed_worker(0)


def test_worker_rng_is_cached_per_epoch_and_reproducible() -> None:
    seed_everything(21)
    rng = worker_rng()
    assert worker_rng() is rng
    first = rng.random(3)
    assert not np.array_equal(worker_rng().random(3), first), "the stream must advance"
    epoch1 = worker_rng(1).random(3)
    epoch2 = worker_rng(2).random(3)
    assert not np.array_equal(epoch1, epoch2)
    assert worker_rng(1) is not worker_rng(2) is not worker_rng()

    seed_everything(21)
    assert np.array_equal(worker_rng().random(3), first)
    assert np.array_equal(worker_rng(2).random(3), epoch2), "an epoch stream ignores others"
    with pytest.raises(ValueError, match="epoch"):
        worker_rng(-1)


def test_seed_everything_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)

    def draw() -> tuple:
        return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()

    seed_everything(2024)
    first = draw()
    seed_everything(2024)
    assert draw() == first
    assert os.environ["PYTHONHASHSEED"] == "2024"
    seed_everything(2025)
    assert draw() != first
    seed_everything(2**40)  # beyond NumPy's 32-bit legacy seed
    big = draw()
    seed_everything(2**40)
    assert draw() == big
    with pytest.raises(ValueError, match="seed"):
        seed_everything(-1)
    with pytest.raises(TypeError, match="seed"):
        seed_everything(1.5)  # type: ignore[arg-type]


def test_seed_everything_deterministic_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.are_deterministic_algorithms_enabled(),
    )
    try:
        seed_everything(0, deterministic=True)
        assert torch.backends.cudnn.deterministic is True
        assert torch.backends.cudnn.benchmark is False
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        seed_everything(0, deterministic=True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8", "a user's setting is kept"
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[:2]
        torch.use_deterministic_algorithms(saved[2])


class Holder:
    def __init__(self, **attributes: object) -> None:
        self.__dict__.update(attributes)


def test_reseed_dataset_generators_finds_nested_generators() -> None:
    shared = np.random.default_rng(0)
    philox = np.random.Generator(np.random.Philox(0))
    inner = Holder(rng=shared, again=shared, gens=[random.Random(0), torch.Generator()])
    outer = Holder(
        dataset=inner,
        by_name={"legacy": np.random.RandomState(0), "philox": philox},
        samples=[np.random.default_rng(0) for _ in range(100)],  # too long to scan
        transform=Holder(rng=np.random.default_rng(0)),
    )
    found = reseed_dataset_generators(outer, 5)
    assert sorted(found) == sorted(
        [
            "dataset.dataset.rng",
            "dataset.dataset.gens[0]",
            "dataset.dataset.gens[1]",
            "dataset.by_name['legacy']",
            "dataset.by_name['philox']",
            "dataset.transform.rng",
        ]
    )
    assert inner.rng is shared and inner.again is shared
    assert isinstance(philox.bit_generator, np.random.Philox)
    # Every generator gets its own stream, and the same seed gives the same streams.
    values = [inner.rng.random(), outer.transform.rng.random(), philox.random()]
    assert len(set(values)) == 3
    assert outer.samples[0].random() == np.random.default_rng(0).random(), "not scanned"

    again = Holder(dataset=Holder(rng=np.random.default_rng(1)), transform=Holder(rng=None))
    again.transform.rng = np.random.default_rng(2)
    reseed_dataset_generators(again, 5)
    assert again.transform.rng.random() == values[1]


def test_reseed_dataset_generators_validates_seed() -> None:
    with pytest.raises(ValueError, match="seed"):
        reseed_dataset_generators(Holder(), -3)
