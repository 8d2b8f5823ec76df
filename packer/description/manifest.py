"""``manifest.json``: what a packed dataset is, written last and atomically, checked loudly on read.

A directory without a manifest is an unfinished conversion and every reader refuses it. The file is
plain JSON (no pickle, no code); ``version`` guards the layout, and readers refuse versions they do
not know. No timestamps go in: the same input and options give a byte-identical manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import CorruptDataError, ManifestError, UnfinishedDatasetError
from ..fields import FIELD_KINDS, KINDS, named
from ..fields.mask import MASK_DTYPES
from ..files.fileio import open_regular
from ..files.filesystem import atomic_write_bytes, fsync_dir
from .placement import is_file_id

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "FIELDS_VERSION",
    "FIRST_FIELDS_VERSION",
    "MASK_DTYPES",
    "with_mask_dtype",
    "widest_mask_dtype",
    "FIELD_KINDS",
    "FileEntry",
    "Skipped",
    "Manifest",
    "read_manifest",
    "write_manifest",
    "atomic_write_bytes",
    "fsync_dir",
    "file_sha256",
    "file_problem",
    "ITEM_RECORDS",
    "item_records",
    "without_item_records",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 2
#: The version of datasets whose samples have fields besides the image (masks, extra images,
#: boxes); a dataset without any is written in :data:`MANIFEST_VERSION`, which readers of
#: packer 0.2 before fields read.
FIELDS_VERSION = 4
#: The first version whose samples may have fields.
FIRST_FIELDS_VERSION = 3
#: Versions this packer reads: 1 (packer 0.1), 2 (payload files carry ids that bind samples to
#: their place), 3 (samples may have a mask, extra images and boxes: ``fields``), 4 (the mask
#: field declares the dtype every mask is read as: ``"dtype"``).
READABLE_VERSIONS = (1, 2, 3, 4)
MAX_MANIFEST_BYTES = 1 << 30  # a manifest lists every file and skip: ~100 bytes each


@dataclass
class FileEntry:
    """One payload file: its name in the dataset directory, samples in it, size and SHA-256."""

    name: str
    samples: int
    bytes: int
    sha256: str
    first: int = 0  # global index of its first sample
    #: version 2: the file's identity (packer.description.placement), or the sample table's (packer.description.samples.table_id;
    #: "" in tables written before tables had one); "" for index files and version 1
    id: str = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON form written in the manifest (no ``id`` key where there is none)."""
        d = asdict(self)
        if not self.id:
            del d["id"]
        return d


@dataclass
class Skipped:
    """A source file that was left out, and why."""

    path: str
    reason: str


