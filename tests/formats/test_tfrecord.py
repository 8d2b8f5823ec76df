"""TFRecord files: the exact record layout, Example encoding, .idx, gzip, limits, corruption."""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import zlib

import crc32c
import numpy as np
import pytest
from tfrecord import example_pb2
from tfrecord.writer import TFRecordWriter as PackageWriter

from packer.converters.base import WriterOptions
from packer.converters.tfrecord import TFRecordWriter
from packer.datasets import open_dataset
from packer.description.manifest import file_sha256, read_manifest
from packer.errors import CorruptDataError
from packer.images.imageproc import ProcessedImage
from packer.layouts.tfexample import encode_example, parse_example
from packer.layouts.tfrecord import masked_crc32c, unpack_zindex
from tests.helpers import fixed_image, forge_manifest_sizes, pack, place_seed_by_spec


def convert(src, dst, encode="jpeg:90", shuffle=True, **writer):
    return pack(src, dst, "tfrecord", encode, shuffle=shuffle, writer=writer)


def walk(data: bytes):
    """(offset, framed length, example bytes) of every record, checking both CRCs with the
    tfrecord package's own masking code (an implementation independent of ours)."""
    pos, out = 0, []
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        assert data[pos + 8 : pos + 12] == PackageWriter.masked_crc(data[pos : pos + 8])
        example = data[pos + 12 : pos + 12 + n]
        assert data[pos + 12 + n : pos + 16 + n] == PackageWriter.masked_crc(example)
        out.append((pos, n + 16, example))
        pos += n + 16
    assert pos == len(data)
    return out


def reference_example(**features) -> bytes:
    """Serialise with protobuf (the tfrecord package's generated protos), deterministically."""
    ex = example_pb2.Example()
    for k, v in features.items():
        f = ex.features.feature[k]
        if isinstance(v, bytes):
            f.bytes_list.value.append(v)
        else:
            f.int64_list.value.append(v)
    return ex.SerializeToString(deterministic=True)


def test_exact_bytes_of_one_raw_sample(one_image, tmp_path):
    convert(one_image, tmp_path / "out", encode="raw", shuffle=False)
    data = (tmp_path / "out" / "shard-000000.tfrecord").read_bytes()
    fid, seed = place_seed_by_spec(0, "cls/img.png", fixed_image().tobytes(), 0)
    assert read_manifest(tmp_path / "out").files[0].id == fid
    example = reference_example(**{
        "image/encoded": fixed_image().tobytes(), "image/format": b"raw", "image/class/label": 0,
        "image/height": 8, "image/width": 8, "image/channels": 3, "image/filename": b"cls/img.png",
        "packer/place": struct.pack("<I", seed),
    })
    length = struct.pack("<Q", len(example))
    assert data == length + PackageWriter.masked_crc(length) + example + PackageWriter.masked_crc(example)
    assert len(example) == 406 and data[:12].hex() == "96010000000000004ab9e695"
    assert example[:3] == b"\x0a\x93\x03"  # Example.features, 403 bytes; entries follow in key order
    assert example[-4:] == struct.pack("<I", seed)  # packer/place sorts last
    assert (tmp_path / "out" / "shard-000000.idx").read_bytes() == b"0 422\n"
    # any change to the layout must be deliberate: update these together with docs/FORMATS.md
    assert hashlib.sha256(data).hexdigest() == "919ad29d0919f281a45583945fab49707122dcbc779d07ea5d53e713a9e3bd1b"
    rgb, label = open_dataset(tmp_path / "out", output="numpy")[0]
    np.testing.assert_array_equal(rgb, fixed_image())


@pytest.mark.parametrize("features", [
    {"b": b"x", "a": 1, "c": -7},
    {"z": [1, -2, 3, 1 << 40], "y": [b"", b"two", bytes(300)], "\u00e9t\u00e9": b"unicode key"},
    {"f": [1.5, -2.25, 0.0], "empty": []},
])
def test_encode_example_matches_protobuf_deterministic(features):
    ours = encode_example(features)
    ex = example_pb2.Example.FromString(ours)
    assert ex.SerializeToString(deterministic=True) == ours
    parsed = parse_example(ours).features.feature
    for k, v in features.items():
        f = parsed[k]
        kind = f.WhichOneof("kind")
        got = list(getattr(f, kind).value)
        want = v if isinstance(v, list) else [v]
        assert got == want


