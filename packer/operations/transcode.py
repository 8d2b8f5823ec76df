"""Format -> format and format -> ImageFolder: :func:`convert_dataset`.

Packed -> packed copies stored bytes through the writers and the engine of an ImageFolder
conversion; packed -> ``imagefolder`` unpacks to ``DST/<class>/<path>``, never outside DST.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import cv2

from .. import __version__
from ..description.manifest import (
    FIELDS_VERSION,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    Manifest,
    Skipped,
)
from ..description.record import Record
from ..description.samples import carried_label
from ..errors import CorruptDataError, ImageError, ResumeError, SourceError
from ..fields import named
from ..fields.boxes import BOXES
from ..fields.image import IMAGE
from ..fields.mask import MASK
from ..fields.sample import FieldSources, process_sample
from ..files.filesystem import check_destination, claim_destination
from ..files.journal import digest
from ..formats import get_format, read_manifest, writer_class
from ..images.codecs import FILE_EXTENSIONS
from ..images.imageproc import (
    CODECS,
    Encoding,
    ProcessedField,
    ProcessedImage,
    ProcessOptions,
    check_encoded,
    decode_payload,
    parse_encoding,
    parse_resize,
)
from ..pipeline.engine import (
    ConvertOptions,
    ConvertReport,
    Item,
    convert_imagefolder,
    convert_source,
    options_fingerprint,
    publish,
    recover_publish,
    source_items,
    temp_dir_for,
)
from ..pipeline.scan import IMG_EXTENSIONS
from ..pipeline.sourcefiles import Result
from ..storage.shardspec import has_braces

__all__ = ["COPY", "TranscodeReport", "convert_dataset", "is_copy", "reprocess", "processing_for", "safe_relpath"]

#: Processing that copies stored bytes unchanged (``--encode keep``, no resize): the default.
COPY = ProcessOptions(encoding=Encoding("keep", 0))

#: File extensions that match each stored codec (lower case); the first is used for renames.
_EXTENSIONS = FILE_EXTENSIONS
_NAME_MAX = 255  # bytes per path component on common file systems


@dataclass
class TranscodeReport(ConvertReport):
    """What :func:`convert_dataset` did; ``renamed`` lists (key, path written, why) for keys and
    class names that had to be sanitised or collided (imagefolder destinations only)."""

    renamed: list[tuple[str, str, str]] = field(default_factory=list)
    copied: bool = True


def is_copy(processing: ProcessOptions) -> bool:
    """True when ``processing`` asks for nothing but the stored bytes (keep, no resize)."""
    return processing.encoding.codec == "keep" and processing.resize.mode == "none"


def processing_for(
    src_manifest: Manifest | None, resize: str | None, encode: str | None, base: ProcessOptions | None = None
) -> ProcessOptions:
    """The processing a conversion from a packed dataset asks for, given the ``--resize`` and
    ``--encode`` texts (None: not given): :data:`COPY` when neither is given; otherwise the given
    parts, with no resize and the source's encoding (``keep`` if unknown) for the missing one.
    ``base`` supplies the other fields (upscale, max_pixels, reduced_decode)."""
    base = base if base is not None else ProcessOptions()
    if resize is None and encode is None:
        return replace(base, resize=COPY.resize, encoding=COPY.encoding)
    if encode is None:
        encode = "keep"
        if src_manifest is not None:
            try:
                encode = str(parse_encoding(str(src_manifest.processing.get("encoding", "keep"))))
            except ValueError:
                pass
    return replace(base, resize=parse_resize(resize or "none"), encoding=parse_encoding(encode))


# -- sources ---------------------------------------------------------------------------------------
def open_source(src: str, src_format: str) -> Any:
    """Open the packed source for reading: by its manifest, or, for formats other tools write
    (tar, tfrecord), without one through ``open_dataset(path, format=...)``, which also takes a
    brace pattern of shard files (``dir/shard-{000000..000009}.tar``)."""

    from packer.datasets import open_dataset

    if has_braces(src):  # a brace pattern of shard files (packer's or another tool's)
        return open_dataset(src, format=src_format, output="numpy")
    if not os.path.exists(src):
        raise SourceError(f"source does not exist: {src}")
    if not os.path.isdir(src):
        raise SourceError(f"source is not a packed dataset directory: {src}")
    if not os.path.exists(os.path.join(src, MANIFEST_NAME)) and get_format(src_format).foreign:
        return open_dataset(src, format=src_format, output="numpy")
    m = read_manifest(src)  # without a manifest: UnfinishedDatasetError, with the usual explanation
    if m.format != src_format:
        raise SourceError(f"{src} holds a {m.format} dataset, not {src_format}")
    return open_dataset(src, output="numpy")


_WORKER_SOURCES: dict[tuple[str, str], Any] = {}


def _worker_source(src: str, src_format: str) -> Any:
    key = (src, src_format)
    if key not in _WORKER_SOURCES:
        _WORKER_SOURCES[key] = open_source(src, src_format)
    return _WORKER_SOURCES[key]


def reprocess(rec: Record, opts: ProcessOptions, boxes: tuple[Any, Any] | None = None) -> ProcessedImage:
    """Process a stored sample again (resize, re-encode) as :func:`process_image` does a source
    file, with its fields (:func:`~packer.images.fields.process_sample`: masks resized by nearest
    neighbour, extra images to the image's new size) and ``boxes`` (``(boxes, labels)`` in stored
    pixels, scaled to the new size).

    Raw pixels go through a lossless PNG on the way; ``keep`` keeps each sample's codec family
    (raw stays raw, JPEG stays JPEG at quality 90, PNG stays PNG, anything else becomes PNG).
    """
    if rec.codec == "raw" and opts.encoding.codec == "keep":
        opts = replace(opts, encoding=Encoding("raw", 0))
    sources = FieldSources(
        mask=next((bytes(f.payload) for f in rec.fields if named(f.name) is MASK), None),
        images=tuple((f.name, _file_bytes(f.payload, f.codec, f.height, f.width)) for f in rec.fields
                     if named(f.name) is IMAGE),
        boxes=None if boxes is None else boxes[0],
        box_labels=None if boxes is None or all(v < 0 for v in boxes[1]) else boxes[1],
        payloads=tuple((f.name, bytes(f.payload)) for f in rec.fields if named(f.name) not in (MASK, IMAGE)),
    )
    return process_sample(_file_bytes(rec.payload, rec.codec, rec.height, rec.width), opts, sources)


def _file_bytes(payload: bytes | memoryview, codec: str, height: int, width: int) -> bytes:
    """Stored bytes as an image file's: raw pixels as a lossless PNG, anything else unchanged."""
    if codec != "raw":
        return bytes(payload)
    rgb = decode_payload(payload, "raw", height, width)
    ok, buf = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise ImageError("OpenCV could not re-encode raw pixels")
    return buf.tobytes()


