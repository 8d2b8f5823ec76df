"""Converting an explicit list of images: :func:`convert_items`, what one task of a Ray, Dask or
Spark job calls to make one part of a dataset (:func:`packer.ops.merge.merge` joins the parts)."""

from __future__ import annotations

import functools
import hashlib
import numbers
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Union

from .. import __version__
from ..errors import ImageError, PackerError
from ..filesystem import claim_destination, recover_publish
from ..imageproc import ProcessOptions
from ..journal import digest
from ..manifest import Manifest, read_manifest
from ..registry import writer_class
from .engine import (
    ConvertOptions,
    ConvertReport,
    Item,
    _process_file,
    options_fingerprint,
    ordered_map,
    process_data,
    write_packed_result,
)

__all__ = ["ImageItem", "convert_items", "item_classes"]

#: One image to convert: (a file path or the file's bytes, a class name or label, metadata).
ImageItem = tuple[Union[str, "os.PathLike[str]", bytes], str | int, dict[str, Any] | None]


def item_classes(labels: Sequence[str | int], classes: Sequence[str] | None) -> tuple[list[str], list[int]]:
    """The class list and each item's label number. Without ``classes``: the sorted names when
    every label is a name, ``"0"`` .. ``"K-1"`` when every label is a number (K = 1 + the largest).
    ValueError names the first item whose label fits neither."""
    ints = [isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in labels]
    if classes is None:
        if all(ints):
            names = [str(i) for i in range(max((int(x) for x in labels), default=-1) + 1)]
        elif not any(ints) and all(isinstance(x, str) for x in labels):
            names = sorted(set(labels))  # type: ignore[arg-type]
        else:
            raise ValueError("item labels mix class names and numbers (or hold other types); pass classes=[...]")
    else:
        names = list(classes)
    to_label = {c: i for i, c in enumerate(names)}
    out = []
    for i, (x, is_int) in enumerate(zip(labels, ints)):
        label = int(x) if is_int else to_label.get(x, -1) if isinstance(x, str) else -1  # type: ignore[call-overload]
        if not 0 <= label < len(names):
            raise ValueError(f"item {i}: label {x!r} is not one of the {len(names)} classes")
        out.append(label)
    return names, out


