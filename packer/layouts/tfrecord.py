"""The TFRecord layout: ``tf.train.Example`` records with the conventional image keys, plus ``.idx``.

The one home of the format's on-disk knowledge: the writer (packer.converters.tfrecord), the
reader (packer.datasets.formats.tfrecord), ``verify`` and the tests import it. docs/FORMATS.md
("TFRecord") gives the record framing, the Example's keys, the ``.idx`` text index and the
``.zidx`` gzip index.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from collections.abc import Collection, Sequence
from typing import Any

import crc32c
import numpy as np

from packer.description.damage import Report, byte_diff, read_all
from packer.description.manifest import FileEntry, Manifest
from packer.description.record import Record
from packer.description.samples import decode_meta, encode_meta, sample_fields
from packer.errors import CorruptDataError
from packer.fields import named
from packer.fields.mask import MASK
from packer.images.codecs import TF_FORMAT_CODECS
from packer.images.imageproc import ProcessedField, ProcessedImage
from packer.images.placeholder import file_placeholder_reason, placeholder_reason
from packer.layouts.tfexample import Floats, encode_example

__all__ = [
    "identify",
    "zlib_tfrecord",
    "ZLIB_ADVICE",
    "TFRECORD_SUFFIX",
    "GZIP_SUFFIX",
    "INDEX_SUFFIX",
    "ZINDEX_SUFFIX",
    "ZINDEX_MAGIC",
    "FOREIGN_SUFFIXES",
    "PLACE_FEATURE",
    "MASK_PREFIX",
    "BOX_FEATURES",
    "BOX_LABEL_FEATURE",
    "field_prefix",
    "field_features",
    "GZIP_HEADER",
    "GZIP_LEVEL",
    "HEAD",
    "masked_crc32c",
    "frame_record",
    "image_example",
    "image_record",
    "pack_zindex",
    "unpack_zindex",
    "parse_idx",
    "scan_file",
    "locate_damage",
]

TFRECORD_SUFFIX = ".tfrecord"
GZIP_SUFFIX = ".tfrecord.gz"
INDEX_SUFFIX = ".idx"
ZINDEX_SUFFIX = ".zidx"
ZINDEX_MAGIC = b"PKGZ"
ZINDEX_VERSION = 1
GZIP_LEVEL = 6

_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_U32 = struct.Struct("<I")
#: gzip member header: magic, deflate, no flags, mtime 0, no extra flags, OS unknown (255), so the
#: same records give the same bytes. The file is one standard gzip member that any gzip reader,
#: ``tf.data`` (``compression_type="GZIP"``) and the ``tfrecord`` package read; ``.idx`` offsets
#: then count in the uncompressed stream, where the ``tfrecord`` package seeks through ``gzip.open``.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """TFRecord's masked CRC32C of ``data``."""
    crc = crc32c.crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One framed TFRecord: length, its masked CRC, the data, its masked CRC."""
    head = _LENGTH.pack(len(data))
    return b"".join((head, _U32.pack(masked_crc32c(head)), data, _U32.pack(masked_crc32c(data))))


PLACE_FEATURE = "packer/place"
META_FEATURE = "packer/meta"
#: The mask's features (DeepLab's names); an extra image NAME's are ``image/NAME/encoded`` and ``/format``.
MASK_PREFIX = "image/segmentation/class/"
#: The feature prefix of the kinds that TFRecord stores under their own names (a storage row);
#: any other stored field's is ``image/NAME/``.
FIELD_PREFIXES = {MASK: MASK_PREFIX}
#: Boxes, normalised to [0, 1] by the stored width and height, and their labels (the TensorFlow
#: Object Detection API's names).
BOX_FEATURES = ("image/object/bbox/xmin", "image/object/bbox/ymin", "image/object/bbox/xmax", "image/object/bbox/ymax")
BOX_LABEL_FEATURE = "image/object/class/label"


def field_prefix(name: str) -> str:
    """The feature name prefix of a stored field: ``image/segmentation/class/`` for the mask,
    ``image/NAME/`` for an extra image; ``encoded`` and ``format`` follow it."""
    return FIELD_PREFIXES.get(named(name), f"image/{name}/")


def field_features(image: ProcessedImage) -> dict[str, Any]:
    """The features of a sample's masks, extra images and boxes (none for a sample without)."""
    out: dict[str, Any] = {}
    for f in image.fields:
        out[field_prefix(f.name) + "encoded"] = f.payload
        out[field_prefix(f.name) + "format"] = f.codec.encode("ascii")
    if image.boxes is not None:
        for i, name in enumerate(BOX_FEATURES):
            scale = image.width if i % 2 == 0 else image.height
            out[name] = Floats(b[i] / scale for b in image.boxes)
        if image.box_labels is not None:
            out[BOX_LABEL_FEATURE] = list(image.box_labels)
    return out