def test_parse_example_rejects_garbage():
    with pytest.raises(ValueError, match="not a valid tf.train.Example"):
        parse_example(encode_example({"a": b"hello"})[:-2])


def test_records_idx_and_examples(tiny_folder, tmp_path):
    src, pixels = tiny_folder
    convert(src, tmp_path / "out", shard_samples=5)
    m = read_manifest(tmp_path / "out")
    assert [f.name for f in m.files] == [f"shard-{i:06d}{e}" for i in range(3) for e in (".tfrecord", ".idx")] + [
        "samples.table"]
    assert [f.samples for f in m.files] == [5, 0, 5, 0, 4, 0, 0]
    assert [f.first for f in m.files] == [0, 0, 5, 5, 10, 10, 0]
    for f in m.files:
        assert file_sha256(str(tmp_path / "out" / f.name)) == f.sha256
    assert sorted(os.listdir(tmp_path / "out")) == sorted([f.name for f in m.files] + ["manifest.json"])
    ds = open_dataset(tmp_path / "out")
    assert ds.shard_sizes == [5, 5, 4]
    seen = []
    for f in (f for f in m.files if f.samples):
        data = (tmp_path / "out" / f.name).read_bytes()
        records = walk(data)
        idx = (tmp_path / "out" / f.name.replace(".tfrecord", ".idx")).read_text()
        assert idx == "".join(f"{off} {n}\n" for off, n, _ in records)
        for i, (_, _, example) in enumerate(records):
            ex = example_pb2.Example.FromString(example)
            assert ex.SerializeToString(deterministic=True) == example
            feat = ex.features.feature
            assert sorted(feat) == sorted(["image/encoded", "image/format", "image/class/label", "image/height",
                                           "image/width", "image/channels", "image/filename", "packer/place"])
            seed = crc32c.crc32c(b"PKPL" + bytes.fromhex(f.id) + struct.pack("<Q", i))
            assert feat["packer/place"].bytes_list.value[0] == struct.pack("<I", seed)
            rec = ds.read_record(f.first + i)
            assert feat["image/encoded"].bytes_list.value[0] == bytes(rec.payload)
            assert feat["image/filename"].bytes_list.value[0].decode() == rec.key
            assert feat["image/class/label"].int64_list.value[0] == rec.label
            assert feat["image/format"].bytes_list.value[0] == b"jpeg"
            seen.append(rec.key)
    assert sorted(seen) == sorted(k.replace(os.sep, "/") for k in pixels)


def test_gzip_is_the_plain_stream_compressed_and_reads_randomly(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "plain", shard_samples=6)
    convert(src, tmp_path / "gz", shard_samples=6, gzip=True)
    m = read_manifest(tmp_path / "gz")
    assert m.layout["gzip"] is True
    assert [f.name for f in m.files][:3] == ["shard-000000.tfrecord.gz", "shard-000000.idx", "shard-000000.zidx"]
    for i in range(3):
        plain = (tmp_path / "plain" / f"shard-{i:06d}.tfrecord").read_bytes()
        packed = (tmp_path / "gz" / f"shard-{i:06d}.tfrecord.gz").read_bytes()
        assert packed[:10] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # mtime 0: reproducible
        assert gzip.decompress(packed) == plain  # one standard member, CRC and size checked
        assert (tmp_path / "gz" / f"shard-{i:06d}.idx").read_bytes() == \
               (tmp_path / "plain" / f"shard-{i:06d}.idx").read_bytes()  # uncompressed offsets
        offsets = unpack_zindex((tmp_path / "gz" / f"shard-{i:06d}.zidx").read_bytes(), "zidx")
        for (off, n, _), a, b in zip(walk(plain), offsets, offsets[1:]):
            assert zlib.decompressobj(-15).decompress(packed[a:b]) == plain[off : off + n]
    a, b = open_dataset(tmp_path / "plain", output="numpy"), open_dataset(tmp_path / "gz", output="numpy")
    for i in reversed(range(len(a))):  # random access, backwards
        ra, rb = a.read_record(i), b.read_record(i)
        assert (ra.key, ra.label, bytes(ra.payload)) == (rb.key, rb.label, bytes(rb.payload))