@dataclass
class Manifest:
    """The parsed manifest. ``layout`` holds format-specific facts (documented in FORMATS.md)."""

    format: str
    num_samples: int
    classes: list[str]
    processing: dict[str, Any]
    files: list[FileEntry]
    shuffle_seed: int | None = None
    skipped: list[Skipped] = field(default_factory=list)
    ignored: dict[str, int] = field(default_factory=dict)
    layout: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    created_by: str = ""
    version: int = MANIFEST_VERSION
    #: ``class`` (one class index per sample), ``multi`` (a list of them) or ``number``
    #: (packer.description.samples); written as ``"labels": {"kind": ...}`` when not ``class``.
    label_kind: str = "class"
    #: Version 3 on: what each sample has besides its image and label, in stored order:
    #: ``{"name": "mask", "kind": "mask", "dtype": "uint8" or "uint16"}`` (``dtype`` from version
    #: 4: every mask is read as it, its stored PNG 8 or 16 bits), ``{"name": NAME, "kind":
    #: "image"}`` (extra images) and ``{"name": "boxes", "kind": "boxes", "labels": bool}``. Empty
    #: in versions 1 and 2.
    fields: list[dict[str, Any]] = field(default_factory=list)

    @property
    def field_names(self) -> list[str]:
        """The names of the samples' fields besides image and label (``mask``, extra images' names,
        ``boxes``), in stored order."""
        return [f["name"] for f in self.fields]

    def field_kind(self, name: str) -> str | None:
        """The kind of field ``name`` (``mask``, ``image``, ``boxes``), or None when samples have none."""
        return next((f["kind"] for f in self.fields if f["name"] == name), None)

    @property
    def mask_dtype(self) -> str | None:
        """The dtype every mask is read as (``uint8`` or ``uint16``), or None: no mask, or a
        version 3 dataset, whose masks read as each one is stored (8 or 16 bits)."""
        return next((f.get("dtype") for f in self.fields if KINDS[f["kind"]].dtyped), None)

    @property
    def stored_fields(self) -> list[str]:
        """The names of the fields stored as payloads (masks and extra images), in stored order."""
        return [f["name"] for f in self.fields if KINDS[f["kind"]].stored]

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name -> label."""
        return {c: i for i, c in enumerate(self.classes)}

    def to_json(self) -> dict[str, Any]:
        """The JSON object written to disk (keys in a fixed order)."""
        d = {
            "version": self.version,
            "format": self.format,
            "created_by": self.created_by,
            "num_samples": self.num_samples,
            "classes": self.classes,
            "processing": self.processing,
            "shuffle_seed": self.shuffle_seed,
            "files": [f.to_json() for f in self.files],
            "layout": self.layout,
            "source": self.source,
            "skipped": [asdict(s) for s in self.skipped],
            "ignored": self.ignored,
        }
        if self.label_kind != "class":
            d["labels"] = {"kind": self.label_kind}
        if self.fields:
            d["fields"] = self.fields
        return d

    def dumps(self) -> bytes:
        """Serialised manifest bytes (stable: same manifest, same bytes)."""
        return (json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, d: Any, path: str = MANIFEST_NAME, formats: Collection[str] | None = None) -> Manifest:
        """Validate and build a Manifest; ManifestError names the file and the problem. With
        ``formats`` (:func:`packer.formats.format_names`) the ``format`` must be one of them."""
        if not isinstance(d, dict):
            raise ManifestError(f"{path}: expected a JSON object")
        version = d.get("version")
        if isinstance(version, bool) or version not in READABLE_VERSIONS:
            raise ManifestError(
                f"{path}: manifest version {version!r} is not supported by this packer "
                f"(it reads versions {', '.join(map(str, READABLE_VERSIONS))}); upgrade packer or re-convert"
            )
        try:
            files = [_file_entry(f, i) for i, f in enumerate(_typed(_field(d, "files", "files"), list, "files"))]
            shuffle_seed = d.get("shuffle_seed")
            if shuffle_seed is not None:
                _typed(shuffle_seed, int, "shuffle_seed")
            m = cls(
                format=_format_name(_field(d, "format", "format"), formats),
                num_samples=_count(_field(d, "num_samples", "num_samples"), "num_samples"),
                classes=_class_names(_field(d, "classes", "classes")),
                processing=_typed_keys(_field(d, "processing", "processing"), "processing", _PROCESSING_TYPES),
                files=files,
                shuffle_seed=shuffle_seed,
                skipped=[_skipped(s, i) for i, s in enumerate(_typed(d.get("skipped", []), list, "skipped"))],
                ignored=_counts(d.get("ignored", {}), "ignored"),
                layout=_typed_keys(d.get("layout", {}), "layout", _LAYOUT_TYPES),
                source=dict(_typed(d.get("source", {}), dict, "source")),
                created_by=_typed(d.get("created_by", ""), str, "created_by"),
                version=version,
                label_kind=_label_kind(d.get("labels", {"kind": "class"})),
                fields=_fields(d.get("fields", []), version),
            )
        except (TypeError, ValueError) as e:
            raise ManifestError(f"{path}: malformed manifest ({e})") from None
        for f in files:
            if version >= 2 and (f.samples or f.id) and not is_file_id(f.id):
                what = "payload file" if f.samples else "file"
                raise ManifestError(f"{path}: {what} {f.name!r} has no valid id (16 hex digits)")
            if version < 2 and f.id:
                raise ManifestError(f"{path}: version {version} manifests have no file ids ({f.name!r} has one)")
        names = [f.name for f in files]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ManifestError(f"{path}: the file {dup!r} is listed twice")
        if sum(f.samples for f in files) != m.num_samples:
            raise ManifestError(
                f"{path}: files hold {sum(f.samples for f in files)} samples but num_samples is {m.num_samples}"
            )
        if not m.num_samples:  # every conversion refuses to publish an empty dataset
            raise ManifestError(f"{path}: files[] lists no file holding samples; a packed dataset holds at least one")
        held = 0
        for i, f in enumerate(files):  # payload files hold consecutive samples, in the order listed
            if f.samples and f.first != held:
                raise ManifestError(f"{path}: files[{i}] ({f.name!r}) says its first sample is {f.first}, but the "
                                    f"files listed before it hold {held}")
            held += f.samples
        if m.label_kind == "class" and not m.classes:
            raise ManifestError(f"{path}: classes is empty, but the {m.num_samples} samples have class labels")
        return m


_MAX_COUNT = (1 << 63) - 1
_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", bool: "true or false",
               float: "a number", type(None): "null"}
#: Types of the nested fields packer reads back and acts on (other keys are kept as they are).
_PROCESSING_TYPES: dict[str, type | tuple[type, ...]] = {
    "resize": str, "encoding": str, "color": str, "interpolation": str, "upscale": bool, "reduced_decode": bool,
    "max_pixels": int,
}
_LAYOUT_TYPES: dict[str, type | tuple[type, ...]] = {"foreign": bool, "gzip": bool}


def _fields(value: Any, version: int) -> list[dict[str, Any]]:
    """The ``fields`` list checked: versions 3 and 4 have at least one, earlier versions none;
    unique names, known kinds, ``mask`` and ``boxes`` named so; a version 4 mask's ``dtype``."""
    out = [dict(_typed(f, dict, f"fields[{i}]")) for i, f in enumerate(_typed(value, list, "fields"))]
    if (version >= FIRST_FIELDS_VERSION) != bool(out):
        raise ValueError(f"a version {version} manifest has {'no' if not out else ''} fields"
                         f"{'' if not out else ' (only versions 3 and later have them)'}")
    names = [_typed(_field(f, "name", "fields.name"), str, "fields.name") for f in out]
    for f, name in zip(out, names):
        kind = _typed(_field(f, "kind", "fields.kind"), str, "fields.kind")
        if kind not in KINDS:
            raise ValueError(f"field {name!r} has kind {kind!r}, not one of {', '.join(KINDS)}")
        if named(name) is not KINDS[kind]:
            raise ValueError(f"field {name!r} of kind {kind!r}: the mask is named mask, the boxes boxes")
        KINDS[kind].check(f, version >= FIELDS_VERSION)
    if len(set(names)) != len(names):
        raise ValueError(f"field {next(n for n in names if names.count(n) > 1)!r} is listed twice")
    return out


