"""MosaicML Streaming's MDS format read without the library: ``index.json`` and its shards, local
or at a URL, uncompressed or in any compression Streaming writes (zstd, gz, bz2, snappy, br)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from ...errors import SourceError
from .common import Column, Folder, needs, raw_image_png, reading

__all__ = ["MDSTable", "decompressor"]

_SCALARS = {"uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "int8": "<i1", "int16": "<i2",
            "int32": "<i4", "int64": "<i8", "float16": "<f2", "float32": "<f4", "float64": "<f8", "int": "<i8"}
_NDARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
                   34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
_LISTS = ("list[pil]", "list[jpeg]", "list[png]", "jpeg_array", "jpegarray")


def decompressor(algo: str | None, where: str) -> Callable[[bytes], bytes]:
    """The function that undoes compression ``algo`` (``zstd:7``, ``gz``, ``bz2``, ``snappy``,
    ``br``, ...); SourceError naming ``where`` for an unknown one or a missing module."""
    family = (algo or "").split(":")[0]
    if not family:
        return bytes
    if family == "gz":
        import gzip

        return gzip.decompress
    if family == "bz2":
        import bz2

        return bz2.decompress
    what = f"{where}: reading {family}-compressed data"
    if family == "zstd":
        zstandard = needs("zstandard", what, "mds")
        return lambda data: zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if family == "snappy":
        return needs("snappy", what, "mds").decompress
    if family == "br":
        return needs("brotli", what, "mds").decompress
    raise SourceError(f"{where}: unknown compression {algo!r} (packer reads zstd, gz, bz2, snappy and br)")


def _column(name: str, encoding: str) -> Column:
    base = encoding.split(":")[0]
    if base in ("jpeg", "png", "pil"):
        return Column(name, "image")
    if base == "bytes":
        return Column(name, "bytes")
    if base == "pkl":
        return Column(name, "refused", "is pickled (MDS encoding pkl); packer never unpickles data")
    if base in _LISTS:
        return Column(name, "refused", f"holds a list of images (MDS encoding {encoding}); packer keeps one image "
                                       f"per sample")
    if base in _SCALARS or base in ("str", "json", "ndarray", "str_int", "str_float", "str_decimal"):
        return Column(name, "value")
    return Column(name, "refused", f"has an MDS encoding packer does not know ({encoding!r})")


def _ndarray(encoding: str, data: bytes) -> list[Any]:
    """An MDS ``ndarray[:dtype[:shape]]`` value as nested lists."""
    parts = encoding.split(":")
    dtype = parts[1] if len(parts) > 1 and parts[1] else None
    shape = tuple(int(x) for x in parts[2].split(",")) if len(parts) > 2 else None
    at = 0
    if dtype is None:
        dtype, at = _NDARRAY_DTYPES[data[0]], 1
    if shape is None:
        ndim, width = data[at] >> 2, 2 ** (data[at] % 4)
        shape = tuple(np.frombuffer(data, f"<u{width}", ndim, at + 1).tolist())
        at += 1 + ndim * width
    return np.frombuffer(data[at:], dtype).reshape(shape).tolist()


def _decode(encoding: str, data: bytes, where: str) -> Any:
    """One MDS value as packer keeps it: image bytes, bytes, or a JSON value."""
    base = encoding.split(":")[0]
    if base in ("jpeg", "png", "bytes"):
        return data
    if base == "pil":
        width, height, size = struct.unpack_from("<3I", data)
        mode = data[12:12 + size].decode("utf-8")
        return raw_image_png(mode, width, height, data[12 + size:], where)
    if base in _SCALARS:
        return np.frombuffer(data, _SCALARS[base], 1).item()
    if base == "ndarray":
        return _ndarray(encoding, data)
    text = data.decode("utf-8")
    if base == "json":
        return json.loads(text)
    return {"str_int": int, "str_float": float, "str_decimal": lambda t: str(Decimal(t))}.get(base, str)(text)


class MDSTable:
    """An MDS dataset (the folder or URL that holds ``index.json``), read shard by shard."""

    def __init__(self, src: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
        self.folder = Folder(src, storage_options)
        self.shown = self.folder.shown
        index = self.folder.json("index.json")
        shards = index.get("shards") if isinstance(index, dict) else None
        if not isinstance(shards, list) or not shards:
            raise SourceError(f"{self.shown}/index.json: no shards listed; not an MDS index")
        self.shards = shards
        for s in shards:
            if s.get("format") != "mds":
                raise SourceError(f"{self.shown}/index.json: a shard of format {s.get('format')!r}; packer reads "
                                  f"MDS shards (format 'mds')")
        with reading(f"{self.shown}/index.json"):
            self.columns = [_column(n, e) for n, e in zip(shards[0]["column_names"], shards[0]["column_encodings"])]
        self.class_names: dict[str, list[str]] = {}

    def rows(self, names: Sequence[str]) -> Iterator[dict[str, Any]]:
        """Every sample in shard order, the columns ``names`` decoded (one shard in memory at a time)."""
        for shard in self.shards:
            yield from self._shard_rows(shard, set(names))

    def _shard_rows(self, shard: dict[str, Any], wanted: set[str]) -> Iterator[dict[str, Any]]:
        with reading(f"{self.shown}/index.json"):
            zipped = shard.get("zip_data")
            name = (zipped or shard["raw_data"])["basename"]
            names, encodings, sizes = shard["column_names"], shard["column_encodings"], shard["column_sizes"]
        where = f"{self.shown}/{name}"
        unzip = decompressor(shard.get("compression") if zipped else None, where)
        raw = self.folder.read(name)
        with reading(where):
            data = unzip(raw)
        count = struct.unpack_from("<I", data)[0] if len(data) >= 4 else -1
        if count != shard.get("samples") or len(data) < 4 * (count + 2):
            raise SourceError(f"{where}: holds {count} samples where index.json says {shard.get('samples')}; the "
                              f"shard is damaged or not this index's")
        offsets = np.frombuffer(data, "<u4", count + 1, 4).tolist()
        for i in range(count):
            with reading(f"{where}: sample {i} (bytes {offsets[i]}..{offsets[i + 1]})"):
                yield _sample(data[offsets[i]:offsets[i + 1]], names, encodings, sizes, wanted, f"{where}: sample {i}")


def _sample(sample: bytes, names: Sequence[str], encodings: Sequence[str], sizes: Sequence[int | None],
            wanted: set[str], where: str) -> dict[str, Any]:
    """One MDS sample's columns ``wanted``, decoded."""
    at, lengths = 0, []
    for size in sizes:
        if size is None:
            size = struct.unpack_from("<I", sample, at)[0]
            at += 4
        lengths.append(size)
    if at + sum(lengths) != len(sample):
        raise SourceError(f"{where}: its columns take {at + sum(lengths)} bytes, the sample has {len(sample)}")
    row = {}
    for name, encoding, size in zip(names, encodings, lengths):
        if name in wanted:
            row[name] = _decode(encoding, sample[at:at + size], f"{where}, column {name!r}")
        at += size
    return row
