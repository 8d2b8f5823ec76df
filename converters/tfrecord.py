"""The TFRecord writer: Example records, ``.idx`` and ``.zidx`` files (layout: packer.layouts.tfrecord)."""

from __future__ import annotations

import struct
import zlib
from typing import Any

from packer.imageproc import ProcessedImage
from packer.layouts.tfrecord import (
    GZIP_HEADER,
    GZIP_LEVEL,
    GZIP_SUFFIX,
    INDEX_SUFFIX,
    PLACE_FEATURE,
    TFRECORD_SUFFIX,
    ZINDEX_SUFFIX,
    frame_record,
    image_example,
    pack_zindex,
)
from packer.manifest import FileEntry
from packer.placement import file_id, place_seed

from .base import Writer, WriterOptions
from .shards import ShardFile, ShardLimits, keep_shards, shard_name, shard_state, write_small_file

__all__ = ["TFRecordWriter"]

_U32 = struct.Struct("<I")


class TFRecordWriter(Writer):
    """Writes TFRecord files with ``.idx`` (and ``.zidx`` when gzipped); see the module doc."""

    format = "tfrecord"
    resumable = True

    def __init__(self, directory: str, options: WriterOptions) -> None:
        super().__init__(directory, options)
        self._limits = ShardLimits.from_options(options)
        self._gzip = options.gzip
        self._files: list[FileEntry] = []
        self._shard: ShardFile | None = None
        self._first = 0
        self._number = 0  # of the open shard
        self._count = 0
        self._stream = 0  # bytes of (uncompressed) records in the open shard
        self._index: list[bytes] = []
        self._zoffsets: list[int] = []
        self._zcrc = 0
        self._z: Any = None
        self._fid = ""  # the open file's identity (packer.placement)
        self._due = False

    def add(self, index: int, key: str, label: int, image: ProcessedImage) -> None:
        """Append one record, starting a new file first when this one is full."""
        example = bytearray(image_example(key, label, image, place=0))
        if self._shard is not None and self._limits.full(self._count, self._stream + len(example) + 16):
            self._finish_shard()
        if self._shard is None:
            self._open_shard(index)
            self._fid = file_id(self._number, key, image.payload)
        example[-4:] = _U32.pack(place_seed(self._fid, index - self._first))
        record = frame_record(example)
        shard: ShardFile = self._shard  # type: ignore[assignment]
        self._index.append(b"%d %d\n" % (self._stream, len(record)))
        self._stream += len(record)
        self._count += 1
        if self._gzip:
            self._zoffsets.append(shard.size)
            self._zcrc = zlib.crc32(record, self._zcrc)
            shard.write(self._z.compress(record) + self._z.flush(zlib.Z_FULL_FLUSH))
        else:
            shard.write(record)

    def _open_shard(self, first: int) -> None:
        self._shard = ShardFile(self.directory, shard_name(self._number, GZIP_SUFFIX if self._gzip else TFRECORD_SUFFIX))
        self._first = first
        if self._gzip:
            self._z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
            self._zcrc = 0
            self._shard.write(GZIP_HEADER)

    def _finish_shard(self) -> None:
        shard: ShardFile = self._shard  # type: ignore[assignment]
        if self._gzip:
            self._zoffsets.append(shard.size)
            shard.write(self._z.flush(zlib.Z_FINISH) + struct.pack("<II", self._zcrc, self._stream & 0xFFFFFFFF))
        self._files.append(shard.finish(self._count, self._first, self._fid))
        self._shard = None
        stem = shard_name(self._number, "")
        self._number += 1
        self._files.append(write_small_file(self.directory, stem + INDEX_SUFFIX, b"".join(self._index), self._first))
        if self._gzip:
            self._files.append(write_small_file(self.directory, stem + ZINDEX_SUFFIX,
                                                pack_zindex(self._zoffsets), self._first))
        self._index, self._zoffsets, self._count, self._stream, self._z = [], [], 0, 0, None
        self._due = True

    def checkpoint_due(self) -> bool:
        """True right after a file and its index files were finished."""
        return self._due

    def checkpoint(self) -> dict[str, Any]:
        """The finished files (already fsynced and renamed); the open file is not part of it."""
        self._due = False
        return shard_state(self.directory, self._files)

    def resume(self, state: dict[str, Any]) -> None:
        """Keep the checkpoint's files (size and SHA-256 checked), delete the rest; the next
        ``add`` starts the next file number."""
        self._files = keep_shards(self.directory, state)
        suffix = GZIP_SUFFIX if self._gzip else TFRECORD_SUFFIX
        self._number = sum(1 for f in self._files if f.name.endswith(suffix))

    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Finish the last file; return data files and index files (index entries hold 0 samples)."""
        if self._shard is not None:
            self._finish_shard()
        layout: dict[str, Any] = {
            "files": "shard-NNNNNN" + (GZIP_SUFFIX if self._gzip else TFRECORD_SUFFIX),
            "index": "shard-NNNNNN.idx (text: 'offset length' per record"
                     + (", uncompressed offsets" if self._gzip else "") + ")",
            "gzip": self._gzip,
            "features": ["image/encoded", "image/format", "image/class/label", "image/height",
                         "image/width", "image/channels", "image/filename", PLACE_FEATURE],
            **self._limits.to_json(),
        }
        if self._gzip:
            layout["gzip_index"] = "shard-NNNNNN.zidx (packer gzip offsets v1, docs/FORMATS.md)"
            layout["gzip_level"] = GZIP_LEVEL
        return self._files, layout

    def abort(self) -> None:
        """Delete the unfinished file."""
        if self._shard is not None:
            self._shard.discard()
            self._shard = None