def with_mask_dtype(fields: list[dict[str, Any]], bits: int, version: int) -> list[dict[str, Any]]:
    """``fields`` with the mask's ``dtype`` declared for masks whose widest stored PNG has ``bits``
    (version 4 on; a version 3 dataset's fields are returned as they are)."""
    if version < FIELDS_VERSION:
        return fields
    return [KINDS[f["kind"]].with_depth(f, MASK_DTYPES[bits]) for f in fields]


def widest_mask_dtype(dtypes: list[str | None]) -> int:
    """The bits of the widest of mask ``dtypes`` (``uint8``/``uint16``; None counts as 8)."""
    bits = {v: k for k, v in MASK_DTYPES.items()}
    return max((bits.get(d or "uint8", 16) for d in dtypes), default=8)


def _label_kind(value: Any) -> str:
    kind = _typed(_field(_typed(value, dict, "labels"), "kind", "labels.kind"), str, "labels.kind")
    if kind not in ("class", "multi", "number"):
        raise ValueError(f"labels.kind must be class, multi or number, not {kind!r}")
    return kind


def _typed(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """``value`` when it is a ``kind`` (a bool is not an integer here); else TypeError naming ``what``."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        wanted = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
        raise TypeError(f"{what} must be {wanted}, not {_JSON_NAMES.get(type(value), type(value).__name__)}")
    return value


def _field(d: dict[str, Any], key: str, what: str) -> Any:
    """``d[key]``; ValueError naming the field ``what`` when it is missing."""
    if key not in d:
        raise ValueError(f"{what} is missing")
    return d[key]


def _format_name(value: Any, formats: Collection[str] | None) -> str:
    """The format's name; with ``formats`` (the registry's names), one of them."""
    name = _typed(value, str, "format")
    if formats is not None and name not in formats:
        shown = name if len(name) <= 40 else f"{name[:40]}..."
        raise ValueError(f"format {shown!r} is not one this packer reads ({', '.join(formats)}); "
                         f"written by a newer packer or not a packer manifest")
    return name


def _typed_keys(value: Any, what: str, types: dict[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """A JSON object whose known keys have their types (``what.key`` named when one does not)."""
    d = dict(_typed(value, dict, what))
    for key, kind in types.items():
        if key in d:
            _typed(d[key], kind, f"{what}.{key}")
    return d


def _counts(value: Any, what: str) -> dict[str, int]:
    """A JSON object of counts (``ignored``)."""
    d = dict(_typed(value, dict, what))
    for key, n in d.items():
        _count(n, f"{what}.{key}")
    return d


def _skipped(s: Any, i: int) -> Skipped:
    """One ``skipped[]`` entry: an object with string ``path`` and ``reason``."""
    _typed(s, dict, f"skipped[{i}]")
    return Skipped(path=_typed(_field(s, "path", f"skipped[{i}].path"), str, f"skipped[{i}].path"),
                   reason=_typed(_field(s, "reason", f"skipped[{i}].reason"), str, f"skipped[{i}].reason"))


def _count(value: Any, what: str) -> int:
    """A non-negative integer that fits in int64 (no bool, float or string)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
        raise ValueError(f"{what} must be an integer from 0 to 2^63-1, not {shown}")
    return value


