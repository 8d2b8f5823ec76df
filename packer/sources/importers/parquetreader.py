"""Parquet files read with pyarrow: a Hugging Face dataset's ``to_parquet`` export (its Image and
ClassLabel features from the schema's ``huggingface`` metadata) or any file with an image column."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from ...errors import SourceError
from .common import Column, needs, reading

__all__ = ["ParquetTable"]


def _files(src: str) -> list[str]:
    if os.path.isdir(src):
        files = sorted(os.path.join(src, n) for n in os.listdir(src) if n.endswith(".parquet"))
        if not files:
            raise SourceError(f"{src}: no .parquet files in the folder")
        return files
    if not os.path.isfile(src):
        raise SourceError(f"{src}: no such Parquet file or folder")
    return [src]


def _features(schema: Any) -> dict[str, Any]:
    """The Hugging Face features in the schema's metadata (empty when there are none)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        info = json.loads(raw) if raw else {}
        features = info.get("info", {}).get("features", {})
    except (ValueError, AttributeError):
        return {}
    return features if isinstance(features, dict) else {}


def _column(field: Any, feature: Any) -> Column:
    import pyarrow as pa

    kind = feature.get("_type") if isinstance(feature, dict) else None
    t = field.type
    if kind == "Image" or (pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} >= {"bytes", "path"}):
        return Column(field.name, "image")
    if kind in ("Audio", "Video", "Pdf"):
        return Column(field.name, "refused", f"holds Hugging Face {kind} data, which metadata (JSON) cannot")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return Column(field.name, "bytes")
    return Column(field.name, "value")


class ParquetTable:
    """A Parquet file, or a folder of them read in name order, read a batch of rows at a time."""

    def __init__(self, src: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
                 allow_outside_root: bool = False) -> None:
        pq = needs("pyarrow.parquet", f"{os.fspath(src)}: reading Parquet", "parquet")
        self.shown = os.path.abspath(os.fspath(src))
        #: the folder an image's ``path`` is relative to and must lie inside (default: its Parquet file's)
        self.root = os.path.abspath(os.fspath(root)) if root is not None else None
        self.allow_outside_root = allow_outside_root
        self.files = _files(self.shown)
        try:
            schema = pq.read_schema(self.files[0])
        except Exception as e:  # noqa: BLE001 - pyarrow's errors: ArrowInvalid, OSError, ...
            raise SourceError(f"{self.files[0]}: not a Parquet file ({e})") from None
        features = _features(schema)
        self.columns = [_column(f, features.get(f.name)) for f in schema]
        self.class_names = {n: list(f["names"]) for n, f in features.items()
                            if isinstance(f, dict) and f.get("_type") == "ClassLabel" and f.get("names")}

    def rows(self, names: Sequence[str]) -> Iterator[dict[str, Any]]:
        """Every row in order, the columns ``names`` as Python values (an image as its bytes)."""
        import pyarrow.parquet as pq

        images = {c.name for c in self.columns if c.kind == "image"}
        for path in self.files:
            n = 0  # the row in this file
            with reading(path):
                batches = pq.ParquetFile(path).iter_batches(batch_size=256, columns=list(dict.fromkeys(names)))
            while True:
                with reading(path):
                    batch = next(batches, None)
                    rows = batch.to_pylist() if batch is not None else None
                if rows is None:
                    break
                for row in rows:
                    for name in images & row.keys():
                        row[name] = self._image(path, row[name], n, name)
                    n += 1
                    yield row

    def _image(self, path: str, value: Any, n: int, column: str) -> bytes | str:
        """An image cell's bytes (of bytes, or of a ``{bytes, path}`` struct); without bytes, the
        path of its file (relative to the root: the Parquet file's folder unless ``root`` is given;
        SourceError for one outside it unless ``allow_outside_root``); empty bytes when there is
        neither (the sample is then skipped as undecodable, named in the report). SourceError
        naming row ``n`` and ``column`` for text in place of bytes."""
        from ..listsource import outside_root_error, path_inside

        if isinstance(value, dict):
            data = value.get("bytes")
            if isinstance(data, str):
                raise SourceError(f"{path}: row {n}, column {column!r}: its bytes hold text ({data[:40]!r}), not an "
                                  f"image file's bytes")
            if data is not None:
                return data
            name = value.get("path")
            if not isinstance(name, str) or not name:
                return b""
            base = self.root or os.path.dirname(path)
            full = os.path.normpath(os.path.join(base, name))
            if not self.allow_outside_root and not path_inside(base, full):
                raise outside_root_error(path, base, self.root is not None, [(n, name)], at="row",
                                     source="the Parquet file")
            return full
        if isinstance(value, str):
            raise SourceError(f"{path}: row {n}, column {column!r}: text ({value[:40]!r}), not an image file's bytes")
        return value if isinstance(value, bytes) else b""
