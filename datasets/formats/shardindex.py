"""The per-shard indexes of a large local tar or TFRecord dataset, read where they lie instead of
loaded: nothing of them is read at open, and a process holds O(shards) of its own.

A reader built over ``N`` samples in ``S`` shards keeps the shards' first samples (``S`` int64) and,
per process, a bitmap of the index files it has checked and a few open descriptors. A read finds
its shard by bisection, checks that shard's index file once in the process (its header against
the manifest, its CRC32C, its offsets inside the shard: the same checks a full load makes) and
then reads only its sample's entry (tar: the 48-byte entry and its key with two ``pread``\\ s;
TFRecord: the parsed offsets of the shard, kept for the last :data:`PARSED_SHARDS` shards). The
index files' pages are the page cache's, one copy per node for every rank and worker; a process
maps nothing it does not read, and keys and metadata are never loaded for training.

Used for datasets of at least :data:`LAZY_INDEX_SAMPLES` samples on local disk; smaller ones,
remote ones and other tools' data load their index whole at construction as before (one pread
fewer per read, and below that size the whole index is a few tens of MB).
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from packer.errors import CorruptDataError
from packer.layouts.tar import FIELDS_INDEX_VERSION, INDEX_ENTRY, INDEX_HEADER, read_index

__all__ = ["LAZY_INDEX_SAMPLES", "PARSED_SHARDS", "OPEN_INDEXES", "LazyTarIndex", "LazyPairs", "TarEntry"]

#: Datasets with at least this many samples read their shard indexes lazily.
LAZY_INDEX_SAMPLES = 1_000_000
#: Index files a process keeps open at once (least recently used closed first).
OPEN_INDEXES = 64
#: TFRecord: shards whose parsed offsets a process keeps (least recently used dropped first).
PARSED_SHARDS = 256

_ENTRY = INDEX_ENTRY.itemsize
_HEAD = INDEX_HEADER.size
#: INDEX_ENTRY as a struct: offset, size, label, height, width, crc, key_end, codec, channels.
_UNPACK = struct.Struct("<QQqIIIIBB6x").unpack_from
assert struct.calcsize("<QQqIIIIBB6x") == _ENTRY

#: One tar sample's entry: shard, image offset, size, label, height, width, crc, codec, key.
TarEntry = tuple[int, int, int, int, int, int, int, int, str]


class _Shards:
    """Shard lookup and the per-process state (dropped in a forked or unpickled copy)."""

    def __init__(self, names: Sequence[str], firsts: Sequence[int], sizes: Sequence[int], root: str) -> None:
        self.names, self.root = list(names), root
        self.firsts = array("q", firsts)  # bisected per read: faster than numpy for one value
        self.sizes = array("q", sizes)
        self._pid = -1

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")} | {"_pid": -1}

    def _reset(self) -> None:
        for held in getattr(self, "_open", {}).values():  # this process's copies, inherited through fork
            if held[0] >= 0:
                os.close(held[0])
        self._pid = os.getpid()
        self._checked = np.zeros(len(self.names), bool)
        self._open: OrderedDict[int, tuple[int, ...]] = OrderedDict()

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, position in it) of sample ``index``."""
        s = bisect_right(self.firsts, index) - 1
        return s, index - self.firsts[s]

    def path(self, s: int) -> str:
        """Shard ``s``'s index file, as errors name it."""
        return os.path.join(self.root, self.names[s])

    def close(self) -> None:
        """Close this process's index descriptors."""
        if self._pid == os.getpid():
            for held in self._open.values():
                if held[0] >= 0:
                    os.close(held[0])
            self._open.clear()
        self._pid = -1


