"""The conversion engine every writer shares: scan -> process (worker processes) -> write -> manifest.

Determinism: the sample order is fixed before any work starts (folder order, or a permutation from
the recorded seed), workers process chunks of that order, and the single writer consumes results
strictly in order. So the output is the same whatever ``workers`` is.

Robustness: workers are separate processes (``spawn``: no inherited threads or locks); a Python
exception on one image becomes a skip with the file and the reason; a worker that dies (segfault,
OOM kill) raises a clear error instead of hanging; Ctrl-C stops the workers and the writer. The
output is built in a hidden sibling folder and published by rename only once the manifest is in,
so a reader never sees half a dataset under the destination name.
"""

from __future__ import annotations

import collections
import functools
import multiprocessing
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from . import __version__
from .converters.base import WriterOptions
from .errors import ImageError, PackerError, SourceError
from .imageproc import ProcessedImage, ProcessOptions, process_image
from .manifest import Manifest, Skipped, fsync_dir, write_manifest
from .registry import writer_class
from .scan import Sample, scan_imagefolder

__all__ = [
    "ConvertOptions",
    "ConvertReport",
    "convert_imagefolder",
    "temp_dir_for",
    "publish",
    "ordered_map",
    "write_packed",
]

_CHUNK = 16  # samples per task sent to a worker
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert: image processing, parallelism, order, failure policy, format options."""

    processing: ProcessOptions = ProcessOptions()
    writer: WriterOptions = WriterOptions()
    workers: int = 1
    shuffle: bool = True
    seed: int = 0
    strict: bool = False
    overwrite: bool = False
    progress: bool = False


@dataclass
class ConvertReport:
    """What a conversion did."""

    output: str
    manifest: Manifest
    seconds: float
    skipped: list[Skipped] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Images written per second."""
        return self.manifest.num_samples / self.seconds if self.seconds > 0 else 0.0


Result = tuple[ProcessedImage | None, str | None]  # (image, None) or (None, reason)


def _process_file(path: str, opts: ProcessOptions) -> Result:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return None, f"cannot read: {e.strerror or e}"
    try:
        return process_image(data, opts), None
    except ImageError as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - any decoder failure is a skip with the reason
        return None, f"{type(e).__name__}: {e}"


def _process_chunk(paths: Sequence[str], opts: ProcessOptions) -> list[Result]:
    return [_process_file(p, opts) for p in paths]


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    import cv2

    cv2.setNumThreads(1)


def ordered_map(
    fn: Callable[[Sequence[T]], list[R]], items: Sequence[T], workers: int, name: Callable[[int], str] = str
) -> Iterator[R]:
    """``fn`` over chunks of ``items`` in ``workers`` spawned processes (0 or 1: this process),
    results yielded in item order. ``fn`` must be picklable (a module-level function or a
    ``functools.partial`` of one); ``name(i)`` names item ``i`` in the error raised when a worker dies.
    """
    if workers <= 1:
        for start in range(0, len(items), _CHUNK):
            yield from fn(items[start : start + _CHUNK])
        return
    ctx = multiprocessing.get_context("spawn")
    window = workers * 4
    pending: collections.deque[tuple[int, Future[list[R]]]] = collections.deque()
    it = iter(range(0, len(items), _CHUNK))
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker) as pool:
        try:
            for start in it:
                pending.append((start, pool.submit(fn, items[start : start + _CHUNK])))
                if len(pending) >= window:
                    break
            while pending:
                start, fut = pending.popleft()
                try:
                    chunk = fut.result()
                except BrokenProcessPool:
                    raise PackerError(
                        f"a worker process died while processing {name(start)} or one of "
                        f"the {_CHUNK - 1} after it (killed, out of memory, or a decoder crash)"
                    ) from None
                nxt = next(it, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(fn, items[nxt : nxt + _CHUNK])))
                yield from chunk
        except BaseException:
            for _, fut in pending:
                fut.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _results(samples: Sequence[Sample], opts: ProcessOptions, workers: int) -> Iterator[Result]:
    """Processed results in sample order, from ``workers`` processes (0 or 1: this process)."""
    paths = [s.path for s in samples]
    return ordered_map(functools.partial(_process_chunk, opts=opts), paths, workers, paths.__getitem__)


def temp_dir_for(dst: str) -> str:
    """The hidden sibling folder a conversion of ``dst`` is built in."""
    parent, name = os.path.split(os.path.abspath(dst))
    return os.path.join(parent, f".{name}.packer-tmp")


def publish(tmp: str, dst: str, overwrite: bool) -> None:
    """Move a finished dataset from ``tmp`` to ``dst``; an existing ``dst`` is replaced only after
    the new one is complete, so a failure leaves the old dataset in place."""
    parent = os.path.dirname(os.path.abspath(dst))
    old = None
    if os.path.lexists(dst):
        if not overwrite:
            raise FileExistsError(f"destination exists: {dst} (use --overwrite to replace it)")
        old = os.path.join(parent, f".{os.path.basename(os.path.abspath(dst))}.packer-old")
        if os.path.lexists(old):
            shutil.rmtree(old)
        os.replace(dst, old)
    os.replace(tmp, dst)
    fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


