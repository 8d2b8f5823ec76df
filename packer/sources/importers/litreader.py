"""LitData's optimized datasets read without the library: ``index.json`` and its ``chunk-*.bin``
files (uncompressed, or zstd-compressed per chunk file, per batch of items or per item)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ...errors import SourceError
from .common import Column, Folder, check_value_size, raw_image_png, reading
from .mdsreader import MAX_INFLATED, decompressor

__all__ = ["LitDataTable"]

#: LitData's numpy dtype numbers (its NumpySerializer) and torch dtype numbers (TensorSerializer).
_NUMPY = dict(enumerate(["<i1", "<i2", "<i4", "<i8", "<u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8"])) | {13: "?"}
_TORCH = {0: "<f4", 1: "<f4", 2: "<f8", 3: "<f8", 8: "<f2", 9: "<f2", 11: "<u1", 12: "<i1", 13: "<i2", 14: "<i2",
          15: "<i4", 16: "<i4", 17: "<i8", 18: "<i8", 19: "?", 20: "<u2"}
_FRAMED_MAGIC = b"LDFZ01\0\0"
_VALUES = ("int", "float", "bool", "str", "text", "numpy", "no_header_numpy", "tensor", "no_header_tensor", "json")
#: LitData's ``json`` serializer (a list or dict kept as one leaf): a tag byte per value (or JSON
#: text, its first byte past 0x20); the record fields' kinds from 0x10.
_J_JSON, _J_STRS, _J_INTS, _J_FLOATS, _J_BOOLS, _J_DICT, _J_RECORDS, _J_STR, _J_INT, _J_FLOAT, _J_BOOL, _J_NONE = range(12)
_J_FIELDS = {0x10: _J_NONE, 0x11: _J_STR, 0x12: _J_INT, 0x13: _J_FLOAT, 0x14: _J_BOOL}
#: The bound on a chunk whose items are compressed inside it (no uncompressed size in the index):
#: twice the chunk size LitData targets, at least this.
_MIN_CHUNK_BOUND = 256 << 20


def _leaf_names(spec: Any, prefix: str = "") -> list[str]:
    """The names of a pytree spec's leaves: dict keys (nested ones joined by ``.``), positions."""
    children = spec.get("children_spec") or []
    if not children:
        return [prefix or "0"]
    context = spec.get("context")
    keys = json.loads(context) if isinstance(context, str) and spec.get("type") == "builtins.dict" else None
    out = []
    for i, child in enumerate(children):
        name = str(keys[i]) if keys is not None else str(i)
        out.extend(_leaf_names(child, f"{prefix}.{name}" if prefix else name))
    return out


def _column(name: str, fmt: str) -> Column:
    base = fmt.split(":")[0]
    if base in ("jpeg", "pil", "image"):
        return Column(name, "image")
    if base == "bytes":
        return Column(name, "bytes")
    if base == "pickle":
        return Column(name, "refused", "is pickled (LitData's pickle serializer); packer never unpickles data")
    if base in _VALUES:
        return Column(name, "value")
    return Column(name, "refused", f"has a LitData serializer packer does not read ({fmt!r})")


def _array(data: bytes, dtype: str, shape: Sequence[int] | None, where: str) -> list[Any]:
    if dtype is None:
        raise SourceError(f"{where}: an array of a dtype packer does not read")
    arr = np.frombuffer(data, dtype)
    return (arr.reshape(tuple(shape)) if shape is not None else arr).tolist()


def _decode(fmt: str, data: bytes, where: str) -> Any:
    """One LitData leaf as packer keeps it: image bytes, bytes, or a JSON value."""
    base, _, arg = fmt.partition(":")
    if base in ("jpeg", "image", "bytes"):
        return data
    if base == "pil":
        width, height, size = struct.unpack_from("<3I", data)
        return raw_image_png(data[12:12 + size].decode("utf-8"), width, height, data[12 + size:], where)
    if base in ("int", "float", "bool"):
        return struct.unpack({"int": "<q", "float": "<d", "bool": "?"}[base], data)[0]
    if base in ("str", "text"):
        return data.decode("utf-8")
    if base == "numpy":
        code, ndim = struct.unpack_from("<II", data)
        shape = struct.unpack_from(f"<{ndim}I", data, 8)
        return _array(data[8 + 4 * ndim:], _NUMPY.get(code), shape, where)
    if base == "no_header_numpy":
        return _array(data, _NUMPY.get(int(arg)), None, where)
    if base == "tensor":
        code, ndim = struct.unpack_from(">II", data)
        shape = struct.unpack_from(f">{ndim}I", data, 8)
        return _array(data[8 + 4 * ndim:], _TORCH.get(code), shape, where)
    if base == "json":
        return _json_value(data)
    return _array(data, _TORCH.get(int(arg)), None, where)  # no_header_tensor