def _stored_boxes(ds: Any, i: int, rec: Record) -> tuple[Any, Any] | None:
    """Sample ``i``'s boxes and box labels, in stored pixels: from the sample itself (other
    tools' data) or the dataset's sample table; None when the dataset has none."""
    if rec.boxes is not None:
        return rec.boxes, rec.box_labels if rec.box_labels is not None else [-1] * len(rec.boxes)
    if ds.manifest.field_kind("boxes") is None:
        return None
    table = ds.sample_table()
    if table is None or not table.has_boxes:
        raise CorruptDataError("the dataset has boxes but its sample table holds none", path=ds.root, sample=i)
    return table.boxes_of(i)


def _source_fields(ds: Any) -> list[dict[str, Any]]:
    """The fields a conversion of ``ds`` writes: its manifest's, or for other tools' data (whose
    samples carry a mask or boxes, found by the reader), those of its first sample; a later sample
    without them is a skip that says so."""
    if ds.manifest.fields or not ds.manifest.layout.get("foreign"):
        return list(ds.manifest.fields)
    try:
        rec = ds.read_record(0)
    except (CorruptDataError, OSError):
        return []
    out: list[dict[str, Any]] = [named(f.name).declare(f.name) for f in rec.fields]
    if rec.boxes is not None:
        out.append(BOXES.declare(BOXES.name, labels=rec.box_labels is not None))
    return out


