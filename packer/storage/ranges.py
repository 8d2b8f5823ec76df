"""Reading a remote dataset's records by byte range: one ranged GET per record instead of a
download of its shard (map-style ``ds[i]``, previews, evaluation subsets); docs/datasets.md says
when each way of reading pays off."""

from __future__ import annotations

import io
import os
import posixpath
import threading
from collections.abc import Sequence
from typing import Any

from ..description.manifest import Manifest
from ..errors import CorruptDataError, DatasetChangedError
from .remote import Remote, RemoteError, RemoteFiles, bounded_call

__all__ = ["RANGE_FORMATS", "REMOTE_MODES", "COALESCE_GAP", "RangeFiles", "RangeFile", "RangesRefused", "coalesce"]

#: How a dataset at a URL is read: ``"range"`` (each record by one ranged GET; index files and the
#: sample table whole, once) or ``"whole"`` (every file downloaded whole into the node cache).
REMOTE_MODES = ("range", "whole")
#: The formats whose records lie at byte offsets their index gives (LMDB's are found through its
#: B-tree pages, so an LMDB file is read whole).
RANGE_FORMATS = ("tar", "tfrecord", "hdf5")
#: Ranges of one file at most this many bytes apart are fetched by one GET (the gap read and dropped).
COALESCE_GAP = 64 << 10


def coalesce(spans: Sequence[tuple[int, int]], gap: int = COALESCE_GAP) -> list[tuple[int, int]]:
    """``(offset, size)`` spans merged where at most ``gap`` bytes apart, as ``(start, end)`` in
    offset order: what to fetch, one GET each."""
    out: list[list[int]] = []
    for offset, size in sorted(spans):
        if out and offset <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], offset + size)
        else:
            out.append([offset, offset + size])
    return [(a, b) for a, b in out]


class RangesRefused(RemoteError):
    """The server answers a ranged GET with the whole object (a plain HTTP server): with the default
    mode the reader goes on with whole files (``files.ranged`` is then False)."""


