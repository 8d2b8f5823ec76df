"""LMDB writer: one environment, key ``%010d`` per sample in sample order, value = packer record.

The value layout is :mod:`packer.record` (header, key, payload, CRC32C; no pickle). Samples are
appended in write transactions of bounded size; when the memory map is full the transaction is
retried after doubling the map, so users never see ``MDB_MAP_FULL``.
"""

from __future__ import annotations

import os
from typing import Any

import lmdb

from packer.imageproc import ProcessedImage
from packer.manifest import FileEntry, file_sha256
from packer.record import pack_record

from .base import Writer, WriterOptions

__all__ = ["LMDBWriter", "lmdb_key"]

DATA_FILE = "data.mdb"
_INITIAL_MAP = 1 << 30
_BATCH_BYTES = 64 << 20
_BATCH_SAMPLES = 1024


def lmdb_key(index: int) -> bytes:
    """The LMDB key of sample ``index``: ten ASCII digits, so byte order is sample order."""
    return b"%010d" % index


class LMDBWriter(Writer):
    """Writes a packed LMDB environment into the output directory."""

    format = "lmdb"

    def __init__(self, directory: str, options: WriterOptions) -> None:
        super().__init__(directory, options)
        self._map_size = _INITIAL_MAP
        self._env = lmdb.open(
            directory, subdir=True, map_size=self._map_size, sync=False, metasync=False,
            meminit=True, readahead=False, max_dbs=0,
        )
        self._batch: list[tuple[bytes, bytes]] = []
        self._batch_bytes = 0
        self._count = 0

    def add(self, index: int, key: str, label: int, image: ProcessedImage) -> None:
        """Queue one sample; commits every 1024 samples or 64 MB."""
        value = pack_record(key, label, image.codec, image.height, image.width, image.payload)
        self._batch.append((lmdb_key(index), value))
        self._batch_bytes += len(value)
        self._count += 1
        if len(self._batch) >= _BATCH_SAMPLES or self._batch_bytes >= _BATCH_BYTES:
            self._commit()

    def _commit(self) -> None:
        while self._batch:
            try:
                with self._env.begin(write=True) as txn:
                    for k, v in self._batch:
                        txn.put(k, v, append=True)
            except lmdb.MapFullError:
                self._map_size *= 2
                self._env.set_mapsize(self._map_size)
                continue
            self._batch.clear()
            self._batch_bytes = 0

    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Commit the last batch, sync, close, and drop the lock file readers do not need."""
        self._commit()
        self._env.sync(True)
        self._env.close()
        lock = self.path("lock.mdb")
        if os.path.exists(lock):
            os.remove(lock)
        data = self.path(DATA_FILE)
        entry = FileEntry(DATA_FILE, self._count, os.path.getsize(data), file_sha256(data))
        return [entry], {"key_format": "%010d", "value": "packer record v1 (docs/FORMATS.md)"}

    def abort(self) -> None:
        """Close the environment without committing the pending batch."""
        self._env.close()
