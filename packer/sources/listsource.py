"""Sources that are lists, not class folders: a CSV, TSV or JSON Lines file naming each image, its
label and any other per-sample fields (kept as metadata). :func:`read_list` parses one into the
items :func:`packer.pipeline.items.convert_items` takes; :func:`convert_list` does both.

    path,label,photographer
    train/0001.jpg,cat,ann
    train/0002.jpg,dog,bob

Paths are relative to the list's folder unless ``root`` is given, and must lie inside that folder:
a row that leads out of it (``../x.jpg``, an absolute path elsewhere) is refused unless
``allow_outside_root`` is set, so a list from elsewhere cannot pack files it was not meant to reach.
The check is on the path as written; symlinks inside the folder are followed wherever they lead,
as in an image folder (the folder is the user's own; the list may be someone else's).
The label column holds a class name or number (``class``), several classes (``multi``: a JSON list
in JSON Lines, or names separated by ``label_sep`` in CSV/TSV), or a number (``number``). Columns
may also name a mask, extra images and boxes per row (:class:`FieldColumns`). CSV/TSV metadata is
typed column by column (:func:`column_types`) unless ``metadata_types="text"``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..description.samples import LABEL_KINDS, MAX_META_BYTES, MAX_META_DEPTH, encode_meta
from ..errors import SourceError
from ..fields.sample import check_field_name
from ..files.fileio import NotReadableError, open_source_file
from ..wording import plural

__all__ = ["ListSource", "FieldColumns", "read_list", "convert_list", "column_types", "LIST_FORMATS", "METADATA_TYPES"]

#: List file suffixes and the format each means.
LIST_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
PATH_COLUMNS = ("path", "file", "filename", "image")
LABEL_COLUMNS = ("label", "labels", "class", "target")
#: How CSV/TSV metadata cells are stored: ``auto`` (a column typed as a whole, :func:`column_types`)
#: or ``text`` (every cell a string, as written).
METADATA_TYPES = ("auto", "text")
_DIGITS = re.compile(r"[+-]?[0-9]+")
_INT = re.compile(r"[+-]?(0|[1-9][0-9]{0,18})")  # no leading zeros: "007" is a code, not the number 7
_FLOAT = re.compile(r"[+-]?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_INT64 = (-(2**63), 2**63 - 1)
#: The longest line a list may have: a path, a label and the most metadata a sample may carry, with room.
MAX_LINE_CHARS = 16 * MAX_META_BYTES


@dataclass(frozen=True)
class FieldColumns:
    """The list's columns of fields besides the image: a mask file (a label map), extra image
    files (each named after its column), boxes (a JSON list of ``[x0, y0, x1, y1]`` in the source
    image's pixels; in CSV/TSV a JSON string) and their labels (a JSON list of class names or
    numbers). Paths are relative to the root, as the image's are."""

    mask: str | None = None
    images: tuple[str, ...] = ()
    boxes: str | None = None
    box_labels: str | None = None

    def names(self) -> list[str]:
        """The columns, in this order."""
        return [c for c in (self.mask, *self.images, self.boxes, self.box_labels) if c is not None]


@dataclass
class ListSource:
    """A parsed list: the items (source path, label, metadata), the label kind, the folder the
    paths are relative to, and the columns used."""

    items: list[tuple[Any, ...]]
    label_kind: str
    root: str
    path_column: str
    label_column: str
    #: the list's line number of each item
    lines: list[int]

    def check_classes(self, path: str, classes: Sequence[str]) -> None:
        """SourceError naming the first line whose class is not in ``classes``."""
        names = set(classes)
        for line, (_, label, _, *fields) in zip(self.lines, self.items):
            box_labels = (fields[0].get("box_labels") or []) if fields else []
            for c in [*(label if self.label_kind == "multi" else [label] if self.label_kind == "class" else []),
                      *box_labels]:
                if (isinstance(c, int) and not 0 <= c < len(classes)) or (isinstance(c, str) and c not in names):
                    raise SourceError(f"{path}:{line}: class {c!r} is not in the pinned class list "
                                      f"({plural(len(classes), 'class')}); the labels would not line up")


def _list_format(path: str) -> str:
    for suffix, fmt in LIST_FORMATS.items():
        if path.lower().endswith(suffix):
            return fmt
    raise SourceError(f"{path}: a list must be .csv, .tsv or .jsonl (JSON Lines); got {os.path.basename(path)!r}")