class _Cursor:
    """A read position in one LitData ``json`` value."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value[0] if len(value) == 1 else value

    def text(self) -> str:
        size = self.take("<I")
        raw = self.data[self.at:self.at + size]
        if len(raw) != size:
            raise ValueError(f"a text of {size} bytes where {len(raw)} are left")
        self.at += size
        return raw.decode("utf-8")

    def array(self, dtype: str) -> list[Any]:
        n = self.take("<I")
        values = np.frombuffer(self.data, dtype, n, self.at)
        self.at += values.nbytes
        return values.tolist()

    def value(self, tag: int | None = None) -> Any:
        tag = self.take("<B") if tag is None else tag
        if tag in (_J_STR, _J_INT, _J_FLOAT, _J_BOOL, _J_NONE):
            return (self.text() if tag == _J_STR else None if tag == _J_NONE else
                    self.take({_J_INT: "<q", _J_FLOAT: "<d", _J_BOOL: "<?"}[tag]))
        if tag in (_J_INTS, _J_FLOATS, _J_BOOLS):
            return self.array({_J_INTS: "<i8", _J_FLOATS: "<f8", _J_BOOLS: "?"}[tag])
        if tag == _J_JSON:
            size = self.take("<I")
            self.at += size
            return json.loads(self.data[self.at - size:self.at])
        if tag == _J_STRS:
            return [self.text() for _ in range(self.take("<I"))]
        if tag == _J_DICT:
            n = self.take("<I")
            return {self.text(): self.value() for _ in range(n)}
        if tag == _J_RECORDS:
            rows, n = self.take("<II")
            keys = [self.text() for _ in range(n)]
            if rows and (not keys or rows * len(keys) > len(self.data) - self.at):
                raise ValueError(f"{rows} records of {len(keys)} fields in {len(self.data) - self.at} bytes")
            return [{k: self.value(_J_FIELDS.get(self.take("<B"), -1)) for k in keys} for _ in range(rows)]
        raise ValueError(f"unknown tag {tag} in a LitData json value")


def _json_value(data: bytes) -> Any:
    """A LitData ``json`` leaf (a list or dict, or any JSON value) as a JSON value: its tagged
    binary form, or JSON text (what earlier LitData versions wrote); ValueError when damaged."""
    if data[:1] and data[0] > 0x20:
        return json.loads(data)
    cursor = _Cursor(bytes(data))
    value = cursor.value()
    if cursor.at != len(data):
        raise ValueError(f"{len(data) - cursor.at} bytes after the value")
    return value


def _items(data: bytes, unzip: Callable[[bytes, int, str], bytes], per_item: bool, bound: int, said: str,
           where: str) -> list[bytes]:
    """The items of a chunk file: framed (batches of items in zstd frames, each bounded by the
    size the frame table gives it) or classic (a count, file offsets, the items; each item a zstd
    frame when ``per_item``, together bounded by ``bound``)."""
    if data[:8] == _FRAMED_MAGIC:
        _, _, _, n, _, frames = struct.unpack_from("<8sHHIII", data)
        offsets = np.frombuffer(data, "<u4", n + 1, 24).tolist()
        table = 24 + 4 * (n + 1)
        specs = [struct.unpack_from("<IIQII", data, table + 24 * f) for f in range(frames)]
        declared = sum(spec[4] for spec in specs)
        if declared > bound:
            raise SourceError(f"{where}: its frame table declares {declared} bytes, more than {bound} ({said}); refused "
                              f"before it fills memory (a decompression bomb, or damaged)")
        body = b"".join(unzip(data[at:at + size], raw, f"the size the chunk's frame table gives frame {f}")
                        for f, (_, _, at, size, raw) in enumerate(specs))
        return [body[offsets[i]:offsets[i + 1]] for i in range(n)]
    n = struct.unpack_from("<I", data)[0]
    offsets = np.frombuffer(data, "<u4", n + 1, 4).tolist()
    items = [data[offsets[i]:offsets[i + 1]] for i in range(n)]
    if not per_item:
        return items
    out, left = [], bound
    for x in items:
        out.append(unzip(x, left, f"what is left of {bound} bytes for the chunk, {said}"))
        left -= len(out[-1])
    return out


class LitDataTable:
    """A LitData optimized dataset (the folder or URL holding ``index.json``), read chunk by chunk."""

    def __init__(self, src: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
        self.folder = Folder(src, storage_options)
        self.shown = self.folder.shown
        index = self.folder.json("index.json")
        config = index.get("config") if isinstance(index, dict) else None
        if not isinstance(config, dict) or not isinstance(index.get("chunks"), list):
            raise SourceError(f"{self.shown}/index.json: no chunks and config; not a LitData index")
        if config.get("encryption"):
            raise SourceError(f"{self.shown}: the chunks are encrypted; packer reads unencrypted LitData datasets")
        if config.get("item_loader", "PyTreeLoader") != "PyTreeLoader":
            raise SourceError(f"{self.shown}: items of LitData's {config['item_loader']}; packer reads the default "
                              f"PyTreeLoader's")
        self.chunks, self.config = index["chunks"], config
        self.formats = list(config.get("data_format") or [])
        spec = json.loads(config["data_spec"])[1] if config.get("data_spec") else {}
        names = _leaf_names(spec)
        if len(names) != len(self.formats):
            raise SourceError(f"{self.shown}/index.json: {len(names)} fields in data_spec, {len(self.formats)} in "
                              f"data_format")
        self.columns = [_column(n, f) for n, f in zip(names, self.formats)]
        self.class_names: dict[str, list[str]] = {}

    def rows(self, names: Sequence[str]) -> Iterator[dict[str, Any]]:
        """Every item in chunk order, the columns ``names`` decoded (one chunk in memory at a time)."""
        wanted = set(names)
        level = self.config.get("compression_level") or "chunk"
        for chunk in self.chunks:
            name = chunk["filename"]
            where = f"{self.shown}/{name}"
            compression = self.config.get("compression")
            unzip = decompressor(compression, where)
            bound, said = self._bound(chunk, level)
            data = self.folder.read(name)
            with reading(where):
                if level == "chunk" and compression:
                    data = unzip(data, bound, said)
            if data[-8:] == b"LDARW01\0":
                raise SourceError(f"{where}: rows kept in an Arrow footer (LitData's layout for text-only data); "
                                  f"packer imports datasets with an image per item")
            with reading(where):
                items = _items(data, unzip, level == "sample", bound, said, where)
            if len(items) != chunk.get("chunk_size"):
                raise SourceError(f"{where}: holds {len(items)} items where index.json says {chunk.get('chunk_size')}")
            for i, item in enumerate(items):
                with reading(f"{where}: item {i}"):
                    yield self._item(item, wanted, f"{where}: item {i}")

    def _bound(self, chunk: dict[str, Any], level: str) -> tuple[int, str]:
        """The most bytes chunk ``chunk`` may decompress to, and what sets it: the uncompressed size
        index.json gives a chunk compressed whole; twice the chunk size it targets (at least
        256 MiB) for items compressed inside the file."""
        declared, target = chunk.get("chunk_bytes"), self.config.get("chunk_bytes")
        if level == "chunk" and isinstance(declared, int) and 0 < declared <= MAX_INFLATED:
            return declared, "the size index.json gives the chunk in chunk_bytes"
        if level != "chunk":
            target = target if isinstance(target, int) and target > 0 else 0
            return (min(MAX_INFLATED, max(2 * target, _MIN_CHUNK_BOUND)),
                    "twice the chunk size index.json targets, at least 256 MiB")
        return MAX_INFLATED, "the most a LitData chunk can hold"

    def _item(self, item: bytes, wanted: set[str], where: str) -> dict[str, Any]:
        """One item's columns ``wanted``, decoded."""
        sizes = struct.unpack_from(f"<{len(self.formats)}I", item)
        at, row = 4 * len(sizes), {}
        if at + sum(sizes) != len(item):
            raise SourceError(f"{where}: its fields take {at + sum(sizes)} bytes, the item has {len(item)}")
        for column, fmt, size in zip(self.columns, self.formats, sizes):
            if column.name in wanted:
                if column.kind == "value":
                    check_value_size(size, where, column.name)
                row[column.name] = _decode(fmt, item[at:at + size], f"{where}, {column.name!r}")
            at += size
        return row
