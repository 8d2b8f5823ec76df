"""What the sharded readers (tar, tfrecord) share: shard paths, lazily opened per-process file
descriptors, exact-size ``pread``, and shard sizes taken from real shards only (index files are
in the manifest with 0 samples and are not shards).

Every read is checked against the shard's real size (taken when it is opened) before a buffer is
allocated, so neither a truncated shard nor a hostile index or manifest can make a reader
allocate more than the file holds; a shard that turns out to be a git-LFS pointer or an HTML page
says so.

The per-sample index (numpy columns and the key blob, ~65 bytes a sample: 80 MB for ImageNet's
1.28M) is sent to spawn and forkserver DataLoader workers in shared memory, not copied: the first
time the dataset is sent to a worker its large index attributes move into one memfd region that
this process and every worker map, so each holds a share of one copy, as under fork
(docs/benchmarks.md, section 8).

A dataset at a URL reads no index at open: the manifest names the shards and their sample counts,
so opening costs the manifest's requests whatever the number of shards, and each process reads a
shard's index (one small GET the first time on a node, then the node cache's copy) when it first
reads a sample of that shard; :meth:`ShardedDataset.load_indexes` reads them all at once."""

from __future__ import annotations

import bisect
import copy
import os
from collections.abc import Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any

import numpy as np

from packer.description.manifest import FileEntry, Manifest
from packer.description.placement import place_seed
from packer.errors import CorruptDataError, ManifestError
from packer.files.fileio import pread_buffer
from packer.storage.ranges import RangesRefused, coalesce
from packer.storage.remote import is_url
from packer.storage.shardspec import ShardSpecError

from ..base import PackedDataset
from ..shm.region import SharedBytes, SharedRegion, region_views

__all__ = ["ShardedDataset", "foreign_manifest", "listed_shards", "SHARE_INDEX_BYTES"]

#: Index attributes (numpy arrays, bytes) of at least this size go to workers in shared memory.
SHARE_INDEX_BYTES = 1 << 20


