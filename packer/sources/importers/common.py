"""What every importer shares: the table a reader presents, the choice of the image, label and
metadata columns, and the conversion of its rows through a spool folder beside the destination."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...description.samples import MAX_META_BYTES
from ...errors import PackerError, SourceError

__all__ = ["Column", "Table", "convert_import", "choose_columns", "check_value_size", "is_image", "needs", "reading",
           "text_value", "LABEL_COLUMNS", "MAX_VALUE_BYTES"]

LABEL_COLUMNS = ("label", "labels", "class", "target")
#: The most stored bytes a value column (number, text, JSON, array) may hold in one sample: four
#: times what a sample's metadata may take as JSON (its ``MAX_META_BYTES``).
MAX_VALUE_BYTES = 4 * MAX_META_BYTES
_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")


@dataclass(frozen=True)
class Column:
    """A column of a foreign dataset: ``kind`` is ``image`` (an image type), ``bytes`` (raw bytes,
    an image or not), ``value`` (a number, text or JSON value) or ``refused`` (``why`` says why)."""

    name: str
    kind: str
    why: str = ""


class Table(Protocol):
    """A foreign dataset as a reader presents it."""

    #: the source as shown in messages (its path or URL)
    shown: str
    columns: list[Column]
    #: the class names a column declares (a Hugging Face ClassLabel), by column
    class_names: dict[str, list[str]]

    def rows(self, names: Sequence[str]) -> Iterator[dict[str, Any]]:
        """Every sample in order, with the columns ``names`` decoded: images and bytes as bytes
        (an image file's) or an image as the absolute path of its file, values as JSON values."""
        ...


@dataclass
class Choice:
    """The columns a conversion uses: the image, the label and the metadata."""

    image: str
    label: str
    meta: list[str] = field(default_factory=list)


def needs(module: str, what: str, extra: str) -> Any:
    """``module`` imported, or SourceError saying ``what`` needs it and the extra that brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise SourceError(f"{what} needs the {module.split('.')[0]} module: pip install 'packer[{extra}]'") from None


@contextlib.contextmanager
def reading(where: str) -> Iterator[None]:
    """Errors of damaged data read inside (a short file, a bad offset, a failed decompression) as
    one SourceError line naming ``where``."""
    try:
        yield
    except PackerError:
        raise
    except Exception as e:  # noqa: BLE001 - struct, numpy, zlib, zstandard, snappy, brotli, pyarrow: each its own types
        text = str(e).splitlines()[0] if str(e) else ""
        raise SourceError(f"{where}: damaged or not as its index describes ({type(e).__name__}: {text})") from None


def check_value_size(size: int, where: str, column: str) -> None:
    """SourceError naming ``where`` and ``column`` when a value column's stored bytes are more
    than :data:`MAX_VALUE_BYTES`: checked before the value is decoded, so a large array or text
    is refused without building it (no number takes more than 8 bytes and fewer than 2 of JSON,
    no text fewer bytes of JSON than it has)."""
    if size > MAX_VALUE_BYTES:
        raise SourceError(f"{where}: column {column!r} holds {size} bytes, more than metadata can keep (at most "
                          f"{MAX_META_BYTES} bytes of JSON a sample); leave it out with --drop-column {column} "
                          f"(drop_column=[...] in Python)")


def text_value(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text; SourceError naming ``where`` when it is not UTF-8 or holds a NUL
    byte (binary data such as a number under a text encoding, not text)."""
    text = bytes(data).decode("utf-8")
    if "\0" in text:
        raise SourceError(f"{where}: a text value with a NUL byte ({bytes(data[:16])!r}...): binary data, not text; "
                          f"is the column's declared type right?")
    return text


def is_image(data: Any) -> bool:
    """True when ``data`` starts like an image file (JPEG, PNG, GIF, BMP, TIFF, WebP)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return False
    head = bytes(data[:12])
    return head.startswith(_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")


def _names(columns: Sequence[Column]) -> str:
    return ", ".join(f"{c.name} ({c.kind})" for c in columns)


def _image_column(table: Table, given: str | None, columns: list[Column]) -> str:
    if given is not None:
        if given not in {c.name for c in columns}:
            raise SourceError(f"{table.shown}: no image column {given!r} (columns: {_names(table.columns)})")
        return given
    images = [c.name for c in columns if c.kind == "image"]
    if not images:  # bytes columns whose first value is an image file
        candidates = [c.name for c in columns if c.kind == "bytes"]
        first = next(table.rows(candidates), {}) if candidates else {}
        images = [n for n in candidates if is_image(first.get(n))]
    if len(images) != 1:
        what = f"{len(images)} image columns ({', '.join(images)})" if images else "no image column"
        raise SourceError(f"{table.shown}: {what}; name the one to use with --image-column "
                          f"(image_column= in Python; columns: {_names(table.columns)})")
    return images[0]


def choose_columns(table: Table, image: str | None = None, label: str | None = None,
                   drop: Sequence[str] = ()) -> Choice:
    """The image, label and metadata columns of ``table``; SourceError naming the columns (and the
    option to use) when the choice is ambiguous or a column cannot be kept."""
    known = {c.name for c in table.columns}
    unknown = [d for d in drop if d not in known]
    if unknown:
        raise SourceError(f"{table.shown}: --drop-column {unknown[0]!r}: no such column (columns: "
                          f"{_names(table.columns)})")
    columns = [c for c in table.columns if c.name not in drop]
    image = _image_column(table, image, columns)
    if label is None:
        label = next((n for n in LABEL_COLUMNS if n in {c.name for c in columns}), None)
        if label is None:
            raise SourceError(f"{table.shown}: no label column; name one of {', '.join(LABEL_COLUMNS)} or pass "
                              f"--label-column (label_column= in Python; columns: {_names(table.columns)})")
    elif label not in {c.name for c in columns}:
        raise SourceError(f"{table.shown}: no label column {label!r} (columns: {_names(table.columns)})")
    kinds = {c.name: c.kind for c in columns}
    if kinds[image] not in ("image", "bytes"):
        raise SourceError(f"{table.shown}: column {image!r} holds no images (it is a {kinds[image]} column; columns: "
                          f"{_names(table.columns)})")
    for c in columns:
        if c.name == image:
            continue
        if c.kind == "refused" or (c.kind in ("image", "bytes") and c.name != label):
            why = c.why or f"holds {'images' if c.kind == 'image' else 'bytes'}, which metadata (JSON) cannot"
            raise SourceError(f"{table.shown}: column {c.name!r} {why}; leave it out with --drop-column {c.name} "
                              f"(drop_column=[...] in Python)")
    return Choice(image, label, [c.name for c in columns if c.name not in (image, label)])


def _spool(table: Table, choice: Choice, spool: str) -> tuple[list[tuple[str, Any, dict[str, Any] | None]], list[str]]:
    """Each row's image written to a file in ``spool``, and the items convert_items takes."""
    from ...files.spool import write_spooled

    items: list[tuple[str, Any, dict[str, Any] | None]] = []
    keys: list[str] = []
    for i, row in enumerate(table.rows([choice.image, choice.label, *choice.meta])):
        data = row[choice.image]
        if isinstance(data, str):  # an image file the source names: read where it is
            path = data
        else:
            path = os.path.join(spool, f"{i:010d}")
            write_spooled(path, bytes(data) if isinstance(data, (bytes, bytearray, memoryview)) else b"")
        meta = {k: row[k] for k in choice.meta}
        items.append((path, row[choice.label], meta or None))
        keys.append(f"item-{i:010d}")
    if not items:
        raise SourceError(f"{table.shown}: the dataset has no samples")
    return items, keys


def _label_kind(items: Sequence[tuple[str, Any, Any]]) -> str:
    """``multi`` for lists, ``number`` for numbers with a fraction, else ``class``."""
    labels = [x[1] for x in items]
    if all(isinstance(v, list) for v in labels):
        return "multi"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in labels) and \
            any(isinstance(v, float) and not v.is_integer() for v in labels):
        return "number"
    return "class"