def _copied(rec: Record, boxes: tuple[Any, Any] | None, h: int, w: int) -> ProcessedImage:
    """The stored sample as it is, fields and boxes included."""
    fields = tuple(ProcessedField(f.name, f.codec, bytes(f.payload), f.height, f.width, f.channels, f.depth)
                   for f in rec.fields)
    if boxes is None:
        return ProcessedImage(rec.codec, bytes(rec.payload), h, w, fields=fields)
    labels = tuple(int(v) for v in boxes[1])
    return ProcessedImage(rec.codec, bytes(rec.payload), h, w, fields=fields,
                          boxes=tuple(tuple(float(v) for v in b) for b in boxes[0]),
                          box_labels=None if all(v < 0 for v in labels) else labels)


def _read(ds: Any, i: int) -> tuple[Record | None, str | None]:
    """A sample's record, or the reason it cannot be read (a skip). Damage to a whole file (no
    sample named: an unreadable LMDB or HDF5 file, a shard that is a git-LFS pointer) is not a
    bad sample but a broken source, and raises SourceError."""
    try:
        return ds.read_record(i), None
    except CorruptDataError as e:
        if e.sample is None:
            raise SourceError(str(e)) from None
        return None, str(e)
    except OSError as e:
        return None, str(e)


def reprocess_one(ds: Any, i: int, opts: ProcessOptions, copy: bool = False) -> Item:
    """Sample ``i`` of ``ds`` as an engine item: its stored bytes (``copy``; those written by another
    tool checked first) or processed again with ``opts``; a skip with the reason when it cannot be."""
    rec, reason = _read(ds, i)
    if rec is None:
        return f"sample {i}", -1, None, reason
    if len(rec.payload) == 0:
        return rec.key, rec.label, None, "empty image payload (0 bytes)"
    try:
        boxes = _stored_boxes(ds, i, rec)
        if copy:
            h, w = rec.height, rec.width
            if ds.manifest.layout.get("foreign") and rec.codec != "raw":
                h, w = check_encoded(bytes(rec.payload), opts.keep_damaged_jpeg)
            return rec.key, rec.label, _copied(rec, boxes, h, w), None
        return rec.key, rec.label, reprocess(rec, opts, boxes), None
    except ImageError as e:
        return rec.key, rec.label, None, str(e)
    except Exception as e:  # noqa: BLE001 - any decoder failure is a skip with the reason
        return rec.key, rec.label, None, f"{type(e).__name__}: {e}"


def _reprocess_chunk(indices: Sequence[int], src: str, src_format: str, opts: ProcessOptions) -> list[Result]:
    ds = _worker_source(src, src_format)
    return [reprocess_one(ds, i, opts)[2:] for i in indices]


class _PackedItems:
    """A packed dataset as an :class:`~packer.pipeline.engine.ItemSource` of the one conversion funnel:
    ``process`` copies its samples (``copy``) or processes them again, in this process
    (``local``) or in worker processes that open the source themselves. A sample's key and label
    come from the record ``process`` read here, or, from workers, from reading it again here."""

    def __init__(self, ds: Any, src: str, src_format: str, opts: ProcessOptions, copy: bool, local: bool) -> None:
        self.ds, self.src = ds, src
        self.read: dict[int, tuple[str, Any]] = {}  # key and label of the samples processed here, until asked
        if local:
            self.process: Callable[[Sequence[int]], list[Result]] = functools.partial(self._here, opts=opts, copy=copy)
        else:
            self.process = functools.partial(_reprocess_chunk, src=src, src_format=src_format, opts=opts)

    def __len__(self) -> int:
        return len(self.ds)

    def sources(self, start: int) -> Sequence[int]:
        return range(start, len(self.ds))

    def _here(self, indices: Sequence[int], opts: ProcessOptions, copy: bool) -> list[Result]:
        out = []
        for i in indices:
            key, label, image, reason = reprocess_one(self.ds, i, opts, copy)
            # with its multi-label classes, number and metadata (a skip's label is not written)
            self.read[i] = key, carried_label(self.ds, i, label) if image is not None else label
            out.append((image, reason))
        return out

    def _key_label(self, pos: int) -> tuple[str, Any]:
        if pos in self.read:
            return self.read[pos]
        rec, _ = _read(self.ds, pos)  # as the worker read it: a skip when it cannot be read
        return (f"sample {pos}", -1) if rec is None else (rec.key, carried_label(self.ds, pos, rec.label))

    def sample(self, pos: int) -> tuple[str, Any]:
        key_label = self._key_label(pos)
        self.read.pop(pos, None)
        return key_label

    def name(self, pos: int) -> str:
        return f"{self.src}: {self._key_label(pos)[0]}"


