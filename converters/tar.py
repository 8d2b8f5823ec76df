"""The tar writer: WebDataset-convention shards and their index files (layout: packer.layouts.tar)."""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import numpy as np

from packer.description.manifest import FileEntry
from packer.description.placement import place_seed
from packer.description.samples import sample_fields
from packer.images.codecs import CODEC_IDS
from packer.images.imageproc import ProcessedImage
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

from .base import WriterOptions
from .shards import ShardedWriter, ShardFile, write_small_file

__all__ = ["TarWriter"]

_ENTRY = struct.Struct("<QQqIIIIBB6x")  # one INDEX_ENTRY, packed as the writer goes
assert _ENTRY.size == INDEX_ENTRY.itemsize


class TarWriter(ShardedWriter):
    """Writes WebDataset tar shards and their index files (layout: packer.layouts.tar)."""

    format = "tar"
    suffix = TAR_SUFFIX

    def __init__(self, directory: str, options: WriterOptions) -> None:
        super().__init__(directory, options)
        self._rows = bytearray()  # the open shard's index entries, packed (INDEX_ENTRY)
        self._keys = bytearray()  # and its keys, one after another

    def add(self, index: int, key: str, label: int, image: ProcessedImage) -> None:
        """Append one sample's members, starting a new shard first when this one is full."""
        if image.codec == "raw":
            payload: bytes = npy_header(image.height, image.width, image.channels) + image.payload
        else:
            payload = image.payload
        blob = sample_members(index, key, int(label), image.codec, image.height, image.width, payload,
                              sample_fields(label))
        size = self.shard.size if self.shard is not None else 0
        start = self.shard_for(index, key, payload, final_size(size + len(blob))).write(blob)
        self._keys += key.encode("utf-8")
        if len(self._keys) > 0xFFFFFFFF:
            raise ValueError("sample keys of one shard exceed 4 GiB; set a smaller shard size")
        self._rows += _ENTRY.pack(
            start + BLOCK, len(payload), int(label), image.height, image.width,
            crc32c.crc32c(payload, place_seed(self.fid, index - self.first)),
            len(self._keys), CODEC_IDS[image.codec], image.channels,
        )

    def seal(self, shard: ShardFile) -> None:
        """The end-of-archive blocks, padded to a whole tar record."""
        shard.write(end_of_archive(shard.size))

    def write_indexes(self, stem: str) -> list[FileEntry]:
        """The shard's ``.pkidx`` file (packer tar index v2)."""
        index = pack_index(self.first, np.frombuffer(self._rows, dtype=INDEX_ENTRY), bytes(self._keys))
        self._rows, self._keys = bytearray(), bytearray()
        return [write_small_file(self.directory, stem + INDEX_SUFFIX, index, self.first)]

    def layout(self) -> dict[str, Any]:
        """Shard and index names, key format, member names, shard limits."""
        return {
            "shards": f"{self.prefix}-NNNNNN.tar",
            "index": f"{self.prefix}-NNNNNN.pkidx (packer tar index v2, docs/FORMATS.md)",
            "key_format": "%010d",
            "members": ["KEY.<codec extension>", "KEY.cls (class labels)", "KEY.json"],
            **self.limits.to_json(),
        }
