"""Converting an explicit list of images: :func:`convert_items`, what one task of a Ray, Dask or
Spark job calls to make one part of a dataset (:func:`packer.operations.merge.merge` joins the parts)."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import numbers
import os
import time
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Union

from .. import __version__
from ..description.manifest import FIELDS_VERSION, ITEM_RECORDS, Manifest
from ..description.samples import LABEL_KINDS, Label, encode_meta, sample_fields
from ..errors import PackerError
from ..files.filesystem import claim_destination, recover_publish
from ..files.journal import digest
from ..formats import read_manifest, writer_class
from ..images.imageproc import ProcessOptions
from ..wording import plural
from .engine import (
    ConvertOptions,
    ConvertReport,
    convert_source,
    options_fingerprint,
)
from .itemfields import (
    FieldFiles,
    ItemFields,
    SourceSize,
    declared_fields,
    field_processor,
    fields_entry,
    item_fields,
    with_stamps,
)
from .sourcefiles import NO_STAMP, Stamp, process_data, process_file, stamp_mismatch

__all__ = ["ImageItem", "convert_items", "item_classes", "check_classes"]

#: One image to convert: (a file path or the file's bytes, a class name or label, metadata), and
#: optionally its fields (:mod:`packer.pipeline.itemfields`): a mask, extra images, boxes, box labels.
_ImageSource = Union[str, "os.PathLike[str]", bytes]
ImageItem = tuple[_ImageSource, Any, dict[str, Any] | None] | tuple[_ImageSource, Any, dict[str, Any] | None,
                                                                    dict[str, Any] | None]


def check_classes(classes: Sequence[str], what: str = "classes") -> list[str]:
    """A pinned class list as a list, each name once (label ``i`` is ``classes[i]``, so a name
    listed twice would give one class two labels): TypeError for a string, ValueError naming the
    first name listed twice; ``what`` starts the message."""
    if isinstance(classes, (str, bytes)):
        raise TypeError(f"{what}: a list of class names, not a string ({classes!r})")
    names = list(classes)
    seen: set[str] = set()
    for c in names:
        if c in seen:
            raise ValueError(f"{what}: class {c!r} is listed twice")
        seen.add(c)
    return names


def item_classes(labels: Sequence[str | int], classes: Sequence[str] | None) -> tuple[list[str], list[int]]:
    """The class list and each item's label number. Without ``classes``: the sorted names when
    every label is a name, ``"0"`` .. ``"K-1"`` when every label is a number (K = 1 + the largest).
    ValueError names the first item whose label fits neither."""
    names = _class_names(labels) if classes is None else list(classes)
    to_label = {c: i for i, c in enumerate(names)}
    out = []
    for i, x in enumerate(labels):
        label = _label_number(x, to_label)
        if not 0 <= label < len(names):
            raise ValueError(f"item {i}: label {x!r} is not one of the {plural(len(names), 'class')}")
        out.append(label)
    return names, out


def _class_names(labels: Iterable[Any]) -> list[str]:
    """The class list that labels given without ``classes`` imply (see :func:`item_classes`),
    found in one pass that keeps only the distinct names."""
    names: set[str] = set()
    top, kinds = -1, set()
    for x in labels:
        if _is_number(x):
            top, kind = max(top, int(x)), "number"
        elif isinstance(x, str):
            names.add(x)
            kind = "name"
        else:
            kind = "other"
        kinds.add(kind)
    if kinds <= {"number"}:
        return [str(i) for i in range(top + 1)]
    if kinds == {"name"}:
        return sorted(names)
    raise ValueError("item labels mix class names and numbers (or hold other types); pass classes=[...]")


def _key(i: int, source: str | os.PathLike[str] | bytes, root: str | None) -> str:
    """A sample's key: the path (relative to ``root`` when given, ``/``-separated), or ``item-N``
    for an image given as bytes (N its position in the items)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"item-{i:010d}"
    path = os.fspath(source)
    if root is not None:
        path = os.path.relpath(path, root)
    return path.replace(os.sep, "/")


def _process_source(source: str | bytes, stamp: Stamp | None, files: FieldFiles | None = None, *,
                    opts: ProcessOptions) -> tuple[Any, str | None]:
    if files is None:
        return process_data(source, opts) if isinstance(source, bytes) else process_file(source, opts, stamp)
    process = field_processor(files)
    out = process(source, opts) if isinstance(source, bytes) else process_file(source, opts, stamp, process)
    declared_by = files.size.declared_by if files.size is not None else None
    if out[1] is not None and declared_by and declared_by != SourceSize.declared_by and declared_by not in out[1]:
        return out[0], f"{declared_by}: {out[1]}"  # the entry that named this image (images[3] of a COCO file)
    return out