class RangeFiles(RemoteFiles):
    """:class:`RemoteFiles` that also reads byte ranges of a file straight from the server.

    ``files(name)`` still downloads a whole file into the node cache (index files, the sample
    table); :meth:`read` fetches ``size`` bytes at ``offset`` with one ranged GET, bounded by the
    remote deadline and retried as every request is. The first range of a file in a process
    opens it once (the server's size, and on S3 its ETag, which every later GET must match): a
    size other than the manifest's, a GET refused because the object changed, or an answer
    shorter than asked is an error naming the URL, never other bytes (the readers' record
    checksums catch changed bytes of the same size).

    ``fallback`` (the default mode, not an explicit ``remote="range"``): a server that does not
    answer range requests makes the reader download whole files instead of failing."""

    def __init__(self, remote: Remote, manifest: Manifest, cache: Any, view: str, fallback: bool = False) -> None:
        super().__init__(remote, manifest, cache, view)
        self.ranged = True
        self.fallback = fallback
        self._open: dict[str, Any] = {}
        self._pid = os.getpid()
        self._guard = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"], state["_guard"], state["_pid"] = {}, None, None  # each process opens its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._guard = threading.Lock()

    def url(self, name: str) -> str:
        """The URL of the dataset's file ``name``."""
        return self.remote.join(name)

    def size(self, name: str) -> int:
        """The manifest's size of file ``name``."""
        return self._entries[name][0]

    def _handle(self, name: str) -> tuple[Any, threading.Lock]:
        if self._pid != os.getpid():  # inherited through fork: the parent's connections stay its own
            self._open, self._pid = {}, os.getpid()
        got = self._open.get(name)
        if got is not None:
            return got
        url = self.url(name)
        fs, path = self.remote.filesystem()
        try:
            f = bounded_call(self.remote.deadline, url, fs.open, posixpath.join(path, name), "rb", cache_type="none")
        except RemoteError as e:
            if self._replaced():
                raise self.changed_error(name) from e
            raise
        self.cache.count(self.view, 1, 0)  # the open asked for the size (and ETag): a HEAD
        size, want = getattr(f, "size", None), self.size(name)
        if size is not None and size != want:
            f.close()
            self._raise_changed(name, f"the server holds {size:,} bytes, the manifest says {want:,}")
        got = self._open[name] = (f, threading.Lock())
        return got

    def _raise_changed(self, name: str, why: str) -> None:
        url = self.url(name)
        if self._replaced():
            raise DatasetChangedError(f"{self.remote.url} was replaced or removed after this reader opened it: "
                                      f"{url}: {why}; open the dataset again", path=url)
        raise CorruptDataError(f"{url}: {why} (the object was replaced or damaged on the server)", path=url)

    def read(self, name: str, offset: int, size: int, sample: int | None = None) -> bytes:
        """Exactly ``size`` bytes at ``offset`` of file ``name``: one ranged GET. RemoteError
        (server), DatasetChangedError (the object or the dataset replaced) or CorruptDataError
        (a short answer, a range outside the file) naming the URL."""
        url = self.url(name)
        if offset < 0 or size < 0 or offset + size > self.size(name):
            raise CorruptDataError(f"range {offset}..{offset + size} lies outside {url} ({self.size(name):,} bytes)",
                                   path=url, sample=sample, offset=offset)
        if size == 0:
            return b""
        with self._guard:
            f, lock = self._handle(name)
        try:
            with lock:
                f.seek(offset)
                data = bounded_call(self.remote.deadline, url, f.read, size)
        except RemoteError as e:
            self.cache.count(self.view, 1, 0)
            self._drop(name)
            text = str(e).lower()
            if "fileexpired" in text or "pre-condition" in text or "precondition" in text:
                self._raise_changed(name, "the server no longer holds the object this reader opened (its ETag changed)")
            if "support range requests" in text:
                if self.fallback:
                    self.ranged = False
                    raise RangesRefused(f"{url}: the server does not answer range requests; reading whole "
                                        f"files") from None
                raise RemoteError(f"{url}: the server does not answer range requests; open the dataset with "
                                  f"remote='whole' (--remote whole) to download whole files instead") from None
            if self._replaced():
                raise self.changed_error(name) from e
            raise
        self.cache.count(self.view, 1, len(data))
        if len(data) != size:
            self._drop(name)
            if self._replaced():
                self._raise_changed(name, f"answered {len(data)} of {size} bytes at {offset}")
            raise CorruptDataError(f"short answer from the server: {len(data)} of {size} bytes at {offset} of {url}",
                                   path=url, sample=sample, offset=offset)
        return data

    def read_spans(self, name: str, spans: Sequence[tuple[int, int]], sample: int | None = None
                   ) -> tuple[int, bytes]:
        """The bytes from the first to the last of ``spans`` (``(offset, size)``) of file ``name``
        by one GET, and the offset they start at (for spans close together: :func:`coalesce`)."""
        start = min(o for o, _ in spans)
        end = max(o + s for o, s in spans)
        return start, self.read(name, start, end - start, sample)

    def _drop(self, name: str) -> None:
        with self._guard:
            got = self._open.pop(name, None)
        if got is not None:
            try:
                got[0].close()
            except Exception:  # noqa: BLE001 - closing after a failed read
                pass

    def file(self, name: str, block: int = COALESCE_GAP) -> RangeFile:
        """File ``name`` as a read-only file object whose reads are ranged GETs (for h5py)."""
        return RangeFile(self, name, block)


class RangeFile(io.RawIOBase):
    """A remote file read by ranges: reads of at least ``block`` bytes are one GET each; smaller
    ones go through ``block``-sized blocks, kept (so a library's many small reads of its own
    metadata, h5py's, cost a few requests)."""

    def __init__(self, files: RangeFiles, name: str, block: int) -> None:
        super().__init__()
        self.files, self.name_, self.block = files, name, block
        self.length = files.size(name)
        self.pos = 0
        self.blocks: dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self.length - self.pos))
        if n >= self.block:
            view[:n] = self.files.read(self.name_, self.pos, n)
        else:
            done = 0
            while done < n:
                b, at = divmod(self.pos + done, self.block)
                data = self.blocks.get(b)
                if data is None:
                    start = b * self.block
                    data = self.blocks[b] = self.files.read(self.name_, start, min(self.block, self.length - start))
                take = min(n - done, len(data) - at)
                view[done : done + take] = data[at : at + take]
                done += take
        self.pos += n
        return n
