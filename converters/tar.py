"""The tar writer: WebDataset-convention shards and their index files (layout: packer.layouts.tar)."""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import numpy as np

from packer.description.manifest import FileEntry
from packer.description.placement import place_seed
from packer.description.samples import sample_fields
from packer.fields import KINDS, named
from packer.fields.boxes import BOXES
from packer.images.codecs import CODEC_IDS, TAR_EXTENSIONS
from packer.images.imageproc import ProcessedImage
from packer.layouts.tar import (
    BLOCK,
    FIELD_ENTRY,
    INDEX_ENTRY,
    INDEX_SUFFIX,
    TAR_SUFFIX,
    end_of_archive,
    field_offsets,
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
_FIELD = struct.Struct("<QQIIIBBBx")  # one FIELD_ENTRY
assert _FIELD.size == FIELD_ENTRY.itemsize


def _member_data(codec: str, payload: bytes, height: int, width: int, channels: int) -> bytes:
    """What a member holds for a payload: the bytes, or for raw pixels the whole ``.npy`` file."""
    return npy_header(height, width, channels) + payload if codec == "raw" else payload


class TarWriter(ShardedWriter):
    """Writes WebDataset tar shards and their index files (layout: packer.layouts.tar)."""

    format = "tar"
    writes_fields = True
    suffix = TAR_SUFFIX

    def __init__(self, directory: str, options: WriterOptions) -> None:
        super().__init__(directory, options)
        self._rows = bytearray()  # the open shard's index entries, packed (INDEX_ENTRY)
        self._keys = bytearray()  # and its keys, one after another
        self._fields: list[str] | None = None  # version 3: the stored fields' names (index v3)
        self._boxes = False  # version 3 with boxes: KEY.json holds them
        self._field_rows = bytearray()  # the open shard's FIELD_ENTRY rows

    def begin(self, info: dict[str, Any]) -> None:
        """Note the samples' fields (a version 3 dataset: field members, boxes in ``.json``, index v3)."""
        declared = info.get("fields") or []
        if declared:
            self._fields = [f["name"] for f in declared if KINDS[f["kind"]].stored]
            self._boxes = any(KINDS[f["kind"]] is BOXES for f in declared)

    def add(self, index: int, key: str, label: int, image: ProcessedImage) -> None:
        """Append one sample's members, starting a new shard first when this one is full."""
        payload = _member_data(image.codec, image.payload, image.height, image.width, image.channels)
        extra = sample_fields(label)
        fields = [(f.name, f.codec, _member_data(f.codec, f.payload, f.height, f.width, f.channels))
                  for f in (image.fields if self._fields is not None else ())]
        if self._boxes:
            extra["boxes"] = image.boxes or ()
            if image.box_labels is not None:
                extra["box_labels"] = list(image.box_labels)
        blob = sample_members(index, key, int(label), image.codec, image.height, image.width, payload, extra, fields)
        size = self.shard.size if self.shard is not None else 0
        start = self.shard_for(index, key, payload, final_size(size + len(blob))).write(blob)
        self._keys += key.encode("utf-8")
        if len(self._keys) > 0xFFFFFFFF:
            raise ValueError("sample keys of one shard exceed 4 GiB; set a smaller shard size")
        seed = place_seed(self.fid, index - self.first)
        self._rows += _ENTRY.pack(
            start + BLOCK, len(payload), int(label), image.height, image.width, crc32c.crc32c(payload, seed),
            len(self._keys), CODEC_IDS[image.codec], image.channels,
        )
        offsets = field_offsets(len(payload), [len(data) for _, _, data in fields])
        for f, (_, _, data), at in zip(image.fields, fields, offsets):
            self._field_rows += _FIELD.pack(start + at, len(data), f.height, f.width, crc32c.crc32c(data, seed),
                                            CODEC_IDS[f.codec], f.channels, f.depth)

    def seal(self, shard: ShardFile) -> None:
        """The end-of-archive blocks, padded to a whole tar record."""
        shard.write(end_of_archive(shard.size))

    def write_indexes(self, stem: str) -> list[FileEntry]:
        """The shard's ``.pkidx`` file (packer tar index v2; v3 with the field section)."""
        fields = None
        if self._fields is not None:
            fields = (self._fields, np.frombuffer(self._field_rows, dtype=FIELD_ENTRY))
        index = pack_index(self.first, np.frombuffer(self._rows, dtype=INDEX_ENTRY), bytes(self._keys), fields=fields)
        self._rows, self._keys, self._field_rows = bytearray(), bytearray(), bytearray()
        return [write_small_file(self.directory, stem + INDEX_SUFFIX, index, self.first)]

    def layout(self) -> dict[str, Any]:
        """Shard and index names, key format, member names, shard limits."""
        members = ["KEY.<codec extension>", "KEY.cls (class labels)", "KEY.json"]
        if self._fields is not None:
            codecs = [named(n).codec for n in self._fields]
            members[1:1] = [f"KEY.{n}.{TAR_EXTENSIONS[c] if c else '<codec extension>'}" for n, c in zip(self._fields, codecs)]
        version = 3 if self._fields is not None else 2
        return {
            "shards": f"{self.prefix}-NNNNNN.tar",
            "index": f"{self.prefix}-NNNNNN.pkidx (packer tar index v{version}, docs/FORMATS.md)",
            "key_format": "%010d",
            "members": members,
            **self.limits.to_json(),
        }