def _process_sources(sources: Sequence[tuple[Any, ...]], opts: ProcessOptions) -> list[tuple[Any, str | None]]:
    return [_process_source(*s, opts=opts) for s in sources]


class _Rows:
    """The items read lazily by position: each checked when read, its key, label and source made
    on the fly, so a Sequence of items is never copied (conversion memory does not grow with N).
    The :class:`~packer.pipeline.engine.ItemSource` that :func:`convert_items` feeds the pipeline."""

    def __init__(self, items: Sequence[Any], names: list[str], root: str | None, kind: str = "class",
                 keys: Sequence[str] | None = None, opts: ProcessOptions | None = None) -> None:
        self.items, self.root, self.kind, self.keys = items, root, kind, keys
        self.process = functools.partial(_process_sources, opts=opts or ProcessOptions())
        #: the first item's fields (every item must have the same), and the extra images' order
        self.first = item_fields(0, _checked(0, items[0])[3]) if len(items) else None
        self.image_order = [n for n, _ in self.first.images] if self.first is not None else []
        self.to_label = {c: i for i, c in enumerate(names)}
        self.count = len(names)
        # (size, mtime_ns) of each item's file as listed; NO_STAMP for bytes. Items given as bytes
        # before the first file hold no entry (all-bytes items: none at all, memory flat in N).
        self.stamps = array("q")
        self.bytes_before_files = 0
        #: the same of each item's field files: (mask, extra images) slots per item, the files by path first
        self.field_stamps = array("q")
        self.field_slots = (self.first.mask is not None) + len(self.image_order) + len(self.first.payloads) \
            if self.first is not None else 0

    def __len__(self) -> int:
        return len(self.items)

    def row(self, i: int) -> tuple[str | bytes, str, int]:
        """Item ``i`` as (source: path or bytes, key, label number); TypeError/ValueError naming it."""
        source, label, meta, _ = _checked(i, self.items[i])
        src = bytes(source) if isinstance(source, (bytes, bytearray, memoryview)) else os.fspath(source)
        if meta:
            encode_meta(meta, f"item {i}: metadata")  # ValueError naming the item
        key = self.keys[i] if self.keys is not None else _key(i, src, self.root)
        if self.kind == "number":
            if isinstance(label, bool) or not isinstance(label, numbers.Real) or not math.isfinite(label):
                raise ValueError(f"item {i}: label {label!r} is not a finite number")
            return src, key, Label(-1, target=float(label), meta=meta)
        if self.kind == "multi":
            if isinstance(label, (str, bytes)) or not isinstance(label, Iterable):
                raise ValueError(f"item {i}: label {label!r} is not a list of classes")
            ids = [self._number(i, x) for x in label]
            return src, key, Label(-1, labels=ids, meta=meta)
        number = self._number(i, label)
        return src, key, Label(number, meta=meta) if meta else number

    def _number(self, i: int, label: Any, what: str = "label") -> int:
        number = _label_number(label, self.to_label)
        if not 0 <= number < self.count:
            raise ValueError(f"item {i}: {what} {label!r} is not one of the {plural(self.count, 'class')}")
        return number

    def checked_fields(self, i: int) -> tuple[ItemFields, FieldFiles] | None:
        """Item ``i``'s fields (None when items have none), and what a worker needs of them: its
        extra images in the first item's order, box labels as class numbers. ValueError naming
        the item when it has other fields than the first item."""
        fields = item_fields(i, _checked(i, self.items[i])[3])
        have = fields.signature() if fields is not None else None
        if have != (self.first.signature() if self.first is not None else None):
            raise ValueError(f"item {i} has {fields.describe() if fields else 'no fields'}, item 0 "
                             f"{self.first.describe() if self.first else 'no fields'}: every item must have the same fields")
        if fields is None:
            return None
        images = dict(fields.images)
        labels = tuple(self._number(i, x, "box label") for x in fields.box_labels) \
            if fields.box_labels is not None else None
        return fields, FieldFiles(fields.mask, tuple((n, images[n]) for n in self.image_order), fields.boxes, labels,
                                  size=fields.size, payloads=fields.payloads)

    def sources(self, start: int) -> _Sources:
        """The sources from position ``start`` on, as a lazy sequence for ``ordered_map``."""
        return _Sources(self, start)

    def sample(self, pos: int) -> tuple[str, Any]:
        """Item ``pos``'s key and label."""
        return self.row(pos)[1:]  # type: ignore[return-value]

    def name(self, pos: int) -> str:
        """Item ``pos`` as errors name it: its key."""
        return self.row(pos)[1]

    def stamp(self, i: int) -> Stamp:
        """Item ``i``'s file as :meth:`fingerprint` listed it."""
        i -= self.bytes_before_files
        return (self.stamps[2 * i], self.stamps[2 * i + 1]) if i >= 0 else NO_STAMP

    def listed_fields(self, i: int) -> FieldFiles | None:
        """Item ``i``'s field files, each with the stamp :meth:`fingerprint` listed for it."""
        checked = self.checked_fields(i)
        if checked is None:
            return None
        at = 2 * self.field_slots * i
        flat = self.field_stamps[at:at + 2 * len(checked[1].paths)]
        return with_stamps(checked[1], [(flat[k], flat[k + 1]) for k in range(0, len(flat), 2)])

    def fingerprint(self, expected: Sequence[Stamp | None] | None = None,
                    keep_records: bool = True) -> tuple[str, list[list[Any]]]:
        """Digest of the items: each key and label, and a file's size and modification time or the
        SHA-256 of bytes given directly (the rows hashed one by one, as ``digest(list)`` would);
        and each file's record (:data:`~packer.description.manifest.ITEM_RECORDS`). Each file's stamp is kept
        for the conversion to check; one that differs from ``expected[i]`` raises SourceError."""
        if expected is not None and len(expected) != len(self):
            raise ValueError(f"expected_stats has {len(expected)} entries for {len(self)} items")
        h = hashlib.sha256(b"[")
        records: list[list[Any]] = []
        del self.stamps[:]
        del self.field_stamps[:]
        self.bytes_before_files = 0
        for i in range(len(self)):
            source, key, label = self.row(i)
            want = expected[i] if expected is not None else None
            if isinstance(source, bytes):
                if want is not None:
                    raise ValueError(f"item {i}: expected_stats applies to files, not to bytes (give None)")
                entry: list[Any] = [key, int(label), hashlib.sha256(source).hexdigest()]
                if self.stamps:  # bytes are recorded by the digest above alone
                    self.stamps.extend(NO_STAMP)
                else:
                    self.bytes_before_files += 1
            else:
                try:
                    st = os.stat(source)
                    entry = [key, int(label), st.st_size, st.st_mtime_ns]
                    stamp = (st.st_size, st.st_mtime_ns)
                except OSError as e:
                    entry = [key, int(label), -1, str(e.strerror)]
                    stamp = NO_STAMP
                if want is not None and tuple(want) != stamp:
                    raise stamp_mismatch(source, stamp, tuple(want))
                if keep_records:  # else none: a list of N lists is what would grow with N
                    records.append([key, *stamp])
                self.stamps.extend(stamp)
            fields = sample_fields(label)
            if fields:  # labels of other kinds and metadata (absent for plain items: same digest as before)
                entry.append(fields)
            checked = self.checked_fields(i)
            if checked is not None:  # the mask, extra images and boxes (absent without: same digest as before)
                files = with_stamps(checked[1])
                for _, st in files.stamps:
                    self.field_stamps.extend(st)
                self.field_stamps.extend(NO_STAMP * (self.field_slots - len(files.stamps)))
                entry.append({"fields": fields_entry(files)})
            h.update((b"," if i else b"") + json.dumps(entry, sort_keys=True, separators=(",", ":"),
                                                         ensure_ascii=False, default=str).encode("utf-8"))
        h.update(b"]")
        return h.hexdigest(), records