def image_example(key: str, label: int, image: ProcessedImage, place: int | None = None) -> bytes:
    """The serialised Example of one sample: ``image/encoded``, ``image/format``,
    ``image/class/label``, ``image/height``, ``image/width``, ``image/channels``,
    ``image/filename``, the fields' features (:func:`field_features`) and, with ``place`` (the
    sample's place seed), ``packer/place``. A
    multi-label sample's ``image/class/label`` lists its classes; a number label is
    ``image/target`` (float32; the exact float64 is in the sample table) with class label -1;
    metadata is ``packer/meta`` (compact JSON). Keys are sorted, so ``packer/place`` is the last
    4 bytes and can be patched once the sample's shard is known."""
    extra = {PLACE_FEATURE: _U32.pack(place)} if place is not None else {}
    extra.update(field_features(image))
    fields = sample_fields(label)
    if "target" in fields:
        extra["image/target"] = [fields["target"]]
    if "meta" in fields:
        extra[META_FEATURE] = encode_meta(fields["meta"], f"sample {key!r}")
    return encode_example({
        **extra,
        "image/encoded": image.payload,
        "image/format": image.codec.encode("ascii"),
        "image/class/label": fields["labels"] if "labels" in fields else int(label),
        "image/height": image.height,
        "image/width": image.width,
        "image/channels": image.channels,
        "image/filename": key.encode("utf-8"),
    })


def pack_zindex(offsets: Sequence[int]) -> bytes:
    """Serialise a gzip offset index from the N + 1 compressed offsets.

    The writer fully flushes the compressor (``Z_FULL_FLUSH``) after every record, so each record's
    compressed bytes start on a byte boundary with a fresh dictionary: a reader inflates record i
    alone (``zlib.decompressobj(-15)`` over ``[c[i], c[i+1])``) from one ``pread``.
    """
    body = struct.pack(f"<4sHHQ{len(offsets)}Q", ZINDEX_MAGIC, ZINDEX_VERSION, 0, len(offsets) - 1, *offsets)
    return body + _U32.pack(crc32c.crc32c(body))


def unpack_zindex(data: bytes, path: str) -> list[int]:
    """Parse and check a gzip offset index; return the N + 1 offsets (CorruptDataError if bad)."""
    if len(data) < 28 or data[:4] != ZINDEX_MAGIC:
        raise CorruptDataError("not a packer gzip index", path=path, offset=0)
    _, version, _, n = struct.unpack_from("<4sHHQ", data)
    if version != ZINDEX_VERSION:
        raise CorruptDataError(f"gzip index version {version} is not supported", path=path, offset=4)
    if len(data) != 16 + 8 * (n + 1) + 4:
        raise CorruptDataError(f"gzip index is {len(data)} bytes for {n} records", path=path, offset=8)
    if crc32c.crc32c(memoryview(data)[:-4]) != _U32.unpack_from(data, len(data) - 4)[0]:
        raise CorruptDataError("gzip index checksum mismatch", path=path, offset=len(data) - 4)
    offsets = list(struct.unpack_from(f"<{n + 1}Q", data, 16))
    if any(b < a for a, b in zip(offsets, offsets[1:])):
        raise CorruptDataError("gzip index offsets are not increasing", path=path, offset=16)
    return offsets


#: File endings taken as TFRecord files when a foreign directory is opened.
FOREIGN_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr")