def _key(i: int, source: str | os.PathLike[str] | bytes, root: str | None) -> str:
    """A sample's key: the path (relative to ``root`` when given, ``/``-separated), or ``item-N``
    for an image given as bytes (N its position in the items)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"item-{i:010d}"
    path = os.fspath(source)
    if root is not None:
        path = os.path.relpath(path, root)
    return path.replace(os.sep, "/")


def _process_source(source: str | bytes, opts: ProcessOptions) -> tuple[Any, str | None]:
    return process_data(source, opts) if isinstance(source, bytes) else _process_file(source, opts)


def _process_sources(sources: Sequence[str | bytes], opts: ProcessOptions) -> list[tuple[Any, str | None]]:
    return [_process_source(s, opts) for s in sources]


def _fingerprint(sources: Sequence[str | bytes], keys: Sequence[str], labels: Sequence[int]) -> str:
    """Digest of the items: each key and label, and a file's size and modification time or the
    SHA-256 of bytes given directly."""
    rows: list[Any] = []
    for source, key, label in zip(sources, keys, labels):
        if isinstance(source, bytes):
            rows.append((key, label, hashlib.sha256(source).hexdigest()))
            continue
        try:
            st = os.stat(source)
            rows.append((key, label, st.st_size, st.st_mtime_ns))
        except OSError as e:
            rows.append((key, label, -1, str(e.strerror)))
    return digest(rows)


def convert_items(
    items: Iterable[ImageItem],
    dst: str | os.PathLike[str],
    fmt: str,
    options: ConvertOptions | None = None,
    classes: Sequence[str] | None = None,
    *,
    root: str | os.PathLike[str] | None = None,
) -> ConvertReport:
    """Convert ``items``, each ``(path or bytes, label, metadata)``, into a packed dataset of
    format ``fmt`` at ``dst``, in the order given (``options.shuffle`` and ``seed`` are not used).

    Labels are class names or numbers (see :func:`item_classes` for ``classes=None``); give the
    full ``classes`` list when parts made separately are to be merged without renumbering. Images
    are decoded and processed by ``options.workers`` processes, bad ones skipped and listed (or,
    ``strict``, raise ImageError), as for an image folder; ``options.resume`` continues an
    interrupted call with the same items, and keeps a dataset at ``dst`` that such a call finished
    (its manifest's ``source.fingerprint``: a retried task does no work twice). A path's key is the path (relative to ``root``), an
    image given as bytes is ``item-N``. ``metadata`` (a dict or None) is accepted but not stored
    yet: no format has per-sample metadata so far. FileExistsError when ``dst`` exists without
    ``overwrite``; SourceError when no image could be converted.
    """
    t0 = time.perf_counter()
    dst = os.fspath(dst)
    options = options if options is not None else ConvertOptions()
    names, labels, sources, keys = _rows(items, classes, root)
    writer_class(fmt)  # an unknown format fails before any work
    template = Manifest(format=fmt, num_samples=0, classes=names, processing=options.processing.to_json(), files=[],
                        source={"kind": "items"}, created_by=f"packer {__version__}")

    def stream(start: int) -> Iterator[Item]:
        fn = functools.partial(_process_sources, opts=options.processing)
        results = ordered_map(fn, sources[start:], options.workers, lambda k: keys[start + k])
        for key, label, (image, reason) in zip(keys[start:], labels[start:], results):
            if image is None and options.strict:
                raise ImageError(f"{key}: {reason}")
            yield key, label, image, reason

    fingerprint = {"source": _fingerprint(sources, keys, labels),
                   "options": options_fingerprint(fmt, template, options)}
    template.source["fingerprint"] = digest(fingerprint)
    with claim_destination(dst):
        recover_publish(dst)
        kept = _finished(dst, template.source["fingerprint"]) if options.resume else None
        if kept is not None:
            return ConvertReport(dst, kept, time.perf_counter() - t0, list(kept.skipped),
                                 notes=[f"kept {dst}: finished before from the same items and options"])
        if os.path.lexists(dst) and not options.overwrite:
            raise FileExistsError(f"destination exists: {dst} (use --overwrite to replace it)")
        manifest, resumed, notes = write_packed_result(dst, fmt, stream, template, options, len(sources),
                                                       f"the {len(sources)} items", fingerprint)
    return ConvertReport(dst, manifest, time.perf_counter() - t0, list(manifest.skipped), resumed=resumed, notes=notes)


def _rows(items: Iterable[ImageItem], classes: Sequence[str] | None,
          root: str | os.PathLike[str] | None) -> tuple[list[str], list[int], list[str | bytes], list[str]]:
    """Classes, labels, sources (paths or bytes) and keys of the items, checked."""
    rows = list(items)
    for i, row in enumerate(rows):
        if not isinstance(row, tuple) or len(row) != 3 or not isinstance(row[2], (dict, type(None))):
            raise TypeError(f"item {i} must be a (path or bytes, label, metadata dict or None) tuple")
    names, labels = item_classes([row[1] for row in rows], classes)
    sources = [bytes(r[0]) if isinstance(r[0], (bytes, bytearray, memoryview)) else os.fspath(r[0]) for r in rows]
    base = os.fspath(root) if root is not None else None
    return names, labels, sources, [_key(i, s, base) for i, s in enumerate(sources)]


def _finished(dst: str, fingerprint: str) -> Manifest | None:
    """The manifest of a dataset at ``dst`` that a call with the same items and options finished."""
    try:
        m = read_manifest(dst)
    except (OSError, PackerError):
        return None
    return m if m.source.get("fingerprint") == fingerprint else None
