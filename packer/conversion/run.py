"""Running a checked :class:`~packer.conversion.options.ConvertRequest`: a URL SRC fetched, a URL DST
uploaded, parts under torchrun, then the source's own conversion (the source table). What
``packer convert`` and :func:`packer.convert` both call."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ..errors import PackerError
from ..formats import format_names
from ..sources.table import get_source
from ..wording import plural
from .options import Caller, ConvertRequest, OptionError, writes_image_folder

__all__ = ["run_conversion", "pinned_classes", "remote_deadline"]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr)


def run_conversion(r: ConvertRequest, launch: Any = None) -> Any:
    """Run the conversion ``r`` (as rank ``launch.rank`` of a torchrun job when ``launch`` is not
    None) and return its ConvertReport (None on a rank other than 0, whose part rank 0 merged).
    OptionError for what the request cannot do here (a source that does not split under torchrun,
    a URL of a source read from local paths)."""
    from ..storage.remote import is_url
    from ..storage.shardspec import has_braces

    source, n = get_source(r.src_format), r.caller.name
    with remote_deadline(r.storage.remote_deadline):
        if launch is not None and not source.splits and not source.packed:
            split = f" (or {source.split_hint})" if source.split_hint else ""
            raise r.caller.error(f"a {r.src_format} source converts in one process; under torchrun add "
                                 f"{n('no_torchrun')}{split}")
        if launch is not None:
            return _convert_torchrun(r, launch)
        if is_url(r.src) and has_braces(r.src):
            r = replace(r, src=_fetched_shards(r, r.src))
        elif is_url(r.src) and not source.reads_urls:
            if not source.packed:
                raise r.caller.error("an image folder, list or COCO file is read from a local path; a URL SRC must "
                                     "be packed")
            r = replace(r, src=_fetched(r, r.src))
        if not is_url(r.dst):
            return _convert_local(r)
        return _convert_to_url(r)


def pinned_classes(spec: str, caller: Caller) -> list[str]:
    """The class list of ``classes_from``: a packed dataset's (its manifest) or a text file's (one
    name per line; blank lines ignored). OptionError saying what is wrong."""
    from ..description.manifest import MANIFEST_NAME
    from ..formats import read_manifest
    from ..pipeline.items import check_classes

    what = f"{caller.name('classes_from')} {spec}"
    try:
        if os.path.isdir(spec):
            if not os.path.exists(os.path.join(spec, MANIFEST_NAME)):
                raise caller.error(f"{what}: not a packed dataset (no manifest.json)")
            classes = read_manifest(spec).classes
        else:
            with open(spec, encoding="utf-8") as f:
                classes = [line.strip() for line in f if line.strip()]
    except (OSError, UnicodeDecodeError, PackerError) as e:
        raise caller.error(f"{what}: {e}") from None
    if not classes:
        raise caller.error(f"{what}: no class names")
    try:
        return check_classes(classes, f"{caller.prog}: {what}")
    except ValueError as e:
        raise OptionError(str(e)) from None


def _convert_local(r: ConvertRequest) -> Any:
    if r.source.classes_from is not None:
        r = replace(r, options=replace(r.options, classes=tuple(pinned_classes(r.source.classes_from, r.caller))))
    _warn_partial_output(r)
    return get_source(r.src_format).convert(r)


def _convert_to_url(r: ConvertRequest) -> Any:
    """Convert into a local folder of the node cache, uploading each file as it is finished (the
    manifest last); the folder's name comes from the URL, so resume finds it again. The folder is
    claimed before anything in it is touched and until the upload has finished, so a second
    conversion to the URL on this node is refused and removes nothing."""
    import shutil

    from ..files.filesystem import claim_destination
    from ..formats import read_manifest
    from ..storage.nodecache import NodeCache
    from ..storage.remote import Uploader, check_remote_destination, upload_folder, watch_uploads

    url = r.dst
    work = upload_folder(NodeCache(r.storage.cache_dir).root, url)
    with claim_destination(work, shown=url):
        uploader = Uploader(check_remote_destination(url, dict(r.storage.options), r.options.overwrite))
        local = os.path.join(work, "dataset")
        if os.path.lexists(local):
            shutil.rmtree(local)  # an earlier run's finished copy; the upload record says what is uploaded
        keep = False
        try:
            with watch_uploads(uploader, local):
                report = _convert_local(replace(r, dst=local))
            uploader.finish(local, read_manifest(local))
            if not r.quiet:
                print(f"uploaded to {url}")
            report.output = url
            return report
        except BaseException as e:
            keep = getattr(e, "partial_output", None) is not None
            raise
        finally:
            if not keep:
                shutil.rmtree(work, ignore_errors=True)


def _warn_partial_output(r: ConvertRequest) -> None:
    """Say, before it happens, that a run without resume deletes an interrupted run's partial output."""
    from ..files.filesystem import temp_dir_for
    from ..pipeline.engine import interrupted_samples

    if r.options.resume or writes_image_folder(r.dst_format) or (os.path.lexists(r.dst) and not r.options.overwrite):
        return
    dropped = interrupted_samples(r.dst)
    if dropped is not None:
        _say(f"packer: starting over: deleting the partial output of an interrupted conversion in "
             f"{temp_dir_for(r.dst)} ({plural(dropped, 'sample')} written); {r.caller.name('resume')} continues "
             "from it instead")


