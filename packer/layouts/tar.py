"""The tar layout: WebDataset-convention shards plus a binary ``.pkidx`` index per shard for random access.

The one home of the format's on-disk knowledge: the writer (packer.converters.tar), the reader
(packer.datasets.formats.tar), ``verify`` and the tests import it. docs/FORMATS.md ("tar") gives the
members of a sample and the byte layout of the index.
"""

from __future__ import annotations

import json
import os
import re
import struct
import tarfile
from collections.abc import Callable, Container, Sequence
from typing import Any

import crc32c
import numpy as np

from packer.description.damage import Report, byte_diff, read_all
from packer.description.manifest import FileEntry, Manifest
from packer.description.placement import place_seed
from packer.description.samples import table_fields
from packer.errors import CorruptDataError
from packer.fields import named
from packer.fields.boxes import BOXES
from packer.images.codecs import CODEC_IDS, CODEC_NAMES, MEMBER_CODECS, TAR_EXTENSIONS
from packer.images.placeholder import file_placeholder_reason

__all__ = [
    "identify",
    "compressed_tar_note",
    "TAR_SUFFIX",
    "INDEX_SUFFIX",
    "INDEX_SUFFIXES",
    "LEGACY_INDEX_SUFFIX",
    "index_name",
    "INDEX_MAGIC",
    "INDEX_VERSION",
    "INDEX_VERSIONS",
    "INDEX_HEADER",
    "INDEX_ENTRY",
    "IMAGE_EXTENSIONS",
    "BLOCK",
    "tar_header",
    "npy_header",
    "npy_payload",
    "FIELDS_INDEX_VERSION",
    "FIELD_ENTRY",
    "pack_index",
    "unpack_index",
    "read_index",
    "field_member",
    "field_offsets",
    "json_boxes",
    "sample_key",
    "sample_members",
    "final_size",
    "end_of_archive",
    "scan_shard",
    "tar_samples",
    "locate_damage",
]

TAR_SUFFIX = ".tar"
INDEX_SUFFIX = ".pkidx"
#: The index suffix of datasets written before packer 0.2's release (and of version 1): renamed
#: because DALI's WebDataset reader takes ``.idx`` files beside tar shards for its own format.
LEGACY_INDEX_SUFFIX = ".idx"
INDEX_SUFFIXES = (INDEX_SUFFIX, LEGACY_INDEX_SUFFIX)


def index_name(tar_name: str, names: Container[str]) -> str:
    """The index file of the shard ``tar_name`` among the dataset's file ``names``: ``.pkidx``,
    else the legacy ``.idx``, else the ``.pkidx`` name (which the caller then reports missing)."""
    stem = tar_name[: -len(TAR_SUFFIX)]
    return next((stem + s for s in INDEX_SUFFIXES if stem + s in names), stem + INDEX_SUFFIX)
BLOCK = 512
RECORD = 20 * BLOCK  # tar's default blocking factor: archives are padded to a multiple of this

INDEX_MAGIC = b"PKTI"
INDEX_VERSION = 2
#: The index of a version 3 dataset (samples with fields): version 2's, then the field section.
FIELDS_INDEX_VERSION = 3
INDEX_VERSIONS = (1, 2, 3)  # readable
#: magic, version, entry size, N samples, first sample's global index, key blob bytes K, and the
#: CRC32C of header bytes [0, 28), the entries and the key blob: 32 bytes.
INDEX_HEADER = struct.Struct("<4sHHQQII")
INDEX_ENTRY = np.dtype([
    ("offset", "<u8"), ("size", "<u8"), ("label", "<i8"), ("height", "<u4"), ("width", "<u4"),
    ("crc", "<u4"), ("key_end", "<u4"), ("codec", "u1"), ("channels", "u1"), ("pad", "V6"),
])  # 48 bytes; crc: of the image member's data, seeded with the sample's place (packer.description.placement);
# key_end: where the sample's key ends in the key blob (it starts where the previous one ends)

