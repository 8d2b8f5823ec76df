"""The Python API of a conversion: :func:`convert` (``packer convert`` as a function) and
:func:`pack` (a dataset from any iterable and a function that makes each sample)."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .conversion.options import OPTIONS, Caller
from .conversion.request import convert_request
from .fields.sample import check_field_name
from .files.spool import write_spooled
from .pipeline.engine import ConvertReport

__all__ = ["convert", "pack", "RESERVED_FIELDS"]

#: Sample dict names that are fields, never metadata: the mask, the boxes and their labels.
RESERVED_FIELDS = ("mask", "boxes", "box_labels")

_CONVERT, _PACK = Caller("packer.convert()"), Caller("packer.pack()")


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

    TypeError for an unknown option (naming those taken) or a value of the wrong type; ValueError
    (:class:`~packer.conversion.options.OptionError`) for a bad value or combination, naming the keyword;
    the conversion's own errors as the command line reports them (FileExistsError when ``dst``
    exists without ``overwrite=True``, SourceError, ...).
    """
    from .conversion.distributed import torchrun_launch
    from .conversion.run import run_conversion

    request = convert_request(_CONVERT, src_format, dst_format, src, dst, options)
    launch = None if request.no_torchrun else torchrun_launch()
    return run_conversion(request, launch)


def pack(inputs: Iterable[Any], dst: str | os.PathLike[str], format: str, fn: Callable[[Any], dict[str, Any]] | None = None,
         *, classes: Sequence[str] | None = None, label_kind: str = "class", images: Sequence[str] = (),
         **options: Any) -> ConvertReport:
    """Pack a dataset of ``format`` (lmdb, hdf5, tar, tfrecord) at ``dst`` from ``inputs``, each
    made a sample by ``fn`` (or given as samples when ``fn`` is None), and return the report.

    ``inputs``: any iterable or sequence (paths, ids, rows, ...); it is read once, into a list.
    ``fn`` runs in the ``workers`` processes (spawned: it must be picklable, a module-level
    function or a ``functools.partial`` of one) and returns a sample dict:

    - ``"image"``: a file path, the bytes of an image file, or an H x W x 3 uint8 RGB array;
    - ``"label"``: a class name or number (a list of them with ``label_kind="multi"``, a float
      with ``"number"``; see :func:`~packer.pipeline.items.convert_items`);
    - ``"key"`` (optional): the sample's name (default: the path, or ``item-N`` for bytes and
      arrays, N the input's position);
    - ``"mask"`` (optional): a label map, as a file path, a file's bytes or an H x W uint8 or
      uint16 array (stored as a lossless PNG; resized by nearest neighbour with the image);
    - ``"boxes"`` (optional): ``[[x0, y0, x1, y1], ...]`` (or an N x 4 array) in the image's
      pixels, with optional ``"box_labels"``: a class name or number per box (the same class list
      as the labels);
    - the keys named in ``images``: extra images (path, bytes or H x W x 3 uint8 RGB array, as
      ``"image"``), processed like the image and stored under their key's name;
    - the field name of a kind added to :data:`packer.fields.KINDS` (a user's): that field, as a
      file path or a file's bytes, processed by its kind;
    - every other key: per-sample metadata (JSON values), read back by ``fields=("meta", ...)``.

    Every sample must have the same fields (ValueError naming the first input that differs).
    Images are then processed as ``packer convert`` does (the same keyword ``options``:
    ``resize``, ``encode``, ``workers``, ``shard_size``, ``no_shuffle``, ``seed``, ``strict``,
    ...); bad images are skipped and listed in the report. Bytes and arrays go through a
    temporary folder beside ``dst`` (arrays as lossless PNG), so memory does not grow with the
    dataset. ``resume=True`` runs ``fn`` again and continues an interrupted pack of the same
    samples (or keeps a finished one). ``classes`` pins the class list (label ``i`` is ``classes[i]``; each name once: ValueError naming a
    name listed twice).

    TypeError for an unknown option; ValueError or TypeError naming the input for a sample
    ``fn`` made wrong. An exception ``fn`` raises comes back, whatever ``workers``, with a message
    naming the input, the original type and its message (``input 3: fn raised KeyError: ...``),
    the worker's traceback as its cause: as the same type where that type can be built from one
    message, else as :class:`~packer.errors.WorkerError` (``type_name`` holds the original type).
    """
    from .pipeline.items import check_classes, convert_items
    from .pipeline.order import recorded_seed, write_order
    from .pipeline.pool import ordered_map

    if fn is not None and not callable(fn):
        raise TypeError(f"packer.pack(): fn must be callable, not {type(fn).__name__}")
    if classes is not None:
        classes = check_classes(classes, "packer.pack(): classes")  # before fn runs on any input
    images = _image_names(images)
    if format == "imagefolder":
        raise ValueError("packer.pack(): format must be a packed format (lmdb, hdf5, tar, tfrecord), not imagefolder")
    request = convert_request(_PACK, "list", format, "<inputs>", dst, options, [o for o in OPTIONS if o.pack])
    opts = request.options
    values = list(inputs)
    dst = os.path.abspath(request.dst)
    parent = os.path.dirname(dst)
    os.makedirs(parent, exist_ok=True)
    spool = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.pack-", dir=parent)
    try:
        work = functools.partial(_make_samples, fn=fn, spool=spool, images=images)
        numbered = _Numbered(values)
        samples = list(ordered_map(work, numbered, opts.workers, lambda i: f"input {i}"))
        _check_same_fields(samples)
        order = write_order(len(samples), opts)
        items = [samples[i][1:] for i in order]
        keys = [samples[i][0] for i in order]
        return convert_items(items, dst, format, opts, classes, label_kind=label_kind, keys=keys,
                             source={"kind": "pack", "inputs": len(values)},
                             shuffle_seed=recorded_seed(opts), record_files=False)
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


