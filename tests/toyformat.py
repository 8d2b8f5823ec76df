"""A toy packed format in one module, for tests/formats/test_toy_format.py: one flat file of packed records
(``data.toy``, the records LMDB stores as values) and their byte offsets in the manifest's layout.
Its writer, its reader and its ``identify`` are all a format needs; the test adds its row."""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any

from packer.converters.base import Writer, WriterOptions
from packer.datasets.base import PackedDataset
from packer.description.manifest import FileEntry, file_sha256
from packer.description.placement import file_id, place_seed
from packer.description.record import Record, pack_record, unpack_record
from packer.images.imageproc import ProcessedImage

__all__ = ["DATA_FILE", "ToyWriter", "ToyDataset", "identify"]

DATA_FILE = "data.toy"


class ToyWriter(Writer):
    """Appends each sample's record to ``data.toy``; the offsets go into the manifest's layout."""

    format = "toy"

    def __init__(self, directory: str, options: WriterOptions) -> None:
        super().__init__(directory, options)
        self._file = open(self.path(DATA_FILE), "wb")  # noqa: SIM115 - closed in close()/abort()
        self._offsets = [0]
        self._fid = ""

    def add(self, index: int, key: str, label: int, image: ProcessedImage) -> None:
        """Append sample ``index``'s record, its checksum seeded with its place."""
        if index == 0:
            self._fid = file_id(0, key, image.payload)
        record = pack_record(key, label, image.codec, image.height, image.width, image.payload,
                             place_seed(self._fid, index))
        self._file.write(record)
        self._offsets.append(self._offsets[-1] + len(record))

    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """fsync ``data.toy``; the file entry and the offsets."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        path = self.path(DATA_FILE)
        entry = FileEntry(DATA_FILE, len(self._offsets) - 1, os.path.getsize(path), file_sha256(path), id=self._fid)
        return [entry], {"offsets": self._offsets}

    def abort(self) -> None:
        """Close the file (the engine removes the folder)."""
        self._file.close()


class ToyDataset(PackedDataset):
    """Map-style reader of ``data.toy``: one ``pread`` per sample, between two offsets."""

    format = "toy"
    _fd: int | None = None

    def _open(self) -> None:
        self._fd = self._open_file(self.data_file)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_fd",)

    def _read(self, index: int, fields: Collection[str] | None = None) -> Record:
        assert self._fd is not None
        start, end = self.manifest.layout["offsets"][index : index + 2]
        path = os.path.join(self.root, self.data_file)
        return unpack_record(os.pread(self._fd, end - start, start), verify=self.verify, path=path, sample=index,
                             seed=place_seed(self.manifest.files[0].id, index))


def identify(directory: str, files: set[str]) -> str | None:
    """"" for a folder holding ``data.toy`` without a manifest (an unfinished conversion), else None."""
    return "" if DATA_FILE in files else None
