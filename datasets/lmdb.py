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


class LMDBDataset(PackedDataset):
    """Map-style dataset over a packed LMDB directory (see :class:`PackedDataset` for options)."""

    format = "lmdb"
    _env: lmdb.Environment | None = None

    def _open(self) -> None:
        path = os.path.join(self.root, DATA_FILE)
        if not os.path.exists(path):
            raise CorruptDataError("LMDB data file is missing", path=path)
        self._env = lmdb.open(
            self.root, subdir=True, readonly=True, lock=False, readahead=False, meminit=False,
            max_readers=1,
        )

    def _close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_env",)

    def _read(self, index: int) -> Record:
        assert self._env is not None
        with self._env.begin(buffers=False) as txn:
            value = txn.get(lmdb_key(index))
        if value is None:
            raise CorruptDataError("key missing from LMDB", path=os.path.join(self.root, DATA_FILE), sample=index)
        return unpack_record(value, verify=self.verify, path=os.path.join(self.root, DATA_FILE), sample=index)