HEAD = struct.Struct("<QI")
FORMAT_CODECS = TF_FORMAT_CODECS


def parse_idx(text: bytes, path: str) -> np.ndarray:
    """Parse an ``.idx`` text index into an (N, 2) int64 array of (offset, length)."""
    why = placeholder_reason(text[:256]) if text else None
    if why:
        raise CorruptDataError(f"{path} is {why}", path=path)
    try:
        values = np.array(text.split(), dtype=np.int64)
    except (ValueError, OverflowError):
        raise CorruptDataError("TFRecord index is not decimal 'offset length' lines", path=path) from None
    if len(values) and (values.min() < 0 or values.max() >= 1 << 62):  # sums below never overflow int64
        raise CorruptDataError("TFRecord index holds a negative offset or length, or one of 2^62 bytes or more",
                               path=path)
    if len(values) % 2:
        raise CorruptDataError("TFRecord index has an odd number of fields", path=path)
    pairs = values.reshape(-1, 2)
    if len(pairs):
        offsets, lengths = pairs[:, 0], pairs[:, 1]
        if offsets[0] != 0 or np.any(lengths < 16) or np.any(offsets[1:] != offsets[:-1] + lengths[:-1]):
            raise CorruptDataError("TFRecord index records are not contiguous from offset 0", path=path)
    return pairs


#: Features packer reads into a Record's fields; any other feature is metadata.
IMAGE_FEATURES = frozenset({"image/encoded", "image/class/label", "image/format", "image/height", "image/width",
                            "image/channels", "image/filename", "image/target", PLACE_FEATURE})


def example_meta(msg: Any, read: Collection[str] = ()) -> dict[str, Any]:
    """The metadata of a parsed Example: ``packer/meta``'s JSON object, and every feature packer
    does not read otherwise (nor in ``read``) as ``name: value`` (UTF-8 bytes as text, one number
    as a number, more as a list; bytes that are not UTF-8 are left out)."""
    meta: dict[str, Any] = {}
    for name, feature in msg.features.feature.items():
        if name in IMAGE_FEATURES or name in read:
            continue
        if name == META_FEATURE:
            raw = feature.bytes_list.value
            meta.update(decode_meta(raw[0] if raw else b"", META_FEATURE))
            continue
        kind = feature.WhichOneof("kind")
        values: list[Any] = list(getattr(feature, kind).value) if kind else []
        if kind == "bytes_list":
            try:
                values = [v.decode("utf-8") for v in values]
            except UnicodeDecodeError:
                continue
        elif kind == "float_list":
            values = [float(v) for v in values]
        else:
            values = [int(v) for v in values]
        meta[name] = values[0] if len(values) == 1 else values
    return meta


