"""Stable node shard sets: each node of a job reads the same shards every epoch, in a new order.

A node cache smaller than the dataset thrashes when every epoch deals the shards to the nodes
anew: a node's share of epoch 2 is mostly shards it evicted or never had. :class:`NodeOrder` deals
them once (by ``(seed, deal)``; ``deal`` changes only when the user asks) and then, each epoch,
permutes the pieces of the node's share (whole shards, and the parts of the two shards it shares
with its neighbours) and lets the node's ranks take their spans of that; the rank's shuffle
(windows of positions) runs inside its span as usual. Every position of the epoch is still one
sample of the dataset, each sample once (plus the padding, which repeats fixed samples).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from packer.checks import check_int

from .stages import Partition, rank_span, shard_order

__all__ = ["NodeOrder", "deal_of"]

_DOMAIN_NODE = 0x6E6F6465  # the key domain of the per-epoch permutation of a node's pieces


def deal_of(epoch: int, every: int) -> int:
    """The dealing of shards to nodes that ``epoch`` uses: 0 for ever when ``every`` is 0, else
    a new one each ``every`` epochs."""
    return 0 if every == 0 else epoch // every


class NodeOrder:
    """The rank sequence of ``rank`` (before its window shuffle) whose node keeps its shards from
    epoch to epoch: ``.length`` positions, ``.at(q)`` the global indices at positions ``q``.

    ``sizes``: the samples of each shard (block) in stored order; the ranks of one node are
    ``node_ranks`` consecutive ranks; ``every``: epochs between dealings (0: one dealing).
    """

    def __init__(self, sizes: NDArray[np.int64], *, seed: int, epoch: int, rank: int, world_size: int,
                 partition: Partition, shuffle: bool, node_ranks: int, every: int) -> None:
        node_ranks = check_int("node_ranks", node_ranks, 1)
        if world_size % node_ranks:
            raise ValueError(f"stable node shards need whole nodes: world size {world_size} is not a multiple of "
                             f"{node_ranks} ranks per node (LOCAL_WORLD_SIZE)")
        self.count = count = int(sizes.sum())
        order = shard_order(len(sizes), seed, deal_of(epoch, check_int("every", every, 0)), shuffle)
        starts = (np.cumsum(sizes) - sizes)[order]  # each shard's first global index, in dealt order
        self._ends = np.cumsum(sizes[order])  # where each ends in the dealt sequence
        self._starts = starts
        node = rank // node_ranks
        first, _ = rank_span(count, world_size, node * node_ranks, partition)
        last, n = rank_span(count, world_size, (node + 1) * node_ranks - 1, partition)
        self.start, self.length = rank_span(count, world_size, rank, partition)
        self._first, stop = first, min(last + n, count)
        inner = self._ends[(self._ends > first) & (self._ends < stop)]
        cuts = np.concatenate([[first], inner, [stop]]).astype(np.int64) if stop > first else np.zeros(1, np.int64)
        lens = np.diff(cuts)
        perm = np.arange(len(lens))
        if shuffle and len(lens) > 1:
            key = (_DOMAIN_NODE, check_int("epoch", epoch, 0), node)
            perm = np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=key)).permutation(len(lens))
        self._piece_at = cuts[:-1][perm]  # where each piece (in this epoch's order) lies in the dealt sequence
        self._piece_end = np.cumsum(lens[perm])  # where it ends among the node's positions
        self._piece_len = lens[perm]

    def at(self, q: NDArray[np.int64]) -> NDArray[np.int64]:
        """Global indices at rank positions ``q``."""
        g = self.start + np.asarray(q, dtype=np.int64)
        within = g - self._first
        dealt = (g - self.count) % max(self.count, 1)  # padding past the end: fixed samples from the start
        inside = g < self.count
        if inside.any():
            k = np.searchsorted(self._piece_end, within[inside], side="right")
            dealt[inside] = self._piece_at[k] + within[inside] - (self._piece_end[k] - self._piece_len[k])
        slot = np.searchsorted(self._ends, dealt, side="right")
        begin = np.where(slot > 0, self._ends[np.maximum(slot - 1, 0)], 0)  # the shard's first dealt position
        return self._starts[slot] + dealt - begin
