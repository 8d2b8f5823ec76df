"""Tar shard writer in WebDataset conventions, plus a binary index per shard for random access.

Each sample is three consecutive members named by its key, the 10-digit sample index::

    0000000042.jpg    the image payload (.png, .webp, ...; raw pixels as .npy, no pickle)
    0000000042.cls    the label as ASCII decimal, e.g. b"3"
    0000000042.json   {"key": source relpath, "label": 3, "height": H, "width": W}

so ``webdataset.WebDataset(urls).decode("rgb8").to_tuple("jpg", "cls")`` reads the shards as
they are. Headers are POSIX ustar, written here byte by byte (mode 0644, uid/gid 0, empty owner
names, mtime 0, no pax records), and every shard ends with two zero blocks padded to a 10240-byte
record, as tar(1) writes it: the same samples give the same bytes.

Next to ``shard-000000.tar`` goes ``shard-000000.idx`` (layout below): where each sample's image
data starts, its size, label, stored size, codec and CRC32C, and the sample keys, so the reader
fetches an image with one ``pread`` and never parses tar. All integers little-endian::

    header, 32 bytes
    0    4   magic b"PKTI"
    4    2   version (2; 1 in version 1 datasets)
    6    2   entry size in bytes (48)
    8    8   N, samples in the shard (uint64)
    16   8   global index of the shard's first sample (uint64)
    24   4   K, byte length of the key blob (uint32)
    28   4   CRC32C of header bytes [0, 28), all entries and the key blob (uint32)
    entries, N x 48 bytes
    0    8   offset in the tar of the image member's data (uint64)
    8    8   size of the image member's data (uint64)
    16   8   label (int64)
    24   4   stored height (uint32)
    28   4   stored width (uint32)
    32   4   CRC32C of the image member's data, seeded with the sample's place (version 2,
             packer.placement: the shard's id and the position in the shard; version 1: not seeded)
    36   4   end of this sample's key in the key blob (uint32; it starts where the previous ends)
    40   1   codec id (packer.record.CODEC_IDS: 0 raw, 1 jpeg, 2 png, 3 webp, ...)
    41   1   channels (3)
    42   6   zero
    key blob, K bytes: the UTF-8 source keys, concatenated

For ``raw`` the image member is a complete ``.npy`` file (format 1.0, dtype ``|u1``, shape
(H, W, 3), C order) and the offset, size and CRC cover the whole file, header included.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import crc32c
import numpy as np

from packer.errors import CorruptDataError
from packer.imageproc import CODECS, ProcessedImage
from packer.manifest import FileEntry
from packer.placement import file_id, place_seed
from packer.record import CODEC_IDS

from .base import Writer, WriterOptions
from .shards import ShardFile, ShardLimits, keep_shards, shard_name, shard_state, write_small_file

__all__ = [
    "TarWriter",
    "TAR_SUFFIX",
    "INDEX_SUFFIX",
    "INDEX_MAGIC",
    "INDEX_HEADER",
    "INDEX_ENTRY",
    "tar_header",
    "npy_header",
    "pack_index",
    "unpack_index",
    "sample_key",
    "sample_members",
    "end_of_archive",
]

TAR_SUFFIX = ".tar"
INDEX_SUFFIX = ".idx"
BLOCK = 512
RECORD = 20 * BLOCK  # tar's default blocking factor: archives are padded to a multiple of this

INDEX_MAGIC = b"PKTI"
INDEX_VERSION = 2
INDEX_VERSIONS = (1, 2)  # readable
INDEX_HEADER = struct.Struct("<4sHHQQII")  # 32 bytes; the CRC is the last field
INDEX_ENTRY = np.dtype([
    ("offset", "<u8"), ("size", "<u8"), ("label", "<i8"), ("height", "<u4"), ("width", "<u4"),
    ("crc", "<u4"), ("key_end", "<u4"), ("codec", "u1"), ("channels", "u1"), ("pad", "V6"),
])  # 48 bytes

_ZEROS = bytes(RECORD)


def sample_key(index: int) -> str:
    """The WebDataset key of sample ``index``: ten digits, no dots."""
    return f"{index:010d}"


def _octal(value: int, width: int) -> bytes:
    """A ustar numeric field: ``width - 1`` octal digits and a NUL."""
    digits = b"%0*o" % (width - 1, value)
    if len(digits) != width - 1:
        raise ValueError(f"{value} does not fit a {width}-byte tar field")
    return digits + b"\0"


def tar_header(name: str, size: int) -> bytes:
    """A 512-byte POSIX ustar header for a regular file (deterministic fields; see module doc)."""
    raw = name.encode("utf-8")
    if len(raw) > 100:
        raise ValueError(f"tar member name longer than 100 bytes: {name!r}")
    head = b"".join((
        raw.ljust(100, b"\0"),
        _octal(0o644, 8),          # mode
        _octal(0, 8),              # uid
        _octal(0, 8),              # gid
        _octal(size, 12),          # size (up to 8 GiB - 1)
        _octal(0, 12),             # mtime
        b" " * 8,                  # checksum, counted as spaces
        b"0",                      # typeflag: regular file
        bytes(100),                # linkname
        b"ustar\x0000",            # magic and version
        bytes(32),                 # uname
        bytes(32),                 # gname
        _octal(0, 8),              # devmajor
        _octal(0, 8),              # devminor
        bytes(155),                # prefix
        bytes(12),                 # pad to 512
    ))
    checksum = b"%06o\0 " % sum(head)
    return head[:148] + checksum + head[156:]


def _padding(size: int) -> bytes:
    return _ZEROS[: -size % BLOCK]


def npy_header(height: int, width: int, channels: int = 3) -> bytes:
    """The ``.npy`` (format 1.0) header of a C-order uint8 (H, W, C) array, padded to 64 bytes."""
    text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({height}, {width}, {channels}), }}"
    total = -(-(10 + len(text) + 1) // 64) * 64
    text = text.ljust(total - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin-1")


def pack_index(first: int, entries: np.ndarray, keys: bytes, version: int = INDEX_VERSION) -> bytes:
    """Serialise a shard index (layout in the module doc; ``version`` 1 only to rebuild old ones)."""
    body = entries.astype(INDEX_ENTRY, copy=False).tobytes() + keys
    head = INDEX_HEADER.pack(INDEX_MAGIC, version, INDEX_ENTRY.itemsize, len(entries), first, len(keys), 0)
    crc = crc32c.crc32c(body, crc32c.crc32c(head[:28]))
    return head[:28] + struct.pack("<I", crc) + body


def unpack_index(data: bytes, path: str) -> tuple[int, np.ndarray, bytes]:
    """Parse and check a shard index; return (first sample, entries, key blob).

    Raises CorruptDataError naming ``path`` for a bad magic, version, size or checksum.
    """
    if len(data) < INDEX_HEADER.size:
        raise CorruptDataError(f"tar index of {len(data)} bytes is shorter than its header", path=path)
    magic, version, entry_size, n, first, klen, crc = INDEX_HEADER.unpack_from(data)
    if magic != INDEX_MAGIC:
        raise CorruptDataError(f"not a packer tar index (magic {magic!r})", path=path, offset=0)
    if version not in INDEX_VERSIONS or entry_size != INDEX_ENTRY.itemsize:
        raise CorruptDataError(
            f"tar index version {version} with {entry_size}-byte entries is not supported (this packer "
            f"reads version {INDEX_VERSION}); upgrade packer or re-convert", path=path, offset=4,
        )
    if len(data) != INDEX_HEADER.size + n * INDEX_ENTRY.itemsize + klen:
        raise CorruptDataError(
            f"tar index is {len(data)} bytes, its header promises {n} entries and {klen} key bytes",
            path=path, offset=8,
        )
    actual = crc32c.crc32c(memoryview(data)[32:], crc32c.crc32c(memoryview(data)[:28]))
    if actual != crc:
        raise CorruptDataError(f"tar index checksum mismatch (stored {crc:08x}, computed {actual:08x})",
                               path=path, offset=28)
    entries = np.frombuffer(data, INDEX_ENTRY, count=n, offset=INDEX_HEADER.size)
    keys = data[INDEX_HEADER.size + n * INDEX_ENTRY.itemsize :]
    if n and (int(entries["key_end"][-1]) != klen or np.any(np.diff(entries["key_end"].astype(np.int64)) < 0)):
        raise CorruptDataError("tar index key offsets are inconsistent", path=path, offset=INDEX_HEADER.size)
    return first, entries, keys


def _final_size(size: int) -> int:
    """Size of a tar whose members end at ``size``, after the end-of-archive blocks and padding."""
    return -(-(size + 2 * BLOCK) // RECORD) * RECORD


def end_of_archive(size: int) -> bytes:
    """The zero blocks that end a tar whose members end at ``size`` (two blocks, then padding to
    a 10240-byte record)."""
    return _ZEROS[: _final_size(size) - size]


def sample_members(index: int, key: str, label: int, codec: str, height: int, width: int, payload: bytes) -> bytes:
    """The three tar members of one sample, padded: ``KEY.<ext>`` holding ``payload`` (for raw,
    the whole ``.npy`` file), ``KEY.cls`` and ``KEY.json``. The image data starts at byte 512.
    ``packer verify`` rebuilds these bytes from the index to say which sample a bad byte is in."""
    stem = sample_key(index)
    cls = b"%d" % label
    meta = json.dumps(
        {"key": key, "label": label, "height": height, "width": width},
        ensure_ascii=False, separators=(",", ":"),
    ).encode("utf-8")
    return b"".join((
        tar_header(f"{stem}.{CODECS[codec]}", len(payload)), payload, _padding(len(payload)),
        tar_header(f"{stem}.cls", len(cls)), cls, _padding(len(cls)),
        tar_header(f"{stem}.json", len(meta)), meta, _padding(len(meta)),
    ))


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
        if self._shard is not None and self._limits.full(len(self._rows), _final_size(self._shard.size + len(blob))):
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
