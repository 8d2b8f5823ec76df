"""Who this process is: DDP rank of a world size, DataLoader worker of a number of workers.

The one answer for every reader, sampler and seeding helper in ``packer.datasets``: the rank
comes from ``torch.distributed`` when it is initialised here, else from the ``RANK`` and
``WORLD_SIZE`` environment variables (set by ``torchrun`` and inherited by spawned DataLoader
workers, which never have a process group), else this is rank 0 of 1. The worker comes from
``torch.utils.data.get_worker_info()``: worker 0 of 1 in the main process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from packer.checks import check_int

__all__ = ["World", "detect_rank", "detect_rank_and_world_size", "detect_worker", "detect_world"]


@dataclass(frozen=True)
class World:
    """Where this process sits: DDP rank of world size, DataLoader worker of num workers.

    Fields are validated on construction (TypeError for non-integers, ValueError naming the
    values for out-of-range ones). Tests build one directly; a dataset calls :meth:`detect`.
    ``dataclasses.replace(world, worker=..., num_workers=...)`` gives a copy for another worker.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        world_size = check_int("world_size", self.world_size, 1)
        num_workers = check_int("num_workers", self.num_workers, 1)
        rank = check_int("rank", self.rank, None)
        worker = check_int("worker", self.worker, None)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, "
                             f"world_size={world_size}")
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker must be in [0, num_workers), got worker={worker}, "
                             f"num_workers={num_workers}")
        # Store plain ints even when given numpy integers (hashing, equality, JSON).
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "world_size", world_size)
        object.__setattr__(self, "worker", worker)
        object.__setattr__(self, "num_workers", num_workers)

    @classmethod
    def detect(cls) -> World:
        """The world of the calling process (:func:`detect_world`). Call it inside ``__iter__``
        so that it runs in the DataLoader worker."""
        return detect_world()


def _distributed() -> tuple[int, int] | None:
    """(rank, world size) of an initialised ``torch.distributed`` process group, else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return None


def _env_int(name: str) -> int | None:
    """The integer in environment variable ``name``; None when it is unset or blank."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def detect_rank() -> int:
    """The global DDP rank: ``torch.distributed`` if initialised, else ``RANK``, else 0.

    Only the rank is asked for, so ``RANK`` alone is enough here (``WORLD_SIZE`` may be unset).
    """
    found = _distributed()
    if found is not None:
        return found[0]
    rank = _env_int("RANK")
    return 0 if rank is None else check_int("environment variable RANK", rank, 0)


def detect_rank_and_world_size() -> tuple[int, int]:
    """(rank, world size): ``torch.distributed`` if initialised, else ``RANK`` and
    ``WORLD_SIZE``, else (0, 1). Setting only one of the two variables is an error, never a
    silent guess; so is a rank outside the world."""
    found = _distributed()
    if found is None:
        rank, size = _env_int("RANK"), _env_int("WORLD_SIZE")
        if (rank is None) != (size is None):
            raise ValueError("set both RANK and WORLD_SIZE or neither, got "
                             f"RANK={os.environ.get('RANK')!r}, "
                             f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r}")
        found = (0, 1) if rank is None or size is None else (rank, size)
    world = World(rank=found[0], world_size=found[1])
    return world.rank, world.world_size


def detect_worker() -> tuple[int, int]:
    """(worker id, number of workers) of the DataLoader worker running this; (0, 1) outside."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))


def detect_world() -> World:
    """Rank, world size, worker and number of workers of the calling process."""
    rank, world_size = detect_rank_and_world_size()
    worker, num_workers = detect_worker()
    return World(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