class ShardedDataset(PackedDataset):
    """A PackedDataset over several shard files read with ``os.pread``.

    Subclasses set ``shard_suffixes`` (the payload file endings) and read with :meth:`_pread`.
    File descriptors are opened on first use of each shard in each process and never shared
    across fork: descriptors inherited from a parent are closed in the child and reopened.
    """

    shard_suffixes: tuple[str, ...] = ()
    _fds: list[int | None] | None = None
    _fsizes: list[int] | None = None
    #: Read by range: the bytes of one GET that covered several reads of a record (shard, offset, bytes).
    _window: tuple[int, int, bytes] | None = None
    #: A dataset at a URL: each shard's index is read when the shard is first read (module docstring).
    _lazy: bool = False
    #: The shards whose index this process has read (lazy): shard -> its rows, or the error it raised.
    _loaded: dict[int, Any] | None = None

    def _shard_entries(self) -> list[FileEntry]:
        """The payload files in sample order: for other tools' data (no index files, any names such
        as ``.tfrecords`` or ``train-00000-of-01024``) every file; for ours, those with a shard suffix."""
        if self.manifest.layout.get("foreign"):
            return list(self.manifest.files)
        return [f for f in self.manifest.files if f.name.endswith(self.shard_suffixes)]

    def _init_shards(self, entries: list[FileEntry]) -> None:
        held = sum(f.samples for f in entries)
        if held != len(self):  # a reader never yields fewer samples than its length without an error
            raise ManifestError(f"{self.root}: its shards hold {held} samples, the manifest says {len(self)}")
        # Read by range from a URL, a record's errors name the shard's URL, not the cache's folder.
        self._shard_paths = [self._remote.url(f.name) if self._ranged else os.path.join(self.root, f.name)  # type: ignore[union-attr]
                             for f in entries]
        self._sizes = [f.samples for f in entries]
        self._bytes = [f.bytes for f in entries]
        self._fids = [f.id for f in entries]  # version 2: each shard's identity (packer.description.placement)
        self._firsts = [f.first for f in entries]
        self._files = entries
        self._starts = np.cumsum([0, *self._sizes])[:-1].tolist()  # each shard's first sample, in order
        self._lazy = self._remote is not None and not self.manifest.layout.get("foreign")

    # -- each shard's index, read when the shard is first read (a dataset at a URL) ----------------
    def _shard_of(self, index: int) -> int:
        """The shard that holds sample ``index`` (empty shards are stepped over)."""
        return bisect.bisect_right(self._starts, index) - 1

    def _shard_rows(self, shard: int) -> Any:
        """Shard ``shard``'s index rows, read once per process. A shard whose index files fail
        their check raises the same error again without a second read; a failed fetch (the server,
        the network) is tried again at the next read."""
        loaded = self._loaded
        if loaded is None:
            loaded = self._loaded = {}
        got = loaded.get(shard)
        if got is None:
            self._release_shards()  # a new shard: the one read before leaves room in the node cache
            blobs = [self._read_small_file(name, self._index_what) for name in self._index_files(shard)]
            try:
                got = self._shard_rows_from(shard, blobs)
            except CorruptDataError as e:
                got = e
            loaded[shard] = got
        if isinstance(got, CorruptDataError):
            raise copy.copy(got)
        return got

    #: What the format's index files are called in errors.
    _index_what = "index file"

    def _shard_rows_from(self, shard: int, blobs: list[bytes]) -> Any:
        """Shard ``shard``'s index rows from the bytes of its index files, checked (the format's)."""
        raise NotImplementedError

    def _index_files(self, shard: int) -> list[str]:
        """The names of the index files of shard ``shard`` (the format's)."""
        raise NotImplementedError

    def index_names(self, shard: int) -> list[str]:
        """The index files this process still has to read before it reads shard ``shard``: none for
        a local dataset (its index is read at open) or a shard read before; for a dataset at a URL,
        the shard's index files (a read-ahead fetches them with the shard)."""
        if not self._lazy or shard in (self._loaded or {}):
            return []
        return self._index_files(shard)

    def load_indexes(self) -> None:
        """Read every shard's index now (a dataset at a URL reads each one when it first reads
        that shard): CorruptDataError for the first that fails its check. Costs one request per
        index file this node has not cached yet."""
        if self._lazy:
            for shard in range(len(self._files)):
                self._shard_rows(shard)

    def _file_path(self, name: str) -> str:
        """Where the dataset's file ``name`` is, as errors name it: its URL for a dataset at a URL."""
        remote = getattr(self._remote, "remote", None)
        return remote.join(name) if remote is not None else os.path.join(self.root, name)

    def _seed(self, shard: int, index: int) -> int:
        """The checksum seed of sample ``index`` in shard ``shard``: its place (0 in version 1)."""
        return place_seed(self._fids[shard], index - self._firsts[shard])

    @property
    def shard_sizes(self) -> list[int]:
        """Samples per shard, in sample order (index files are not shards)."""
        return list(self._sizes)

    @property
    def shard_paths(self) -> list[str]:
        """Absolute paths of the shards, in sample order."""
        return list(self._shard_paths)

    def _open(self) -> None:
        self._fsizes = [0] * len(self._shard_paths)
        inherited, self._fds = self._fds, [None] * len(self._shard_paths)
        for fd in inherited or ():
            if fd is not None:
                try:
                    os.close(fd)  # our copy after fork; the parent's stays open
                except OSError:
                    pass

    def _close(self) -> None:
        fds, self._fds = self._fds, None
        for fd in fds or ():
            if fd is not None:
                os.close(fd)

    def _handle_attrs(self) -> tuple[str, ...]:
        return ("_fds", "_fsizes", "_window", "_loaded", "_every_row")

    # -- the index in shared memory for spawn / forkserver workers ------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if get_spawning_popen() is None:  # plain pickle: a copy, on purpose
            state.pop("_shared_index", None)
            return {k: v[:] if isinstance(v, SharedBytes) else v for k, v in state.items()}
        shared = self.__dict__.get("_shared_index") or self._share_index()
        if shared is not None:
            for name, *_ in shared[1]:
                state.pop(name, None)
            state["_shared_index"] = shared
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        shared = state.get("_shared_index")
        if shared is not None:
            self.__dict__.update(region_views(*shared))

    def _share_index(self) -> tuple[SharedRegion, list[tuple[str, str, int, int]]] | None:
        """Move this dataset's large index attributes into one shared region (views here too):
        the region and (attribute, dtype or "bytes", offset, count) of each, or None if none."""
        big = [(k, v) for k, v in self.__dict__.items()
               if isinstance(v, (np.ndarray, bytes)) and len(memoryview(v).cast("B")) >= SHARE_INDEX_BYTES
               and (not isinstance(v, np.ndarray) or (v.ndim == 1 and v.dtype.kind in "iub" and v.flags.c_contiguous))]
        if not big:
            self.__dict__["_shared_index"] = None
            return None
        layout, size = [], 0
        for name, value in big:
            raw = memoryview(value).cast("B")
            layout.append((name, "bytes" if isinstance(value, bytes) else value.dtype.str, size, len(value)))
            size += -(-len(raw) // 64) * 64  # every column 64-byte aligned
        region = SharedRegion(size, "packer-index")
        for (_name, value), (_, _, offset, _) in zip(big, layout):
            raw = memoryview(value).cast("B")
            region.buffer[offset : offset + len(raw)] = raw
        shared = (region, layout)
        self.__dict__.update(region_views(*shared))
        self.__dict__["_shared_index"] = shared
        return shared

    def _fd(self, shard: int) -> int:
        fds: list[int | None] = self._fds  # type: ignore[assignment]  # set by _ensure_open
        fd = fds[shard]
        if fd is None:
            self._release_shards()
            fd = self._open_file(os.path.basename(self._shard_paths[shard]))
            self._fsizes[shard] = os.fstat(fd).st_size  # type: ignore[index]  # set with _fds
            fds[shard] = fd
        return fd

    def _release_shards(self) -> None:
        """A remote dataset's open shard holds its copy in the node cache: close the shards held
        open here before another file is fetched, so the cache can evict them and stay within
        its limit (one file per reading process at a time)."""
        fds = self._fds
        if self._remote is None or fds is None:
            return
        for other, held in enumerate(fds):
            if held is not None:
                fds[other] = None
                os.close(held)

    def _pread(self, shard: int, size: int, offset: int, sample: int) -> memoryview:
        """Exactly ``size`` bytes at ``offset`` of shard ``shard``, in a new writable buffer;
        CorruptDataError when the file does not hold them (checked before anything is allocated)
        or cannot be read. Read by range (a dataset at a URL), one ranged GET, or bytes that
        :meth:`_prefetch` fetched."""
        if self._ranged:
            try:
                return self._ranged_read(shard, size, offset, sample)
            except RangesRefused:  # a plain HTTP server: whole shards through the node cache from now on
                pass
        fd = self._fd(shard)
        end = self._fsizes[shard]  # type: ignore[index]
        if offset < 0 or size < 0 or offset + size > end:
            raise CorruptDataError(
                f"short read: {max(0, min(size, end - offset))} of {size} bytes (shard truncated?)",
                path=self._shard_paths[shard], sample=sample, offset=offset,
            )
        try:
            data = pread_buffer(fd, size, offset)
        except OSError as e:
            raise CorruptDataError(f"cannot read ({e})", path=self._shard_paths[shard], sample=sample,
                                   offset=offset) from None
        if len(data) != size:
            raise CorruptDataError(
                f"short read: {len(data)} of {size} bytes (shard truncated?)",
                path=self._shard_paths[shard], sample=sample, offset=offset,
            )
        return data

    def _prefetch(self, shard: int, spans: list[tuple[int, int]], sample: int) -> None:
        """Read by range, fetch the ``(offset, size)`` spans of one record (its image and fields)
        by one GET when they lie close together, for the reads that follow."""
        self._window = None
        if self._ranged and len(spans) > 1 and len(coalesce(spans)) == 1:
            name = os.path.basename(self._shard_paths[shard])
            try:
                start, data = self._remote.read_spans(name, spans, sample)  # type: ignore[union-attr]
            except RangesRefused:  # whole shards from now on (see _pread)
                return
            self._window = (shard, start, data)

    def _ranged_read(self, shard: int, size: int, offset: int, sample: int) -> memoryview:
        window = self._window
        if window is not None and window[0] == shard and window[1] <= offset and offset + size <= window[1] + len(window[2]):
            at = offset - window[1]
            return memoryview(bytearray(window[2][at : at + size]))
        name = os.path.basename(self._shard_paths[shard])
        return memoryview(bytearray(self._remote.read(name, offset, size, sample)))  # type: ignore[union-attr]


def listed_shards(paths: Sequence[str | os.PathLike[str]]) -> tuple[str, list[str]]:
    """The one folder (or URL prefix) and the file names, in the order given, of a list of shard
    files; ShardSpecError when they lie in several (a reader opens its files by name in one)."""
    full = [p if is_url(p) else os.path.abspath(os.fspath(p)) for p in map(os.fspath, paths)]
    if not full:
        raise ShardSpecError("an empty list of shard files")
    folders = sorted({os.path.dirname(p) for p in full})
    if len(folders) > 1:
        raise ShardSpecError(f"shards in {len(folders)} folders ({', '.join(folders[:3])}"
                             f"{', ...' if len(folders) > 3 else ''}): a list of shards is read from one folder; "
                             f"give one folder's shards (or a mixture of datasets, one per folder)")
    return folders[0], [os.path.basename(p) for p in full]


#: Labels of data written by other tools become class names "0".."N-1": above this, refused.
MAX_FOREIGN_CLASSES = 1_000_000


def foreign_manifest(fmt: str, files: list[FileEntry], max_label: int, source: dict[str, Any]) -> Manifest:
    """An in-memory manifest for shards written by another tool (never written to disk).

    Class names are unknown there, so the classes are the labels as strings, ``"0"`` to
    ``str(max_label)``; sizes are real, checksums empty (nothing to check them against).
    """
    if max_label >= MAX_FOREIGN_CLASSES:
        raise CorruptDataError(f"{source.get('path', fmt)}: a label of {max_label} in {fmt} data written by another "
                               f"tool; labels name classes 0..N-1, and more than {MAX_FOREIGN_CLASSES:,} classes "
                               f"are refused (damaged or not class labels)")
    return Manifest(
        format=fmt,
        num_samples=sum(f.samples for f in files),
        classes=[str(c) for c in range(max_label + 1)],
        processing={"encoding": "unknown", "color": "RGB"},
        files=files,
        source=source,
        layout={"foreign": True},
        created_by="packer (synthesised at open for foreign data)",
    )