def _image_names(images: Sequence[str]) -> tuple[str, ...]:
    """``pack``'s ``images`` checked: valid extra image names, each once; ValueError/TypeError."""
    if isinstance(images, str):
        images = (images,)
    out = tuple(images)
    for name in out:
        try:
            check_field_name(name)
        except ValueError as e:
            raise ValueError(f"packer.pack(): images: {e}") from None
    if len(set(out)) != len(out):
        raise ValueError(f"packer.pack(): images names {next(n for n in out if out.count(n) > 1)!r} twice")
    return out


def _check_same_fields(samples: Sequence[tuple[Any, ...]]) -> None:
    """ValueError naming the first input whose fields are not those of input 0."""
    def have(fields: dict[str, Any] | None) -> list[str]:
        return sorted((fields or {}).keys() - {"images"}) + sorted((fields or {}).get("images", {}))

    first = have(samples[0][4]) if samples else []
    for i, sample in enumerate(samples):
        if have(sample[4]) != first:
            raise ValueError(f"input {i}: the sample has the fields {have(sample[4]) or 'none'}, input 0 "
                             f"{first or 'none'}: every sample must have the same (mask, boxes, box_labels, images)")


def _make_samples(chunk: Sequence[tuple[int, Any]], fn: Callable[[Any], Any] | None, spool: str,
                  images: tuple[str, ...] = ()) -> list[tuple[str, str, Any, dict[str, Any] | None, Any]]:
    """In a worker: ``fn`` over a chunk of inputs, each sample as ``(key, image path, label,
    metadata, fields)``, images and masks given as bytes or arrays written into ``spool``."""
    out = []
    for i, value in chunk:
        if fn is None:
            sample = value
        else:
            try:
                sample = fn(value)
            except Exception as e:
                raise _input_error(i, e) from e
        out.append(_sample_item(i, sample, spool, images))
    return out


def _input_error(i: int, e: Exception) -> Exception:
    """What ``fn``'s exception ``e`` for input ``i`` is raised as: the same type with a message that
    names the input, or, for a type that cannot be built from one message, a WorkerError with it."""
    from .errors import WorkerError
    from .pipeline.pool import rebuildable, type_name

    message = f"input {i}: fn raised {type_name(e)}: {e}"
    if rebuildable(e):
        return type(e)(message)
    return WorkerError(message, type_name=type_name(e))


def _sample_item(i: int, sample: Any, spool: str,
                 images: tuple[str, ...] = ()) -> tuple[str, str, Any, dict[str, Any] | None, Any]:
    """One sample dict checked and made an item (with its fields, or None); TypeError/ValueError
    naming the input."""
    if not isinstance(sample, dict):
        raise TypeError(f"input {i}: a sample must be a dict with 'image' and 'label', not {type(sample).__name__}")
    missing = [k for k in ("image", "label", *images) if k not in sample]
    if missing:
        raise ValueError(f"input {i}: the sample has no {missing[0]!r} (it has {', '.join(map(repr, sample)) or 'nothing'})")
    image, key = sample["image"], sample.get("key")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"input {i}: 'key' must be a string, not {type(key).__name__}")
    path = _spooled(i, "", image, spool, _image_bytes)
    if key is None:
        key = os.fspath(image).replace(os.sep, "/") if isinstance(image, (str, os.PathLike)) else f"item-{i:010d}"
    from .pipeline.itemfields import payload_keys

    taken = ("image", "label", "key", *RESERVED_FIELDS, *payload_keys(), *images)
    meta = {k: v for k, v in sample.items() if k not in taken}
    return key, path, sample["label"], meta or None, _sample_fields(i, sample, spool, images)