def image_record(
    example_cls: Any, data: memoryview, path: str, index: int | str, offset: int, place: int | None = None,
    want_meta: bool = False, foreign: bool = False, stored: Sequence[str] = (),
) -> Record:
    """The sample in a serialised Example (CorruptDataError when it is not an image Example, or,
    with ``place``, when its ``packer/place`` feature is not that seed: a sample from another place).
    ``foreign``: a file written by another tool, whose label must be one int64 and whose features
    may have the names in :data:`FOREIGN_ALIASES` (its mask and boxes, where it has them, are read
    too). ``stored``: the names of the dataset's stored fields (version 3), read into ``fields``."""
    msg = example_cls()
    try:
        msg.ParseFromString(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError is not a ValueError
        raise CorruptDataError(f"record is not a valid tf.train.Example ({e})", path=path, sample=index,
                               offset=offset) from None
    features = msg.features.feature
    get = features.get
    aliases = _aliases(features) if foreign else {}
    encoded, label, fmt, height, width, name = (
        get(aliases.get(k, k)) for k in ("image/encoded", "image/class/label", "image/format", "image/height",
                                         "image/width", "image/filename")
    )
    try:
        payload = encoded.bytes_list.value[0]  # type: ignore[union-attr]
        if label is None:
            raise AttributeError
    except (AttributeError, IndexError):
        names = ("image/encoded (or image_raw)", "image/class/label (or label)") if foreign else (
            "image/encoded", "image/class/label")
        raise CorruptDataError(f"record has no {names[0]} bytes or no {names[1]}",
                               path=path, sample=index, offset=offset) from None
    target = _class_label(label, aliases.get("image/class/label", "image/class/label"), foreign, path, index, offset)
    if place is not None:
        tag = get(PLACE_FEATURE)
        got = tag.bytes_list.value[0] if tag is not None and tag.bytes_list.value else b""
        if got != struct.pack("<I", place):
            raise CorruptDataError(f"record belongs to another place (packer/place {got.hex() or 'missing'}, "
                                   f"expected {struct.pack('<I', place).hex()}): shards swapped, renamed or copied "
                                   f"from another dataset", path=path, sample=index, offset=offset)
    v: Any = fmt.bytes_list.value if fmt is not None else ()
    codec = FORMAT_CODECS.get(v[0], "jpeg") if v else "jpeg"  # any encoded image decodes; only raw needs to be known
    v = height.int64_list.value if height is not None else ()
    h = v[0] if v else 0
    v = width.int64_list.value if width is not None else ()
    w = v[0] if v else 0
    v = name.bytes_list.value if name is not None else ()
    key = v[0].decode("utf-8", "replace") if v else f"{os.path.basename(path)}:{index}"
    parts = _example_fields(get, stored, foreign, h, w, (path, index, offset)) if stored or foreign else {}
    read = set(aliases.values()) | set(parts.pop("read", ()))
    return Record(codec, target, h, w, key, payload, meta=example_meta(msg, read) if want_meta else None, **parts)


def _example_fields(get: Any, stored: Sequence[str], foreign: bool, height: int, width: int,
                    where: tuple[str, int | str, int]) -> dict[str, Any]:
    """``fields`` (and for another tool's Example, ``boxes`` and ``box_labels``) of a Record, and
    ``read``: the feature names they came from. CorruptDataError (naming ``where``: path, sample,
    offset) when a stored field is missing."""
    names = list(stored) or ([MASK.name] if foreign and get(MASK_PREFIX + "encoded") is not None else [])
    fields, read = [], []
    for name in names:
        prefix = field_prefix(name)
        encoded, fmt = get(prefix + "encoded"), get(prefix + "format")
        value = encoded.bytes_list.value if encoded is not None else ()
        if not value:
            path, sample, offset = where
            raise CorruptDataError(f"record has no {prefix}encoded bytes (the sample's {name!r})", path=path,
                                   sample=sample, offset=offset)
        token = fmt.bytes_list.value if fmt is not None else ()
        kind = named(name)
        codec = FORMAT_CODECS.get(token[0], "jpeg") if token else (kind.codec or "jpeg")
        h, w, channels, depth = kind.shape(value[0]) or (height, width, kind.channels, 8)
        fields.append(ProcessedField(name, codec, value[0], h, w, channels, depth))
        read += [prefix + "encoded", prefix + "format"]
    out: dict[str, Any] = {"fields": tuple(fields), "read": read}
    if foreign and get(BOX_FEATURES[0]) is not None and height and width:
        coords = [list(get(n).float_list.value) if get(n) is not None else [] for n in BOX_FEATURES]
        if all(len(c) == len(coords[0]) for c in coords):
            scale = (width, height, width, height)
            out["boxes"] = tuple(tuple(float(c[k]) * scale[i] for i, c in enumerate(coords)) for k in range(len(coords[0])))
            labels = get(BOX_LABEL_FEATURE)
            values = list(labels.int64_list.value) if labels is not None else []
            out["box_labels"] = tuple(int(v) for v in values) if len(values) == len(coords[0]) else None
            read += [*BOX_FEATURES, BOX_LABEL_FEATURE]
    return out


#: Other tools' names for the features packer reads, used in their files where packer's is absent:
#: TensorFlow's TFRecord tutorial writes ``image_raw`` (the image file's bytes), ``label``,
#: ``height`` and ``width``.
FOREIGN_ALIASES = {"image/encoded": "image_raw", "image/class/label": "label", "image/height": "height",
                   "image/width": "width"}


def _aliases(features: Any) -> dict[str, str]:
    """packer's feature name -> the other name a foreign Example uses for it, where it lacks packer's."""
    return {ours: theirs for ours, theirs in FOREIGN_ALIASES.items() if ours not in features and theirs in features}


def _class_label(label: Any, name: str, foreign: bool, path: str, index: int | str, offset: int) -> int:
    """A record's class number from its label feature ``name``: its one int64 value; -1 for a
    packer multi-label sample with no class (the sample table holds every sample's classes; earlier
    versions wrote that empty list as bytes, still read). CorruptDataError for labels of another type, and
    in another tool's file for anything but exactly one value (a multi-label foreign file is not
    read as single-label)."""
    kind = label.WhichOneof("kind")
    values = getattr(label, kind).value if kind else ()
    if kind in ("bytes_list", "float_list") and len(values):
        what = "bytes" if kind == "bytes_list" else "floats"
        shown = ", ".join(repr(v[:32] if kind == "bytes_list" else v) for v in values[:3])
        raise CorruptDataError(f"{name} holds {what} ({shown}{', ...' if len(values) > 3 else ''}), not int64 class "
                               f"numbers", path=path, sample=index, offset=offset)
    if kind != "int64_list" or not len(values):
        if foreign:
            raise CorruptDataError(f"{name} holds no value; every record needs one int64 class number",
                                   path=path, sample=index, offset=offset)
        return -1
    if foreign and len(values) != 1:
        shown = ", ".join(str(v) for v in values[:8])
        raise CorruptDataError(f"{name} holds {len(values)} values ({shown}{', ...' if len(values) > 8 else ''}); "
                               f"packer reads one class per record from other tools' TFRecord files (multi-label "
                               f"ones are refused, not read as their first label)", path=path, sample=index,
                               offset=offset)
    return int(values[0])


def scan_file(path: str, rows: list[tuple[int, int]], example_cls: Any) -> int:
    """Append (offset, framed length) for every record of a TFRecord file; return its largest label.

    Each length field is checked against its CRC and against the bytes left in the file before
    the record is read, so a crafted length cannot make the scan allocate more than the file holds.
    """
    size = os.path.getsize(path)
    max_label = -1
    with open(path, "rb", buffering=1 << 20) as f:
        pos = 0
        while pos < size:
            head = f.read(12)
            if len(head) != 12:
                why = file_placeholder_reason(path) if pos == 0 else None
                raise CorruptDataError(f"{path} is {why}" if why else "truncated record header", path=path,
                                       sample=len(rows), offset=pos)
            length, length_crc = HEAD.unpack(head)
            if masked_crc32c(head[:8]) != length_crc:
                why = file_placeholder_reason(path) if pos == 0 else None
                if why:
                    raise CorruptDataError(f"{path} is {why}", path=path)
                raise CorruptDataError("record length checksum mismatch", path=path, sample=len(rows), offset=pos + 8)
            if length > size - pos - 16:
                raise CorruptDataError(f"record length {length} runs past the end of the file ({size} bytes)",
                                       path=path, sample=len(rows), offset=pos)
            data = f.read(length)
            f.read(4)
            record = image_record(example_cls, memoryview(data), path, len(rows), pos + 12, foreign=True)
            if record.label < 0:
                raise CorruptDataError(f"image/class/label {record.label} is negative; labels are class numbers",
                                       path=path, sample=len(rows), offset=pos + 12)
            max_label = max(max_label, record.label)
            rows.append((pos, length + 16))
            pos += length + 16
    return max_label


# -- damage locator (packer verify) ---------------------------------------------------------------
def locate_damage(root: str, m: Manifest, f: FileEntry, intact: set[str], report: Report) -> None:
    """Name the records a damaged TFRecord index or gzip index is wrong about, by rebuilding it from
    the intact data file (``packer verify``; ``f`` failed its SHA-256)."""

    path = os.path.join(root, f.name)
    stem = f.name.rsplit(".", 1)[0]
    gz = m.layout.get("gzip", False)
    data_name = stem + (GZIP_SUFFIX if gz else TFRECORD_SUFFIX)
    if f.name.endswith(INDEX_SUFFIX) and data_name in intact:
        raw = read_all(os.path.join(root, data_name))
        if gz:
            raw = gzip.decompress(raw)
        lines, pos = [], 0
        while pos < len(raw):
            (length,) = struct.unpack_from("<Q", raw, pos)
            lines.append(b"%d %d\n" % (pos, length + 16))
            pos += length + 16
        want = b"".join(lines)
        got = read_all(path)
        starts = np.cumsum([0] + [len(x) for x in lines])
        reported: set[int | None] = set()
        for b in byte_diff(got, want):
            line = int(np.searchsorted(starts, int(b), side="right")) - 1
            sample = f.first + line if 0 <= line < len(lines) else None
            if sample not in reported:
                reported.add(sample)
                report(path, sample, int(b), "index line differs from what the records imply")
    elif f.name.endswith(ZINDEX_SUFFIX) and data_name in intact:
        got = read_all(path)
        n = (len(got) - 20) // 8 - 1
        if n < 0 or got[:4] != ZINDEX_MAGIC:
            report(path, None, 0, "gzip index header damaged")
            return
        offsets = struct.unpack_from(f"<{n + 1}Q", got, 16)
        if struct.unpack_from("<Q", got, 8)[0] != n:
            report(path, None, 8, "gzip index header damaged")
        comp = read_all(os.path.join(root, data_name))
        for i in range(n):
            try:
                rec = zlib.decompressobj(-zlib.MAX_WBITS).decompress(comp[offsets[i] : offsets[i + 1]])
                (length,) = struct.unpack_from("<Q", rec, 0)
                good = len(rec) == length + 16
            except (zlib.error, struct.error):
                good = False
            if not good:
                report(path, f.first + i, 16 + 8 * i, "gzip index offset does not start a record")
    elif f.name == data_name and gz:
        got = read_all(path)
        if got[:10] != GZIP_HEADER:
            report(path, None, int(byte_diff(got[:10], GZIP_HEADER)[0]), "gzip header damaged")
        try:
            stream = gzip.decompress(got)
        except (OSError, EOFError, zlib.error):
            report(path, None, 0, "the gzip stream does not decompress as a whole (damaged record data or trailer)")
            return
        del stream


#: What to do with a ZLIB-compressed TFRecord file of another tool.
ZLIB_ADVICE = ("packer reads other tools' TFRecord files uncompressed (GZIP only in packer's own datasets, "
               "which carry an index); decompress each file first (zlib.decompress of the whole file) or write "
               "them without compression")


def zlib_tfrecord(head: bytes) -> bool:
    """Whether a TFRecord file whose first bytes are ``head`` is ZLIB-compressed: no valid record
    header (its length CRC fails) but a zlib stream (RFC 1950 header) that inflates."""
    if len(head) < 2:
        return False
    if len(head) >= HEAD.size and masked_crc32c(head[:8]) == HEAD.unpack_from(head)[1]:
        return False
    try:
        zlib.decompressobj().decompress(head, 16)
    except zlib.error:
        return False
    return True


def identify(directory: str, files: set[str]) -> str | None:
    """For a folder without a manifest: None when it holds no TFRecord files, "" when they are
    packer's own (an unfinished conversion), else what they are and what to do."""
    from . import read_head

    records = [n for n in files if n.endswith(FOREIGN_SUFFIXES)]
    if not records:
        return None
    head = read_head(os.path.join(directory, sorted(records)[0]))
    if PLACE_FEATURE.encode() in head:
        return ""
    if zlib_tfrecord(head):
        return f"ZLIB-compressed TFRecord files written by another tool: {ZLIB_ADVICE}"
    if head[:2] == b"\x1f\x8b":
        return ("gzip-compressed TFRecord files written by another tool: without packer's index they cannot be "
                "read randomly; decompress them (gunzip) first")
    return (f"TFRecord files written by another tool ({len(records)} files): open them with "
            f"open_dataset(path, format='tfrecord') or convert them with 'packer convert tfrecord FMT "
            f"{directory} DST'")
