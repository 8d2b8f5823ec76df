"""Where packed data lives: a local path, or a URL that fsspec reads (s3://, gs://, http(s)://, ...).

Every remote byte goes through fsspec and the protocol's own package (s3fs, gcsfs, aiohttp), so
credentials come from their usual places (environment, config files, instance roles) or from
``storage_options``. Errors are turned into one line that names the URL and what to check.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ..description.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest
from ..errors import (
    CorruptDataError,
    DatasetChangedError,
    ManifestError,
    PackerError,
    UnfinishedDatasetError,
)
from ..files.filesystem import is_url
from ..sizes import seconds_from_env

__all__ = [
    "RemoteError",
    "Remote",
    "RemoteFiles",
    "RemoteShards",
    "remote_shards",
    "is_url",
    "local_copy",
    "open_remote",
    "upload_converted",
    "upload_folder",
    "Uploader",
    "watch_uploads",
    "check_remote_destination",
    "parse_storage_options",
    "read_remote_manifest",
    "upload_dataset",
    "download_requests",
    "streaming_cost",
]

#: Protocol -> the pip extra that brings its fsspec implementation.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}

#: Bounded waits and retries for S3 unless the caller's storage_options say otherwise: a server
#: that stops answering fails a job after about a minute instead of hanging it forever.
_S3_DEFAULTS = {"connect_timeout": 10, "read_timeout": 30, "retries": {"max_attempts": 5, "mode": "standard"}}


#: Seconds the read of one remote file may take from its open to its last byte (the manifest's
#: too), whatever the storage library's own timeouts and retries do; PACKER_REMOTE_DEADLINE
#: (seconds) or ``--remote-deadline`` changes it.
DEFAULT_DEADLINE = 120.0


def remote_deadline(environ: Any = os.environ) -> float:
    """The per-file deadline in seconds: ``PACKER_REMOTE_DEADLINE``, else :data:`DEFAULT_DEADLINE`."""
    return seconds_from_env("PACKER_REMOTE_DEADLINE", DEFAULT_DEADLINE, environ)


#: Protocols whose fsspec file takes a known ``size`` instead of asking the server.
_SIZED = ("s3", "s3a", "http", "https")


class RemoteError(PackerError, OSError):
    """Object storage refused or failed a request; the message names the URL and what to check."""


def parse_storage_options(pairs: Iterable[str]) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` from the CLI as fsspec ``storage_options``; a VALUE that parses as
    JSON (``true``, ``3``, ``{"a": 1}``) is taken as that, otherwise as a string. Dotted keys nest
    (``client_kwargs.endpoint_url=...``)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--storage-option takes KEY=VALUE, not {pair!r}")
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        *parents, leaf = key.split(".")
        node = options
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--storage-option {pair!r}: {p} is already set to a value")
        node[leaf] = parsed
    return options


@dataclass(frozen=True)
class Remote:
    """A dataset at ``url`` with the fsspec ``storage_options`` to reach it (picklable: sent to
    DataLoader workers, which open their own connections). The read of one of its files, open to
    last byte, fails naming the file's URL after ``deadline`` seconds (default
    :func:`remote_deadline`), whatever each request takes."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    deadline: float = field(default_factory=remote_deadline)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", self.url.rstrip("/"))

    def filesystem(self) -> tuple[Any, str]:
        """The fsspec file system and the dataset's path within it."""
        try:
            import fsspec
        except ImportError:
            raise RemoteError(f"{self.url}: reading URLs needs fsspec: pip install 'packer[s3]' "
                              f"(or [gcs], [http])") from None
        scheme = self.url.partition("://")[0]
        options = dict(self.storage_options)
        if scheme in ("s3", "s3a"):
            options["config_kwargs"] = {**_S3_DEFAULTS, **options.get("config_kwargs", {})}
        try:
            if scheme in ("gs", "gcs"):
                fs, path = _gcs_filesystem(self.url, options)
            else:
                fs, path = fsspec.core.url_to_fs(self.url, **options)
        except ImportError as e:
            extra = _EXTRAS.get(scheme)
            hint = f"pip install 'packer[{extra}]'" if extra else "install the fsspec package for it"
            raise RemoteError(f"{self.url}: {scheme}:// needs a package that is missing ({e}); {hint}") from None
        except ValueError as e:
            raise RemoteError(f"{self.url}: {e}") from None
        return fs, path

    def join(self, name: str) -> str:
        """The URL of the dataset's file ``name``."""
        return f"{self.url}/{name}"

    def open(self, name: str, size: int | None = None) -> _Stream:
        """The dataset's file ``name`` opened for sequential reading; each ``read(n)`` is one
        request. ``size`` (from the manifest) saves the request that would ask for it."""
        fs, path = self.filesystem()
        extra: dict[str, Any] = {"cache_type": "none"}
        if size is not None and self.url.partition("://")[0] in _SIZED:
            extra["size"] = size
        url = self.join(name)
        ends = time.monotonic() + self.deadline  # one deadline for the whole file, open included
        f = bounded_call(self.deadline, url, fs.open, posixpath.join(path, name), "rb", **extra)
        if "size" in extra and hasattr(type(f), "details"):
            f.details = {"name": posixpath.join(path, name), "size": size}  # else s3fs asks for them (a HEAD)
        stream = _Stream(f, url, self.deadline, ends)
        stream.requests = int("size" not in extra)  # the server was asked for the size (a HEAD)
        return stream


