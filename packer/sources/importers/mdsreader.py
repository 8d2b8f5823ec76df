"""MosaicML Streaming's MDS format read without the library: ``index.json`` and its shards, local
or at a URL, uncompressed or in any compression Streaming writes (zstd, gz, bz2, snappy, br)."""

from __future__ import annotations

import functools
import json
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from ...errors import SourceError
from .common import Column, Folder, check_value_size, needs, raw_image_png, reading, text_value

__all__ = ["MAX_INFLATED", "MDSTable", "decompressor"]

_SCALARS = {"uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "int8": "<i1", "int16": "<i2",
            "int32": "<i4", "int64": "<i8", "float16": "<f2", "float32": "<f4", "float64": "<f8", "int": "<i8"}
_NDARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
                   34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
_LISTS = ("list[pil]", "list[jpeg]", "list[png]", "jpeg_array", "jpegarray")


#: The most bytes a shard or chunk may decompress to when nothing declares its size: the 4 GiB that
#: its uint32 offsets can address.
MAX_INFLATED = 1 << 32
_STEP = 1 << 20  # decompressed a MiB at a time, so the output never outgrows its bound by more


def _too_big(where: str, bound: int, said: str) -> SourceError:
    return SourceError(f"{where}: decompresses to more than {bound} bytes ({said}); refused before it fills memory "
                       f"(a decompression bomb, or not the file its index describes)")


def _zlib_family(make: Callable[[], Any], data: bytes, bound: int) -> bytes | None:
    """``data`` through decompressors made by ``make`` (gz or bz2, member after member), or None
    past ``bound`` bytes; ValueError when the data ends inside a member."""
    out, unzip, rest = bytearray(), make(), data
    while True:
        want = min(_STEP, bound + 1 - len(out))
        part = unzip.decompress(rest, want)
        out += part
        if len(out) > bound:
            return None
        if unzip.eof:
            if not unzip.unused_data:
                return bytes(out)
            rest, unzip = unzip.unused_data, make()
            continue
        rest = getattr(unzip, "unconsumed_tail", b"")  # zlib hands back the input it did not read; bz2 keeps it
        if not rest and len(part) < want and getattr(unzip, "needs_input", True):
            raise ValueError("the compressed data ends early")


def _zstd(zstandard: Any, data: bytes, bound: int) -> bytes | None:
    reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
    out = bytearray()
    while len(out) <= bound:
        part = reader.read(min(_STEP, bound + 1 - len(out)))
        if not part:
            return bytes(out)
        out += part
    return None


def _snappy(snappy: Any, data: bytes, bound: int) -> bytes | None:
    """Raw snappy: the uncompressed length it declares (a varint at its start) checked first."""
    size, shift = 0, 0
    for i, byte in enumerate(data[:5]):
        size |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
        if i == 4:
            raise ValueError("no snappy length header")
    if size > bound:
        return None
    out = snappy.decompress(data)
    if len(out) != size:
        raise ValueError(f"snappy data of {len(out)} bytes where its header says {size}")
    return out


def _brotli(brotli: Any, data: bytes, bound: int) -> bytes | None:
    unzip = brotli.Decompressor()
    try:
        out = bytearray(unzip.process(data, output_buffer_limit=min(_STEP, bound + 1)))
    except TypeError:  # brotli before 1.1 cannot stop at a size
        raise SourceError("reading br-compressed data with a size bound needs brotli 1.1 or later: "
                          "pip install -U brotli") from None
    while len(out) <= bound and not unzip.is_finished():
        if unzip.can_accept_more_data():
            raise ValueError("the compressed data ends early")
        out += unzip.process(b"", output_buffer_limit=min(_STEP, bound + 1 - len(out)))
    return bytes(out) if len(out) <= bound else None