#: One sample on its way to a writer: (key, label, image, None), or (key, label, None, reason) for a skip.
Item = tuple[str, int, ProcessedImage | None, str | None]


def write_packed(
    dst: str,
    fmt: str,
    items: Iterable[Item],
    template: Manifest,
    options: ConvertOptions,
    *,
    total: int | None = None,
    source: str = "",
) -> Manifest:
    """Write ``items`` with ``fmt``'s writer into the hidden sibling of ``dst``, then the manifest,
    then publish by rename: the part every conversion shares (imagefolder or packed source).

    ``template`` holds what is known before writing (classes, processing, shuffle seed, source,
    ignored counts, and skips found before writing, listed after the items' skips); ``num_samples``,
    ``files``, ``layout`` and ``skipped`` are filled in here. Items without an image are listed as
    skipped, never written (``strict`` is the caller's: raise from ``items``). The writer's optional
    ``begin`` hook gets the dataset facts before the first sample. On any failure, Ctrl-C included,
    the temporary folder is removed and ``dst`` is left as it was.
    """
    tmp = temp_dir_for(dst)
    if os.path.lexists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    skipped: list[Skipped] = []
    index = 0
    writer = None
    closed = False
    try:
        from tqdm import tqdm

        writer = writer_class(fmt)(tmp, options.writer)
        info = template.to_json()
        for k in ("num_samples", "files", "layout", "skipped", "ignored"):
            del info[k]
        writer.begin({**info, "format": fmt})
        bar = tqdm(total=total, unit="img", disable=not options.progress, file=sys.stderr,
                   dynamic_ncols=True, desc=f"convert -> {fmt}")
        with bar:
            for key, label, image, reason in items:
                if image is None:
                    skipped.append(Skipped(key, reason or "unknown error"))
                else:
                    writer.add(index, key, label, image)
                    index += 1
                bar.update(1)
        if index == 0:
            raise SourceError(f"no image in {source or dst} could be converted ({len(skipped)} skipped)")
        files, layout = writer.close()
        closed = True
        manifest = replace(template, format=fmt, num_samples=index, files=files, layout=layout,
                           skipped=skipped + list(template.skipped))
        write_manifest(tmp, manifest)
        publish(tmp, dst, options.overwrite)
    except BaseException:
        if writer is not None and not closed:
            writer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def convert_imagefolder(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], fmt: str, options: ConvertOptions = ConvertOptions()
) -> ConvertReport:
    """Convert an ImageFolder at ``src`` into a packed dataset of format ``fmt`` at ``dst``.

    Bad images are skipped and listed in the report and the manifest (``strict``: the first one
    raises ImageError). Raises SourceError for an unusable source and FileExistsError when ``dst``
    exists and ``overwrite`` is false.
    """
    t0 = time.perf_counter()
    src, dst = os.fspath(src), os.fspath(dst)
    writer_class(fmt)  # an unknown format fails before any work
    if os.path.lexists(dst) and not options.overwrite:
        raise FileExistsError(f"destination exists: {dst} (use --overwrite to replace it)")
    if os.path.abspath(dst).startswith(os.path.abspath(src) + os.sep):
        raise SourceError(f"destination {dst} is inside the source folder {src}")
    scan = scan_imagefolder(src)
    if options.strict and scan.errors:
        path, reason = scan.errors[0]
        raise SourceError(f"{path}: {reason}")
    samples = scan.samples
    if options.shuffle:
        perm = np.random.default_rng(options.seed).permutation(len(samples))
        samples = [samples[i] for i in perm]

    def items() -> Iterator[Item]:
        for sample, (image, reason) in zip(samples, _results(samples, options.processing, options.workers)):
            if image is None and options.strict:
                raise ImageError(f"{sample.path}: {reason}")
            yield sample.relpath.replace(os.sep, "/"), sample.label, image, reason

    template = Manifest(
        format=fmt,
        num_samples=0,
        classes=scan.classes,
        processing=options.processing.to_json(),
        files=[],
        shuffle_seed=options.seed if options.shuffle else None,
        skipped=[Skipped(os.path.relpath(p, src), r) for p, r in scan.errors],
        ignored={"hidden": len(scan.ignored_hidden), "not_images": len(scan.ignored_other)},
        source={"kind": "imagefolder", "empty_classes": scan.empty_classes},
        created_by=f"packer {__version__}",
    )
    manifest = write_packed(dst, fmt, items(), template, options, total=len(samples), source=src)
    return ConvertReport(dst, manifest, time.perf_counter() - t0, list(manifest.skipped), scan.errors)