def _source_fingerprint(src: str, sm: Manifest) -> str:
    """Digest of a packed source: its manifest (which holds every payload file's SHA-256), or for
    foreign shards without one, each file's name, size and modification time."""
    path = os.path.join(src, MANIFEST_NAME)
    if os.path.exists(path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    rows = []
    for f in sm.files:
        try:
            st = os.stat(os.path.join(src, f.name))
            rows.append((f.name, st.st_size, st.st_mtime_ns))
        except OSError:
            rows.append((f.name, -1, -1))
    return digest(rows)


# -- unpacking to an ImageFolder ---------------------------------------------------------------------
def _safe_component(name: str) -> str:
    """One path component that is a plain, visible file or folder name."""
    s = "".join("_" if (unicodedata.category(c) == "Cc" or c in "/\\") else c for c in name)
    s = s.strip()
    if not s or s in (".", ".."):
        s = "_" + s
    elif s.startswith("."):
        s = "_" + s  # hidden names are ignored when a folder is scanned
    raw = s.encode("utf-8")
    if len(raw) > _NAME_MAX:
        stem, ext = os.path.splitext(s)
        digest = hashlib.sha256(raw).hexdigest()[:12]
        room = _NAME_MAX - len(ext.encode("utf-8")) - 13
        s = stem.encode("utf-8")[:room].decode("utf-8", "ignore") + "~" + digest + ext
    return s


def safe_relpath(key: str) -> tuple[list[str], list[str]]:
    """Split an untrusted sample key into safe path components; also return what was changed.

    Backslashes count as separators, empty and ``.`` steps are dropped, ``..`` steps are dropped
    (never followed), and each component goes through a sanitiser (control characters, hidden
    names, over-long names).
    """
    problems: list[str] = []
    text = key.replace("\\", "/")
    if text.startswith("/"):
        problems.append("absolute path")
    parts: list[str] = []
    for comp in text.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if "'..' step" not in problems:
                problems.append("'..' step")
            continue
        safe = _safe_component(comp)
        if safe != comp:
            problems.append(f"unsafe name {comp!r}")
        parts.append(safe)
    return parts, problems


class _Unpacker:
    """Writes samples as files under ``root/<class>/...``; never outside ``root``."""

    def __init__(self, root: str, classes: list[str]) -> None:
        self.root = os.path.realpath(root)
        self.renamed: list[tuple[str, str, str]] = []
        self.used: set[str] = set()
        self.class_dirs: list[str] = []
        for name in classes:
            d = self._unique(_safe_component(name), is_dir=True)
            if d != name:
                self.renamed.append((f"class {name!r}", d, "class name sanitised"))
            self.class_dirs.append(d)
            os.makedirs(os.path.join(self.root, d))
        self.count = 0

    def _unique(self, rel: str, is_dir: bool = False) -> str:
        if rel not in self.used:
            self.used.add(rel)
            return rel
        stem, ext = (rel, "") if is_dir else os.path.splitext(rel)
        n = 1
        while f"{stem}~{n}{ext}" in self.used:
            n += 1
        self.used.add(f"{stem}~{n}{ext}")
        return f"{stem}~{n}{ext}"

    def _class_dir(self, label: int) -> str:
        if 0 <= label < len(self.class_dirs):
            return self.class_dirs[label]
        d = _safe_component(f"label_{label}")
        if d not in self.used:
            self.used.add(d)
            self.renamed.append((f"label {label}", d, "label has no class name"))
        return d

    def add(self, index: int, key: str, label: int, image: ProcessedImage, classes: list[str]) -> None:
        codec, data = image.codec, image.payload
        if codec == "raw":
            rgb = decode_payload(data, "raw", image.height, image.width)
            ok, buf = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
            if not ok:
                raise ImageError(f"{key}: OpenCV could not encode raw pixels as PNG")
            codec, data = "png", buf.tobytes()
        parts, problems = safe_relpath(key)
        cls_dir = self._class_dir(label)
        if parts and 0 <= label < len(classes) and parts[0] in (classes[label], cls_dir):
            parts = parts[1:]
        if not parts:
            parts = [f"sample_{index:08d}"]
            problems.append("no file name")
        stem, ext = os.path.splitext(parts[-1])
        wanted = _EXTENSIONS.get(codec, ("." + CODECS.get(codec, "bin"),))
        if ext.lower() not in wanted:
            parts[-1] = (stem if ext.lower() in IMG_EXTENSIONS else parts[-1]) + wanted[0]
        rel = self._unique("/".join([cls_dir, *parts]))
        if rel != "/".join([cls_dir, *parts]):
            problems.append("name already used")
        # Every component went through _safe_component (no separator, no "." or "..", no hidden
        # name), and the folder holds only what this class wrote: the path stays under root.
        path = os.path.join(self.root, *rel.split("/"))
        if problems:
            self.renamed.append((key, rel, "; ".join(problems)))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "xb") as f:
            f.write(data)
        self.count += 1