#: One stored field (mask or extra image) of one sample, in the version 3 index's field section:
#: its member's data offset and size in the tar (raw: the whole ``.npy``), stored height and
#: width, CRC32C of the data seeded with the sample's place, codec id, channels, bits per channel.
FIELD_ENTRY = np.dtype([
    ("offset", "<u8"), ("size", "<u8"), ("height", "<u4"), ("width", "<u4"), ("crc", "<u4"),
    ("codec", "u1"), ("channels", "u1"), ("depth", "u1"), ("pad", "V1"),
])  # 32 bytes
_FIELD_HEAD = struct.Struct("<HH")  # F field names, FIELD_ENTRY size

_ZEROS = bytes(RECORD)


def sample_key(index: int) -> str:
    """The WebDataset key of sample ``index``: ten digits, no dots."""
    return f"{index:010d}"


def _octal(value: int, width: int) -> bytes:
    """A ustar numeric field: ``width - 1`` octal digits and a NUL."""
    digits = b"%0*o" % (width - 1, value)
    if len(digits) != width - 1:
        raise ValueError(f"{value} does not fit a {width}-byte tar field")
    return digits + b"\0"


def tar_header(name: str, size: int) -> bytes:
    """A 512-byte POSIX ustar header for a regular file.

    Every other field is fixed (mode 0644, uid/gid 0, empty owner names, mtime 0, no pax records),
    so the same samples give the same bytes.
    """
    raw = name.encode("utf-8")
    if len(raw) > 100:
        raise ValueError(f"tar member name longer than 100 bytes: {name!r}")
    head = b"".join((
        raw.ljust(100, b"\0"),
        _octal(0o644, 8),          # mode
        _octal(0, 8),              # uid
        _octal(0, 8),              # gid
        _octal(size, 12),          # size (up to 8 GiB - 1)
        _octal(0, 12),             # mtime
        b" " * 8,                  # checksum, counted as spaces
        b"0",                      # typeflag: regular file
        bytes(100),                # linkname
        b"ustar\x0000",            # magic and version
        bytes(32),                 # uname
        bytes(32),                 # gname
        _octal(0, 8),              # devmajor
        _octal(0, 8),              # devminor
        bytes(155),                # prefix
        bytes(12),                 # pad to 512
    ))
    checksum = b"%06o\0 " % sum(head)
    return head[:148] + checksum + head[156:]


def _padding(size: int) -> bytes:
    return _ZEROS[: -size % BLOCK]


