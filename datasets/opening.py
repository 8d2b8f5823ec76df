"""``open_dataset``: a packed dataset (a folder, a URL, a list of shards or a brace pattern)
opened with the reader its manifest's ``format`` names, or with ``format`` for other tools' files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from packer.description.manifest import MANIFEST_NAME
from packer.description.samples import TABLE_NAME
from packer.errors import UnfinishedDatasetError
from packer.formats import (
    FORMATS,
    explain_missing_manifest,
    format_names,
    get_format,
    read_manifest,
    reader_class,
    shard_format,
    shard_suffixes,
)
from packer.storage.ranges import RANGE_FORMATS, REMOTE_MODES
from packer.storage.remote import is_url
from packer.storage.shardspec import ShardList, ShardSpecError, resolve_paths

from .base import PackedDataset
from .formats.shards import listed_shards

__all__ = ["open_dataset", "listed_format"]


def open_dataset(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, format: str | None = None,
                 remote: str | None = None, **kwargs: Any) -> PackedDataset:
    """Open a packed dataset, choosing the reader from its manifest's ``format`` field.

    Keyword arguments go to the reader: ``transform``, ``target_transform``, ``output``
    (``"tensor"``, ``"numpy"`` or ``"pil"``), ``verify``, ``on_error``. Raises
    UnfinishedDatasetError when the directory has no manifest.

    ``format`` opens data written by another tool, which has no manifest: ``"tar"`` for
    WebDataset shards (``KEY.jpg``/``.png``/... + ``KEY.cls``), ``"tfrecord"`` for TFRecord
    files of ``image/encoded`` + ``image/class/label`` Examples. The index is built by one scan at
    open and the manifest synthesised in memory (classes are the labels as strings). A directory
    that does have a manifest is opened from it, and must then be of that format.

    ``path`` may be a URL (``s3://bucket/data``, ``gs://...``, ``https://...``; needs the
    matching extra, e.g. ``pip install 'packer[s3]'``): ``storage_options`` go to fsspec, and the
    files are downloaded on first use into the node cache ``cache_dir`` (default
    ``PACKER_CACHE_DIR``, else ``~/.cache/packer``), which keeps at most ``cache_limit`` bytes
    (e.g. ``"20GB"``) and is shared by every process on the machine. Opening reads the manifest
    only (no listing, no request per shard): a tar or TFRecord shard's index file is fetched the
    first time a process reads that shard (``ds.load_indexes()`` fetches them all). ``remote``
    chooses how: ``"range"`` (the default for tar, TFRecord and HDF5) fetches the index files and
    the sample table once, then each ``ds[i]`` is one ranged GET of that record (with the fields
    asked for), its checksum checked as for a local file; ``"whole"`` downloads each file whole into the node
    cache on first use and reads it from there (LMDB's default and only way: its records are
    found through the file's B-tree pages). ``StreamingDataset`` reads whole shards.

    ``path`` may also name the shards of one dataset (tar or TFRecord, packer's or another
    tool's): a list of shard files, or a brace pattern (``data/shard-{000000..000009}.tar``) as
    ``packer info`` prints it. The format comes from the files' endings (``format`` for names
    without one); the shards must lie in one folder (or under one URL prefix) and are read in the
    order given. A list that is exactly a packer dataset's shards opens that dataset from its
    manifest. Other tools' shards at URLs are all downloaded into the node cache at open (one scan
    builds their index), so they must fit in ``cache_limit`` together. A list of dataset folders
    is a mixture (:class:`StreamingDataset`); files mixed with folders, mixed endings or a pattern
    that matches nothing raise ShardSpecError naming what was found.
    """
    if remote is not None and remote not in REMOTE_MODES:
        raise ValueError(f"remote must be one of {REMOTE_MODES} (or None: the format's default), not {remote!r}")
    listed = resolve_paths(path, shard_suffixes())
    if listed is not None:
        return _open_listed(listed, format, remote=remote, **kwargs)
    if is_url(path):
        return _open_url(os.fspath(path), format, remote=remote, **kwargs)
    path = os.path.expanduser(os.fspath(path))
    if format is None or os.path.exists(os.path.join(path, MANIFEST_NAME)):
        try:
            manifest = read_manifest(path)
        except UnfinishedDatasetError as e:
            raise explain_missing_manifest(e, path) from None
        if format is not None and manifest.format != format:
            raise ValueError(f"{os.fspath(path)} holds a {manifest.format!r} dataset, not {format!r}")
        ds = reader_class(manifest.format)(path, manifest=manifest, **kwargs)
        ds._ensure_cache()
        return ds
    open_foreign = getattr(reader_class(format), "open_foreign", None)
    if open_foreign is None:
        raise ValueError(f"format {format!r} cannot be read without a packer manifest")
    ds = open_foreign(path, **kwargs)
    ds._ensure_cache()
    return ds


def _open_listed(listed: ShardList, format: str | None, remote: str | None = None, **kwargs: Any) -> PackedDataset:
    """open_dataset for a list of shard files or a brace pattern (see there)."""
    if listed.datasets:
        if len(listed.datasets) == 1:  # a list or a pattern that names one dataset
            return open_dataset(listed.datasets[0], format=format, remote=remote, **kwargs)
        raise ShardSpecError(f"{len(listed.datasets)} datasets ({', '.join(listed.datasets[:2])}, ...): a list of "
                             f"datasets is a mixture; read it with StreamingDataset([...]), or give shard files for "
                             f"one dataset")
    fmt = listed_format(listed.files, format)
    folder, names = listed_shards(listed.files)  # one folder (or URL prefix), or ShardSpecError
    if is_url(listed.files[0]):
        return _open_listed_urls(listed, folder, fmt, names, remote=remote, **kwargs)
    if os.path.exists(os.path.join(folder, MANIFEST_NAME)):
        manifest = read_manifest(folder)
        if manifest.format == fmt and names == [f.name for f in manifest.files if f.samples]:
            return open_dataset(folder, **kwargs)  # all of a packer dataset's shards: the dataset itself
    if not get_format(fmt).foreign:
        raise ShardSpecError(f"{fmt} data is one file with its manifest, not shards: open its folder")
    ds = reader_class(fmt).open_foreign(list(listed.files), **kwargs)  # type: ignore[attr-defined]
    ds._ensure_cache()
    return ds


def _open_listed_urls(listed: ShardList, folder: str, fmt: str, names: list[str], *,
                      storage_options: dict[str, Any] | None = None, cache_dir: str | None = None,
                      cache_limit: int | str | None = None, remote: str | None = None, **kwargs: Any) -> PackedDataset:
    """Shard URLs: all of a packer dataset's shards open that dataset; other shards are
    downloaded into the node cache (all at once: the index is built by one scan at open) and read
    from there, fetched again if the cache evicts them."""
    from packer.storage.remote import Remote, read_remote_manifest, remote_shards

    mode, options = remote, dict(storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
    try:
        manifest = read_remote_manifest(Remote(folder, dict(storage_options or {})), format_names())[0]
    except UnfinishedDatasetError:
        manifest = None
    if manifest is not None and manifest.format == fmt and names == [f.name for f in manifest.files if f.samples]:
        return _open_url(folder, fmt, remote=mode, **options, **kwargs)
    if not get_format(fmt).foreign:
        raise ShardSpecError(f"{fmt} data is one file with its manifest, not shards: open its URL")
    if mode == "range":
        raise ValueError(f"{listed.pattern or folder}: other tools' shards have no index to read records by range "
                         f"from (one scan of every shard builds it): open them with remote='whole'")
    files = remote_shards(listed.files, storage_options, cache_dir, cache_limit)
    limit, sizes = files.cache.limit, [f.bytes for f in files.manifest.files]
    if limit is not None and files.cache.disk_bytes(sizes) > limit:
        raise ShardSpecError(f"{listed.pattern or folder}: opening other tools' shards scans every one, so all "
                             f"{len(sizes)} ({sum(sizes):,} bytes) must fit in cache_limit ({limit:,} bytes) at once")
    held: list[int] = []
    try:
        for n in names:
            held.append(files(n))  # downloaded, and kept from eviction while they are scanned
        ds = reader_class(fmt).open_foreign([os.path.join(files.view, n) for n in names],  # type: ignore[attr-defined]
                                            remote_files=files, **kwargs)
    finally:
        for fd in held:
            os.close(fd)
    ds.url = folder
    ds._ensure_cache()
    return ds


def listed_format(files: Sequence[str], format: str | None) -> str:
    """The format of a list of shard files, from their endings (``format`` for files without a
    known ending); ShardSpecError for mixed endings, an unknown one without ``format``, or a
    ``format`` that the endings contradict."""
    found: dict[str | None, list[str]] = {}
    for f in files:
        found.setdefault(shard_format(os.path.basename(f)), []).append(os.path.basename(f))
    _refuse_companions(found)
    known = [k for k in found if k is not None]
    if len(known) > 1:
        parts = "; ".join(f"{len(v)} {k} ({v[0]}{', ...' if len(v) > 1 else ''})" for k, v in found.items() if k)
        raise ShardSpecError(f"shards of different formats: {parts}; give one format's shards")
    if format is not None:
        get_format(format)  # an unknown name fails here
        if known and known[0] != format:
            raise ShardSpecError(f"{found[known[0]][0]} is named as {known[0]} data, not {format!r}")
        return format
    if None in found:
        endings = ", ".join(shard_suffixes())
        sharded = ", ".join(repr(f.name) for f in FORMATS.values() if f.shard_suffixes)
        raise ShardSpecError(f"cannot tell the format of {found[None][0]} from its name (shard endings: {endings}); "
                             f"pass format= ({sharded})")
    return known[0]


def _refuse_companions(found: dict[str | None, list[str]]) -> None:
    """ShardSpecError for a listed file that is not a shard but lies beside shards: an index file
    (``shard-000000.pkidx`` or ``.idx`` next to ``shard-000000.tar``: what ``glob("shard-*")``
    catches) or a packed dataset's own manifest or sample table."""
    shards = {n.split(".", 1)[0]: n for k, names in found.items() if k is not None for n in names}
    for name in found.get(None, []):
        if name in (MANIFEST_NAME, TABLE_NAME):
            raise ShardSpecError(f"{name} is a packed dataset's own file, not a shard; open the dataset's folder, "
                                 f"or list only its data files")
        shard = shards.get(name.split(".", 1)[0])
        if shard is not None:
            stem, suffix = shard.split(".", 1)
            pattern = (stem.rsplit("-", 1)[0] + "-" if "-" in stem else "") + "*." + suffix
            raise ShardSpecError(f"{name} is not a shard but the index file beside {shard}; list only the data "
                                 f"files: a pattern that ends with their suffix ({pattern}), or the list "
                                 f"`packer info --shards DIR` prints")