def _gcs_filesystem(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    """gcsfs's file system for ``url``, with bounded waits unless ``options`` set
    ``requests_timeout``. At an ``endpoint_url`` (or ``STORAGE_EMULATOR_HOST``) other than
    Google's, gcsfs's plain JSON-API class: the default one first asks a gRPC service that
    only Google runs for each bucket's layout, and retries that for a minute on every call.
    gcsfs logs each failed request with its traceback; unless the application has set up
    logging, those records go nowhere (the error reaches the caller as one RemoteError line)."""
    from aiohttp import ClientTimeout
    from gcsfs.core import GCSFileSystem

    log = logging.getLogger("gcsfs")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
    options.setdefault("requests_timeout", ClientTimeout(sock_connect=10, sock_read=30))
    if options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST", "default") not in ("", "default"):
        return GCSFileSystem(**options), GCSFileSystem._strip_protocol(url)
    import fsspec

    return fsspec.core.url_to_fs(url, **options)


class _Stream:
    """A remote file being read: the storage library's errors as RemoteError naming the URL, and
    a read past the object's real end (it is shorter than the manifest says) as end of data."""

    def __init__(self, f: Any, url: str, deadline: float | None = None, ends: float | None = None) -> None:
        self._f, self._url, self._deadline = f, url, deadline
        self._ends = ends if ends is not None or deadline is None else time.monotonic() + deadline
        self.requests = 0  # asked of the server so far (a read that returns nothing asks nothing)
        self.received = 0  # bytes it answered
        self.on_close: Callable[[int, int], None] | None = None  # given (requests, received) once, at close

    def read(self, n: int = -1) -> bytes:
        left = self.size - self._f.tell() if self.size is not None and hasattr(self._f, "tell") else None
        try:
            if self._deadline is None or self._ends is None:
                data = call(self._url, self._f.read, n)
            else:
                data = bounded_call(self._ends - time.monotonic(), self._url, self._f.read, n, whole=self._deadline)
            self.requests += bool(data) or left is None or left > 0
            self.received += len(data)
            return data
        except RemoteError as e:
            self.requests += 1
            if "range is not satisfiable" in str(e).lower() or "invalidrange" in str(e).lower():
                return b""  # the object ended before the size the manifest gives: a short download
            raise

    @property
    def size(self) -> int | None:
        """The object's size as the server gave it (or as given to :meth:`Remote.open`)."""
        size = getattr(self._f, "size", None)
        return size if isinstance(size, int) else None

    def close(self) -> None:
        """Close the remote file (errors of a file that failed already are dropped); report what it
        asked of the server to ``on_close``."""
        try:
            self._f.close()
        except Exception:  # noqa: BLE001 - closing after a failed read
            pass
        report, self.on_close = self.on_close, None
        if report is not None:
            report(self.requests, self.received)

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def call(url: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with the storage library's errors as one line naming ``url``."""
    try:
        return fn(*args, **kwargs)
    except FileNotFoundError:
        raise RemoteError(f"{url} does not exist (check the bucket, the path and the endpoint)") from None
    except PackerError:
        raise
    except Exception as e:  # noqa: BLE001 - botocore, aiohttp, ... : each library its own types
        if _denied(e):
            raise RemoteError(f"{url}: access denied (check the credentials and the bucket's policy)") from None
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RemoteError(f"{url}: {type(e).__name__}: {text}") from None


def bounded_call(deadline: float, url: str, fn: Any, *args: Any, whole: float | None = None, **kwargs: Any) -> Any:
    """:func:`call` that raises RemoteError naming ``url`` once ``deadline`` seconds have passed,
    however the storage library's timeouts and retries multiply (the call is left to finish in
    a daemon thread, its result unused). ``whole``: the file's deadline this call's ``deadline``
    is what is left of (named in the error)."""
    limit = deadline if whole is None else whole
    if deadline <= 0:
        raise RemoteError(f"{url}: not read within {limit:g} s (the server is too slow; PACKER_REMOTE_DEADLINE or "
                          f"--remote-deadline sets how long the read of one file may take)")
    done = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call(url, fn, *args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="packer-remote-request", daemon=True).start()
    if not done.wait(deadline):
        raise RemoteError(f"{url}: no answer within {limit:g} s (the server is stopped, unreachable or too "
                          f"slow; PACKER_REMOTE_DEADLINE or --remote-deadline sets how long the read of one file "
                          f"may take)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _denied(e: Exception) -> bool:
    """True for a refusal of the credentials: PermissionError (s3fs), an HTTP 401/403 from
    gcsfs (an OSError starting ``Forbidden:`` for 403, an HttpError with ``code`` 401)."""
    if isinstance(e, PermissionError) or getattr(e, "code", None) in (401, 403, "401", "403"):
        return True
    return isinstance(e, OSError) and str(e).startswith("Forbidden:")


def download_requests(nbytes: int) -> int:
    """Requests of one whole-file download of ``nbytes`` through the node cache: one GET per
    :data:`~packer.storage.nodecache.DOWNLOAD_CHUNK`, and a HEAD first for a file larger than one."""
    from .nodecache import DOWNLOAD_CHUNK

    gets = max(1, -(-nbytes // DOWNLOAD_CHUNK))
    return gets + (gets > 1)


def streaming_cost(manifest: Manifest) -> tuple[tuple[int, int], tuple[int, int]]:
    """What streaming the dataset costs from object storage, as ``(requests, bytes)``: once per
    node while the node cache keeps them (the manifest at open, a HEAD and a GET; each index file
    with the first read of its shard, never at open), and per epoch through an empty node cache
    (every shard downloaded whole once per node: :func:`download_requests`); storage libraries'
    retries come on top."""
    index = [f.bytes for f in manifest.files if not f.samples]
    shards = [f.bytes for f in manifest.files if f.samples]
    opened = (2 + sum(map(download_requests, index)), len(manifest.dumps()) + sum(index))
    return opened, (sum(map(download_requests, shards)), sum(shards))


def read_remote_manifest(remote: Remote, formats: Collection[str] | None = None) -> tuple[Manifest, bytes]:
    """The manifest at ``remote`` (validated; its ``format`` one of ``formats`` when given) and
    its exact bytes."""
    where = remote.join(MANIFEST_NAME)
    fs, path = remote.filesystem()
    try:
        f = bounded_call(remote.deadline, where, fs.open, posixpath.join(path, MANIFEST_NAME), "rb")
    except RemoteError as e:
        if "does not exist" in str(e):
            raise UnfinishedDatasetError(f"{where} does not exist: {remote.url} is not a packed dataset, "
                                         f"or its conversion has not finished") from None
        raise
    with f:
        raw = bounded_call(remote.deadline, where, f.read, MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{where}: larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ManifestError(f"{where}: not valid JSON ({e})") from None
    return Manifest.from_json(data, where, formats), raw


def upload_dataset(local: str, remote: Remote, manifest: Manifest) -> None:
    """Upload the packed dataset in the folder ``local`` to ``remote``: every payload and index
    file first, the manifest last, so a reader never finds a manifest whose files are missing."""
    fs, path = remote.filesystem()
    call(remote.url, fs.makedirs, path, exist_ok=True)
    for f in manifest.files:
        call(remote.join(f.name), fs.put_file, os.path.join(local, f.name), posixpath.join(path, f.name))
    call(remote.join(MANIFEST_NAME), fs.put_file, os.path.join(local, MANIFEST_NAME),
         posixpath.join(path, MANIFEST_NAME))


class RemoteFiles:
    """Opens the files of a remote dataset through the node cache: ``files(name)`` is a
    read-only descriptor of the local copy (downloaded on first use, SHA-256 checked), holding
    it in the cache until closed. Picklable, for DataLoader workers."""

    def __init__(self, remote: Remote, manifest: Manifest, cache: Any, view: str) -> None:
        self.remote = remote
        self.cache = cache
        self.view = view
        self.manifest = manifest
        self._entries = {f.name: (f.bytes, f.sha256) for f in manifest.files}

    def __call__(self, name: str, ahead: bool = False) -> int | None:
        """A descriptor of the file ``name``; ``ahead``: a read-ahead's hold on it, or None when
        the cache has no room to spare now (see :meth:`packer.storage.nodecache.NodeCache.fetch`)."""
        size, sha = self._entries[name]
        try:
            return self.cache.fetch(os.path.join(self.view, name), size, sha, lambda: self._source(name, size, sha),
                                    self.remote.join(name), ahead=ahead)
        except (CorruptDataError, RemoteError) as e:
            if self._replaced():
                raise self.changed_error(name) from e
            raise

    def _source(self, name: str, size: int, sha: str) -> _Stream:
        """File ``name`` opened for its download, its requests counted in the node cache. A file of
        at most one download request (:data:`~packer.storage.nodecache.DOWNLOAD_CHUNK`) with a
        SHA-256 is opened at the manifest's size: one GET, no HEAD; the cache reserves at most that
        much, and the digest refuses any other object. Larger files (and other tools' shards, which
        have no digest) are opened without it: the server says what it holds, and the cache
        reserves room only for that (a forged size is refused before anything is taken)."""
        from .nodecache import DOWNLOAD_CHUNK

        stream = self.remote.open(name, size if sha and size <= DOWNLOAD_CHUNK else None)
        stream.on_close = partial(self.cache.count, self.view)
        return stream

    def traffic(self) -> tuple[int, int]:
        """(requests, bytes) every process on this node has asked of the server for this dataset's
        files (downloads and range reads; not the manifest; retries inside the storage library
        unseen): the difference over an epoch is what the epoch cost."""
        return self.cache.traffic(self.view)

    def changed_error(self, name: str) -> DatasetChangedError:
        """The error for file ``name`` of a dataset that is no longer at the URL as it was opened."""
        return DatasetChangedError(
            f"{self.remote.url} was replaced or removed after this reader opened it (e.g. by a conversion "
            f"with --overwrite), so {name} is no longer this dataset's; open the dataset again",
            path=self.remote.url)

    def _replaced(self) -> bool:
        """True when the URL no longer holds the manifest this reader opened."""
        try:
            return read_remote_manifest(self.remote)[0] != self.manifest
        except (UnfinishedDatasetError, ManifestError):  # gone, or another (unreadable) manifest
            return True
        except PackerError:  # the server cannot say: report the original error
            return False


class RemoteShards(RemoteFiles):
    """:class:`RemoteFiles` for other tools' shards at a URL: no manifest, so each download is
    checked by the size the listing gave (there is no SHA-256 to check it against)."""

    def _replaced(self) -> bool:
        return False


def remote_shards(urls: Sequence[str], storage_options: dict[str, Any] | None = None, cache_dir: str | None = None,
                  cache_limit: int | str | None = None) -> RemoteShards:
    """The opener of shard files at ``urls`` (other tools' tar or TFRecord shards under one
    prefix) through the node cache, built from one listing of the prefix. ShardSpecError for
    URLs under several prefixes or names the listing lacks (naming them)."""
    from ..description.manifest import FileEntry
    from .nodecache import NodeCache
    from .shardspec import ShardSpecError

    prefixes = sorted({u.rsplit("/", 1)[0] for u in urls})
    if len(prefixes) != 1:
        raise ShardSpecError(f"shard URLs under {len(prefixes)} prefixes ({', '.join(prefixes[:2])}, ...): a list of "
                             f"shards is read from one prefix")
    remote = Remote(prefixes[0], dict(storage_options or {}))
    fs, path = remote.filesystem()
    listed = {posixpath.basename(e["name"].rstrip("/")): e
              for e in call(remote.url, fs.ls, path, detail=True) if e.get("type") != "directory"}
    names = [u.rsplit("/", 1)[1] for u in urls]
    missing = [remote.join(n) for n in names if n not in listed]
    if missing:
        what = "none of them exists" if len(missing) == len(names) else f"{len(missing)} of {len(names)} do not exist"
        raise ShardSpecError(f"shard URLs under {remote.url}: {what}: {', '.join(missing[:3])}"
                             + (", ..." if len(missing) > 3 else ""))
    # the listing (names, sizes, versions) names this copy in the node cache: changed shards get a new one
    rows = [[n, int(listed[n]["size"]), str(listed[n].get("ETag") or listed[n].get("LastModified") or "")]
            for n in names]
    entries = [FileEntry(n, 0, size, "", 0) for n, size, _ in rows]
    listing = Manifest(format="", num_samples=0, classes=[], processing={}, files=entries, layout={"foreign": True})
    cache = NodeCache(cache_dir, cache_limit)
    raw = json.dumps(["shards", remote.url, rows]).encode()
    return RemoteShards(remote, listing, cache, cache.view(remote.url, raw, write_manifest=False))


def open_remote(url: str, storage_options: dict[str, Any] | None = None, cache_dir: str | None = None,
                cache_limit: int | str | None = None, formats: Collection[str] | None = None
                ) -> tuple[Manifest, RemoteFiles]:
    """The manifest of the dataset at ``url`` (its ``format`` one of ``formats`` when given) and
    the opener of its files through the node cache (see :class:`packer.storage.nodecache.NodeCache`
    for ``cache_dir`` and ``cache_limit``)."""
    from .nodecache import NodeCache

    remote = Remote(url, dict(storage_options or {}))
    manifest, raw = read_remote_manifest(remote, formats)
    cache = NodeCache(cache_dir, cache_limit)
    return manifest, RemoteFiles(remote, manifest, cache, cache.view(remote.url, raw))


def local_copy(url: str, storage_options: dict[str, Any] | None = None, cache_dir: str | None = None,
               cache_limit: int | str | None = None, formats: Collection[str] | None = None) -> tuple[str, list[str]]:
    """Every file of the dataset at ``url`` in the node cache: the local folder (a packed dataset
    with its manifest) and the problems met, one line each (a file that cannot be fetched, or
    whose download does not match the manifest's SHA-256, is left out of the folder). The whole
    dataset must fit in ``cache_limit`` at once: CacheFullError saying the limit it needs when not.
    ``formats`` as for :func:`open_remote`."""
    from .nodecache import CacheFullError

    manifest, files = open_remote(url, storage_options, cache_dir, cache_limit, formats)
    limit = files.cache.limit
    if limit is not None:
        need = files.cache.disk_bytes([f.bytes for f in manifest.files]
                                      + [os.path.getsize(os.path.join(files.view, MANIFEST_NAME))])
        if need > limit:
            raise CacheFullError(f"{url}: a local copy (to verify, inspect or convert it) needs every file in the node "
                                 f"cache at once, {need:,} bytes on disk, more than cache_limit ({limit:,} bytes); "
                                 f"raise --cache-limit to at least {need:,} bytes")
    problems = []
    for f in manifest.files:
        try:
            os.close(files(f.name))
        except (CorruptDataError, RemoteError) as e:
            problems.append(f"{files.remote.join(f.name)}: {e}")
    return files.view, problems


def upload_converted(local: str, url: str, storage_options: dict[str, Any] | None, overwrite: bool) -> None:
    """Publish the packed dataset in ``local`` at ``url`` (files first, manifest last); refused
    when ``url`` already holds a dataset and ``overwrite`` is false."""
    from ..description.manifest import read_manifest

    uploader = Uploader(check_remote_destination(url, storage_options, overwrite))
    uploader.finish(local, read_manifest(local))


class Uploader:
    """Uploads a conversion's files to ``remote`` as they are finished, and the manifest last.

    What was uploaded is recorded at ``remote`` in ``.packer-upload.json`` (name -> SHA-256), so a
    resumed or repeated conversion, which writes the same bytes, uploads each file once. When the
    destination holds a dataset already (``--overwrite``), nothing is uploaded before
    :meth:`finish`, which never rewrites an object the live manifest names: a new file whose name
    the live dataset uses for other bytes is uploaded under a new name (``shard-000001.g1a2b3c4d.tar``:
    a generation from the new manifest's digest; :func:`generation_name`), then the new manifest
    replaces the old one, then the old files it no longer names are removed. Readers that open
    the dataset before the switch read the old one whole, those after it the new one; a reader
    already open fails on its next download of a removed file with an error, never a mix."""

    JOURNAL = ".packer-upload.json"

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        self.fs, self.path = remote.filesystem()
        self.live = call(remote.url, self.fs.exists, self._at(MANIFEST_NAME))
        self.done: dict[str, str] = {}
        if call(remote.url, self.fs.exists, self._at(self.JOURNAL)):
            try:
                self.done = {str(k): str(v) for k, v in json.loads(call(remote.url, self.fs.cat_file,
                                                                         self._at(self.JOURNAL))).items()}
            except (ValueError, AttributeError):
                self.done = {}

    def _at(self, name: str) -> str:
        return posixpath.join(self.path, name)

    def upload(self, local: str, entries: Iterable[tuple[str, str]]) -> None:
        """Upload the finished files ``(name, sha256)`` of the folder ``local`` not uploaded yet
        (nothing while a live dataset is at the destination: see the class docstring)."""
        if self.live:
            return
        todo = [(n, h) for n, h in entries if self.done.get(n) != h]
        for name, sha in todo:
            call(self.remote.join(name), self.fs.put_file, os.path.join(local, name), self._at(name))
            self.done[name] = sha
        if todo:
            call(self.remote.url, self.fs.pipe_file, self._at(self.JOURNAL), json.dumps(self.done).encode())

    def finish(self, local: str, manifest: Manifest) -> Manifest:
        """Upload what is left, then the manifest; remove the upload record and stale files.
        Returns the manifest as uploaded (files renamed where they met live names)."""
        old: dict[str, str] = {}
        data = None
        if self.live:
            try:
                old = {f.name: f.sha256 for f in read_remote_manifest(self.remote)[0].files}
            except PackerError:  # an unreadable old manifest: its files are left where they are
                old = {}
            gen = "g" + hashlib.sha256(manifest.dumps()).hexdigest()[:8]
            names = {f.name: (generation_name(f.name, gen) if f.name in old and old[f.name] != f.sha256 else f.name)
                     for f in manifest.files}
            self.live = False
            for f in manifest.files:
                if names[f.name] != f.name or (f.name not in old and self.done.get(f.name) != f.sha256):
                    call(self.remote.join(names[f.name]), self.fs.put_file, os.path.join(local, f.name),
                         self._at(names[f.name]))
            manifest = replace(manifest, files=[replace(f, name=names[f.name]) for f in manifest.files])
            data = manifest.dumps()
        else:
            self.upload(local, [(f.name, f.sha256) for f in manifest.files])
        if data is None:
            call(self.remote.join(MANIFEST_NAME), self.fs.put_file, os.path.join(local, MANIFEST_NAME),
                 self._at(MANIFEST_NAME))
        else:
            call(self.remote.join(MANIFEST_NAME), self.fs.pipe_file, self._at(MANIFEST_NAME), data)
        for name in sorted(set(old) - {f.name for f in manifest.files}) + [self.JOURNAL]:
            try:
                call(self.remote.join(name), self.fs.rm_file, self._at(name))
            except RemoteError:
                pass  # already gone


def generation_name(name: str, generation: str) -> str:
    """``name`` with ``generation`` after its stem: ``shard-000001.tar`` -> ``shard-000001.<gen>.tar``
    (so index files keep their shard's stem, and suffix checks still hold)."""
    stem, dot, rest = name.partition(".")
    return f"{stem}.{generation}{dot}{rest}"


def upload_folder(cache_root: str, url: str) -> str:
    """The folder of the node cache at ``cache_root`` that a conversion to ``url`` is built in
    (the same for every run to ``url``, so ``--resume`` finds it). Claim it
    (:func:`packer.files.filesystem.claim_destination`) before touching anything inside it."""
    return os.path.join(cache_root, "uploads", hashlib.sha256(Remote(url).url.encode()).hexdigest()[:16])


def check_remote_destination(url: str, storage_options: dict[str, Any] | None, overwrite: bool) -> Remote:
    """``url`` as a conversion's destination: FileExistsError when it holds a dataset already and
    ``overwrite`` is false (checked before any work, and again before the upload)."""
    remote = Remote(url, dict(storage_options or {}))
    fs, path = remote.filesystem()
    if not overwrite and call(remote.url, fs.exists, posixpath.join(path, MANIFEST_NAME)):
        raise FileExistsError(f"{url} already holds a packed dataset; pass --overwrite to replace it")
    return remote


@contextlib.contextmanager
def watch_uploads(uploader: Uploader, dst: str, every: float = 0.5) -> Iterator[None]:
    """While the body converts into the local ``dst``, upload every file its journal lists as
    finished (the journal is written at each checkpoint: a finished shard). An upload error is
    raised when the body ends."""
    from ..files.filesystem import temp_dir_for
    from ..files.journal import read_journal

    tmp = temp_dir_for(dst)
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        while not errors:
            finished = stop.wait(every)
            journal = read_journal(tmp) if os.path.isdir(tmp) else None
            files = journal.writer.get("files", []) if journal is not None else []
            try:
                uploader.upload(tmp, [(f["name"], f["sha256"]) for f in files if os.path.exists(os.path.join(tmp, f["name"]))])
            except Exception as e:  # noqa: BLE001 - raised in the converting thread
                if os.path.isdir(tmp):  # else the folder was just published: finish() uploads from there
                    errors.append(e)
            if finished:
                return

    thread = threading.Thread(target=run, daemon=True, name="packer-upload")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    if errors:
        raise errors[0]
