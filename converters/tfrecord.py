"""TFRecord writer: ``tf.train.Example`` records with the conventional image keys, plus ``.idx``.

Files are ``shard-000000.tfrecord`` (``shard-000000.tfrecord.gz`` with ``gzip``), one record per
sample in sample order. Each record is framed as TensorFlow writes it::

    uint64  length of the data (little-endian)
    uint32  masked CRC32C of the 8 length bytes
    bytes   data: a serialised tf.train.Example
    uint32  masked CRC32C of the data
    masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8, modulo 2**32

The Example holds ``image/encoded`` (bytes: the payload; H*W*3 RGB bytes for raw),
``image/format`` (b"jpeg", b"png", b"webp", b"raw", ...), ``image/class/label``,
``image/height``, ``image/width``, ``image/channels`` (int64), ``image/filename`` (bytes: the
source path relative to the source root, UTF-8) and ``packer/place`` (bytes: the sample's place
seed, packer.placement, as uint32 LE; version 2), serialised deterministically with sorted keys
(packer/tfexample.py), so ``packer/place`` is the last 4 bytes of the data. Readers of other
ecosystems ignore it.

Next to each file goes ``shard-000000.idx``, the text index DALI and the ``tfrecord`` package
read: one line ``"<offset> <length>\\n"`` per record, offset of the record's first byte and its
whole framed length (data + 16), decimal.

With ``gzip`` the file is one standard gzip member (header with mtime 0 and OS 255, so output is
reproducible; zlib level 6) that any gzip reader, ``tf.data`` with ``compression_type="GZIP"``
and the ``tfrecord`` package read. Offsets in ``.idx`` then refer to the *uncompressed* stream
(what the ``tfrecord`` package seeks to through ``gzip.open``; DALI does not read compressed
TFRecord at all). For random access the compressor is fully flushed (``Z_FULL_FLUSH``) after
every record, so each record's compressed bytes start on a byte boundary with a fresh dictionary,
and ``shard-000000.zidx`` records where (all little-endian)::

    0        4        magic b"PKGZ"
    4        2        version (1)
    6        2        zero
    8        8        N, records (uint64)
    16       8(N+1)   compressed offsets: record i is the raw deflate data in [c[i], c[i+1])
    16+8(N+1) 4       CRC32C of all preceding bytes (uint32)

so a reader inflates one record (``zlib.decompressobj(-15)``) from one ``pread``. Shard limits
(``shard_bytes``) then bound the uncompressed stream; the compressed file is no larger except
for a few bytes per record on incompressible data.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import crc32c

from packer.errors import CorruptDataError
from packer.imageproc import ProcessedImage
from packer.manifest import FileEntry
from packer.placement import file_id, place_seed
from packer.tfexample import encode_example

from .base import Writer, WriterOptions
from .shards import ShardFile, ShardLimits, keep_shards, shard_name, shard_state, write_small_file

__all__ = [
    "TFRecordWriter",
    "TFRECORD_SUFFIX",
    "GZIP_SUFFIX",
    "INDEX_SUFFIX",
    "ZINDEX_SUFFIX",
    "ZINDEX_MAGIC",
    "masked_crc32c",
    "frame_record",
    "image_example",
    "pack_zindex",
    "unpack_zindex",
]

TFRECORD_SUFFIX = ".tfrecord"
GZIP_SUFFIX = ".tfrecord.gz"
INDEX_SUFFIX = ".idx"
ZINDEX_SUFFIX = ".zidx"
ZINDEX_MAGIC = b"PKGZ"
ZINDEX_VERSION = 1
GZIP_LEVEL = 6

_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_U32 = struct.Struct("<I")
#: gzip member header: magic, deflate, no flags, mtime 0, no extra flags, OS unknown.
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """TFRecord's masked CRC32C of ``data``."""
    crc = crc32c.crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One framed TFRecord: length, its masked CRC, the data, its masked CRC."""
    head = _LENGTH.pack(len(data))
    return b"".join((head, _U32.pack(masked_crc32c(head)), data, _U32.pack(masked_crc32c(data))))


PLACE_FEATURE = "packer/place"


def image_example(key: str, label: int, image: ProcessedImage, place: int | None = None) -> bytes:
    """The serialised Example of one sample (keys as in the module doc); ``place`` (the sample's
    place seed) is the last 4 bytes, so it can be patched once the sample's shard is known."""
    extra = {PLACE_FEATURE: _U32.pack(place)} if place is not None else {}
    return encode_example({
        **extra,
        "image/encoded": image.payload,
        "image/format": image.codec.encode("ascii"),
        "image/class/label": label,
        "image/height": image.height,
        "image/width": image.width,
        "image/channels": image.channels,
        "image/filename": key.encode("utf-8"),
    })


def pack_zindex(offsets: list[int]) -> bytes:
    """Serialise a gzip offset index from the N + 1 compressed offsets."""
    body = struct.pack(f"<4sHHQ{len(offsets)}Q", ZINDEX_MAGIC, ZINDEX_VERSION, 0, len(offsets) - 1, *offsets)
    return body + _U32.pack(crc32c.crc32c(body))


def unpack_zindex(data: bytes, path: str) -> list[int]:
    """Parse and check a gzip offset index; return the N + 1 offsets (CorruptDataError if bad)."""
    if len(data) < 28 or data[:4] != ZINDEX_MAGIC:
        raise CorruptDataError("not a packer gzip index", path=path, offset=0)
    _, version, _, n = struct.unpack_from("<4sHHQ", data)
    if version != ZINDEX_VERSION:
        raise CorruptDataError(f"gzip index version {version} is not supported", path=path, offset=4)
    if len(data) != 16 + 8 * (n + 1) + 4:
        raise CorruptDataError(f"gzip index is {len(data)} bytes for {n} records", path=path, offset=8)
    if crc32c.crc32c(memoryview(data)[:-4]) != _U32.unpack_from(data, len(data) - 4)[0]:
        raise CorruptDataError("gzip index checksum mismatch", path=path, offset=len(data) - 4)
    offsets = list(struct.unpack_from(f"<{n + 1}Q", data, 16))
    if any(b < a for a, b in zip(offsets, offsets[1:])):
        raise CorruptDataError("gzip index offsets are not increasing", path=path, offset=16)
    return offsets


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
            self._shard.write(_GZIP_HEADER)

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