def _class_labels(items: list[tuple[str, Any, Any]], declared: list[str] | None) -> list[tuple[str, Any, Any]]:
    """Labels given as whole floats (a float column of class numbers) as ints, and numbers as the
    names the source declares for them (so a pinned class list maps them by name)."""
    out = []
    for p, v, m in items:
        v = int(v) if isinstance(v, float) and v.is_integer() else v
        if declared and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(declared):
            v = declared[v]
        out.append((p, v, m))
    return out


def convert_import(table: Table, dst: str | os.PathLike[str], fmt: str, options: Any, *, image_column: str | None = None,
                   label_column: str | None = None, drop_columns: Sequence[str] = (), label_kind: str = "auto",
                   classes: Sequence[str] | None = None, source_kind: str = "import") -> Any:
    """Convert the rows of ``table`` into a packed dataset of format ``fmt`` at ``dst`` (the
    ConvertReport): images through a temporary folder beside ``dst``, so memory does not grow
    with the images; integer labels keep their values, class names come from ``classes``, the
    table's declared classes, or the names found (sorted); other columns become metadata."""
    from ...pipeline.items import convert_items, item_classes
    from ...pipeline.order import recorded_seed, write_order

    choice = choose_columns(table, image_column, label_column, drop_columns)
    dst = os.path.abspath(os.fspath(dst))
    parent = os.path.dirname(dst)
    os.makedirs(parent, exist_ok=True)
    spool = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.import-", dir=parent)
    try:
        items, keys = _spool(table, choice, spool)
        kind = _label_kind(items) if label_kind == "auto" else label_kind
        declared = table.class_names.get(choice.label)
        if kind == "class":
            items = _class_labels(items, declared)
        names = list(classes) if classes is not None else declared
        if kind == "class":  # a label that fits no class, named by its position in the source (before the shuffle)
            try:
                item_classes([x[1] for x in items], names)
            except ValueError as e:
                raise SourceError(f"{table.shown}: {str(e).replace('item ', 'sample ', 1)}") from None
        order = write_order(len(items), options)
        try:
            return convert_items([items[i] for i in order], dst, fmt, options, names, label_kind=kind,
                                 keys=[keys[i] for i in order], record_files=False,
                                 source={"kind": source_kind, "path": table.shown, "image_column": choice.image,
                                         "label_column": choice.label},
                                 shuffle_seed=recorded_seed(options))
        except ValueError as e:
            if isinstance(e, SourceError):
                raise
            raise SourceError(f"{table.shown}: {e}") from None
    finally:
        shutil.rmtree(spool, ignore_errors=True)


