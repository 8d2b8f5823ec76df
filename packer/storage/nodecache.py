"""The node-local cache of downloaded dataset files, shared by every process on the machine.

One download per file per node: every worker and every rank asks the cache, which serialises
the downloads of one file with a file lock, checks the object's size on the server against the
manifest before reserving room for it, and checks each download's SHA-256 against the manifest
before renaming it into place. Files that a reader has open hold a shared ``flock`` and are
never evicted; eviction runs under the cache's lock and keeps every file under the cache's
folders (downloads in progress allocated to full size first) at or below ``cache_limit`` at
every moment. Read-ahead takes only the room that readers leave: it never waits and never evicts
another read-ahead's file, and readers may evict its files. Every file is reached through folder
descriptors opened without following symlinks, so nothing outside ``cache_dir`` is written. All
coordination is file locks, released by the kernel when a process dies, so a crashed job leaves
nothing that can break the next one (its partial downloads are reclaimed when room is needed).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from ..description.manifest import MANIFEST_NAME
from ..errors import CorruptDataError, PackerError
from ..sizes import parse_size

__all__ = ["NodeCache", "CacheFullError", "NodeCacheError", "default_cache_dir", "DOWNLOAD_CHUNK"]

_LOCK = ".lock"  # the whole cache's lock, beside its folders
_WANT = ".want"  # held (shared) by readers waiting for room: read-ahead stands back meanwhile
_DATASETS = "datasets"  # datasets/VIEW/NAME: the downloaded files, as the manifest names them
_WORK = "work"  # work/VIEW/NAME.fetch, .partial, .ahead: bookkeeping no manifest name can reach
_FETCH = ".fetch"  # suffix of a file's download lock
_PARTIAL = ".partial"  # suffix of a download in progress
_AHEAD = ".ahead"  # suffix of a read-ahead's hold (shared lock) on a file not read yet
_CHUNK = 1 << 24  # bytes per read of a download: one request each
#: Bytes per request of a whole-file download: a file up to this size is one GET.
DOWNLOAD_CHUNK = _CHUNK
_TRAFFIC = ".traffic-"  # .traffic-VIEW beside the lock: requests and bytes this node asked for VIEW (16 bytes)
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
        with _named(self.root, self.root):
            os.makedirs(self.root, exist_ok=True)
            with _folder(self.root, _DATASETS), _folder(self.root, _WORK):
                pass

    def view(self, url: str, manifest_raw: bytes, write_manifest: bool = True) -> str:
        """The folder that holds this node's copy of the dataset at ``url`` whose manifest is
        ``manifest_raw`` (a new conversion at the same URL gets a new folder), manifest included
        unless ``write_manifest`` is false (other tools' shards: ``manifest_raw`` is then the
        listing that identifies them)."""
        name = hashlib.sha256(url.encode()).hexdigest()[:16] + "-" + hashlib.sha256(manifest_raw).hexdigest()[:16]
        with _named(self.root, os.path.join(self.root, _DATASETS, name), url), \
                _folder(self.root, _DATASETS, name) as folder:
            if write_manifest:
                try:
                    os.close(os.open(MANIFEST_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                                     dir_fd=folder))
                except FileNotFoundError:
                    _write_new(folder, MANIFEST_NAME, manifest_raw)
        return os.path.join(self.root, _DATASETS, name)

    def fetch(self, path: str, size: int, sha256: str, source: Callable[[], IO[bytes]], url: str,
              ahead: bool = False) -> int | None:
        """A read-only descriptor of the cached file ``path`` (in a folder from :meth:`view`),
        holding a shared lock that keeps it from eviction until closed; downloaded first (from
        ``source()``, which is ``url``) when this node does not have it. The object's size on the
        server must be ``size`` (else CorruptDataError naming the URL, before any room is taken);
        a download whose SHA-256 differs from ``sha256`` is fetched once more, then raises
        CorruptDataError (an empty ``sha256``: other tools' files, which have none, are checked by
        ``size`` only). The cache folder's own failures (disk full, read-only, a planted symlink)
        raise NodeCacheError naming the file and ``url``.

        ``ahead``: a read-ahead. Downloads only when room is free now without evicting another
        read-ahead's file and no reader is waiting for room; returns None when it does not, else
        a descriptor of a hold that keeps other read-aheads (not readers) from evicting the file.
        """
        folder_path, name = os.path.split(path)
        view = os.path.basename(folder_path)
        with _named(self.root, path, url), _folder(self.root, _DATASETS, view) as folder, \
                _folder(self.root, _WORK, view) as work:
            if ahead:
                hold = _open_lock(work, name + _AHEAD, fcntl.LOCK_SH)
                try:
                    fd = self._get(folder, work, name, size, sha256, source, url, ahead=True)
                except BaseException:
                    os.close(hold)
                    raise
                if fd is None:
                    os.close(hold)
                    return None
                os.close(fd)
                return hold
            return self._get(folder, work, name, size, sha256, source, url, ahead=False)

    def disk_bytes(self, sizes: Iterable[int]) -> int:
        """What files of these ``sizes`` take on the cache's disk, as :meth:`usage` counts them
        (each rounded up to the file system's block)."""
        with _named(self.root, self.root):
            block = max(os.statvfs(self.root).f_frsize, 512)
        return sum(-(-int(n) // block) * block for n in sizes)

    def count(self, view_path: str, requests: int, nbytes: int) -> None:
        """Add ``requests`` and ``nbytes`` to what this node (every process) asked of the server for
        the dataset whose folder is ``view_path`` (from :meth:`view`)."""
        if not requests and not nbytes:
            return
        view = os.path.basename(view_path)
        with _named(self.root, view_path), _folder(self.root) as root:
            fd = _open_lock(root, _TRAFFIC + view, fcntl.LOCK_EX)
            try:
                was = os.pread(fd, 16, 0)
                had = struct.unpack("<QQ", was) if len(was) == 16 else (0, 0)
                os.pwrite(fd, struct.pack("<QQ", had[0] + requests, had[1] + nbytes), 0)
            finally:
                os.close(fd)

    def traffic(self, view_path: str) -> tuple[int, int]:
        """(requests, bytes) this node's processes asked of the server for the dataset in
        ``view_path`` since its folder was made: downloads and range reads (retries inside the
        storage library are not seen)."""
        view = os.path.basename(view_path)
        with _named(self.root, view_path), _folder(self.root) as root:
            fd = _open_lock(root, _TRAFFIC + view, fcntl.LOCK_SH)
            try:
                was = os.pread(fd, 16, 0)
            finally:
                os.close(fd)
        return struct.unpack("<QQ", was) if len(was) == 16 else (0, 0)

    def usage(self) -> int:
        """Bytes every file under the cache's folders takes on disk now (downloads in progress at
        their full size)."""
        return sum(st.st_blocks * 512 for _, _, st in self._entries())

    # -- internals --------------------------------------------------------------------------------
    def _get(self, folder: int, work: int, name: str, size: int, sha256: str, source: Callable[[], IO[bytes]],
             url: str, ahead: bool) -> int | None:
        fd = self._open_cached(folder, name)
        if fd is not None:
            return fd
        if self.limit is not None and size > self.limit:
            raise CacheFullError(f"{url} is {size:,} bytes, more than cache_limit ({self.limit:,} bytes); "
                                 f"raise cache_limit to at least the largest file of the dataset")
        if ahead and self._someone_waits():
            return None
        with _locked_file(work, name + _FETCH, fcntl.LOCK_EX):  # one download of this file on this node
            fd = self._open_cached(folder, name)
            if fd is not None:
                return fd
            src = source()
            try:
                _check_size(src, size, url)
                part = self._reserve(work, name, size, url, ahead)
                if part is None:
                    return None
                try:
                    digest, got = _download(part, src, size)
                    if not _intact(digest, got, sha256, size):
                        src.close()
                        src = source()
                        _check_size(src, size, url)
                        digest, got = _download(part, src, size)
                    if not _intact(digest, got, sha256, size) and not sha256:
                        raise CorruptDataError(f"downloaded twice, and both times its size differed from the {size:,} "
                                               f"bytes its listing says (changed while being read?)", path=url)
                    if not _intact(digest, got, sha256, size):
                        raise CorruptDataError(f"downloaded twice, and both times its SHA-256 ({digest[:16]}...) "
                                               f"differs from the manifest's ({sha256[:16]}...)", path=url)
                    with self._locked():
                        os.fsync(part)
                        os.rename(name + _PARTIAL, name, src_dir_fd=work, dst_dir_fd=folder)
                        return _open_held(folder, name)
                finally:
                    os.close(part)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name + _PARTIAL, dir_fd=work)
            finally:
                src.close()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with _folder(self.root) as root, _locked_file(root, _LOCK, fcntl.LOCK_EX):
            yield

    def _someone_waits(self) -> bool:
        """Whether a reader is waiting for room (it holds the ``.want`` lock shared)."""
        with _folder(self.root) as root:
            return _held(_open_lock(root, _WANT, None))

    def _open_cached(self, folder: int, name: str) -> int | None:
        with self._locked():
            try:
                fd = _open_held(folder, name)
            except FileNotFoundError:
                return None
        os.utime(fd)  # recently used: evicted last
        return fd

    def _reserve(self, work: int, name: str, size: int, url: str, ahead: bool) -> int | None:
        """Make room for ``size`` bytes, then create the download file allocated to that size
        (a read-ahead: None at once when there is no room)."""
        deadline = time.monotonic() + self.wait_s
        want = None  # held while this reader waits: read-ahead stands back meanwhile
        try:
            while True:
                with self._locked():
                    if self._make_room(size, ahead):
                        with contextlib.suppress(FileNotFoundError):  # a killed downloader's
                            os.unlink(name + _PARTIAL, dir_fd=work)
                        fd = os.open(name + _PARTIAL, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644,
                                     dir_fd=work)
                        if size:
                            try:
                                os.posix_fallocate(fd, 0, size)
                            except BaseException:
                                os.close(fd)
                                with contextlib.suppress(FileNotFoundError):
                                    os.unlink(name + _PARTIAL, dir_fd=work)
                                raise
                        return fd
                if ahead:
                    return None
                if want is None:
                    with _folder(self.root) as root:
                        want = _open_lock(root, _WANT, fcntl.LOCK_SH)
                if time.monotonic() > deadline:
                    raise CacheFullError(
                        f"cannot cache {url} ({size:,} bytes): the files in use fill cache_limit ({self.limit:,} "
                        f"bytes) in {self.root}; raise cache_limit to at least the largest file times the "
                        f"processes reading at once on this node (ranks x DataLoader workers)")
                time.sleep(0.2)
        finally:
            if want is not None:
                os.close(want)

    def _make_room(self, size: int, ahead: bool) -> bool:
        """Evict files nobody has open until ``size`` more bytes fit: stale partial downloads
        first, then the least recently used files, then (a reader only) read-ahead files not
        read yet, the newest first."""
        if self.limit is None:
            return True
        entries = list(self._entries())
        used = sum(st.st_blocks * 512 for _, _, st in entries)
        if used + size <= self.limit:
            return True
        candidates = []
        for parts, name, st in entries:
            if parts[0] == _WORK:
                if name.endswith(_PARTIAL) and used + size > self.limit and self._stale_partial(parts, name):
                    used -= st.st_blocks * 512
            elif not (len(parts) == 2 and name == MANIFEST_NAME):
                marked = len(parts) == 2 and self._marked(parts[1], name)
                if not (ahead and marked):
                    candidates.append((marked, -st.st_mtime if marked else st.st_mtime, parts, name,
                                       st.st_blocks * 512))
        for _, _, parts, name, nbytes in sorted(candidates):
            if used + size <= self.limit:
                break
            with _folder(self.root, *parts) as folder:
                if _evict(folder, name):
                    used -= nbytes
        return used + size <= self.limit

    def _stale_partial(self, parts: tuple[str, ...], name: str) -> bool:
        """Remove the partial download ``name`` if no process is downloading it (its download
        lock is free: the downloader died); True when removed."""
        with _folder(self.root, *parts) as work:
            try:
                fd = os.open(name[: -len(_PARTIAL)] + _FETCH, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=work)
            except FileNotFoundError:
                fd = None
            try:
                if fd is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(name, dir_fd=work)
                return True
            except (BlockingIOError, FileNotFoundError):
                return False
            finally:
                if fd is not None:
                    os.close(fd)

    def _marked(self, view: str, name: str) -> bool:
        """Whether a read-ahead holds the file ``name`` of ``view`` (not read yet)."""
        try:
            with _folder(self.root, _WORK, view, create=False) as work:
                fd = os.open(name + _AHEAD, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=work)
        except OSError:  # no hold was ever taken
            return False
        return _held(fd)

    def _entries(self) -> Iterator[tuple[tuple[str, ...], str, os.stat_result]]:
        """Every file under the cache's folders, whatever its name or kind (symlinks as links,
        never followed): (folder parts below the root, name, lstat)."""
        stack: list[tuple[str, ...]] = [(_DATASETS,), (_WORK,)]
        while stack:
            parts = stack.pop()
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for e in os.scandir(os.path.join(self.root, *parts)):
                    with contextlib.suppress(FileNotFoundError):
                        st = e.stat(follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            stack.append((*parts, e.name))
                        else:
                            yield parts, e.name, st


@contextlib.contextmanager
def _folder(root: str, *names: str, create: bool = True) -> Iterator[int]:
    """A descriptor of the folder ``root/names...``: ``root`` as the user gave it, each of
    ``names`` opened without following a symlink (one planted there is removed, never followed)
    and created where missing (unless not ``create``)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            child = _subfolder(fd, name, create)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _subfolder(parent: int, name: str, create: bool) -> int:
    for _ in range(3):
        try:
            return os.open(name, _OPEN_DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR) or not create:
                raise
            os.unlink(name, dir_fd=parent)  # a symlink or file where the cache keeps a folder
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent)
    return os.open(name, _OPEN_DIR, dir_fd=parent)


def _open_held(folder: int, name: str) -> int:
    """The cached file ``name`` of ``folder``, read-only, with a shared lock against eviction;
    FileNotFoundError when absent (anything there but a regular file is removed)."""
    if not _is_file(folder, name):
        raise FileNotFoundError(name)
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def _is_file(folder: int, name: str) -> bool:
    """Whether ``name`` in ``folder`` is a regular file; a symlink, FIFO or device there is removed."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(st.st_mode):
        return True
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=folder)
        return False
    raise PackerError(f"a folder stands where the node cache keeps a downloaded file; remove it "
                      f"(the cache's file {name!r})")


def _write_new(folder: int, name: str, data: bytes) -> None:
    """Write ``name`` in ``folder`` via a temp file, fsync and rename."""
    tmp = f"{name}.tmp-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=folder)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=folder)
    with open(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)


def _evict(folder: int, name: str) -> bool:
    """Delete ``name`` unless a reader holds it (a shared flock); True when deleted."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except FileNotFoundError:
        return False
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        os.unlink(name, dir_fd=folder)  # a symlink: nobody reads through it
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        os.unlink(name, dir_fd=folder)
    finally:
        os.close(fd)
    return True


def _held(fd: int) -> bool:
    """Whether another open file description holds a lock on the file open as ``fd`` (closed)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _open_lock(folder: int, name: str, how: int | None) -> int:
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644, dir_fd=folder)
    if how is not None:
        try:
            fcntl.flock(fd, how)
        except BaseException:
            os.close(fd)
            raise
    return fd


@contextlib.contextmanager
def _locked_file(folder: int, name: str, how: int) -> Iterator[None]:
    fd = _open_lock(folder, name, how)
    try:
        yield
    finally:
        os.close(fd)


def _check_size(src: Any, size: int, url: str) -> None:
    """CorruptDataError naming ``url`` when the server says the object is not ``size`` bytes."""
    held = getattr(src, "size", None)
    if held is not None and held != size:
        raise CorruptDataError(f"the server holds {held:,} bytes, the manifest says {size:,}: not this "
                               f"dataset's file (nothing was downloaded)", path=url)


def _intact(digest: str, got: int, sha256: str, size: int) -> bool:
    """Whether a download is the file: its SHA-256 is ``sha256`` (empty: its size is ``size``)."""
    return digest == sha256 if sha256 else got == size


def _download(part: int, src: Any, size: int) -> tuple[str, int]:
    """Copy the stream ``src`` into the file ``part`` from its start; return the SHA-256 of what
    came and how many bytes came (reading stops after one more than ``size``)."""
    sha = hashlib.sha256()
    got = 0
    with open(part, "r+b", closefd=False) as out:
        while True:
            chunk = src.read(_CHUNK)
            if not chunk:
                break
            got += len(chunk)
            if got > size:
                break
            sha.update(chunk)
            out.write(chunk)
        out.flush()
    if got != size:
        sha.update(b"\0size mismatch")  # never equal to the manifest's digest
    return sha.hexdigest(), got