class LazyTarIndex(_Shards):
    """The ``.pkidx`` files of a tar dataset (versions 1 and 2), read entry by entry."""

    def __init__(self, names: Sequence[str], firsts: Sequence[int], sizes: Sequence[int],
                 shard_bytes: Sequence[int], root: str) -> None:
        super().__init__(names, firsts, sizes, root)
        self.shard_bytes = list(shard_bytes)

    def _handle(self, s: int, open_file: Callable[[str], int]) -> tuple[int, ...]:
        if self._pid != os.getpid():
            self._reset()
        held = self._open.get(s)
        if held is not None:
            self._open.move_to_end(s)
            return held
        fd = open_file(self.names[s])
        try:
            head = os.pread(fd, _HEAD, 0)
            if len(head) < _HEAD:
                raise CorruptDataError(f"tar index of {len(head)} bytes is shorter than its header", path=self.path(s))
            _magic, version, _size, n, first, klen, _crc = INDEX_HEADER.unpack(head)
            if not self._checked[s]:
                self._check(s, fd)
                self._checked[s] = True
            if version >= FIELDS_INDEX_VERSION:
                raise CorruptDataError("tar index with a field section in a dataset without fields", path=self.path(s))
        except BaseException:
            os.close(fd)
            raise
        held = (fd, int(n), int(klen))
        self._open[s] = held
        if len(self._open) > OPEN_INDEXES:
            old, (old_fd, *_) = self._open.popitem(last=False)
            os.close(old_fd)
        return held

    def _check(self, s: int, fd: int) -> None:
        """The checks a full load makes of one index file (read whole once per process)."""
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0)
        path = self.path(s)
        first, e, _keys, names, _rows = read_index(data, path)
        if names:
            raise CorruptDataError(f"tar index lists the fields {names} in a dataset without fields", path=path)
        if first != self.firsts[s] or len(e) != self.sizes[s]:
            raise CorruptDataError(f"tar index holds samples {first}..{first + len(e) - 1}, the manifest says "
                                   f"{self.firsts[s]}..{self.firsts[s] + self.sizes[s] - 1}", path=path)
        if len(e) and int(np.max(e["offset"] + e["size"])) > self.shard_bytes[s]:
            raise CorruptDataError("tar index points past the end of its shard", path=path)

    def entry(self, index: int, open_file: Callable[[str], int]) -> TarEntry:
        """Sample ``index``'s entry, its shard's index file checked first (once per process)."""
        s, j = self.locate(index)
        fd, n, klen = self._handle(s, open_file)
        lo = j - 1 if j else 0
        raw = os.pread(fd, _ENTRY * (j - lo + 1), _HEAD + _ENTRY * lo)
        if len(raw) != _ENTRY * (j - lo + 1):
            raise CorruptDataError("tar index is shorter than it was when checked", path=self.path(s))
        offset, size, label, height, width, crc, end, codec, _channels = _UNPACK(raw, len(raw) - _ENTRY)
        start = _UNPACK(raw, 0)[6] if j else 0
        if not 0 <= start <= end <= klen:
            raise CorruptDataError("tar index key offsets are inconsistent", path=self.path(s),
                                   offset=_HEAD + _ENTRY * j)
        key = os.pread(fd, end - start, _HEAD + _ENTRY * n + start) if end > start else b""
        return s, offset, size, label, height, width, crc, codec, key.decode("utf-8", "replace")


class LazyPairs(_Shards):
    """Per-shard parsed arrays (TFRecord's offsets and lengths, and gzip segments), parsed by
    ``parse(shard, open_file)`` on first use and kept for the last :data:`PARSED_SHARDS` shards."""

    def __init__(self, names: Sequence[str], firsts: Sequence[int], sizes: Sequence[int], root: str,
                 parse: Callable[[int, Callable[[str], int]], tuple[np.ndarray, ...]]) -> None:
        super().__init__(names, firsts, sizes, root)
        self.parse = parse

    def get(self, index: int, open_file: Callable[[str], int]) -> tuple[int, int, tuple[np.ndarray, ...]]:
        """(shard, position in it, that shard's parsed arrays) of sample ``index``."""
        if self._pid != os.getpid():
            self._reset()
        s, j = self.locate(index)
        held = self._open.get(s)
        if held is None:
            held = (-1, *self.parse(s, open_file))
            self._open[s] = held
            if len(self._open) > PARSED_SHARDS:
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(s)
        return s, j, held[1:]