def _unpack(items: Iterator[Item], tmp: str, classes: list[str]) -> tuple[int, list[Skipped], list[tuple[str, str, str]]]:
    unpacker = _Unpacker(tmp, classes)
    skipped: list[Skipped] = []
    for index, (key, label, image, reason) in enumerate(items):
        if image is None:
            skipped.append(Skipped(key, reason or "unknown error"))
        else:
            unpacker.add(index, key, label, image, classes)
    return unpacker.count, skipped, unpacker.renamed


# -- the entry point -------------------------------------------------------------------------------
def _check_paths(src: str, dst: str, overwrite: bool) -> None:
    if os.path.lexists(dst) and not overwrite:
        raise FileExistsError(f"destination exists: {dst} (use --overwrite to replace it)")


def convert_dataset(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    src_format: str,
    dst_format: str,
    options: ConvertOptions | None = None,
) -> ConvertReport:
    """Convert a packed dataset to another format, or unpack it to an ImageFolder.

    ``options.processing`` decides what happens to the images: :data:`COPY` (``keep`` encoding,
    no resize; the default when ``options`` is None) copies each sample's stored bytes, label and
    key unchanged (no decode, no re-encode); anything else decodes and processes each sample again,
    in ``options.workers`` processes (see :func:`processing_for` for the CLI's rules).
    ``options.shuffle``/``seed`` are not used: the source's classes, processing facts, order and
    seed are kept. Unreadable samples are skipped and listed (``strict``: the first one raises).
    ``src_format == "imagefolder"`` is :func:`packer.pipeline.engine.convert_imagefolder`. Packed output
    goes through the one conversion funnel every source feeds (:func:`packer.pipeline.engine.convert_source`:
    the same writers, hidden temporary folder, journal, manifest last, publish by rename).

    Unpacking writes ``DST/<class>/<path>``, the path taken from the sample's key (its path
    relative to the source root when it was packed), so with ``keep`` encoding imagefolder -> X ->
    imagefolder gives back byte-identical files. Keys and class names come from a file, so they
    are untrusted: a key can never produce an absolute path, a ``..`` step, a hidden name or a
    path outside DST. Such keys are sanitised and listed in the report (``renamed``), as are names
    that collide. A file's extension is changed when it does not match the stored codec (a
    ``.png`` key holding a JPEG after ``jpeg:90``; raw pixels are written as lossless PNG). Every
    class gets its folder, empty ones too, so labels keep their numbers when read back.

    Raises SourceError for a missing or mismatched source, UnfinishedDatasetError for a directory
    without a manifest (unless its format can be read without one), FileExistsError when ``dst``
    exists without ``overwrite``, ValueError for an unknown format.
    """
    t0 = time.perf_counter()
    src, dst = os.fspath(src), os.fspath(dst)
    options = options if options is not None else ConvertOptions(processing=COPY)
    if src_format == "imagefolder":
        if dst_format == "imagefolder":
            raise ValueError("imagefolder -> imagefolder is not a conversion")
        return convert_imagefolder(src, dst, dst_format, options)
    writer_class(src_format)  # unknown formats fail before any work
    if dst_format != "imagefolder":
        writer_class(dst_format)
    elif options.resume:
        raise ResumeError("--resume is not supported when unpacking to an imagefolder (the unpacked files are "
                          "not journaled); run without --resume")
    check_destination(os.path.dirname(src) if has_braces(src) else src, dst)  # a pattern: its shards' folder
    with claim_destination(dst):
        return _convert_dataset_claimed(src, dst, src_format, dst_format, options, t0)


