"""The Python API of a conversion: :func:`convert` (``packer convert`` as a function) and
:func:`pack` (a dataset from any iterable and a function that makes each sample)."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .cli import UsageError, convert_arguments, convert_from_args, convert_options
from .engine import ConvertReport

__all__ = ["convert", "pack", "RESERVED_FIELDS"]

#: Sample dict names kept for masks and boxes, which :func:`pack` does not store yet.
RESERVED_FIELDS = ("mask", "boxes", "box_labels")

#: ``packer convert`` options that :func:`pack` takes (the rest name a source or a destination URL).
_PACK_OPTIONS = ("resize", "encode", "upscale", "max_pixels", "exact_decode", "keep_damaged_jpeg", "workers", "seed",
                 "no_shuffle", "strict", "overwrite", "resume", "checkpoint_samples", "quiet", "log_interval",
                 "shard_size", "shard_samples", "gzip", "prefix")


def convert(src_format: str, dst_format: str, src: str | os.PathLike[str], dst: str | os.PathLike[str],
            **options: Any) -> ConvertReport | None:
    """Convert ``src`` (an image folder, a list file or a packed dataset) of ``src_format`` into
    ``dst`` of ``dst_format``, as ``packer convert SRC_FORMAT DST_FORMAT SRC DST`` does, and return
    the conversion's report (``report.manifest``, ``report.skipped``, ``report.seconds``).

    ``options`` are the command's flags as keyword arguments, ``-`` written ``_``:
    ``resize="shorter:256"``, ``encode="jpeg:90"``, ``workers=8``, ``shard_size="256MB"``,
    ``no_shuffle=True``, ``quiet=True``, ``storage_option={"client_kwargs": {...}}``, ...; see
    ``packer convert --help``. The same code runs as for the command line, so the same
    arguments write the same bytes. Under ``torchrun`` an image folder converts in parts, one per
    rank (``no_torchrun=True`` converts in this process alone); ranks other than 0 return None.

    TypeError for an unknown option (naming those taken); ValueError for a bad value or
    combination; the conversion's own errors as the command line reports them (FileExistsError
    when ``dst`` exists without ``overwrite=True``, SourceError, ...).
    """
    from .distributed import torchrun_launch

    a = convert_arguments(src_format, dst_format, src, dst, options)
    launch = None if a.no_torchrun else torchrun_launch()
    try:
        return convert_from_args(a, launch)
    except UsageError as e:
        raise ValueError(str(e).replace("packer convert", "packer.convert")) from None


def pack(inputs: Iterable[Any], dst: str | os.PathLike[str], format: str, fn: Callable[[Any], dict[str, Any]] | None = None,
         *, classes: Sequence[str] | None = None, label_kind: str = "class", **options: Any) -> ConvertReport:
    """Pack a dataset of ``format`` (lmdb, hdf5, tar, tfrecord) at ``dst`` from ``inputs``, each
    made a sample by ``fn`` (or given as samples when ``fn`` is None), and return the report.

    ``inputs``: any iterable or sequence (paths, ids, rows, ...); it is read once, into a list.
    ``fn`` runs in the ``workers`` processes (spawned: it must be picklable, a module-level
    function or a ``functools.partial`` of one) and returns a sample dict:

    - ``"image"``: a file path, the bytes of an image file, or an H x W x 3 uint8 RGB array;
    - ``"label"``: a class name or number (a list of them with ``label_kind="multi"``, a float
      with ``"number"``; see :func:`~packer.ops.items.convert_items`);
    - ``"key"`` (optional): the sample's name (default: the path, or ``item-N`` for bytes and
      arrays, N the input's position);
    - every other key: per-sample metadata (JSON values), read back by ``fields=("meta", ...)``.

    ``mask``, ``boxes`` and ``box_labels`` are reserved for masks and boxes and refused for now.
    Images are then processed as ``packer convert`` does (the same keyword ``options``:
    ``resize``, ``encode``, ``workers``, ``shard_size``, ``no_shuffle``, ``seed``, ``strict``,
    ...); bad images are skipped and listed in the report. Bytes and arrays go through a
    temporary folder beside ``dst`` (arrays as lossless PNG), so memory does not grow with the
    dataset. ``resume=True`` runs ``fn`` again and continues an interrupted pack of the same
    samples (or keeps a finished one). ``classes`` pins the class list (label ``i`` is ``classes[i]``).

    TypeError for an unknown option; ValueError or TypeError naming the input for a sample
    ``fn`` made wrong; an exception ``fn`` raises comes back naming the input.
    """
    from .items import convert_items
    from .pool import ordered_map

    if fn is not None and not callable(fn):
        raise TypeError(f"packer.pack(): fn must be callable, not {type(fn).__name__}")
    a = convert_arguments("list", format, "<inputs>", dst, options, caller="packer.pack", accepted=_PACK_OPTIONS)
    if format == "imagefolder":
        raise ValueError("packer.pack(): format must be a packed format (lmdb, hdf5, tar, tfrecord), not imagefolder")
    try:
        opts = convert_options(a)
    except UsageError as e:
        raise ValueError(str(e).replace("packer convert", "packer.pack")) from None
    values = list(inputs)
    dst = os.path.abspath(a.dst)
    parent = os.path.dirname(dst)
    os.makedirs(parent, exist_ok=True)
    spool = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.pack-", dir=parent)
    try:
        work = functools.partial(_make_samples, fn=fn, spool=spool)
        numbered = _Numbered(values)
        samples = list(ordered_map(work, numbered, opts.workers, lambda i: f"input {i}"))
        order = range(len(samples))
        if opts.shuffle:
            import numpy as np

            order = np.random.default_rng(opts.seed).permutation(len(samples)).tolist()
        items = [samples[i][1:] for i in order]
        keys = [samples[i][0] for i in order]
        return convert_items(items, dst, format, opts, classes, label_kind=label_kind, keys=keys,
                             source={"kind": "pack", "inputs": len(values)},
                             shuffle_seed=opts.seed if opts.shuffle else None, record_files=False)
    finally:
        shutil.rmtree(spool, ignore_errors=True)


class _Numbered(Sequence[tuple[int, Any]]):
    """``(position, input)`` pairs, made when sliced (what :func:`ordered_map` sends a worker)."""

    def __init__(self, values: list[Any]) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [(k, self.values[k]) for k in range(*i.indices(len(self)))]
        return i, self.values[i]


def _make_samples(chunk: Sequence[tuple[int, Any]], fn: Callable[[Any], Any] | None,
                  spool: str) -> list[tuple[str, str, Any, dict[str, Any] | None]]:
    """In a worker: ``fn`` over a chunk of inputs, each sample as ``(key, image path, label,
    metadata)``, images given as bytes or arrays written into ``spool``."""
    out = []
    for i, value in chunk:
        if fn is None:
            sample = value
        else:
            try:
                sample = fn(value)
            except Exception as e:
                if not _rebuildable(e):
                    raise
                raise type(e)(f"input {i}: fn raised {type(e).__name__}: {e}") from e
        out.append(_sample_item(i, sample, spool))
    return out


def _rebuildable(e: Exception) -> bool:
    """The exception's type can be rebuilt from one message (so the input's position can be added)."""
    try:
        return type(type(e)(str(e))) is type(e)
    except Exception:  # noqa: BLE001 - a constructor that takes other arguments
        return False


def _sample_item(i: int, sample: Any, spool: str) -> tuple[str, str, Any, dict[str, Any] | None]:
    """One sample dict checked and made an item; TypeError/ValueError naming the input."""
    if not isinstance(sample, dict):
        raise TypeError(f"input {i}: a sample must be a dict with 'image' and 'label', not {type(sample).__name__}")
    reserved = [k for k in RESERVED_FIELDS if k in sample]
    if reserved:
        raise ValueError(f"input {i}: {reserved[0]!r} is reserved for masks and boxes, which packer.pack does not "
                         f"store yet; give the value another name to keep it as metadata")
    missing = [k for k in ("image", "label") if k not in sample]
    if missing:
        raise ValueError(f"input {i}: the sample has no {missing[0]!r} (it has {', '.join(map(repr, sample)) or 'nothing'})")
    image, key = sample["image"], sample.get("key")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"input {i}: 'key' must be a string, not {type(key).__name__}")
    if isinstance(image, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(image))
        key = key if key is not None else os.fspath(image).replace(os.sep, "/")
    else:
        path = os.path.join(spool, f"{i:010d}")
        write_spooled(path, _image_bytes(i, image))
        key = key if key is not None else f"item-{i:010d}"
    meta = {k: v for k, v in sample.items() if k not in ("image", "label", "key")}
    return key, path, sample["label"], meta or None


def write_spooled(path: str, data: bytes) -> None:
    """Write an image's bytes to ``path`` in a spool folder. A conversion knows a file by its size
    and modification time: the time is set from the content, so the same sample spooled again (a
    resumed conversion) is the same file to it."""
    with open(path, "wb") as f:
        f.write(data)
    stamp = int.from_bytes(hashlib.sha256(data).digest()[:7], "little")
    os.utime(path, ns=(stamp, stamp))


def _image_bytes(i: int, image: Any) -> bytes:
    """An image given as bytes or an H x W x 3 uint8 RGB array, as the bytes of an image file."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    import numpy as np

    if not isinstance(image, np.ndarray):
        raise TypeError(f"input {i}: 'image' must be a path, bytes or an H x W x 3 uint8 array, "
                        f"not {type(image).__name__}")
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
        raise ValueError(f"input {i}: an image array must be H x W x 3 uint8 (RGB), not {'x'.join(map(str, image.shape))} "
                         f"{image.dtype}")
    import cv2

    ok, buf = cv2.imencode(".png", np.ascontiguousarray(image[:, :, ::-1]), [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise ValueError(f"input {i}: OpenCV could not encode the array as PNG")
    return buf.tobytes()
