"""The tar writer: WebDataset-convention shards and their index files (layout: packer.layouts.tar)."""

from __future__ import annotations

from typing import Any

import crc32c
import numpy as np

from packer.codecs import CODEC_IDS
from packer.imageproc import ProcessedImage
from packer.layouts.tar import (
    BLOCK,
    INDEX_ENTRY,
    INDEX_SUFFIX,
    TAR_SUFFIX,
    end_of_archive,
    final_size,
    npy_header,
    pack_index,
    sample_members,
)
from packer.manifest import FileEntry
from packer.placement import file_id, place_seed

from .base import Writer, WriterOptions
from .shards import ShardFile, ShardLimits, keep_shards, shard_name, shard_state, write_small_file

__all__ = ["TarWriter"]


class TarWriter(Writer):
    """Writes WebDataset tar shards and their index files (see the module doc)."""

    format = "tar"
    resumable = True

    def __init__(self, directory: str, options: WriterOptions) -> None:
        super().__init__(directory, options)
        self._limits = ShardLimits.from_options(options)
        self._files: list[FileEntry] = []
        self._shard: ShardFile | None = None
        self._first = 0
        self._rows: list[tuple[Any, ...]] = []
        self._keys: list[bytes] = []
        self._key_end = 0
        self._fid = ""  # the open shard's identity (packer.placement)
        self._due = False

    def add(self, index: int, key: str, label: int, image: ProcessedImage) -> None:
        """Append one sample's members, starting a new shard first when this one is full."""
        if image.codec == "raw":
            payload: bytes = npy_header(image.height, image.width, image.channels) + image.payload
        else:
            payload = image.payload
        blob = sample_members(index, key, label, image.codec, image.height, image.width, payload)
        if self._shard is not None and self._limits.full(len(self._rows), final_size(self._shard.size + len(blob))):
            self._finish_shard()
        if self._shard is None:
            number = len(self._files) // 2
            self._shard = ShardFile(self.directory, shard_name(number, TAR_SUFFIX))
            self._first = index
            self._fid = file_id(number, key, payload)
        start = self._shard.write(blob)
        k = key.encode("utf-8")
        self._keys.append(k)
        self._key_end += len(k)
        if self._key_end > 0xFFFFFFFF:
            raise ValueError("sample keys of one shard exceed 4 GiB; set a smaller shard size")
        self._rows.append((
            start + BLOCK, len(payload), label, image.height, image.width,
            crc32c.crc32c(payload, place_seed(self._fid, index - self._first)),
            self._key_end, CODEC_IDS[image.codec], image.channels, b"",
        ))

    def _finish_shard(self) -> None:
        shard: ShardFile = self._shard  # type: ignore[assignment]  # called with a shard open
        shard.write(end_of_archive(shard.size))
        self._files.append(shard.finish(len(self._rows), self._first, self._fid))
        self._shard = None
        index = pack_index(self._first, np.array(self._rows, dtype=INDEX_ENTRY), b"".join(self._keys))
        name = shard.name[: -len(TAR_SUFFIX)] + INDEX_SUFFIX
        self._files.append(write_small_file(self.directory, name, index, self._first))
        self._rows, self._keys, self._key_end = [], [], 0
        self._due = True

    def checkpoint_due(self) -> bool:
        """True right after a shard and its index were finished."""
        return self._due

    def checkpoint(self) -> dict[str, Any]:
        """The finished shards and index files (already fsynced and renamed); the open shard is
        not part of the checkpoint."""
        self._due = False
        return shard_state(self.directory, self._files)

    def resume(self, state: dict[str, Any]) -> None:
        """Keep the checkpoint's shards (size and SHA-256 checked), delete the rest; the next
        ``add`` starts shard number len(shards)."""
        self._files = keep_shards(self.directory, state)

    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Finish the last shard; return shards and index files (index entries hold 0 samples)."""
        if self._shard is not None:
            self._finish_shard()
        layout = {
            "shards": "shard-NNNNNN.tar",
            "index": "shard-NNNNNN.idx (packer tar index v2, docs/FORMATS.md)",
            "key_format": "%010d",
            "members": ["KEY.<codec extension>", "KEY.cls", "KEY.json"],
            **self._limits.to_json(),
        }
        return self._files, layout

    def abort(self) -> None:
        """Delete the unfinished shard."""
        if self._shard is not None:
            self._shard.discard()
            self._shard = None