def _convert_dataset_claimed(
    src: str, dst: str, src_format: str, dst_format: str, options: ConvertOptions, t0: float
) -> ConvertReport:
    recover_publish(dst)
    _check_paths(src, dst, options.overwrite)
    ds = open_source(src, src_format)
    sm: Manifest = ds.manifest
    copy = is_copy(options.processing)
    processing = dict(sm.processing) if copy else options.processing.to_json()
    source: dict[str, Any] = {"kind": src_format, "copied": copy}
    if not copy:
        source["processing"] = dict(sm.processing)
    if sm.source:
        source["source"] = sm.source
    classes = list(sm.classes)
    local = copy or options.workers <= 1
    items = _PackedItems(ds, src, src_format, options.processing, copy, local)
    funnel = replace(options, workers=1) if local else options  # copies are read in this process
    try:
        if dst_format != "imagefolder":
            template = Manifest(
                format=dst_format, num_samples=0, classes=classes, processing=processing, files=[],
                shuffle_seed=sm.shuffle_seed, skipped=list(sm.skipped), ignored=dict(sm.ignored), source=source,
                created_by=f"packer {__version__}", label_kind=sm.label_kind, fields=_source_fields(ds),
            )
            template.version = FIELDS_VERSION if template.fields else MANIFEST_VERSION
            fingerprint = {"source": _source_fingerprint(ds.root, sm),
                           "options": options_fingerprint(dst_format, template, options)}
            done = convert_source(items, dst, dst_format, template, funnel, fingerprint, shown=src, t0=t0)
            manifest = done.manifest
            new_skips = manifest.skipped[: len(manifest.skipped) - len(sm.skipped)]
            return TranscodeReport(dst, manifest, done.seconds, list(new_skips), copied=copy, resumed=done.resumed,
                                   notes=done.notes, left_small=done.left_small)
        if sm.label_kind != "class" or sm.fields:
            what = f"{sm.label_kind} labels" if sm.label_kind != "class" else f"fields ({', '.join(sm.field_names)})"
            raise SourceError(f"{src} has {what}, which class folders cannot hold; convert it to another packed "
                              f"format instead")
        tmp = temp_dir_for(dst)
        if os.path.lexists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
        try:
            count, skipped, renamed = _unpack(source_items(items, funnel)(0), tmp, classes)
            if count == 0:
                raise SourceError(f"no sample of {src} could be unpacked ({len(skipped)} skipped)")
            os.sync()  # every file durable before the folder appears under its name
            publish(tmp, dst, options.overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        ds.close()
    manifest = Manifest(
        format="imagefolder", num_samples=count, classes=classes, processing=processing, files=[],
        shuffle_seed=None, skipped=skipped, source=source, created_by=f"packer {__version__}",
    )
    return TranscodeReport(dst, manifest, time.perf_counter() - t0, skipped, renamed=renamed, copied=copy)
