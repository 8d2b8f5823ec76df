"""The LMDB layout: one environment, key ``%010d`` per sample in sample order, value = packer record
(:mod:`packer.description.record`), and a read-only parser of the LMDB data file.

The one home of the format's on-disk knowledge: the writer (packer.converters.lmdb), the reader
(packer.datasets.formats.lmdb), ``verify`` and the tests import it. The writer uses LMDB itself
(py-lmdb); the reader uses :class:`LMDBFile`. docs/FORMATS.md ("LMDB") gives the layout.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict

import numpy as np

from packer.description.record import MAGICS
from packer.errors import CorruptDataError
from packer.files.fileio import open_regular, pread_buffer
from packer.images.placeholder import file_placeholder_reason

__all__ = ["DATA_FILE", "BRANCH_PAGES", "lmdb_key", "LMDBFile", "identify"]

DATA_FILE = "data.mdb"
#: Parsed branch pages a reader keeps (least recently used dropped first): about 3.5 kB each, so
#: at most ~7 MB per process whatever the dataset's size (10M samples have ~9,900 branch pages).
BRANCH_PAGES = 2048


def lmdb_key(index: int) -> bytes:
    """The LMDB key of sample ``index``: ten ASCII digits, so byte order is sample order."""
    return b"%010d" % index


_MDB_MAGIC = 0xBEEFC0DE
_MDB_VERSION = 1
_PAGE = struct.Struct("<QHHHH")  # page number, pad, flags, lower, upper (pages: lower | upper << 16)
_META = struct.Struct("<II8xQ")  # magic, version, (address), map size
_DB = struct.Struct("<IHHQQQQQ")  # pad (psize in the free DB), flags, depth, branch, leaf, overflow, entries, root
_META_TAIL = struct.Struct("<QQ")  # last page, txnid
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META = 0x01, 0x02, 0x04, 0x08
_F_BIGDATA = 0x01
_P_INVALID = 0xFFFFFFFFFFFFFFFF
_KLEN = struct.Struct("<H")  # key length, at byte 6 of a packer record
_PLEN = struct.Struct("<I")  # payload length, at byte 24


class LMDBFile:
    """A packed LMDB data file opened for reading, parsed directly with ``os.pread``.

    The LMDB 0.9 on-disk format is small and stable (two meta pages, branch and leaf pages of
    sorted nodes, overflow pages for large values), and packer's environments use only its
    simplest part (one unnamed database, no duplicates, one 10-digit key per sample).

    Why not py-lmdb for reading: it trusts the file. py-lmdb touches every page of a value before
    returning it, so one damaged byte in a B-tree node's size field makes it read past the file
    and kill the process with SIGSEGV or SIGBUS. Here every number is checked before it is used:
    meta page magic and version, the page count against the file size, each page's own number and
    type, node offsets against the page, the node's key against the sample's key, value sizes
    against the pages they claim and the record header; any failure is a CorruptDataError naming
    the file, the sample (when the damage is in its path) and the byte offset.
    """

    def __init__(self, path: str, num_samples: int, fd: int | None = None) -> None:
        self.path = path
        self.fd = fd if fd is not None else open_regular(path)
        try:
            self._load(num_samples)
        except BaseException:
            os.close(self.fd)
            raise
        self._leaf_no = -1
        self._leaf = b""
        self._leaf_range = (0, 0)
        self._ptrs: tuple[int, ...] = ()
        self._upper = 0

    def close(self) -> None:
        """Close the file descriptor."""
        os.close(self.fd)

    def _bad(self, what: str, sample: int | None = None, offset: int | None = None) -> CorruptDataError:
        return CorruptDataError(what, path=self.path, sample=sample, offset=offset)

    def _pread(self, n: int, offset: int, sample: int | None = None, fresh: bool = False) -> bytes | memoryview:
        """``n`` bytes at ``offset``: ``bytes``, or with ``fresh`` a new writable buffer (values:
        slicing the record out of it and handing raw pixels on cost no copy)."""
        if offset < 0 or n < 0 or offset + n > self.size:
            raise self._bad(f"LMDB structure points to bytes {offset}..{offset + n}, past the end of the "
                            f"file ({self.size} bytes; truncated?)", sample, offset)
        try:
            data = pread_buffer(self.fd, n, offset) if fresh else os.pread(self.fd, n, offset)
        except OSError as e:
            raise self._bad(f"cannot read ({e})", sample, offset) from None
        if len(data) != n:
            raise self._bad(f"short read: {len(data)} of {n} bytes (file truncated?)", sample, offset)
        return data

    def _load(self, num_samples: int) -> None:
        self.size = os.fstat(self.fd).st_size
        head = os.pread(self.fd, 512, 0)
        if len(head) < _PAGE.size + 136:
            why = file_placeholder_reason(self.path)
            raise self._bad(f"{self.path} is {why}" if why else f"not an LMDB file ({self.size} bytes)", offset=0)
        psize = _DB.unpack_from(head, _PAGE.size + _META.size)[0]
        if psize < 512 or psize > 65536 or psize & (psize - 1):
            why = file_placeholder_reason(self.path)
            raise self._bad(f"{self.path} is {why}" if why else f"not an LMDB file (page size {psize})", offset=16)
        self.psize = psize
        metas = [self._meta(pg) for pg in (0, 1)]
        meta = max(metas, key=lambda m: m[3])  # LMDB uses the meta page with the larger txnid
        main, last_pg = meta[1], meta[2]
        _, flags, depth, _, _, _, entries, root = main
        if (last_pg + 1) * psize > self.size:
            raise self._bad(f"LMDB file truncated: {self.size} bytes, its meta page claims {last_pg + 1} pages "
                            f"of {psize} bytes", offset=self.size)
        self.pages = last_pg + 1
        if flags != 0:
            raise self._bad(f"the LMDB database has flags {flags:#x}; a packer dataset uses none", offset=psize)
        if entries != num_samples:
            raise self._bad(f"the LMDB database holds {entries} entries, the manifest {num_samples} samples")
        if entries and (root == _P_INVALID or depth < 1 or depth > 16):
            raise self._bad(f"LMDB root page {root} at depth {depth} is not valid")
        self.root, self.depth, self.entries = root, depth, entries
        # Branch pages met lately: page -> (first sample of each child but the first, children),
        # the least recently used dropped past BRANCH_PAGES. Opening reads no page of the tree; a
        # read descends from the root (log pages, the upper ones always recent), so the cost of
        # opening and the index a process holds do not grow with the dataset: the pages
        # themselves are the page cache's, one copy for every process of the node.
        self._branches: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def _meta(self, pg: int) -> tuple[int, tuple[int, ...], int, int]:
        off = pg * self.psize
        page = self._pread(_PAGE.size + 136, off)
        pgno, _, flags, _, _ = _PAGE.unpack_from(page)
        magic, version, _ = _META.unpack_from(page, _PAGE.size)
        if not flags & _P_META or magic != _MDB_MAGIC or version != _MDB_VERSION:
            raise self._bad(f"LMDB meta page {pg} is damaged (flags {flags:#x}, magic {magic:#x}, version {version})",
                            offset=off)
        main = _DB.unpack_from(page, _PAGE.size + _META.size + _DB.size)
        last_pg, txnid = _META_TAIL.unpack_from(page, _PAGE.size + _META.size + 2 * _DB.size)
        return pgno, main, last_pg, txnid

    def _page(self, pgno: int, sample: int | None = None) -> bytes:
        if pgno < 2 or pgno >= self.pages:
            raise self._bad(f"LMDB page number {pgno} out of range (2..{self.pages - 1})", sample)
        page = self._pread(self.psize, pgno * self.psize, sample)
        own, _, flags, lower, upper = _PAGE.unpack_from(page)
        if own != pgno or not flags & (_P_BRANCH | _P_LEAF):
            raise self._bad(f"LMDB page {pgno} is damaged (says it is page {own}, flags {flags:#x})", sample,
                            pgno * self.psize)
        if not _PAGE.size <= lower <= upper <= self.psize or lower % 2:
            raise self._bad(f"LMDB page {pgno} has bad bounds ({lower}, {upper})", sample, pgno * self.psize + 12)
        return page

    def _node(self, page: bytes, pgno: int, k: int, sample: int | None = None) -> tuple[int, int, int, bytes, int]:
        """(lo | hi << 16, hi, flags, key, data offset) of node ``k`` of a page."""
        (ptr,) = struct.unpack_from("<H", page, _PAGE.size + 2 * k)
        lower, upper = struct.unpack_from("<HH", page, 12)
        if not upper <= ptr <= self.psize - _NODE.size:
            raise self._bad(f"LMDB node {k} of page {pgno} points outside the page", sample, pgno * self.psize)
        lo, hi, flags, ksize = _NODE.unpack_from(page, ptr)
        start = ptr + _NODE.size
        if start + ksize > self.psize:
            raise self._bad(f"LMDB node {k} of page {pgno} runs past the page", sample, pgno * self.psize + ptr)
        return lo | hi << 16, hi, flags, page[start : start + ksize], start + ksize

    def _branch(self, pgno: int, sample: int) -> tuple[np.ndarray, np.ndarray]:
        """A branch page's child boundaries and children, parsed and checked once."""
        cached = self._branches.get(pgno)
        if cached is not None:
            self._branches.move_to_end(pgno)
            return cached
        page = self._page(pgno, sample)
        _, _, flags, lower, upper = _PAGE.unpack_from(page)
        n = (lower - _PAGE.size) // 2
        if not flags & _P_BRANCH:
            raise self._bad(f"LMDB page {pgno} should be a branch page (flags {flags:#x})", sample, pgno * self.psize)
        if n < 1:
            raise self._bad(f"LMDB page {pgno} is empty", sample, pgno * self.psize)
        raw = np.frombuffer(page, np.uint8)
        ptrs = np.frombuffer(page, "<u2", count=n, offset=_PAGE.size).astype(np.int64)
        room = np.full(n, self.psize - _NODE.size - 10)  # a key of ten digits after each header
        room[0] += 10  # but the first, whose key is empty
        bad = np.flatnonzero((ptrs < upper) | (ptrs > room))
        if len(bad):
            raise self._bad(f"LMDB node {int(bad[0])} of page {pgno} points outside the page", sample, pgno * self.psize)
        head = raw[ptrs[:, None] + np.arange(_NODE.size)].astype(np.int64)  # lo, hi, flags, key size (LE u16)
        words = head[:, 0::2] | head[:, 1::2] << 8
        children = words[:, 0] | words[:, 1] << 16 | words[:, 2] << 32
        keys = raw[ptrs[1:, None] + _NODE.size + np.arange(10)]
        bad = np.flatnonzero((words[1:, 3] != 10) | np.any((keys < 48) | (keys > 57), axis=1))
        if len(bad):
            k = int(bad[0]) + 1
            key = bytes(raw[ptrs[k] + _NODE.size : ptrs[k] + _NODE.size + min(int(words[k, 3]), 16)])
            raise self._bad(f"LMDB branch page {pgno} holds a damaged key {key!r}", sample, pgno * self.psize)
        firsts = (keys.astype(np.int64) - 48) @ (10 ** np.arange(9, -1, -1, dtype=np.int64))
        if n > 2 and not bool(np.all(firsts[1:] > firsts[:-1])):
            raise self._bad(f"LMDB branch page {pgno} is out of order", sample, pgno * self.psize)
        self._branches[pgno] = (firsts, children)
        if len(self._branches) > BRANCH_PAGES:
            self._branches.popitem(last=False)
        return firsts, children

    def _find_leaf(self, index: int) -> None:
        """Descend from the root to the leaf that holds sample ``index`` and load it."""
        pgno, lo, hi = self.root, 0, self.entries
        for _ in range(self.depth - 1):
            firsts, children = self._branch(pgno, index)
            k = int(np.searchsorted(firsts, index, side="right"))
            start = int(firsts[k - 1]) if k else lo
            end = int(firsts[k]) if k < len(firsts) else hi
            if not lo <= start <= index < end <= hi:
                raise self._bad(f"LMDB branch page {pgno} sends sample {index} to samples {start}..{end - 1}, "
                                f"outside its own {lo}..{hi - 1} (damaged B-tree)", index, pgno * self.psize)
            pgno, lo, hi = int(children[k]), start, end
        self._load_leaf(pgno, lo, hi, index)

    def _load_leaf(self, pgno: int, lo: int, hi: int, index: int) -> None:
        """Read and check the leaf of samples ``lo`` .. ``hi - 1`` once; reads stay on it while they can."""
        page = self._page(pgno, index)
        flags, lower, upper = _PAGE.unpack_from(page)[2:]
        n = (lower - _PAGE.size) // 2
        if not flags & _P_LEAF or n != hi - lo:
            raise self._bad(f"LMDB leaf page {pgno} holds {n} keys, the B-tree above it {hi - lo}",
                            index, pgno * self.psize)
        self._leaf, self._leaf_no = page, pgno
        self._leaf_range = (lo, hi)
        self._ptrs = struct.unpack_from(f"<{n}H", page, _PAGE.size)
        self._upper = upper

    def read(self, index: int) -> bytes | memoryview:
        """The value (a packer record) of sample ``index``, every LMDB structure on its way checked."""
        lo, hi = self._leaf_range
        if not lo <= index < hi:
            if not 0 <= index < self.entries:
                raise self._bad("sample index not in the LMDB B-tree", index)
            self._find_leaf(index)
            lo, hi = self._leaf_range
        page, psize = self._leaf, self.psize
        base = self._leaf_no * psize
        ptr = self._ptrs[index - lo]
        if not self._upper <= ptr <= psize - _NODE.size - 10:
            raise self._bad(f"LMDB node {index - lo} of the leaf at {base} points outside its page", index, base)
        size_lo, size_hi, nflags, ksize = _NODE.unpack_from(page, ptr)
        size = size_lo | size_hi << 16
        data = ptr + _NODE.size + ksize
        key = lmdb_key(index)
        if ksize != 10 or page[ptr + _NODE.size : data] != key:
            raise self._bad(f"LMDB leaf holds key {page[ptr + _NODE.size : ptr + _NODE.size + min(ksize, 16)]!r} "
                            f"where {key!r} belongs (damaged B-tree)", index, base + ptr)
        if nflags == _F_BIGDATA:
            if data + 8 > psize:
                raise self._bad("LMDB node runs past its page", index, base + ptr)
            (opg,) = struct.unpack_from("<Q", page, data)
            if opg < 2 or opg * psize + _PAGE.size + size > self.pages * psize:
                raise self._bad(f"LMDB value at page {opg}, {size} bytes, lies outside the file's pages", index,
                                base + ptr)
            raw = self._pread(_PAGE.size + size, opg * psize, index, fresh=True)
            own, _, oflags, _, _ = _PAGE.unpack_from(raw)
            if own != opg or not oflags & _P_OVERFLOW:
                raise self._bad(f"LMDB value page {opg} is damaged (says it is page {own}, flags {oflags:#x})",
                                index, opg * psize)
            value, where = raw[_PAGE.size :], opg * psize + _PAGE.size
        elif nflags == 0 and data + size <= psize:
            value, where = page[data : data + size], base + data
        else:
            raise self._bad(f"LMDB node is damaged (flags {nflags:#x}, size {size})", index, base + ptr)
        if len(value) < 32 or value[:4] not in MAGICS:
            raise self._bad(f"LMDB value is not a packer record (magic {value[:4]!r})", index, where)
        klen, plen = _KLEN.unpack_from(value, 6)[0], _PLEN.unpack_from(value, 24)[0]
        if 32 + klen + plen != len(value) and not (value[:4] == b"PKS3" and 32 + klen + plen < len(value)):
            raise self._bad(f"record header says {32 + klen + plen} bytes, the LMDB node {len(value)}", index, where)
        return value


def identify(directory: str, files: set[str]) -> str | None:
    """For a folder without a manifest: None when it holds no LMDB file, "" when the file is
    packer's own (an unfinished conversion), else what it is."""
    if DATA_FILE not in files:
        return None
    from . import read_head

    head = read_head(os.path.join(directory, DATA_FILE), 1 << 20)
    if b"PKS1" in head or b"PKS2" in head or b"PKS3" in head:
        return ""
    return "an LMDB environment not written by packer (no packer records in data.mdb)"