class _Sources(Sequence[str | bytes]):
    """Sources of ``rows`` from ``start`` on, made when sliced (what :func:`ordered_map` sends)."""

    def __init__(self, rows: _Rows, start: int) -> None:
        self.rows, self.start = rows, start

    def __len__(self) -> int:
        return max(0, len(self.rows) - self.start)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._one(self.start + k) for k in range(*i.indices(len(self)))]
        return self._one(self.start + i)

    def _one(self, i: int) -> tuple[Any, ...]:
        """Item ``i``'s source, with the stamp its file must still have when it is read (and its
        fields' files, when items have fields)."""
        source = self.rows.row(i)[0]
        stamp = None if isinstance(source, bytes) else self.rows.stamp(i)
        files = self.rows.listed_fields(i) if self.rows.first is not None else None
        return (source, stamp) if files is None else (source, stamp, files)


def _checked(i: int, row: Any) -> tuple[Any, Any, Any, Any]:
    """Item ``i`` as (source, label, metadata, fields or None)."""
    if not isinstance(row, tuple) or len(row) not in (3, 4) or not isinstance(row[2], (dict, type(None))):
        raise TypeError(f"item {i} must be a (path or bytes, label, metadata dict or None[, fields dict]) tuple")
    return (*row, None) if len(row) == 3 else row  # type: ignore[return-value]


