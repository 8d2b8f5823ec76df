"""The TFRecord writer: Example records, ``.idx`` and ``.zidx`` files (layout: packer.layouts.tfrecord)."""

from __future__ import annotations

import struct
import zlib
from array import array
from typing import Any

from packer.description.manifest import FileEntry
from packer.description.placement import place_seed
from packer.fields import KINDS
from packer.images.imageproc import ProcessedImage
from packer.layouts.tfrecord import (
    BOX_FEATURES,
    BOX_LABEL_FEATURE,
    GZIP_HEADER,
    GZIP_LEVEL,
    GZIP_SUFFIX,
    INDEX_SUFFIX,
    PLACE_FEATURE,
    TFRECORD_SUFFIX,
    ZINDEX_SUFFIX,
    field_prefix,
    frame_record,
    image_example,
    pack_zindex,
)

from .base import WriterOptions
from .shards import ShardedWriter, ShardFile, write_small_file

__all__ = ["TFRecordWriter"]

_U32 = struct.Struct("<I")


class TFRecordWriter(ShardedWriter):
    """Writes TFRecord files with ``.idx`` (and ``.zidx`` when gzipped); layout:
    packer.layouts.tfrecord."""

    format = "tfrecord"
    writes_fields = True

    def __init__(self, directory: str, options: WriterOptions) -> None:
        super().__init__(directory, options)
        self._gzip = options.gzip
        self.suffix = GZIP_SUFFIX if self._gzip else TFRECORD_SUFFIX  # type: ignore[misc]
        self._stream = 0  # bytes of (uncompressed) records in the open shard
        self._index = bytearray()  # the open shard's .idx text
        self._zoffsets = array("Q")
        self._zcrc = 0
        self._z: Any = None
        self._field_features: list[str] = []  # version 3: the fields' feature names, for the layout

    def begin(self, info: dict[str, Any]) -> None:
        """Note the samples' fields (version 3), whose features the manifest's layout lists."""
        for f in info.get("fields") or []:
            if not KINDS[f["kind"]].stored:  # the boxes: the Object Detection API's features
                self._field_features += [*BOX_FEATURES, *([BOX_LABEL_FEATURE] if f.get("labels") else [])]
            else:
                self._field_features += [field_prefix(f["name"]) + "encoded", field_prefix(f["name"]) + "format"]

    def add(self, index: int, key: str, label: int, image: ProcessedImage) -> None:
        """Append one record, starting a new file first when this one is full."""
        example = bytearray(image_example(key, label, image, place=0))
        shard = self.shard_for(index, key, image.payload, self._stream + len(example) + 16)
        example[-4:] = _U32.pack(place_seed(self.fid, index - self.first))
        record = frame_record(example)
        self._index += b"%d %d\n" % (self._stream, len(record))
        self._stream += len(record)
        if self._gzip:
            self._zoffsets.append(shard.size)
            self._zcrc = zlib.crc32(record, self._zcrc)
            shard.write(self._z.compress(record) + self._z.flush(zlib.Z_FULL_FLUSH))
        else:
            shard.write(record)

    def opened(self, shard: ShardFile) -> None:
        """A gzipped file starts with the gzip header and a fresh raw-deflate stream."""
        if self._gzip:
            self._z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
            self._zcrc = 0
            shard.write(GZIP_HEADER)

    def seal(self, shard: ShardFile) -> None:
        """A gzipped file ends with the deflate stream's end and the gzip trailer."""
        if self._gzip:
            self._zoffsets.append(shard.size)
            shard.write(self._z.flush(zlib.Z_FINISH) + struct.pack("<II", self._zcrc, self._stream & 0xFFFFFFFF))

    def write_indexes(self, stem: str) -> list[FileEntry]:
        """The ``.idx`` file, and the ``.zidx`` file when gzipped."""
        files = [write_small_file(self.directory, stem + INDEX_SUFFIX, bytes(self._index), self.first)]
        if self._gzip:
            files.append(write_small_file(self.directory, stem + ZINDEX_SUFFIX, pack_zindex(self._zoffsets), self.first))
        self._index, self._zoffsets, self._stream, self._z = bytearray(), array("Q"), 0, None
        return files

    def layout(self) -> dict[str, Any]:
        """File and index names, compression, feature names, shard limits."""
        layout: dict[str, Any] = {
            "files": f"{self.prefix}-NNNNNN" + self.suffix,
            "index": f"{self.prefix}-NNNNNN.idx (text: 'offset length' per record"
                     + (", uncompressed offsets" if self._gzip else "") + ")",
            "gzip": self._gzip,
            "features": ["image/encoded", "image/format", "image/class/label", "image/height",
                         "image/width", "image/channels", "image/filename", *self._field_features,
                         PLACE_FEATURE],
            **self.limits.to_json(),
        }
        if self._gzip:
            layout["gzip_index"] = f"{self.prefix}-NNNNNN.zidx (packer gzip offsets v1, docs/FORMATS.md)"
            layout["gzip_level"] = GZIP_LEVEL
        return layout
