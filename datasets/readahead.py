"""Read-ahead of a remote dataset's shards: while a worker reads one shard, the next ones of its
plan (each with the index files the reader has not read yet) download into the node cache in
background threads, so the worker rarely waits for one."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["ShardReadAhead"]


class ShardReadAhead:
    """Downloads, ``depth`` shards ahead, the shards that the sample ``indices`` (in reading order)
    of ``reader`` fall in. Call :meth:`at` with the position about to be read; :meth:`close` at
    the end. A downloaded shard is held (so other read-aheads leave it in the cache; readers may
    still evict it) until reading has passed the point where it is first needed. Read-ahead takes
    only the room the cache has to spare: a shard it finds no room for is tried again when
    reading moves to the next shard, and read when needed otherwise. A failed download is left
    for the reader to meet and report when it reaches that shard."""

    def __init__(self, reader: Any, indices: np.ndarray, depth: int) -> None:
        self._fetch = reader._remote
        starts = np.cumsum([0, *reader.shard_sizes])[:-1]
        shards = np.searchsorted(starts, indices, side="right") - 1
        order, first = np.unique(shards, return_index=True)
        by_need = np.argsort(first, kind="stable")
        needed = order[by_need].tolist()
        self._names = [os.path.basename(reader.shard_paths[s]) for s in needed]
        index_names = getattr(reader, "index_names", None)  # each shard's index comes with it
        self._index = [index_names(s) if index_names is not None else [] for s in needed]
        self._first = first[by_need].tolist()  # position in ``indices`` where each is first needed
        self._depth = depth
        self._next = 0  # next shard (in need order) to start downloading
        self._current = -1  # shards needed so far, at the last call
        self._pool = ThreadPoolExecutor(max(1, min(depth, 4)), thread_name_prefix="packer-readahead")
        self._held: list[tuple[int, int, Future[list[int] | None]]] = []  # (first position, shard, download)

    def at(self, position: int) -> None:
        """Reading is at ``position``: start the downloads needed next, release the passed ones."""
        current = int(np.searchsorted(self._first, position, side="right"))  # shards needed so far
        moved, self._current = current != self._current, current
        while self._next < len(self._names) and self._next < current + self._depth:
            self._held.append((self._first[self._next], self._next, self._submit(self._next)))
            self._next += 1
        keep = []
        for first, shard, fut in self._held:
            if first <= position and fut.done():
                _close(fut)
            elif moved and fut.done() and fut.exception() is None and fut.result() is None:
                keep.append((first, shard, self._submit(shard)))  # no room last time: try again
            else:
                keep.append((first, shard, fut))
        self._held = keep

    def _submit(self, shard: int) -> Future[list[int] | None]:
        return self._pool.submit(self._download, shard)

    def _download(self, shard: int) -> list[int] | None:
        """Fetch shard ``shard``'s index files, then the shard: the holds taken, or None when the
        shard found no room (its index files, small, stay in the cache unheld)."""
        held: list[int] = []
        try:
            for name in self._index[shard]:
                fd = self._fetch(name, ahead=True)
                if fd is not None:
                    held.append(fd)
            fd = self._fetch(self._names[shard], ahead=True)
        except BaseException:
            for h in held:
                os.close(h)
            raise
        if fd is None:
            for h in held:
                os.close(h)
            return None
        return [fd, *held]

    def close(self) -> None:
        """Stop: wait for the downloads in flight and release every held shard."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for _, _, fut in self._held:
            if not fut.cancelled():
                _close(fut)
        self._held = []


def _close(fut: Future[list[int] | None]) -> None:
    if fut.exception() is None and fut.result() is not None:
        for fd in fut.result():  # type: ignore[union-attr]
            os.close(fd)