def _open_list(path: str) -> io.TextIOWrapper:
    """The list opened as UTF-8 text (a leading byte-order mark dropped), only if it is a regular
    file (checked on the opened descriptor; a FIFO does not block); SourceError naming it if not."""
    try:
        fd, _ = open_source_file(path, sys.maxsize)
    except FileNotFoundError:
        raise SourceError(f"{path}: no such list file") from None
    except OSError as e:
        raise SourceError(f"{path}: cannot read the list ({e.strerror or e})") from None
    except NotReadableError as e:
        raise SourceError(f"{path}: {e}") from None
    return open(fd, encoding="utf-8-sig", newline="")


def _lines(f: io.TextIOWrapper, path: str) -> Iterator[str]:
    """The lines of ``f``, each read with a bound: SourceError naming the line beyond
    :data:`MAX_LINE_CHARS` characters (a file of one endless line is not read whole)."""
    n = 0
    while True:
        line = f.readline(MAX_LINE_CHARS + 1)
        n += 1
        if len(line) > MAX_LINE_CHARS:
            raise SourceError(f"{path}:{n}: line longer than {MAX_LINE_CHARS} characters; not a list row")
        if not line:
            return
        yield line


def _rows(path: str, fmt: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) for every row; SourceError naming the line when one cannot be read."""
    try:
        with _open_list(path) as f:
            if fmt == "jsonl":
                out = []
                for n, line in enumerate(_lines(f, path), 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line, object_pairs_hook=_unique_keys)
                    except _DuplicateKey as e:
                        raise SourceError(f"{path}:{n}: key {e.args[0]!r} appears twice in one object; "
                                          f"which value is meant is ambiguous") from None
                    except ValueError as e:
                        raise SourceError(f"{path}:{n}: not JSON ({e})") from None
                    except RecursionError:
                        raise SourceError(f"{path}:{n}: JSON nested too deeply to read (metadata may nest at "
                                          f"most {MAX_META_DEPTH} deep)") from None
                    if not isinstance(row, dict):
                        raise SourceError(f"{path}:{n}: each line must be a JSON object")
                    out.append((n, row))
                return out
            reader = csv.DictReader(_lines(f, path), delimiter="," if fmt == "csv" else "\t")
            if not reader.fieldnames:
                raise SourceError(f"{path}: the list is empty (no header row)")
            twice = sorted({c for c in reader.fieldnames if reader.fieldnames.count(c) > 1})
            if twice:
                raise SourceError(f"{path}:{reader.line_num}: column {twice[0]!r} appears twice in the header; "
                                  f"which one is meant is ambiguous")
            out = []
            for row in reader:
                if None in row:
                    raise SourceError(f"{path}:{reader.line_num}: more fields than the header's "
                                      f"{len(reader.fieldnames)}")
                out.append((reader.line_num, dict(row)))
            return out
    except UnicodeDecodeError as e:
        raise SourceError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except csv.Error as e:
        raise SourceError(f"{path}: not a valid {fmt.upper()} file ({e})") from None


class _DuplicateKey(ValueError):
    """A JSON object names a key twice (``json`` keeps the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def path_inside(base: str, full: str) -> bool:
    """True when the normalised path ``full`` lies inside the folder ``base`` as written (``..``
    and ``.`` resolved, symlinks not)."""
    return full == base or full.startswith(base.rstrip(os.sep) + os.sep)


def outside_root_error(path: str, base: str, root_given: bool, outside: list[tuple[int, str]], *, at: str = "line",
                   source: str = "the list") -> SourceError:
    """The error for rows of ``source`` (the list, a Parquet file) whose paths lead outside the
    root, each shown as ``at`` (line, row) and its number."""
    shown = ", ".join(f"{at} {n}: {rel!r}" for n, rel in outside[:5])
    more = f", ... ({len(outside)} rows in all)" if len(outside) > 5 else ""
    what = f"--root {base}" if root_given else f"{source}'s folder {base} (no --root given)"
    lie = "lies" if len(outside) == 1 else "lie"
    return SourceError(f"{path}: {plural(len(outside), 'row')} {lie} outside {what}: {shown}{more}; pass the folder that "
                       f"holds them as --root, or --allow-outside-root if {source} means it")


def _column(path: str, rows: list[tuple[int, dict[str, Any]]], given: str | None, candidates: Sequence[str],
            what: str) -> str:
    names: list[str] = []
    for _, row in rows:
        names.extend(k for k in row if k not in names)
    if given is not None:
        if given not in names:
            raise SourceError(f"{path}: no {what} column {given!r} (columns: {', '.join(names)})")
        return given
    for c in candidates:
        if c in names:
            return c
    raise SourceError(f"{path}: no {what} column; name one of {', '.join(candidates)} or pass the column's name "
                      f"(columns: {', '.join(names)})")


def _kind(values: list[Any], fmt: str) -> str:
    """The label kind a list's label values imply: lists are ``multi``, non-integral numbers are
    ``number``, anything else ``class``."""
    if values and all(isinstance(v, list) for v in values):
        return "multi"
    if fmt == "jsonl" and values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "number" if any(isinstance(v, float) and not v.is_integer() for v in values) else "class"
    return "class"


def _label(value: Any, kind: str, fmt: str, sep: str, where: str) -> Any:
    """One row's label as convert_items takes it for ``kind``, or SourceError naming ``where``."""
    if value is None or value == "":
        raise SourceError(f"{where}: the label is empty")
    if kind == "number":
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise SourceError(f"{where}: label {value!r} is not a finite number")
        return number
    if kind == "multi":
        parts = value if isinstance(value, list) else [p.strip() for p in str(value).split(sep) if p.strip()]
        for p in parts:
            if isinstance(p, bool) or not isinstance(p, (str, int)):
                raise SourceError(f"{where}: label {p!r} is not a class name or number")
        return [_class_value(p, fmt) for p in parts]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SourceError(f"{where}: label {value!r} is not a class name or number (use label kind 'number' for numbers)")
    return _class_value(value, fmt)


def _same_label(a: Any, b: Any, kind: str) -> bool:
    """Whether two rows' labels mean the same (a multi-label set in any order)."""
    if kind == "multi":
        return sorted(map(str, a)) == sorted(map(str, b))
    return a == b


def _class_value(value: str | int, fmt: str) -> str | int:
    """A class given as text: a number when it is all digits (CSV/TSV have no types), else a name."""
    if isinstance(value, str) and fmt != "jsonl" and value.strip().isdigit():
        return int(value)
    return value


def _cell_type(cell: str) -> str:
    """The narrowest type a CSV/TSV cell holds as written: ``int`` (within int64, no leading
    zeros; other digit strings are ``str``: codes and identifiers), ``float`` (finite), ``bool``
    (``true``/``false`` in any case) or ``str``."""
    if _DIGITS.fullmatch(cell):  # an integer as written, or text: never a float
        return "int" if _INT.fullmatch(cell) and _INT64[0] <= int(cell) <= _INT64[1] else "str"
    if _FLOAT.fullmatch(cell) and len(cell) <= 64 and math.isfinite(float(cell)):
        return "float"
    return "bool" if cell.lower() in ("true", "false") else "str"


def column_types(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> dict[str, str]:
    """The type of each of ``columns`` in CSV/TSV ``rows``, decided over the whole column so that
    every sample's value has the same type: ``int`` when every non-empty cell is an integer,
    ``float`` when every one is a number (integers among them become floats), ``bool`` when every
    one is ``true`` or ``false`` (any case), else ``str`` (one cell of text keeps the whole column
    text). A column with no non-empty cell is ``str``."""
    out = {}
    for col in columns:
        seen = {_cell_type(r[col]) for r in rows if isinstance(r.get(col), str) and r[col] != ""}
        out[col] = seen.pop() if len(seen) == 1 else "float" if seen == {"int", "float"} else "str"
    return out


def _typed(cell: Any, kind: str) -> Any:
    """A CSV/TSV cell as its column's type (:func:`column_types`)."""
    if not isinstance(cell, str) or cell == "" or kind == "str":
        return cell
    return int(cell) if kind == "int" else float(cell) if kind == "float" else cell.lower() == "true"


def read_list(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    path_column: str | None = None,
    label_column: str | None = None,
    label_kind: str = "auto",
    label_sep: str = "|",
    allow_outside_root: bool = False,
    mask_column: str | None = None,
    image_columns: Sequence[str] = (),
    boxes_column: str | None = None,
    box_labels_column: str | None = None,
    metadata_types: str = "auto",
) -> ListSource:
    """Parse a CSV, TSV or JSON Lines list into convert_items' items.

    ``path_column`` / ``label_column`` default to the first of ``path, file, filename, image`` /
    ``label, labels, class, target`` present. Every other column is the sample's metadata: JSON
    Lines values keep their JSON types; CSV and TSV cells are typed by column with
    ``metadata_types="auto"`` (integers, numbers or booleans when the whole column is, see
    :func:`column_types`) or kept as text with ``"text"``; empty CSV cells are left out. ``label_kind``: ``auto`` (a list is multi-label, a number with a fraction in JSON Lines
    is ``number``, else ``class``), or ``class``, ``multi``, ``number``. SourceError names the file
    and line of anything it cannot use, and every row whose path leads outside ``root`` (default:
    the list's folder) unless ``allow_outside_root``; a JSON key or CSV/TSV column named twice, a
    file on two rows with different labels, a line over :data:`MAX_LINE_CHARS` characters and JSON
    nested too deeply are errors too. The list must be a regular file (a FIFO or device is refused
    without blocking); a UTF-8 byte-order mark is skipped.

    The field columns (:class:`FieldColumns`), left out of the metadata: ``mask_column`` (a mask
    file's path), ``image_columns`` (extra images' paths, each image named after its column),
    ``boxes_column`` (a JSON list of ``[x0, y0, x1, y1]`` in source pixels; an empty CSV/TSV cell
    is no boxes) and ``box_labels_column`` (a JSON list of class names or numbers, one per box).
    Their paths follow the image path's rules (relative to ``root``, inside it)."""
    path = os.fspath(path)
    if label_kind != "auto" and label_kind not in LABEL_KINDS:
        raise ValueError(f"label kind must be auto or one of {LABEL_KINDS}, not {label_kind!r}")
    if metadata_types not in METADATA_TYPES:
        raise ValueError(f"metadata types must be one of {', '.join(METADATA_TYPES)}, not {metadata_types!r}")
    fmt = _list_format(path)
    rows = _rows(path, fmt)
    if not rows:
        raise SourceError(f"{path}: the list has no rows")
    pcol = _column(path, rows, path_column, PATH_COLUMNS, "path")
    lcol = _column(path, rows, label_column, LABEL_COLUMNS, "label")
    cols = _field_columns(path, rows, FieldColumns(mask_column, tuple(image_columns), boxes_column, box_labels_column),
                          (pcol, lcol))
    kind = _kind([r.get(lcol) for _, r in rows], fmt) if label_kind == "auto" else label_kind
    base = os.path.abspath(os.fspath(root) if root is not None else os.path.dirname(os.path.abspath(path)))
    parsed = _ParsedRows(path, fmt, base, kind, label_sep)
    if fmt != "jsonl" and metadata_types == "auto":
        parsed.types = column_types([r for _, r in rows], [c for c in rows[0][1] if c not in (pcol, lcol, *cols.names())])
    for n, row in rows:
        parsed.add(n, row, pcol, lcol, cols)
    if parsed.outside and not allow_outside_root:
        raise outside_root_error(path, base, root is not None, parsed.outside)
    return ListSource(parsed.items, kind, base, pcol, lcol, parsed.lines)


def _field_columns(path: str, rows: list[tuple[int, dict[str, Any]]], cols: FieldColumns,
                   taken: tuple[str, str]) -> FieldColumns:
    """``cols`` checked against the list: each present, used once, images' columns valid names."""
    for c in cols.names():
        _column(path, rows, c, (), "field")
    names = [*taken, *cols.names()]
    twice = next((c for c in names if names.count(c) > 1), None)
    if twice is not None:
        raise SourceError(f"{path}: column {twice!r} is given for two uses (path, label, mask, images, boxes)")
    for c in cols.images:
        try:
            check_field_name(c)
        except ValueError as e:
            raise SourceError(f"{path}: image column {c!r}: {e} (an extra image is named after its column)") from None
    if cols.box_labels is not None and cols.boxes is None:
        raise SourceError(f"{path}: a box labels column ({cols.box_labels!r}) needs a boxes column")
    return cols


class _ParsedRows:
    """The items of a list, row by row: labels, metadata, paths and fields checked, the rows
    whose paths lead outside the root collected."""

    def __init__(self, path: str, fmt: str, base: str, kind: str, label_sep: str) -> None:
        self.path, self.fmt, self.base, self.kind, self.label_sep = path, fmt, base, kind, label_sep
        self.items: list[tuple[Any, ...]] = []
        self.lines: list[int] = []
        self.outside: list[tuple[int, str]] = []
        self.seen: dict[str, tuple[int, Any]] = {}  # each file's first line and label
        self.types: dict[str, str] = {}  # CSV/TSV metadata columns' types (column_types)

    def file(self, n: int, row: dict[str, Any], col: str) -> str:
        """The row's path in column ``col``, joined to the root (noted when it leads outside)."""
        rel = row.get(col)
        if not isinstance(rel, str) or not rel:
            raise SourceError(f"{self.path}:{n}: the {col!r} column is empty or not text")
        full = os.path.normpath(os.path.join(self.base, rel))  # what is checked is what is opened
        if not path_inside(self.base, full):
            self.outside.append((n, rel))
        return full

    def add(self, n: int, row: dict[str, Any], pcol: str, lcol: str, cols: FieldColumns) -> None:
        """Row ``n`` as an item; SourceError naming the line for what cannot be used."""
        where = f"{self.path}:{n}"
        full = self.file(n, row, pcol)
        label = _label(row.get(lcol), self.kind, self.fmt, self.label_sep, where)
        skip = (pcol, lcol, *cols.names())
        meta = {k: _typed(v, self.types.get(k, "str")) for k, v in row.items()
                if k not in skip and not (self.fmt != "jsonl" and v == "")}
        try:
            encode_meta(meta, f"{where}: metadata")
        except ValueError as e:
            raise SourceError(str(e)) from None
        first = self.seen.setdefault(full, (n, label))
        if first[0] != n and not _same_label(first[1], label, self.kind):
            raise SourceError(f"{where}: {row[pcol]!r} is also on line {first[0]} with label {first[1]!r}, here "
                              f"{label!r}; which label is meant is ambiguous")
        fields = self.fields(n, row, cols)
        self.items.append((full, label, meta or None) if fields is None else (full, label, meta or None, fields))
        self.lines.append(n)

    def fields(self, n: int, row: dict[str, Any], cols: FieldColumns) -> dict[str, Any] | None:
        """The row's fields as convert_items takes them, or None when the list has no field columns."""
        if not cols.names():
            return None
        out: dict[str, Any] = {}
        if cols.mask is not None:
            out["mask"] = self.file(n, row, cols.mask)
        if cols.images:
            out["images"] = {c: self.file(n, row, c) for c in cols.images}
        if cols.boxes is not None:
            out["boxes"] = _boxes_cell(row.get(cols.boxes), f"{self.path}:{n}: column {cols.boxes!r}")
        if cols.box_labels is not None:
            labels = _json_cell(row.get(cols.box_labels), f"{self.path}:{n}: column {cols.box_labels!r}")
            bad = next((v for v in labels if isinstance(v, bool) or not isinstance(v, (str, int))), None)
            if bad is not None:
                raise SourceError(f"{self.path}:{n}: box label {bad!r} is not a class name or number")
            if len(labels) != len(out["boxes"]):
                raise SourceError(f"{self.path}:{n}: {len(labels)} box labels for {len(out['boxes'])} boxes")
            out["box_labels"] = labels
        return out


def _json_cell(value: Any, where: str) -> list[Any]:
    """A cell holding a JSON list (a JSON Lines value, or a CSV/TSV string; empty: no entries)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise SourceError(f"{where}: not a JSON list ({e})") from None
    if not isinstance(value, list):
        raise SourceError(f"{where}: not a JSON list, a {type(value).__name__}")
    return value


def _boxes_cell(value: Any, where: str) -> list[list[float]]:
    """A boxes cell: a JSON list of ``[x0, y0, x1, y1]``, each four finite numbers."""
    boxes = _json_cell(value, where)
    for k, b in enumerate(boxes):
        if not isinstance(b, list) or len(b) != 4 or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in b):
            raise SourceError(f"{where}: box {k} {b!r} is not [x0, y0, x1, y1] (four finite numbers)")
    return boxes


def convert_list(
    listfile: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    fmt: str,
    options: Any = None,
    classes: Sequence[str] | None = None,
    **list_options: Any,
) -> Any:
    """Convert the images a list names (:func:`read_list`, with ``list_options``) into a packed
    dataset of format ``fmt`` at ``dst``, labels and metadata included; returns the ConvertReport.
    The rows are shuffled at write time with ``options.seed`` unless ``options.shuffle`` is off
    (then they keep the list's order). ``classes`` (or ``options.classes``) pins the class list,
    e.g. a training set's, so labels line up."""
    from ..pipeline.engine import ConvertOptions
    from ..pipeline.items import check_classes, convert_items
    from ..pipeline.order import recorded_seed, write_order

    options = options if options is not None else ConvertOptions()
    if classes is None and options.classes is not None:
        classes = list(options.classes)
    if classes is not None:
        classes = check_classes(classes)  # before the list is read
    source = read_list(listfile, **list_options)
    if classes is not None:
        source.check_classes(os.fspath(listfile), classes)
    items = source.items
    if options.shuffle:
        items = [items[i] for i in write_order(len(items), options)]
    return convert_items(items, dst, fmt, options, classes, root=source.root, label_kind=source.label_kind,
                         source={"kind": "list", "path": os.path.abspath(os.fspath(listfile))},
                         shuffle_seed=recorded_seed(options), record_files=False)
