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
from .common import Column, Folder, raw_image_png, reading
from .mdsreader import decompressor

__all__ = ["LitDataTable"]

#: LitData's numpy dtype numbers (its NumpySerializer) and torch dtype numbers (TensorSerializer).
_NUMPY = dict(enumerate(["<i1", "<i2", "<i4", "<i8", "<u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8"])) | {13: "?"}
_TORCH = {0: "<f4", 1: "<f4", 2: "<f8", 3: "<f8", 8: "<f2", 9: "<f2", 11: "<u1", 12: "<i1", 13: "<i2", 14: "<i2",
          15: "<i4", 16: "<i4", 17: "<i8", 18: "<i8", 19: "?", 20: "<u2"}
_FRAMED_MAGIC = b"LDFZ01\0\0"
_VALUES = ("int", "float", "bool", "str", "text", "numpy", "no_header_numpy", "tensor", "no_header_tensor")


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
    return _array(data, _TORCH.get(int(arg)), None, where)  # no_header_tensor


def _items(data: bytes, unzip: Callable[[bytes], bytes], per_item: bool) -> list[bytes]:
    """The items of a chunk file: framed (batches of items in zstd frames) or classic (a count,
    file offsets, the items; each item a zstd frame when ``per_item``)."""
    if data[:8] == _FRAMED_MAGIC:
        _, _, _, n, _, frames = struct.unpack_from("<8sHHIII", data)
        offsets = np.frombuffer(data, "<u4", n + 1, 24).tolist()
        table = 24 + 4 * (n + 1)
        body = b"".join(unzip(data[at:at + size]) for _, _, at, size, _ in
                        (struct.unpack_from("<IIQII", data, table + 24 * f) for f in range(frames)))
        return [body[offsets[i]:offsets[i + 1]] for i in range(n)]
    n = struct.unpack_from("<I", data)[0]
    offsets = np.frombuffer(data, "<u4", n + 1, 4).tolist()
    items = [data[offsets[i]:offsets[i + 1]] for i in range(n)]
    return [unzip(x) for x in items] if per_item else items


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
            unzip = decompressor(self.config.get("compression"), where)
            data = self.folder.read(name)
            with reading(where):
                if level == "chunk":
                    data, unzip = unzip(data), bytes
            if data[-8:] == b"LDARW01\0":
                raise SourceError(f"{where}: rows kept in an Arrow footer (LitData's layout for text-only data); "
                                  f"packer imports datasets with an image per item")
            with reading(where):
                items = _items(data, unzip, level == "sample")
            if len(items) != chunk.get("chunk_size"):
                raise SourceError(f"{where}: holds {len(items)} items where index.json says {chunk.get('chunk_size')}")
            for i, item in enumerate(items):
                with reading(f"{where}: item {i}"):
                    yield self._item(item, wanted, f"{where}: item {i}")

    def _item(self, item: bytes, wanted: set[str], where: str) -> dict[str, Any]:
        """One item's columns ``wanted``, decoded."""
        sizes = struct.unpack_from(f"<{len(self.formats)}I", item)
        at, row = 4 * len(sizes), {}
        if at + sum(sizes) != len(item):
            raise SourceError(f"{where}: its fields take {at + sum(sizes)} bytes, the item has {len(item)}")
        for column, fmt, size in zip(self.columns, self.formats, sizes):
            if column.name in wanted:
                row[column.name] = _decode(fmt, item[at:at + size], f"{where}, {column.name!r}")
            at += size
        return row