def _open_url(url: str, format: str | None, *, storage_options: dict[str, Any] | None = None,
              cache_dir: str | None = None, cache_limit: int | str | None = None, remote: str | None = None,
              **kwargs: Any) -> PackedDataset:
    """open_dataset for a packed dataset at a URL: its records read by range, or its files
    whole through the node cache (``remote``; see open_dataset)."""
    from packer.storage.ranges import RangeFiles
    from packer.storage.remote import open_remote

    manifest, files = open_remote(url, storage_options, cache_dir, cache_limit, format_names())
    if format is not None and manifest.format != format:
        raise ValueError(f"{url} holds a {manifest.format!r} dataset, not {format!r}")
    if remote == "range" and manifest.format not in RANGE_FORMATS:
        raise ValueError(f"{url}: {manifest.format} data is read whole (remote='whole'): its records are found "
                         f"through the file's own pages, not at offsets an index gives; reading by range is for "
                         f"{', '.join(RANGE_FORMATS)}")
    if remote != "whole" and manifest.format in RANGE_FORMATS:
        files = RangeFiles(files.remote, manifest, files.cache, files.view, fallback=remote is None)
    ds = reader_class(manifest.format)(files.view, manifest=manifest, remote_files=files, **kwargs)
    ds.url = url
    ds._ensure_cache()
    return ds