def _class_names(value: Any) -> list[str]:
    names = _typed(value, list, "classes")
    for i, c in enumerate(names):
        _typed(c, str, f"classes[{i}]")
    if len(set(names)) != len(names):
        raise ValueError(f"class {next(c for c in names if names.count(c) > 1)!r} is listed twice")
    return names


def _file_entry(f: Any, i: int) -> FileEntry:
    """One ``files[]`` entry: a plain file name inside the dataset folder, with sane counts.

    Every sample takes at least one byte of its file (empty payloads are never stored), so an
    entry claiming more samples than bytes is refused: a forged count can never make a reader
    or ``verify`` loop or allocate beyond what the file's real size (checked at open) allows."""
    at = f"files[{i}]"
    _typed(f, dict, at)
    name = _typed(_field(f, "name", f"{at}.name"), str, f"{at}.name")
    if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name or name != name.strip("\n"):
        raise ValueError(f"{at}.name {name!r} is not a plain file name inside the dataset folder")
    entry = FileEntry(name=name, samples=_count(_field(f, "samples", f"{at}.samples"), f"{at}.samples"),
                      bytes=_count(_field(f, "bytes", f"{at}.bytes"), f"{at}.bytes"),
                      sha256=_typed(f.get("sha256", ""), str, f"{at}.sha256"),
                      first=_count(f.get("first", 0), f"{at}.first"), id=_typed(f.get("id", ""), str, f"{at}.id"))
    if entry.samples > entry.bytes:
        raise ValueError(f"{at} ({name!r}) claims {entry.samples} samples in {entry.bytes} bytes; every sample "
                         f"takes at least one byte")
    return entry


#: The ``source`` key under which a conversion of explicit items (``convert_items``) lists the
#: files it converted, in item order: ``[key, size, mtime_ns]`` (``-1, -1`` when it could not be read).
ITEM_RECORDS = "converted"


