"""packer.datasets.world: the one rule for rank, world size and DataLoader worker."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from packer.datasets import partition, seeding, streaming
from packer.datasets.world import (
    World,
    detect_rank,
    detect_rank_and_world_size,
    detect_worker,
    detect_world,
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    return monkeypatch


def test_every_user_has_the_same_world_class() -> None:
    assert partition.World is World is streaming.World
    assert seeding.detect_rank is detect_rank


def test_defaults_outside_ddp_and_workers(clean_env: pytest.MonkeyPatch) -> None:
    assert detect_rank() == 0
    assert detect_rank_and_world_size() == (0, 1)
    assert detect_worker() == (0, 1)
    assert detect_world() == World.detect() == World()


def test_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RANK", " 3 ")
    clean_env.setenv("WORLD_SIZE", "4")
    assert detect_rank() == 3
    assert detect_rank_and_world_size() == (3, 4)
    clean_env.delenv("WORLD_SIZE")
    assert detect_rank() == 3, "the rank alone needs only RANK"
    with pytest.raises(ValueError, match="set both RANK and WORLD_SIZE or neither"):
        detect_rank_and_world_size()
    clean_env.setenv("WORLD_SIZE", "")
    clean_env.setenv("RANK", "")
    assert detect_rank_and_world_size() == (0, 1), "blank counts as unset"


@pytest.mark.parametrize(
    ("rank", "match"),
    [("x", "environment variable RANK must be an integer, got 'x'"),
     ("-1", "environment variable RANK must be >= 0, got -1")],
)
def test_bad_rank_in_environment(clean_env: pytest.MonkeyPatch, rank: str, match: str) -> None:
    clean_env.setenv("RANK", rank)
    with pytest.raises(ValueError, match=match):
        detect_rank()


def test_world_defaults_and_numpy_integers() -> None:
    assert World() == World(0, 1, 0, 1)
    world = World(rank=np.int64(2), world_size=np.int32(4), worker=np.uint8(1), num_workers=3)
    assert world == World(2, 4, 1, 3)
    assert all(type(v) is int for v in dataclasses.astuple(world))
    with pytest.raises(dataclasses.FrozenInstanceError):
        world.rank = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rank": 2, "world_size": 2}, ValueError, "rank=2, world_size=2"),
        ({"rank": -1, "world_size": 2}, ValueError, "rank=-1, world_size=2"),
        ({"world_size": 0}, ValueError, "world_size must be >= 1, got 0"),
        ({"worker": 3, "num_workers": 3}, ValueError, "worker=3, num_workers=3"),
        ({"worker": -1}, ValueError, "worker=-1, num_workers=1"),
        ({"num_workers": 0}, ValueError, "num_workers must be >= 1, got 0"),
        ({"rank": "1", "world_size": 2}, TypeError, "rank must be an integer, got str"),
        ({"world_size": 2.0}, TypeError, "world_size must be an integer, got float"),
        ({"worker": True, "num_workers": 2}, TypeError, "worker must be an integer, got bool"),
    ],
)
def test_world_rejects(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        World(**kwargs)


def test_world_detect_defaults(clean_env: pytest.MonkeyPatch) -> None:
    assert World.detect() == World(0, 1, 0, 1)


def test_world_detect_from_env(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RANK", "3")
    clean_env.setenv("WORLD_SIZE", "4")
    assert World.detect() == World(rank=3, world_size=4)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "1"}, "both RANK and WORLD_SIZE.*WORLD_SIZE=None"),
        ({"WORLD_SIZE": "2"}, "both RANK and WORLD_SIZE.*RANK=None"),
        ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK must be an integer, got 'one'"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank=2, world_size=2"),
    ],
)
def test_world_detect_rejects_bad_env(clean_env: pytest.MonkeyPatch, env: dict[str, str],
                                      match: str) -> None:
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        World.detect()


class _Probe(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> tuple[int, int, int, int]:
        world = detect_world()
        return world.rank, world.world_size, world.worker, world.num_workers


def test_worker_and_environment_in_dataloader_workers(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    loader = DataLoader(_Probe(), batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert sorted(tuple(int(v) for v in row) for row in loader) == [(1, 2, 0, 2), (1, 2, 1, 2)]
