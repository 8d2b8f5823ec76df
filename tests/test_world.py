"""packer.datasets.world: the one rule for rank, world size and DataLoader worker."""

from __future__ import annotations

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
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    return monkeypatch


def test_every_user_has_the_same_world_class() -> None:
    assert partition.World is World is streaming.World
    assert seeding.detect_rank is detect_rank


def test_defaults_outside_ddp_and_workers(env: pytest.MonkeyPatch) -> None:
    assert detect_rank() == 0
    assert detect_rank_and_world_size() == (0, 1)
    assert detect_worker() == (0, 1)
    assert detect_world() == World.detect() == World()


def test_environment(env: pytest.MonkeyPatch) -> None:
    env.setenv("RANK", " 3 ")
    env.setenv("WORLD_SIZE", "4")
    assert detect_rank() == 3
    assert detect_rank_and_world_size() == (3, 4)
    env.delenv("WORLD_SIZE")
    assert detect_rank() == 3, "the rank alone needs only RANK"
    with pytest.raises(ValueError, match="set both RANK and WORLD_SIZE or neither"):
        detect_rank_and_world_size()
    env.setenv("WORLD_SIZE", "")
    env.setenv("RANK", "")
    assert detect_rank_and_world_size() == (0, 1), "blank counts as unset"


@pytest.mark.parametrize(
    ("rank", "match"),
    [("x", "environment variable RANK must be an integer, got 'x'"),
     ("-1", "environment variable RANK must be >= 0, got -1")],
)
def test_bad_rank_in_environment(env: pytest.MonkeyPatch, rank: str, match: str) -> None:
    env.setenv("RANK", rank)
    with pytest.raises(ValueError, match=match):
        detect_rank()


class _Probe(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> tuple[int, int, int, int]:
        world = detect_world()
        return world.rank, world.world_size, world.worker, world.num_workers


def test_worker_and_environment_in_dataloader_workers(env: pytest.MonkeyPatch) -> None:
    env.setenv("RANK", "1")
    env.setenv("WORLD_SIZE", "2")
    loader = DataLoader(_Probe(), batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert sorted(tuple(int(v) for v in row) for row in loader) == [(1, 2, 0, 2), (1, 2, 1, 2)]