class Folder:
    """The files of a foreign dataset's folder, local or at a URL (read through
    :mod:`packer.storage.remote`, with its ``storage_options``), each read whole when asked."""

    def __init__(self, src: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
        from ...storage.remote import Remote, is_url

        self.shown = os.fspath(src).rstrip("/") if is_url(src) else os.path.abspath(os.fspath(src))
        self.remote = Remote(self.shown, dict(storage_options or {})) if is_url(src) else None

    def read(self, name: str) -> bytes:
        """The file ``name`` of the folder; SourceError naming it when it cannot be read."""
        if self.remote is not None:
            with self.remote.open(name) as f:
                return f.read()
        path = os.path.join(self.shown, name)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise SourceError(f"{path}: cannot read it ({e.strerror or e})") from None

    def json(self, name: str) -> Any:
        """The JSON file ``name``; SourceError naming it when it is missing or not JSON."""
        import json

        where = f"{self.shown}/{name}"
        try:
            return json.loads(self.read(name))
        except SourceError:
            raise SourceError(f"{where}: no such file; is {self.shown} the dataset's folder?") from None
        except ValueError as e:
            raise SourceError(f"{where}: not JSON ({e})") from None


def raw_image_png(mode: str, width: int, height: int, raw: bytes, where: str) -> bytes:
    """A PIL image stored raw (mode, size, pixel bytes: MDS ``pil``, LitData's PIL serializer) as
    lossless PNG bytes; modes RGB, RGBA, L and 1. SourceError naming ``where`` for another mode."""
    import cv2
    import numpy as np

    channels = {"RGB": 3, "RGBA": 4, "L": 1}.get(mode)
    if mode == "1":
        if len(raw) != (width + 7) // 8 * height:
            raise SourceError(f"{where}: a {width}x{height} mode-1 image needs {(width + 7) // 8 * height} bytes, "
                              f"not {len(raw)}")
        bits = np.unpackbits(np.frombuffer(raw, np.uint8).reshape(height, -1), axis=1)[:, :width]
        pixels = (bits * 255).astype(np.uint8)
    elif channels is None:
        raise SourceError(f"{where}: a raw image of mode {mode!r}; packer reads modes RGB, RGBA, L and 1")
    else:
        if len(raw) != width * height * channels:
            raise SourceError(f"{where}: a {width}x{height} {mode} image needs {width * height * channels} bytes, "
                              f"not {len(raw)}")
        pixels = np.frombuffer(raw, np.uint8).reshape(height, width, channels)
        pixels = pixels[:, :, [2, 1, 0, 3][:channels]] if channels > 1 else pixels[:, :, 0]
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(pixels), [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise SourceError(f"{where}: OpenCV could not encode the raw image as PNG")
    return buf.tobytes()
