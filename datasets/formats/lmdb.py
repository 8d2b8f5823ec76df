"""``LMDBDataset``: map-style reader for packed LMDB environments (layout and parser:
packer.layouts.lmdb). Handles are opened lazily in each process and never used across fork."""

from __future__ import annotations

import os
from collections.abc import Collection

from packer.description.placement import place_seed
from packer.description.record import Record, unpack_record
from packer.layouts.lmdb import LMDBFile

from ..base import PackedDataset

__all__ = ["LMDBDataset", "LMDBFile"]


class LMDBDataset(PackedDataset):
    """Map-style dataset over a packed LMDB directory (see :class:`PackedDataset` for options)."""

    format = "lmdb"
    _file: LMDBFile | None = None

    def _open(self) -> None:
        self._drop()  # a handle inherited through fork belongs to the parent
        path = os.path.join(self.root, self.data_file)
        self._file = LMDBFile(path, len(self), self._open_file(self.data_file))

    def _drop(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def _close(self) -> None:
        self._drop()

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_file",)

    def _read(self, index: int, fields: Collection[str] | None = None) -> Record:
        """The record (one LMDB value holds the sample's fields together: all are returned)."""
        f = self._file
        assert f is not None
        value = f.read(index)
        fid = self.manifest.files[0].id if self.manifest.files else ""
        return unpack_record(value, verify=self.verify, path=f.path, sample=index,
                             seed=place_seed(fid, index) if fid else None)