def test_gzip_corruption_is_detected(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "gz", gzip=True)
    path = tmp_path / "gz" / "shard-000000.tfrecord.gz"
    offsets = unpack_zindex((tmp_path / "gz" / "shard-000000.zidx").read_bytes(), "zidx")
    data = bytearray(path.read_bytes())
    data[(offsets[3] + offsets[4]) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match=rf"{path}.*sample 3"):
        open_dataset(tmp_path / "gz")[3]


def test_limits(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "n", shard_samples=4)
    assert open_dataset(tmp_path / "n").shard_sizes == [4, 4, 4, 2]
    limit = 8_000
    convert(src, tmp_path / "b", shard_bytes=limit)
    files = [f for f in read_manifest(tmp_path / "b").files if f.samples]
    assert len(files) > 2 and all(f.bytes <= limit or f.samples == 1 for f in files)
    convert(src, tmp_path / "one", shard_bytes=1)
    assert open_dataset(tmp_path / "one").shard_sizes == [1] * 14


def _corrupt(tmp_path, src, mutate):
    convert(src, tmp_path / "out", shard_samples=5)
    path = tmp_path / "out" / "shard-000001.tfrecord"
    offsets = [int(line.split()[0]) for line in (tmp_path / "out" / "shard-000001.idx").read_text().splitlines()]
    data = bytearray(path.read_bytes())
    mutate(data, offsets[2])
    path.write_bytes(bytes(data))
    return open_dataset(tmp_path / "out"), str(path), offsets[2]


def test_flipped_data_byte_is_detected(tiny_folder, tmp_path):
    def flip(data, off):
        data[off + 200] ^= 0x01

    ds, path, off = _corrupt(tmp_path, tiny_folder[0], flip)
    with pytest.raises(CorruptDataError) as err:
        ds[7]
    assert "data checksum mismatch" in str(err.value)
    assert (err.value.path, err.value.sample, err.value.offset) == (path, 7, off + 12)
    assert f"file {path}, sample 7, offset {off + 12}" in str(err.value)
    ds[6], ds[8]  # neighbours are fine


def test_flipped_length_crc_is_detected(tiny_folder, tmp_path):
    def flip(data, off):
        data[off + 9] ^= 0x01

    ds, path, off = _corrupt(tmp_path, tiny_folder[0], flip)
    with pytest.raises(CorruptDataError, match=rf"length checksum mismatch.*{path}.*sample 7.*offset {off + 8}"):
        ds[7]
    open_dataset(ds.root, verify=False)[7]  # without verify the CRCs are not checked


def test_crafted_length_never_drives_allocation(tiny_folder, tmp_path):
    def lie(data, off):
        huge = (1 << 62).to_bytes(8, "little")
        data[off : off + 12] = huge + masked_crc32c(huge).to_bytes(4, "little")  # consistent CRC

    ds, path, off = _corrupt(tmp_path, tiny_folder[0], lie)
    with pytest.raises(CorruptDataError, match=rf"length field says {1 << 62} bytes.*sample 7.*offset {off}"):
        ds[7]


def test_tampered_idx_is_refused_at_open(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out")
    idx = tmp_path / "out" / "shard-000000.idx"
    lines = idx.read_text().splitlines()
    lines[3] = "5 100"
    idx.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptDataError, match="the manifest says.*shard-000000.idx"):
        open_dataset(tmp_path / "out")
    forge_manifest_sizes(tmp_path / "out")
    with pytest.raises(CorruptDataError, match="not contiguous.*shard-000000.idx"):
        open_dataset(tmp_path / "out")


def test_abort_leaves_no_files(tmp_path):
    for gz in (False, True):
        d = tmp_path / str(gz)
        d.mkdir()
        w = TFRecordWriter(str(d), WriterOptions(gzip=gz))
        w.add(0, "a/b.png", 1, ProcessedImage("png", b"\x89PNG fake", 1, 1))
        w.abort()
        assert os.listdir(d) == []
