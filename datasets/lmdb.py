"""``LMDBDataset``: map-style reader for packed LMDB environments.

Opened read-only with ``lock=False`` (safe: a dataset with a manifest is complete and never
written again) and ``readahead=False`` (random access; OS readahead would waste page cache),
lazily in each process that reads.
"""

from __future__ import annotations

import os

import lmdb
from packer.converters.lmdb import DATA_FILE, lmdb_key

from packer.errors import CorruptDataError
from packer.record import Record, unpack_record

from .base import PackedDataset

__all__ = ["LMDBDataset"]

# LMDB allows one open of an environment per process (py-lmdb enforces it), so every dataset
# object for the same directory in a process shares one read-only handle, counted by users.
# An entry inherited through fork belongs to the parent: it is closed (the child's copy of the
# mapping only) and opened afresh, never used.
_ENVS: dict[str, tuple[int, lmdb.Environment, int]] = {}


def _acquire(root: str) -> lmdb.Environment:
    pid = os.getpid()
    entry = _ENVS.get(root)
    if entry is not None and entry[0] != pid:
        entry[1].close()
        entry = None
    if entry is None:
        env = lmdb.open(root, subdir=True, readonly=True, lock=False, readahead=False, meminit=False)
        entry = (pid, env, 0)
    _ENVS[root] = (pid, entry[1], entry[2] + 1)
    return entry[1]


def _release(root: str) -> None:
    entry = _ENVS.get(root)
    if entry is None or entry[0] != os.getpid():
        return
    if entry[2] <= 1:
        entry[1].close()
        del _ENVS[root]
    else:
        _ENVS[root] = (entry[0], entry[1], entry[2] - 1)


class LMDBDataset(PackedDataset):
    """Map-style dataset over a packed LMDB directory (see :class:`PackedDataset` for options)."""

    format = "lmdb"
    _env: lmdb.Environment | None = None

    def _open(self) -> None:
        path = os.path.join(self.root, DATA_FILE)
        if not os.path.exists(path):
            raise CorruptDataError("LMDB data file is missing", path=path)
        self._env = _acquire(self.root)

    def _close(self) -> None:
        if self._env is not None:
            self._env = None
            _release(self.root)

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_env",)

    def _read(self, index: int) -> Record:
        with self._env.begin(buffers=False) as txn:  # type: ignore[union-attr]
            value = txn.get(lmdb_key(index))
        if value is None:
            raise CorruptDataError("key missing from LMDB", path=os.path.join(self.root, DATA_FILE), sample=index)
        return unpack_record(value, verify=self.verify, path=os.path.join(self.root, DATA_FILE), sample=index)