def _spooled(i: int, name: str, value: Any, spool: str, to_bytes: Callable[[int, Any, str], bytes]) -> str:
    """A sample's file: a path as given (made absolute), or bytes or an array (made a file's bytes
    by ``to_bytes``) written into ``spool``."""
    if isinstance(value, (str, os.PathLike)):
        return os.path.abspath(os.fspath(value))
    path = os.path.join(spool, f"{i:010d}{'.' + name if name else ''}")
    write_spooled(path, to_bytes(i, value, name or "image"))
    return path


def _sample_fields(i: int, sample: dict[str, Any], spool: str, images: tuple[str, ...]) -> dict[str, Any] | None:
    """The sample's mask, extra images and boxes as convert_items' fields (None: it has none)."""
    from .pipeline.itemfields import item_fields, payload_keys

    fields: dict[str, Any] = {}
    if sample.get("mask") is not None:
        fields["mask"] = _spooled(i, "mask", sample["mask"], spool, _mask_bytes)
    for k in payload_keys():  # the fields of kinds added to packer.fields.KINDS (a user's)
        if sample.get(k) is not None:
            fields[k] = _spooled(i, k, sample[k], spool, _file_bytes)
    if images:
        fields["images"] = {n: _spooled(i, n, sample[n], spool, _image_bytes) for n in images}
    for k in ("boxes", "box_labels"):
        if sample.get(k) is not None:
            fields[k] = sample[k].tolist() if hasattr(sample[k], "tolist") else sample[k]
    try:
        item_fields(i, fields)
    except (TypeError, ValueError) as e:
        raise type(e)(str(e).replace(f"item {i}:", f"input {i}:", 1)) from None
    return fields or None


def _mask_bytes(i: int, mask: Any, what: str = "mask") -> bytes:
    """A mask given as bytes or an H x W uint8 or uint16 array, as the bytes of a PNG file."""
    import numpy as np

    from .fields.mask import encode_mask

    array = _array(i, mask, "'mask'", "an H x W uint8 or uint16 array")
    if array is None:
        return bytes(mask)
    if array.dtype not in (np.uint8, np.uint16) or array.ndim != 2 or 0 in array.shape:
        raise ValueError(f"input {i}: a mask array must be H x W uint8 or uint16 (a label map), not "
                         f"{'x'.join(map(str, array.shape))} {array.dtype}")
    return encode_mask(np.ascontiguousarray(array))


def _file_bytes(i: int, value: Any, what: str) -> bytes:
    """A field of a user's kind given as a file's bytes (its kind reads the file); TypeError naming
    the input for anything else."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"input {i}: {what!r} must be a path or a file's bytes, not {type(value).__name__}")
    return bytes(value)


def _image_bytes(i: int, image: Any, what: str = "image") -> bytes:
    """An image given as bytes or an H x W x 3 uint8 RGB array, as the bytes of an image file."""
    import numpy as np

    array = _array(i, image, repr(what), "an H x W x 3 uint8 array")
    if array is None:
        return bytes(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3 or 0 in array.shape:
        what = "an image array" if what == "image" else f"the {what!r} array"
        raise ValueError(f"input {i}: {what} must be H x W x 3 uint8 (RGB), not {'x'.join(map(str, array.shape))} "
                         f"{array.dtype}")
    import cv2

    ok, buf = cv2.imencode(".png", np.ascontiguousarray(array[:, :, ::-1]), [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise ValueError(f"input {i}: OpenCV could not encode the array as PNG")
    return buf.tobytes()


def _array(i: int, value: Any, what: str, array: str) -> Any:
    """None for bytes, ``value`` for a NumPy array, else TypeError naming the input."""
    import numpy as np

    if isinstance(value, (bytes, bytearray, memoryview)):
        return None
    if not isinstance(value, np.ndarray):
        raise TypeError(f"input {i}: {what} must be a path, bytes or {array}, not {type(value).__name__}")
    return value
