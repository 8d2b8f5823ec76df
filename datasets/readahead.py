"""Read-ahead of a remote dataset's shards: while a worker reads one shard, the next ones of its
plan download into the node cache in background threads, so the worker rarely waits for one."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["ShardReadAhead"]


class ShardReadAhead:
    """Downloads, ``depth`` shards ahead, the shards that the sample ``indices`` (in reading order)
    of ``reader`` fall in. Call :meth:`at` with the position about to be read; :meth:`close` at
    the end. A downloaded shard is held open (so the cache keeps it) until reading has passed
    the point where it is first needed; a failed download is left for the reader to meet and
    report when it reaches that shard."""

    def __init__(self, reader: Any, indices: np.ndarray, depth: int) -> None:
        self._fetch = reader._remote
        starts = np.cumsum([0, *reader.shard_sizes])[:-1]
        shards = np.searchsorted(starts, indices, side="right") - 1
        order, first = np.unique(shards, return_index=True)
        by_need = np.argsort(first, kind="stable")
        self._names = [os.path.basename(reader.shard_paths[s]) for s in order[by_need].tolist()]
        self._first = first[by_need].tolist()  # position in ``indices`` where each is first needed
        self._depth = depth
        self._next = 0  # next shard (in need order) to start downloading
        self._pool = ThreadPoolExecutor(max(1, min(depth, 4)), thread_name_prefix="packer-readahead")
        self._held: list[tuple[int, Future[int]]] = []

    def at(self, position: int) -> None:
        """Reading is at ``position``: start the downloads needed next, release the passed ones."""
        current = int(np.searchsorted(self._first, position, side="right"))  # shards needed so far
        while self._next < len(self._names) and self._next < current + self._depth:
            self._held.append((self._first[self._next], self._pool.submit(self._fetch, self._names[self._next])))
            self._next += 1
        keep = []
        for first, fut in self._held:
            if first <= position and fut.done():
                _close(fut)
            else:
                keep.append((first, fut))
        self._held = keep

    def close(self) -> None:
        """Stop: wait for the downloads in flight and release every held shard."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for _, fut in self._held:
            if not fut.cancelled():
                _close(fut)
        self._held = []


def _close(fut: Future[int]) -> None:
    if fut.exception() is None:
        os.close(fut.result())
