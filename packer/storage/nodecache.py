"""The node-local cache of downloaded dataset files, shared by every process on the machine.

One download per file per node: every worker and every rank asks the cache, which serialises
the downloads of one file with a file lock and checks each download's SHA-256 against the
manifest before renaming it into place. Files that a reader has open hold a shared ``flock`` and
are never evicted; eviction runs under the cache's lock and keeps the bytes on disk (finished
files plus downloads in progress, which are allocated to full size first) at or below
``cache_limit`` at every moment. All coordination is file locks, released by the kernel when a
process dies, so a crashed job leaves nothing that can break the next one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO

from ..description.manifest import MANIFEST_NAME
from ..errors import CorruptDataError, PackerError
from ..files.filesystem import atomic_write_bytes
from ..sizes import parse_size

__all__ = ["NodeCache", "CacheFullError", "NodeCacheError", "default_cache_dir"]

_LOCK = ".lock"  # the whole cache's lock, beside its datasets/ folder
_FETCH = ".fetch"  # suffix of a file's download lock
_PARTIAL = ".partial"  # suffix of a download in progress
_CHUNK = 1 << 24  # bytes per read of a download: one request each


class CacheFullError(PackerError):
    """The node cache cannot make room: the files in use fill ``cache_limit``."""


class NodeCacheError(PackerError, OSError):
    """The node cache's own folder failed (disk full, read-only, a symlink where a cache file or
    folder belongs, no permission): one line naming the cache path, the URL and what to do."""


#: What to do about a local error of the node cache, by errno.
_ADVICE = {
    errno.ENOSPC: "free space there or lower cache_limit",
    errno.EDQUOT: "free space there or lower cache_limit",
    errno.EROFS: "set cache_dir (or PACKER_CACHE_DIR) to a writable folder",
    errno.EACCES: "set cache_dir (or PACKER_CACHE_DIR) to a writable folder",
    errno.EPERM: "set cache_dir (or PACKER_CACHE_DIR) to a writable folder",
    errno.ELOOP: "a symlink stands where the cache keeps a file or folder; remove it",
}


@contextlib.contextmanager
def _named(root: str, path: str, url: str | None = None) -> Iterator[None]:
    """Local OSErrors of the cache (not the storage library's RemoteError) as NodeCacheError
    naming the file, the URL being cached and what to do."""
    try:
        yield
    except PackerError:
        raise
    except OSError as e:
        where = e.filename if isinstance(e.filename, str) else path
        why = "disk full (no space left on device)" if e.errno == errno.ENOSPC else (e.strerror or str(e)).lower()
        of = f" while caching {url}" if url else ""
        advice = _ADVICE.get(e.errno or 0, f"check the node cache folder {root}")
        err = NodeCacheError(f"node cache: {why}: {where}{of}; {advice}")
        err.errno = e.errno
        raise err from None


def default_cache_dir() -> str:
    """``PACKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/packer``, else ``~/.cache/packer``."""
    if os.environ.get("PACKER_CACHE_DIR"):
        return os.path.expanduser(os.environ["PACKER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "packer")


class NodeCache:
    """The cache folder ``cache_dir`` (default :func:`default_cache_dir`) holding at most
    ``cache_limit`` bytes (an int or a size like ``"20GB"``; None: no limit). Waits up to
    ``wait_s`` for readers to release files before raising :class:`CacheFullError`."""

    def __init__(self, cache_dir: str | None = None, cache_limit: int | str | None = None, wait_s: float = 60.0) -> None:
        self.root = os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir()))
        self.limit = parse_size(cache_limit) if cache_limit is not None else None
        self.wait_s = wait_s
        with _named(self.root, os.path.join(self.root, "datasets")):
            os.makedirs(os.path.join(self.root, "datasets"), exist_ok=True)

    def view(self, url: str, manifest_raw: bytes, write_manifest: bool = True) -> str:
        """The folder that holds this node's copy of the dataset at ``url`` whose manifest is
        ``manifest_raw`` (a new conversion at the same URL gets a new folder), manifest included
        unless ``write_manifest`` is false (other tools' shards: ``manifest_raw`` is then the
        listing that identifies them)."""
        name = hashlib.sha256(url.encode()).hexdigest()[:16] + "-" + hashlib.sha256(manifest_raw).hexdigest()[:16]
        path = os.path.join(self.root, "datasets", name)
        with _named(self.root, path, url):
            os.makedirs(path, exist_ok=True)
            manifest = os.path.join(path, MANIFEST_NAME)
            if write_manifest and not os.path.exists(manifest):
                atomic_write_bytes(manifest, manifest_raw)
        return path

    def fetch(self, path: str, size: int, sha256: str, source: Callable[[], IO[bytes]], url: str) -> int:
        """A read-only descriptor of the cached file ``path``, holding a shared lock that keeps it
        from eviction until closed; downloaded first (from ``source()``, which is ``url``) when
        this node does not have it. A download whose SHA-256 differs from ``sha256`` is fetched
        once more, then raises CorruptDataError (an empty ``sha256``: other tools' files, which
        have none, are checked by ``size`` only). The cache folder's own failures (disk full,
        read-only, a planted symlink) raise NodeCacheError naming the file and ``url``."""
        with _named(self.root, path, url):
            return self._fetch(path, size, sha256, source, url)

    def _fetch(self, path: str, size: int, sha256: str, source: Callable[[], IO[bytes]], url: str) -> int:
        fd = self._open_cached(path)
        if fd is not None:
            return fd
        if self.limit is not None and size > self.limit:
            raise CacheFullError(f"{url} is {size:,} bytes, more than cache_limit ({self.limit:,} bytes); "
                                 f"raise cache_limit to at least the largest file of the dataset")
        with _flocked(path + _FETCH, fcntl.LOCK_EX):  # one download of this file on this node
            fd = self._open_cached(path)
            if fd is not None:
                return fd
            part = self._reserve(path, size, url)
            try:
                for attempt in (1, 2):
                    digest, got = _download(part, source, size, url)
                    if got == size and (digest == sha256 or not sha256):
                        break
                    if attempt == 2 and not sha256:
                        raise CorruptDataError(f"downloaded twice, and both times its size differed from the {size:,} "
                                               f"bytes its listing says (changed while being read?)", path=url)
                    if attempt == 2:
                        raise CorruptDataError(f"downloaded twice, and both times its SHA-256 ({digest[:16]}...) "
                                               f"differs from the manifest's ({sha256[:16]}...)", path=url)
                with self._locked():
                    os.fsync(part.fileno())
                    os.rename(path + _PARTIAL, path)
                    return self._open_locked(path)
            finally:
                part.close()
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path + _PARTIAL)

    def disk_bytes(self, sizes: Iterable[int]) -> int:
        """What files of these ``sizes`` take on the cache's disk, as :meth:`usage` counts them
        (each rounded up to the file system's block)."""
        with _named(self.root, self.root):
            block = max(os.statvfs(self.root).f_frsize, 512)
        return sum(-(-int(n) // block) * block for n in sizes)

    def usage(self) -> int:
        """Bytes the cache's files take on disk now (downloads in progress at their full size)."""
        return sum(st.st_blocks * 512 for _, st in self._entries(partials=True))

    # -- internals --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with _flocked(os.path.join(self.root, _LOCK), fcntl.LOCK_EX):
            yield

    def _open_cached(self, path: str) -> int | None:
        with self._locked():
            try:
                fd = self._open_locked(path)
            except FileNotFoundError:
                return None
        os.utime(fd)  # recently used: evicted last
        return fd

    @staticmethod
    def _open_locked(path: str) -> int:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    def _reserve(self, path: str, size: int, url: str) -> IO[bytes]:
        """Make room for ``size`` bytes, then create the download file allocated to that size."""
        deadline = time.monotonic() + self.wait_s
        while True:
            with self._locked():
                if self._make_room(size):
                    f = open(path + _PARTIAL, "w+b")  # a stale one of a killed downloader is replaced
                    try:
                        if size:
                            os.posix_fallocate(f.fileno(), 0, size)
                    except BaseException:
                        f.close()
                        os.remove(path + _PARTIAL)
                        raise
                    return f
            if time.monotonic() > deadline:
                raise CacheFullError(
                    f"cannot cache {url} ({size:,} bytes): the files in use fill cache_limit ({self.limit:,} "
                    f"bytes) in {self.root}; raise cache_limit or read fewer shards at once")
            time.sleep(0.2)

    def _make_room(self, size: int) -> bool:
        """Evict least recently used files nobody has open until ``size`` more bytes fit."""
        if self.limit is None:
            return True
        entries = list(self._entries(partials=True))
        used = sum(st.st_blocks * 512 for _, st in entries)
        candidates = sorted((st.st_mtime, p, st.st_blocks * 512) for p, st in entries
                            if not p.endswith(_PARTIAL) and os.path.basename(p) != MANIFEST_NAME)
        for _, p, nbytes in candidates:
            if used + size <= self.limit:
                break
            if _evict(p):
                used -= nbytes
        return used + size <= self.limit

    def _entries(self, partials: bool) -> Iterator[tuple[str, os.stat_result]]:
        base = os.path.join(self.root, "datasets")
        for d in os.scandir(base):
            if not d.is_dir(follow_symlinks=False):
                continue
            for e in os.scandir(d.path):
                if e.name.endswith(_FETCH) or (e.name.endswith(_PARTIAL) and not partials):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat(follow_symlinks=False)
                    if not e.is_symlink():
                        yield e.path, st


def _evict(path: str) -> bool:
    """Delete ``path`` unless a reader holds it (a shared flock); True when deleted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        os.remove(path)
    finally:
        os.close(fd)
    return True


@contextlib.contextmanager
def _flocked(path: str, how: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)


def _download(part: IO[bytes], source: Callable[[], IO[bytes]], size: int, url: str) -> tuple[str, int]:
    """Copy ``source()`` into ``part`` from its start; return the SHA-256 of what came and how
    many bytes came (reading stops after one more than ``size``)."""
    sha = hashlib.sha256()
    part.seek(0)
    got = 0
    with source() as src:
        while True:
            chunk = src.read(_CHUNK)
            if not chunk:
                break
            got += len(chunk)
            if got > size:
                break
            sha.update(chunk)
            part.write(chunk)
    part.flush()
    if got != size:
        sha.update(b"\0size mismatch")  # never equal to the manifest's digest
    return sha.hexdigest(), got