def _convert_torchrun(r: ConvertRequest, launch: Any) -> Any:
    """One rank of ``torchrun ... -m packer convert imagefolder FMT SRC DST``: a part per rank,
    merged by rank 0 (packer.conversion.distributed); the report on rank 0, None on the others."""
    from datetime import timedelta

    from ..storage.remote import is_url
    from .distributed import convert_imagefolder_torchrun, rank_timeout

    if not r.quiet:
        print(f"packer: torchrun detected: {launch.describe()}; converting one part per rank, rank 0 merges",
              flush=True)
    if not get_source(r.src_format).splits or writes_image_folder(r.dst_format) or is_url(r.dst):
        raise r.caller.error("under torchrun only an image folder converts in parts, to a local packed "
                             "destination; run other conversions without torchrun")
    timeout = rank_timeout() if r.rank_timeout is None else timedelta(seconds=r.rank_timeout)
    report = convert_imagefolder_torchrun(r.src, r.dst, r.dst_format, r.options, launch, timeout)
    return report if launch.rank == 0 else None


def _fetched(r: ConvertRequest, url: str) -> str:
    """The node cache's complete copy of the dataset at ``url`` (an error if a file is bad)."""
    from ..storage.remote import local_copy

    view, problems = local_copy(url, dict(r.storage.options), r.storage.cache_dir, r.storage.cache_limit, format_names())
    if problems:
        raise PackerError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    return view


def _fetched_shards(r: ConvertRequest, pattern: str) -> str:
    """For a brace pattern of shard URLs: the local pattern of their copies in the node cache, or
    for all of a packer dataset's shards, the node cache's copy of the dataset."""
    from packer.datasets import open_dataset

    ds = open_dataset(pattern, format=r.src_format, output="numpy", storage_options=dict(r.storage.options),
                      cache_dir=r.storage.cache_dir, cache_limit=r.storage.cache_limit)
    if not ds.manifest.layout.get("foreign"):
        return _fetched(r, ds.url)
    return os.path.join(ds.root, pattern.rsplit("/", 1)[1])  # every shard was downloaded to be scanned


@contextlib.contextmanager
def remote_deadline(seconds: float | None) -> Iterator[None]:
    """PACKER_REMOTE_DEADLINE set to ``seconds`` for the block (every Remote it makes, its worker
    processes too), as it was before once the block ends; nothing when ``seconds`` is None."""
    if seconds is None:
        yield
        return
    before = os.environ.get("PACKER_REMOTE_DEADLINE")
    os.environ["PACKER_REMOTE_DEADLINE"] = repr(seconds)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PACKER_REMOTE_DEADLINE", None)
        else:
            os.environ["PACKER_REMOTE_DEADLINE"] = before