def npy_header(height: int, width: int, channels: int = 3) -> bytes:
    """The ``.npy`` (format 1.0) header of a C-order uint8 (H, W, C) array, padded to 64 bytes."""
    text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({height}, {width}, {channels}), }}"
    total = -(-(10 + len(text) + 1) // 64) * 64
    text = text.ljust(total - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin-1")


def pack_index(first: int, entries: np.ndarray, keys: bytes, version: int = INDEX_VERSION,
               fields: tuple[list[str], np.ndarray] | None = None) -> bytes:
    """Serialise a shard index (layout in docs/FORMATS.md; ``version`` 1 only to rebuild old ones).
    With ``fields`` (the stored fields' names and every sample's FIELD_ENTRY rows, sample by
    sample), a version 3 index with its field section."""
    body = entries.astype(INDEX_ENTRY, copy=False).tobytes() + keys
    if fields is not None:
        names, rows = fields
        version = FIELDS_INDEX_VERSION
        encoded = [n.encode("utf-8") for n in names]
        body += b"".join([_FIELD_HEAD.pack(len(names), FIELD_ENTRY.itemsize),
                          *(bytes((len(n),)) + n for n in encoded),
                          rows.astype(FIELD_ENTRY, copy=False).tobytes()])
    head = INDEX_HEADER.pack(INDEX_MAGIC, version, INDEX_ENTRY.itemsize, len(entries), first, len(keys), 0)
    crc = crc32c.crc32c(body, crc32c.crc32c(head[:28]))
    return head[:28] + struct.pack("<I", crc) + body


def unpack_index(data: bytes, path: str) -> tuple[int, np.ndarray, bytes]:
    """Parse and check a shard index; return (first sample, entries, key blob) (see :func:`read_index`)."""
    first, entries, keys, _names, _fields = read_index(data, path)
    return first, entries, keys


def read_index(data: bytes, path: str) -> tuple[int, np.ndarray, bytes, list[str], np.ndarray]:
    """Parse and check a shard index; return (first sample, entries, key blob, stored field names,
    field entries: N x F FIELD_ENTRY rows, sample by sample; no names and no rows before version 3).

    Raises CorruptDataError naming ``path`` for a bad magic, version, size or checksum.
    """
    if len(data) < INDEX_HEADER.size:
        raise CorruptDataError(f"tar index of {len(data)} bytes is shorter than its header", path=path)
    magic, version, entry_size, n, first, klen, crc = INDEX_HEADER.unpack_from(data)
    if magic != INDEX_MAGIC:
        raise CorruptDataError(f"not a packer tar index (magic {magic!r})", path=path, offset=0)
    if version not in INDEX_VERSIONS or entry_size != INDEX_ENTRY.itemsize:
        raise CorruptDataError(
            f"tar index version {version} with {entry_size}-byte entries is not supported (this packer "
            f"reads versions {', '.join(map(str, INDEX_VERSIONS))}); upgrade packer or re-convert", path=path, offset=4,
        )
    end = INDEX_HEADER.size + n * INDEX_ENTRY.itemsize + klen
    if len(data) < end or (version < FIELDS_INDEX_VERSION and len(data) != end):
        raise CorruptDataError(
            f"tar index is {len(data)} bytes, its header promises {n} entries and {klen} key bytes",
            path=path, offset=8,
        )
    actual = crc32c.crc32c(memoryview(data)[32:], crc32c.crc32c(memoryview(data)[:28]))
    if actual != crc:
        raise CorruptDataError(f"tar index checksum mismatch (stored {crc:08x}, computed {actual:08x})",
                               path=path, offset=28)
    entries = np.frombuffer(data, INDEX_ENTRY, count=n, offset=INDEX_HEADER.size)
    keys = data[INDEX_HEADER.size + n * INDEX_ENTRY.itemsize : end]
    if n and (int(entries["key_end"][-1]) != klen or np.any(np.diff(entries["key_end"].astype(np.int64)) < 0)):
        raise CorruptDataError("tar index key offsets are inconsistent", path=path, offset=INDEX_HEADER.size)
    names: list[str] = []
    rows = np.zeros(0, FIELD_ENTRY)
    if version >= FIELDS_INDEX_VERSION:
        names, rows = _field_section(data, end, n, path)
    return first, entries, keys, names, rows


def _field_section(data: bytes, at: int, n: int, path: str) -> tuple[list[str], np.ndarray]:
    """The names and N x F entries of a version 3 index's field section, which starts at ``at``."""
    def bad(why: str, where: int) -> CorruptDataError:
        return CorruptDataError(f"tar index field section {why}", path=path, offset=where)

    if len(data) < at + _FIELD_HEAD.size:
        raise bad("is missing", at)
    count, entry_size = _FIELD_HEAD.unpack_from(data, at)
    if entry_size != FIELD_ENTRY.itemsize:
        raise bad(f"has {entry_size}-byte entries, not {FIELD_ENTRY.itemsize}", at + 2)
    pos, names = at + _FIELD_HEAD.size, []
    for _ in range(count):
        size = data[pos] if pos < len(data) else 0
        if not size or pos + 1 + size > len(data):
            raise bad("has a cut or empty field name", pos)
        names.append(data[pos + 1 : pos + 1 + size].decode("utf-8", "replace"))
        pos += 1 + size
    if len(data) != pos + n * count * FIELD_ENTRY.itemsize:
        raise bad(f"is {len(data) - pos} bytes after its names, {n} samples x {count} fields need "
                  f"{n * count * FIELD_ENTRY.itemsize}", pos)
    return names, np.frombuffer(data, FIELD_ENTRY, count=n * count, offset=pos)


def final_size(size: int) -> int:
    """Size of a tar whose members end at ``size``, after the end-of-archive blocks and padding."""
    return -(-(size + 2 * BLOCK) // RECORD) * RECORD


def end_of_archive(size: int) -> bytes:
    """The zero blocks that end a tar whose members end at ``size`` (two blocks, then padding to
    a 10240-byte record)."""
    return _ZEROS[: final_size(size) - size]


def field_member(stem: str, name: str, codec: str) -> str:
    """The member name of field ``name`` of sample ``stem``: ``STEM.mask.png``, ``STEM.NAME.<ext>``."""
    return f"{stem}.{name}.{TAR_EXTENSIONS[codec]}"


def field_offsets(payload_size: int, sizes: list[int]) -> list[int]:
    """Where in :func:`sample_members`' bytes the data of each field member starts, from the
    image member's data size and the fields' member data sizes (the fields follow the image)."""
    out, pos = [], BLOCK + payload_size + (-payload_size % BLOCK)
    for size in sizes:
        out.append(pos + BLOCK)
        pos += BLOCK + size + (-size % BLOCK)
    return out


def _short(value: float) -> float:
    """A float32 box coordinate as the shortest decimal that reads back as the same float32."""
    return float(str(np.float32(value)))


def sample_members(index: int, key: str, label: int, codec: str, height: int, width: int, payload: bytes,
                   extra: dict[str, Any] | None = None,
                   fields: Sequence[tuple[str, str, bytes]] = ()) -> bytes:
    """The tar members of one sample, padded: ``KEY.<ext>`` holding ``payload`` (for raw, the whole
    ``.npy`` file), each of ``fields`` (name, codec, member data: ``KEY.mask.png``,
    ``KEY.NAME.<ext>``), ``KEY.cls`` (single-label datasets only: WebDataset reads it with ``int()``)
    and ``KEY.json``, which also holds ``extra`` (``labels``, ``target``, ``meta``: see
    packer.description.samples.sample_fields; ``boxes``, written as float32 values, and
    ``box_labels`` in version 3). The image
    data starts at byte 512. ``packer verify`` rebuilds these bytes from the index and the sample
    table to say which sample a bad byte is in."""
    stem = sample_key(index)
    extra = extra or {}
    if BOXES.name in extra:  # the boxes in KEY.json, as short decimals
        extra = {**extra, BOXES.name: [[_short(v) for v in b] for b in extra[BOXES.name]]}
    head: dict[str, Any] = {"key": key, "label": label, "height": height, "width": width, **extra}
    meta = json.dumps(head, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    members = [tar_header(f"{stem}.{TAR_EXTENSIONS[codec]}", len(payload)), payload, _padding(len(payload))]
    for name, field_codec, data in fields:
        members += [tar_header(field_member(stem, name, field_codec), len(data)), data, _padding(len(data))]
    if "labels" not in extra and "target" not in extra:
        cls = b"%d" % label
        members += [tar_header(f"{stem}.cls", len(cls)), cls, _padding(len(cls))]
    members += [tar_header(f"{stem}.json", len(meta)), meta, _padding(len(meta))]
    return b"".join(members)


def json_boxes(data: bytes) -> dict[str, Any]:
    """``boxes`` (and ``box_labels``, one int per box) from a sample's ``.json`` member, as a
    Record takes them; nothing when it has none or they are not a list of ``[x0, y0, x1, y1]``."""
    try:
        value = json.loads(data)
        boxes = value["boxes"]
        out: dict[str, Any] = {"boxes": tuple((float(a), float(b), float(c), float(d)) for a, b, c, d in boxes)}
    except (ValueError, TypeError, KeyError):
        return {}
    labels = value.get("box_labels")
    if isinstance(labels, list) and len(labels) == len(out["boxes"]) and all(isinstance(v, int) for v in labels):
        out["box_labels"] = tuple(labels)
    return out


#: Member extensions read as the image of a foreign sample, in order of preference -> codec.
IMAGE_EXTENSIONS = MEMBER_CODECS
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's split: key = up to the first dot
_META = re.compile(r"__[^/]*__($|/)")  # WebDataset skips members such as __index__


def npy_payload(buf: bytes, height: int, width: int, path: str, sample: int, offset: int) -> tuple[memoryview, int, int]:
    """Pixels of a ``.npy`` member as a view, with (height, width); checks the header is a C-order
    uint8 (H, W, 3) array. No pickle: only the header dict is parsed, by numpy's literal parser."""
    mv = memoryview(buf)
    if height and width:  # ours: the header length is implied by the known pixel count
        start = len(buf) - height * width * 3
        if start >= 10 and buf[:6] == b"\x93NUMPY" and buf[6] == 1 and 10 + struct.unpack_from("<H", buf, 8)[0] == start:
            return mv[start:], height, width
    import io

    from numpy.lib import format as npformat

    f = io.BytesIO(buf)
    try:
        version = npformat.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = npformat.read_array_header_2_0(f)
    except ValueError as e:
        raise CorruptDataError(f"bad .npy header ({e})", path=path, sample=sample, offset=offset) from None
    if dtype != np.uint8 or fortran or len(shape) != 3 or shape[2] != 3:
        raise CorruptDataError(
            f".npy member holds {dtype} {shape}{' (Fortran order)' if fortran else ''}, expected uint8 (H, W, 3)",
            path=path, sample=sample, offset=offset,
        )
    start = f.tell()
    return mv[start:], int(shape[0]), int(shape[1])



def scan_shard(path: str, shard: int, rows: list[tuple[int, int, int, int, int]], keys: list[bytes],
               extras: list[tuple[int, str, int, int]] | None = None) -> None:
    """Append one row per sample of a tar shard: image data offset/size, label, codec, shard; and
    to ``extras``, (row, extension, data offset, size) of each of its other members (``.json``,
    ``.txt``, ...: the sample's metadata)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        try:
            tf = tarfile.open(fileobj=f, mode="r:")
        except tarfile.TarError as e:
            why = file_placeholder_reason(path)
            raise CorruptDataError(f"{path} is {why}" if why else f"not a readable tar file ({e})", path=path) from None
        fd = f.fileno()
        key: str | None = None
        members: dict[str, tuple[int, int]] = {}
        first_offset = 0

        def flush() -> None:
            if key is None:
                return
            image = next((ext for ext in IMAGE_EXTENSIONS if ext in members), None)
            where = f"tar key {key!r} (members {', '.join(sorted(members))})"
            if image is None:
                raise CorruptDataError(f"{where} has no image member", path=path, offset=first_offset)
            if "cls" not in members:
                raise CorruptDataError(f"{where} has no .cls label member", path=path, offset=first_offset)
            off, n = members["cls"]
            text = os.pread(fd, min(n, 32), off)
            try:
                if n > 32:
                    raise ValueError
                label = int(text.strip())
                if not 0 <= label < 1 << 63:
                    raise ValueError
            except ValueError:
                raise CorruptDataError(f"{where}: .cls member {text[:32]!r} is not a class number (an integer "
                                       f"from 0 to 2^63-1)", path=path, offset=off) from None
            img_off, img_size = members[image]
            if extras is not None:
                extras.extend((len(rows), ext, o, n) for ext, (o, n) in members.items()
                              if ext != "cls" and ext not in IMAGE_EXTENSIONS)
            rows.append((img_off, img_size, label, CODEC_IDS[IMAGE_EXTENSIONS[image]], shard))
            keys.append(key.encode("utf-8", "surrogateescape"))  # the name's own bytes, UTF-8 or not

        try:
            while (ti := tf.next()) is not None:
                tf.members.clear()  # a sequential scan; do not keep every TarInfo
                if not ti.isreg() or _META.search(ti.name):
                    continue
                m = _KEY_EXT.match(ti.name)
                if m is None:
                    continue
                if ti.offset_data + ti.size > size:
                    raise CorruptDataError(f"member {ti.name!r} runs past the end of the file (truncated)",
                                           path=path, offset=ti.offset)
                if m.group(1) != key:
                    flush()
                    key, members, first_offset = m.group(1), {}, ti.offset
                members[m.group(2).lower()] = (ti.offset_data, ti.size)
            flush()
        except tarfile.TarError as e:
            raise CorruptDataError(f"cannot read tar headers ({e})", path=path) from None


# -- damage locators (packer verify) --------------------------------------------------------------
def tar_samples(path: str):  # noqa: ANN202 - iterator of (stem, {ext: (data offset, bytes)})
    """Each sample of a tar file as its stem and its members' data offsets and bytes, in file order."""
    with open(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tf:
        stem, members = None, {}
        for ti in tf:
            s, _, ext = ti.name.partition(".")
            if s != stem and stem is not None:
                yield stem, members
                members = {}
            stem = s
            fh2 = tf.extractfile(ti)
            members[ext] = (ti.offset_data, fh2.read() if fh2 is not None else b"")
        if stem is not None:
            yield stem, members


def locate_damage(root: str, m: Manifest, f: FileEntry, intact: set[str], report: Report) -> None:
    """Name the samples a damaged tar shard or index file holds wrong bytes for, by rebuilding what the
    intact other half implies (``packer verify``; ``f`` failed its SHA-256). With the other half
    damaged too there is nothing to compare with, and the SHA-256 problem alone names the file."""
    if f.name.endswith(TAR_SUFFIX):
        idx_name = index_name(f.name, {e.name for e in m.files})
        if idx_name in intact:
            _locate_in_shard(os.path.join(root, f.name), root, idx_name, f.id, report,
                             table_fields(root, m))
    elif f.name.endswith(INDEX_SUFFIXES):
        tar_name = f.name[: f.name.rindex(".")] + TAR_SUFFIX
        if tar_name in intact:
            _locate_in_index(os.path.join(root, f.name), root, tar_name, m, f.first, report)


def _locate_in_shard(path: str, root: str, idx_name: str, file_id: str, report: Report,
                     fields: Callable[[int], dict[str, Any]]) -> None:
    """Compare a shard, sample by sample, with the members its intact index implies."""
    first, entries, keys, names, rows = read_index(read_all(os.path.join(root, idx_name)), idx_name)
    data = read_all(path)
    stem = _first_stem(data, first)
    pos, key_start, count = 0, 0, len(names)
    for j, e in enumerate(entries):
        off, size = int(e["offset"]), int(e["size"])
        payload = data[off : off + size]
        key = keys[key_start : int(e["key_end"])].decode("utf-8")
        key_start = int(e["key_end"])
        mine = rows[j * count : (j + 1) * count]
        stored = [(n, CODEC_NAMES[int(r["codec"])], data[int(r["offset"]) : int(r["offset"]) + int(r["size"])])
                  for n, r in zip(names, mine)]
        want = sample_members(stem + j, key, int(e["label"]), CODEC_NAMES[int(e["codec"])], int(e["height"]),
                              int(e["width"]), payload, fields(first + j), stored)
        bad = byte_diff(data[pos : pos + len(want)], want)
        seed = place_seed(file_id, j)
        if len(bad):
            report(path, first + j, pos + int(bad[0]), "bytes differ from what the index implies")
        elif crc32c.crc32c(payload, seed) != int(e["crc"]):
            report(path, first + j, off, "image data checksum mismatch")
        else:
            damaged = [(n, r) for (n, _, d), r in zip(stored, mine) if crc32c.crc32c(d, seed) != int(r["crc"])]
            if damaged:
                report(path, first + j, int(damaged[0][1]["offset"]), f"{damaged[0][0]} member checksum mismatch")
        pos += len(want)
    bad = byte_diff(data[pos:], end_of_archive(pos))
    if len(bad):
        report(path, None, pos + int(bad[0]), "end-of-archive blocks damaged")


def _first_stem(data: bytes, first: int) -> int:
    """The number in the shard's first member name: the sample's number where the shard was
    written (a shard that ``packer merge`` copied keeps its part's numbers), else ``first``."""
    name = data[:100].split(b"\0", 1)[0]
    stem = name.split(b".", 1)[0]
    return int(stem) if stem.isdigit() and len(stem) == len(sample_key(0)) else first


def _index_from_shard(shard: str, file_id: str, first: int, version: int,
                      names: list[str]) -> tuple[bytes, np.ndarray]:
    """The index an intact shard implies (version 3: with the field section of the stored fields
    ``names``), and the end of each sample's key in its key blob."""
    rows, blob, field_rows = [], [], []
    key_end = 0
    for j, (_stem, members) in enumerate(tar_samples(shard)):
        meta = json.loads(members["json"][1])
        ext = next(x for x in members if x not in ("cls", "json"))
        off, payload = members[ext]
        k = str(meta["key"]).encode("utf-8")
        key_end += len(k)
        blob.append(k)
        codec = MEMBER_CODECS.get(ext, ext)
        seed = place_seed(file_id, j)
        h, w = int(meta["height"]), int(meta["width"])
        rows.append((off, len(payload), int(meta["label"]), h, w, crc32c.crc32c(payload, seed), key_end,
                     CODEC_IDS[codec], 3, b""))
        for name in names:
            member = next(x for x in members if x.startswith(name + "."))
            at, data = members[member]
            kind = named(name)
            shape = kind.shape(data)
            field_rows.append((at, len(data), h, w, crc32c.crc32c(data, seed), CODEC_IDS[MEMBER_CODECS[member[len(name) + 1:]]],
                               kind.channels, shape[3] if shape else 8, b""))
    entries = np.array(rows, dtype=INDEX_ENTRY)
    fields = (names, np.array(field_rows, dtype=FIELD_ENTRY)) if version >= FIELDS_INDEX_VERSION else None
    return (pack_index(first, entries, b"".join(blob), version=version, fields=fields),
            entries["key_end"].astype(np.int64))


def _locate_in_index(path: str, root: str, tar_name: str, m: Manifest, first: int, report: Report) -> None:
    """Compare an index with the one its intact shard implies; report each sample once. A byte of
    the header, of the field section's names, or past the key blob in an index without fields,
    belongs to no sample."""
    file_id = next((e.id for e in m.files if e.name == tar_name), "")
    version = FIELDS_INDEX_VERSION if m.version >= 3 else 2 if m.version >= 2 else 1
    names = m.stored_fields
    want, ends = _index_from_shard(os.path.join(root, tar_name), file_id, first, version, names)
    entries_end = INDEX_HEADER.size + len(ends) * INDEX_ENTRY.itemsize
    key_bytes = int(ends[-1]) if len(ends) else 0
    fields_at = entries_end + key_bytes + _FIELD_HEAD.size + sum(1 + len(n.encode("utf-8")) for n in names)
    per_sample = FIELD_ENTRY.itemsize * len(names)
    reported: set[int | None] = set()
    for b in byte_diff(read_all(path), want):
        b = int(b)
        if b < INDEX_HEADER.size:
            sample = None
        elif b < entries_end:
            sample = first + (b - INDEX_HEADER.size) // INDEX_ENTRY.itemsize
        elif b < entries_end + key_bytes:
            sample = first + int(np.searchsorted(ends, b - entries_end, side="right"))
        elif version >= FIELDS_INDEX_VERSION and per_sample and b >= fields_at:
            sample = first + (b - fields_at) // per_sample
        else:
            sample = None
        if sample not in reported:
            reported.add(sample)
            report(path, sample, b, "index bytes differ from what the shard implies")


#: Compressed tar files and the command that decompresses each (packer reads samples at their
#: offsets inside uncompressed tar files).
_COMPRESSED_TARS = {".tar.gz": "gunzip", ".tgz": "gunzip", ".tar.bz2": "bunzip2", ".tar.xz": "unxz",
                    ".tar.zst": "unzstd"}


def compressed_tar_note(names: list[str]) -> str | None:
    """What to say about compressed tar shards among ``names`` (None when there are none)."""
    found = sorted(n for n in names if n.lower().endswith(tuple(_COMPRESSED_TARS)))
    if not found:
        return None
    tool = next(t for suffix, t in _COMPRESSED_TARS.items() if found[0].lower().endswith(suffix))
    return (f"compressed tar shards ({len(found)} file(s) such as {found[0]}), which packer does not read: it reads "
            f"samples at their offsets in uncompressed .tar files; decompress them first ({tool} {found[0]})")


def identify(directory: str, files: set[str]) -> str | None:
    """For a folder without a manifest: None when it holds no tar files, "" when they are
    packer's own (an unfinished conversion), else what they are and what to do."""
    from . import read_head

    tars = [n for n in files if n.endswith(TAR_SUFFIX)]
    if not tars:
        return compressed_tar_note(sorted(files))
    if any(read_head(os.path.join(directory, n), 4) == INDEX_MAGIC for n in files if n.endswith(INDEX_SUFFIXES)):
        return ""
    return (f"tar shards written by another tool ({len(tars)} .tar files): open them with "
            f"open_dataset(path, format='tar') or convert them with 'packer convert tar FMT {directory} DST'")