def _box_label_names(seq: Sequence[Any]) -> Iterator[Any]:
    """Every item's box labels, in item order (they name classes as the items' labels do)."""
    for i in range(len(seq)):
        fields = item_fields(i, _checked(i, seq[i])[3])
        if fields is not None and fields.box_labels is not None:
            yield from fields.box_labels


def _label_list(i: int, label: Any) -> list[Any]:
    if isinstance(label, (str, bytes)) or not isinstance(label, Iterable):
        raise ValueError(f"item {i}: label {label!r} is not a list of classes")
    return list(label)


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _label_number(x: Any, to_label: dict[str, int]) -> int:
    return int(x) if _is_number(x) else to_label.get(x, -1) if isinstance(x, str) else -1


def convert_items(
    items: Iterable[ImageItem],
    dst: str | os.PathLike[str],
    fmt: str,
    options: ConvertOptions | None = None,
    classes: Sequence[str] | None = None,
    *,
    root: str | os.PathLike[str] | None = None,
    label_kind: str = "class",
    source: dict[str, Any] | None = None,
    shuffle_seed: int | None = None,
    expected_stats: Sequence[Stamp | None] | None = None,
    record_files: bool = True,
    keys: Sequence[str] | None = None,
) -> ConvertReport:
    """Convert ``items``, each ``(path or bytes, label, metadata)``, into a packed dataset of
    format ``fmt`` at ``dst``, in the order given (``options.shuffle`` and ``seed`` are not used).

    A Sequence (a list, or a lazy sequence that makes item ``i`` when asked) is read by position,
    item by item, and never copied: two or three passes (class names when ``classes`` is None,
    the fingerprint, the conversion), so it must give the same items each time; memory then
    grows with the number of items only by the 16 bytes of each file item's stamp (and of each of
    its field files; none for images given as bytes before the first file) and, with
    ``record_files``, the list of file items the manifest keeps (below). Any other iterable is first made a list.

    Labels are class names or numbers (see :func:`item_classes` for ``classes=None``); give the
    full ``classes`` list when parts made separately are to be merged without renumbering. Images
    are decoded and processed by ``options.workers`` processes, bad ones skipped and listed (or,
    ``strict``, raise ImageError), as for an image folder; ``options.resume`` continues an
    interrupted call with the same items, and keeps a dataset at ``dst`` that such a call finished
    (its manifest's ``source.fingerprint``: a retried task does no work twice). A path's key is the path (relative to ``root``), an
    image given as bytes is ``item-N``. ``metadata`` (a JSON-able dict or None, see
    :mod:`packer.description.samples`) is stored with the sample and returned by ``fields=("meta", ...)``.

    An item may carry a fourth element, its fields (:mod:`packer.pipeline.itemfields`): ``{"mask":
    path or bytes, "images": {name: path or bytes}, "boxes": [[x0, y0, x1, y1], ...],
    "box_labels": [class name or number, ...]}``, any of the keys, the boxes in the source image's
    pixels. Every item must have the same fields (ValueError naming the first that differs); the
    dataset is then version 3 and lists them. A mask is a label map (kept unchanged, resized by
    nearest neighbour, stored as PNG), an extra image is processed like the image, boxes are
    checked to lie in the image and scaled with it; box labels name classes of the same class
    list as the labels (inferred from both when ``classes`` is None). A field's file that cannot be
    read or processed (a mask of another size, a box outside the image) skips the sample, naming
    the file and the reason. The fields' files (size and modification time, or the bytes' SHA-256)
    and boxes are part of the items' fingerprint, so ``resume`` notices a changed mask, and a
    field file must still be as listed when it is read (SourceError otherwise), as the image.

    ``label_kind``: ``"class"`` (a class name or number per item), ``"multi"`` (a list of them per
    item; classes are the names found in all lists) or ``"number"`` (a float per item; no classes).
    ``source`` is recorded in the manifest (its ``fingerprint`` key is set here), and so is
    ``shuffle_seed`` (the seed of a shuffle the caller applied to the items, or None).

    The manifest's ``source.converted`` lists what each file item was, ``[key, size, mtime_ns]``
    as listed before any image is read; each file must still be of that size and modification
    time when it is read (SourceError naming it otherwise: it changed during the conversion), and
    :func:`~packer.operations.merge.merge` refuses parts that disagree about the same file. Items given
    as bytes are bound by their SHA-256 in ``source.fingerprint`` alone (their keys are positions,
    which parts cannot share). ``record_files=False`` leaves the list out, for a dataset that is
    an end product rather than a part to merge (the list takes a few tens of bytes and the key per
    file in the manifest, which every reader reads); the files are still checked as they are
    read. ``expected_stats``, one entry per item, pins a file to the ``(size, mtime_ns)`` that
    the process planning the work saw (None: not pinned; always None for bytes); a file that
    differs fails the call before any image is read, naming it (a node with a stale copy of the
    source). ``keys``, one string per item, names the samples instead of the paths and
    ``item-N``. FileExistsError
    when ``dst`` exists without ``overwrite``; SourceError when no image could be converted;
    ValueError naming the item for a label or metadata that cannot be stored.
    """
    if label_kind not in LABEL_KINDS:
        raise ValueError(f"label_kind must be one of {LABEL_KINDS}, not {label_kind!r}")
    t0 = time.perf_counter()
    dst = os.fspath(dst)
    options = options if options is not None else ConvertOptions()
    seq = items if isinstance(items, Sequence) else list(items)
    names = _item_class_names(seq, classes, label_kind)
    if keys is not None and len(keys) != len(seq):
        raise ValueError(f"keys has {len(keys)} entries for {len(seq)} items")
    rows = _Rows(seq, names, os.fspath(root) if root is not None else None, label_kind, keys, options.processing)
    writer_class(fmt)  # an unknown format fails before any work
    template = Manifest(format=fmt, num_samples=0, classes=names, processing=options.processing.to_json(), files=[],
                        source=dict(source or {"kind": "items"}), created_by=f"packer {__version__}",
                        label_kind=label_kind, shuffle_seed=shuffle_seed)
    if rows.first is not None:
        template.version, template.fields = FIELDS_VERSION, declared_fields(rows.first, rows.image_order)

    listed, records = rows.fingerprint(expected_stats, record_files)
    fingerprint = {"source": listed, "options": options_fingerprint(fmt, template, options)}
    template.source["fingerprint"] = digest(fingerprint)
    if records and record_files:
        template.source[ITEM_RECORDS] = records
    with claim_destination(dst):
        recover_publish(dst)
        kept = _finished(dst, template.source["fingerprint"]) if options.resume else None
        if kept is not None:
            return ConvertReport(dst, kept, time.perf_counter() - t0, list(kept.skipped), already_complete=True,
                                 notes=[f"kept {dst}: finished before from the same items and options"])
        if os.path.lexists(dst) and not options.overwrite:
            raise FileExistsError(f"destination exists: {dst} (use --overwrite to replace it)")
        return convert_source(rows, dst, fmt, template, options, fingerprint, t0=t0,
                              shown=_shown_source(template.source, len(rows)))


def _item_class_names(seq: Sequence[Any], classes: Sequence[str] | None, label_kind: str) -> list[str]:
    """The class list: ``classes`` (each name once), or the one the items' labels and box labels imply."""
    if classes is not None:
        return check_classes(classes)
    if label_kind == "number":  # no classes of their own: those of the box labels, if any
        return _class_names(_box_label_names(seq))
    if label_kind == "multi":
        labels: Iterable[Any] = (x for i in range(len(seq)) for x in _label_list(i, _checked(i, seq[i])[1]))
    else:
        labels = (_checked(i, seq[i])[1] for i in range(len(seq)))
    return _class_names(itertools.chain(labels, _box_label_names(seq)))


def _shown_source(source: dict[str, Any], n: int) -> str:
    """What the user is told the items came from: the list file they were read from, if any."""
    return str(source["path"]) if isinstance(source.get("path"), str) else f"the {plural(n, 'item')}"


def _finished(dst: str, fingerprint: str) -> Manifest | None:
    """The manifest of a dataset at ``dst`` that a call with the same items and options finished."""
    try:
        m = read_manifest(dst)
    except (OSError, PackerError):
        return None
    return m if m.source.get("fingerprint") == fingerprint else None
