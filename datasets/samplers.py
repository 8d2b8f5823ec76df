"""Samplers for map-style datasets under DDP: ``ExactDistributedSampler`` for evaluation."""

from __future__ import annotations

from collections.abc import Iterator, Sized

import numpy as np
from torch.utils.data import Sampler

from packer.checks import check_int

from .partition import rank_span
from .world import World, detect_rank_and_world_size

__all__ = ["ExactDistributedSampler"]

_MAX_SEED = 2**128
_MAX_EPOCH = 2**32


class ExactDistributedSampler(Sampler[int]):
    """Each rank a disjoint part of the dataset, every index exactly once over the ranks.

    For evaluation: unlike ``torch.utils.data.DistributedSampler`` nothing is repeated or left
    out, so the ranks' counts differ by at most one (the first ``len(dataset) % world_size``
    ranks get one more). Rank ``r`` reads a consecutive slice of the (optionally shuffled) indices,
    as ``StreamingDataset(partition="exact")`` does. Gather per-rank sums and counts afterwards
    (docs/guide.md, "Evaluation under DDP"); a DDP training step on unequal counts would hang.

    Args:
        dataset: anything with ``len``.
        world: rank and world size (default: the process group, else ``RANK``/``WORLD_SIZE``,
            else a single process); the worker fields are not used.
        shuffle: permute the indices with ``(seed, epoch)`` before slicing (default: stored
            order).
        seed: the permutation's seed, ``0 <= seed < 2**128``.
    """

    def __init__(self, dataset: Sized, *, world: World | None = None, shuffle: bool = False,
                 seed: int = 0) -> None:
        if world is not None and not isinstance(world, World):
            raise TypeError(f"world must be a World, got {type(world).__name__}")
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {shuffle!r}")
        self.rank, self.world_size = ((world.rank, world.world_size) if world is not None
                                      else detect_rank_and_world_size())
        self.num_samples = len(dataset)
        self.shuffle = shuffle
        self.seed = check_int("seed", seed, 0, _MAX_SEED)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the shuffle of the following iterations."""
        self.epoch = check_int("epoch", epoch, 0, _MAX_EPOCH)

    def __len__(self) -> int:
        return rank_span(self.num_samples, self.world_size, self.rank, "exact")[1]

    def __iter__(self) -> Iterator[int]:
        start, count = rank_span(self.num_samples, self.world_size, self.rank, "exact")
        if not self.shuffle:
            return iter(range(start, start + count))
        rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(self.epoch,)))
        return iter(rng.permutation(self.num_samples)[start : start + count].tolist())