def decompressor(algo: str | None, where: str) -> Callable[[bytes, int, str], bytes]:
    """The function ``unzip(data, bound, said)`` that undoes compression ``algo`` (``zstd:7``,
    ``gz``, ``bz2``, ``snappy``, ``br``, ...) without producing more than ``bound`` bytes: past
    it, a SourceError naming ``where``, the bound and what set it (``said``), before the output
    outgrows it. SourceError for an unknown algorithm or a missing module."""
    family = (algo or "").split(":")[0]
    if not family:
        return lambda data, bound, said: data
    what = f"{where}: reading {family}-compressed data"
    if family == "gz":
        import zlib

        inflate = functools.partial(_zlib_family, lambda: zlib.decompressobj(zlib.MAX_WBITS | 32))
    elif family == "bz2":
        import bz2

        inflate = functools.partial(_zlib_family, bz2.BZ2Decompressor)
    elif family == "zstd":
        inflate = functools.partial(_zstd, needs("zstandard", what, "mds"))
    elif family == "snappy":
        inflate = functools.partial(_snappy, needs("snappy", what, "mds"))
    elif family == "br":
        inflate = functools.partial(_brotli, needs("brotli", what, "mds"))
    else:
        raise SourceError(f"{where}: unknown compression {algo!r} (packer reads zstd, gz, bz2, snappy and br)")

    def unzip(data: bytes, bound: int, said: str) -> bytes:
        out = inflate(data, bound)
        if out is None:
            raise _too_big(where, bound, said)
        return out

    return unzip


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
        width = np.dtype(_SCALARS[base]).itemsize
        if len(data) != width:
            raise SourceError(f"{where}: {len(data)} bytes for an MDS {base} value, which takes {width}")
        return np.frombuffer(data, _SCALARS[base], 1).item()
    if base == "ndarray":
        return _ndarray(encoding, data)
    text = text_value(data, f"{where} (MDS encoding {encoding})")
    if base == "json":
        return json.loads(text)
    return {"str_int": int, "str_float": float, "str_decimal": lambda t: str(Decimal(t))}.get(base, str)(text)


def _layout(shard: Any, where: str) -> tuple[list[str], list[str], list[int | None]]:
    """A shard entry's column names, encodings and sizes; SourceError naming ``where`` when they
    are missing or do not pair up."""
    names, encodings, sizes = (shard.get(k) if isinstance(shard, dict) else None
                               for k in ("column_names", "column_encodings", "column_sizes"))
    if not (isinstance(names, list) and isinstance(encodings, list) and isinstance(sizes, list)
            and len(names) == len(encodings) == len(sizes) and all(isinstance(n, str) for n in names)
            and all(isinstance(e, str) for e in encodings)
            and all(z is None or (isinstance(z, int) and z >= 0) for z in sizes)):
        raise SourceError(f"{where}: its column_names, column_encodings and column_sizes are missing or do not pair up")
    return names, encodings, sizes


def _unlike(first: tuple[list[str], ...], other: tuple[list[Any], ...]) -> str:
    """What differs between shard 0's columns and another shard's, for the message."""
    (names0, enc0, sizes0), (names, enc, sizes) = first, other
    if names != names0:
        missing, extra = [n for n in names0 if n not in names], [n for n in names if n not in names0]
        if missing or extra:
            return (f"it has column {extra[0]!r} where shard 0 has {missing[0]!r}" if missing and extra else
                    f"it lacks shard 0's column {missing[0]!r}" if missing else
                    f"it has column {extra[0]!r}, which shard 0 lacks")
        return f"its columns are in another order ({', '.join(names)}; shard 0: {', '.join(names0)})"
    for n, e0, e, z0, z in zip(names, enc0, enc, sizes0, sizes):
        if e != e0:
            return f"its column {n!r} has encoding {e!r} where shard 0's has {e0!r}"
        if z != z0:
            return f"its column {n!r} takes {z} bytes where shard 0's takes {z0}"
    return ""