def _nested_sources(source: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``source`` and the sources it holds (a converted dataset's ``source``, a merge's
    ``parts[i].source``), each with where it is (``source``, ``source.parts[1].source``)."""
    out, stack = [], [("source", source)]
    while stack:
        at, s = stack.pop()
        out.append((at, s))
        inner = s.get("source")
        if isinstance(inner, dict):
            stack.append((f"{at}.source", inner))
        parts = s.get("parts")
        for i, p in enumerate(parts if isinstance(parts, list) else []):
            if isinstance(p, dict) and isinstance(p.get("source"), dict):
                stack.append((f"{at}.parts[{i}].source", p["source"]))
    return out


def item_records(source: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every per-item record list (:data:`ITEM_RECORDS`) in a manifest's ``source``, nested ones
    included, each with where it is (``source.converted``); not checked here."""
    return [(f"{at}.{ITEM_RECORDS}", s[ITEM_RECORDS]) for at, s in _nested_sources(source) if ITEM_RECORDS in s]


def without_item_records(source: dict[str, Any]) -> dict[str, Any]:
    """A copy of a manifest's ``source`` without per-item record lists, nested ones included (what
    goes where a manifest's facts are copied: HDF5's ``manifest`` attribute, a merge's parts)."""
    if not item_records(source):
        return source
    root = dict(source)
    stack = [root]
    while stack:  # copies along the nesting, no recursion (a manifest may nest deeply)
        s = stack.pop()
        s.pop(ITEM_RECORDS, None)
        if isinstance(s.get("source"), dict):
            s["source"] = dict(s["source"])
            stack.append(s["source"])
        if isinstance(s.get("parts"), list):
            parts = []
            for p in s["parts"]:
                if isinstance(p, dict) and isinstance(p.get("source"), dict):
                    p = {**p, "source": dict(p["source"])}
                    stack.append(p["source"])
                parts.append(p)
            s["parts"] = parts
    return root


def write_manifest(directory: str, manifest: Manifest) -> None:
    """Write ``directory/manifest.json`` atomically; call it after every payload file is durable."""
    atomic_write_bytes(os.path.join(directory, MANIFEST_NAME), manifest.dumps())


def read_manifest(directory: str | os.PathLike[str], formats: Collection[str] | None = None) -> Manifest:
    """Read and validate a dataset's manifest (its ``format`` one of ``formats`` when given:
    :func:`packer.formats.read_manifest` gives the registry's).

    Raises FileNotFoundError for a missing directory, UnfinishedDatasetError when the directory
    exists without a manifest, ManifestError when it is unreadable or of an unknown version.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        if os.path.exists(directory):
            raise ManifestError(f"{directory} is not a packed dataset (a packed dataset is a directory)")
        raise FileNotFoundError(f"no packed dataset at {directory}")
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_MANIFEST_BYTES:
                raise ManifestError(f"{path}: larger than {MAX_MANIFEST_BYTES >> 20} MiB; not a packer manifest")
            raw = f.read()
    except CorruptDataError as e:
        raise ManifestError(str(e)) from None
    except FileNotFoundError:
        err = UnfinishedDatasetError(
            f"{directory} has no {MANIFEST_NAME}: the conversion did not finish (or this is not a "
            f"packed dataset); re-run the conversion, with --resume if it was interrupted"
        )
        err.directory = directory  # type: ignore[attr-defined]  # for packer.formats.explain_missing_manifest
        raise err from None
    try:
        d = json.loads(raw)
    except ValueError as e:  # also UnicodeDecodeError, and integers of more than 4300 digits
        raise ManifestError(f"{path}: not valid JSON ({str(e)[:200]})") from None
    except RecursionError:
        raise ManifestError(f"{path}: JSON nested too deeply; not a packer manifest") from None
    if _SURROGATE_ESCAPE.search(raw):  # rare: only then is every string walked
        where = _lone_surrogate(d, "manifest")
        if where:
            raise ManifestError(f"{path}: {where} holds a lone UTF-16 surrogate escape (\\ud800-\\udfff): "
                                f"not Unicode text, so it could not be written anywhere")
    return Manifest.from_json(d, path, formats)


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate(value: Any, where: str) -> str | None:
    """The field (``classes[0]``, ``skipped[2].path``) of the first string or key in ``value``
    that is not valid Unicode (JSON lets ``\\udce9`` stand alone), or None."""
    stack = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return at
        elif isinstance(v, list):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))
        elif isinstance(v, dict):
            for k, x in v.items():
                stack.append((k, f"{at} key {k.encode('utf-8', 'backslashreplace').decode()!r}"))
                stack.append((x, f"{at}.{k}" if at != "manifest" else k))
    return None


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_problem(fp: str, f: FileEntry, sha256: bool = True) -> str | None:
    """What is wrong with the dataset file ``fp`` against its manifest entry ``f`` (not a regular
    file, another size, with ``sha256`` another SHA-256), or None when it agrees."""
    try:
        st = os.lstat(fp)
    except FileNotFoundError:
        return "missing payload file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a symlink, FIFO, device or folder); not read"
    if st.st_size != f.bytes:
        return f"{st.st_size} bytes, manifest says {f.bytes} (truncated or appended)"
    if sha256 and file_sha256(fp) != f.sha256:
        return "SHA-256 differs from the manifest (file modified or corrupt)"
    return None