class MDSTable:
    """An MDS dataset (the folder or URL that holds ``index.json``), read shard by shard; every
    shard's columns are checked against shard 0's at open."""

    def __init__(self, src: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
        self.folder = Folder(src, storage_options)
        self.shown = self.folder.shown
        index = self.folder.json("index.json")
        shards = index.get("shards") if isinstance(index, dict) else None
        if not isinstance(shards, list) or not shards:
            raise SourceError(f"{self.shown}/index.json: no shards listed; not an MDS index")
        self.shards = shards
        where = f"{self.shown}/index.json"
        layouts = []
        for k, s in enumerate(shards):
            if not isinstance(s, dict) or s.get("format") != "mds":
                raise SourceError(f"{where}: shard {k} is of format {s.get('format') if isinstance(s, dict) else s!r}; "
                                  f"packer reads MDS shards (format 'mds')")
            layouts.append(_layout(s, f"{where}: shard {k} ({_basename(s)})"))
            differs = _unlike(layouts[0], layouts[k]) if k else ""
            if differs:
                raise SourceError(f"{where}: shard {k} ({_basename(s)}) is unlike shard 0: {differs}; packer imports "
                                  f"datasets whose shards share one set of columns (convert such shards apart)")
        self.columns = [_column(n, e) for n, e in zip(layouts[0][0], layouts[0][1])]
        self.class_names: dict[str, list[str]] = {}

    def rows(self, names: Sequence[str]) -> Iterator[dict[str, Any]]:
        """Every sample in shard order, the columns ``names`` decoded (one shard in memory at a time)."""
        for shard in self.shards:
            yield from self._shard_rows(shard, set(names))

    def _shard_rows(self, shard: dict[str, Any], wanted: set[str]) -> Iterator[dict[str, Any]]:
        zipped = shard.get("zip_data")
        name = _basename(shard)
        names, encodings, sizes = shard["column_names"], shard["column_encodings"], shard["column_sizes"]
        where = f"{self.shown}/{name}"
        unzip = decompressor(shard.get("compression") if zipped else None, where)
        declared = (shard.get("raw_data") or {}).get("bytes")
        bound, said = ((declared, "the size index.json gives it in raw_data.bytes")
                       if isinstance(declared, int) and 0 < declared <= MAX_INFLATED else
                       (MAX_INFLATED, "the most an MDS shard can hold"))
        raw = self.folder.read(name)
        with reading(where):
            data = unzip(raw, bound, said)
        count = struct.unpack_from("<I", data)[0] if len(data) >= 4 else -1
        if count != shard.get("samples") or len(data) < 4 * (count + 2):
            raise SourceError(f"{where}: holds {count} samples where index.json says {shard.get('samples')}; the "
                              f"shard is damaged or not this index's")
        offsets = np.frombuffer(data, "<u4", count + 1, 4).tolist()
        for i in range(count):
            with reading(f"{where}: sample {i} (bytes {offsets[i]}..{offsets[i + 1]})"):
                yield _sample(data[offsets[i]:offsets[i + 1]], names, encodings, sizes, wanted, f"{where}: sample {i}")


def _basename(shard: Any) -> str:
    """The file name of a shard entry (its compressed file's when it has one), or ``?``."""
    entry = (shard.get("zip_data") or shard.get("raw_data")) if isinstance(shard, dict) else None
    name = entry.get("basename") if isinstance(entry, dict) else None
    return name if isinstance(name, str) and name else "?"


def _sample(sample: bytes, names: Sequence[str], encodings: Sequence[str], sizes: Sequence[int | None],
            wanted: set[str], where: str) -> dict[str, Any]:
    """One MDS sample's columns ``wanted``, decoded (a value column's size checked first)."""
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
            if _column(name, encoding).kind == "value":
                check_value_size(size, where, name)
            row[name] = _decode(encoding, sample[at:at + size], f"{where}, column {name!r}")
        at += size
    return row
