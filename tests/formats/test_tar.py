"""Tar shards: the exact on-disk layout, the index, shard limits, and corruption detection."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tarfile

import crc32c
import cv2
import numpy as np
import pytest

from packer.converters.base import WriterOptions
from packer.converters.shards import DEFAULT_SHARD_BYTES
from packer.converters.tar import TarWriter
from packer.datasets import open_dataset
from packer.description.manifest import file_sha256, read_manifest
from packer.errors import CorruptDataError
from packer.images.imageproc import ProcessedImage
from packer.layouts.tar import npy_header, unpack_index
from tests.helpers import fixed_image, forge_manifest_sizes, pack, place_seed_by_spec


def convert(src, dst, encode="jpeg:90", shuffle=True, **writer):
    return pack(src, dst, "tar", encode, shuffle=shuffle, writer=writer)


def ustar(name: bytes, size: int) -> bytes:
    """The header we promise, spelled out field by field (independently of the writer)."""
    h = bytearray(512)
    h[0 : len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[148:156] = b" " * 8
    h[156:157] = b"0"
    h[257:265] = b"ustar\x0000"
    h[329:337] = b"0000000\0"
    h[337:345] = b"0000000\0"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def test_exact_bytes_of_one_raw_sample(one_image, tmp_path):
    convert(one_image, tmp_path / "out", encode="raw", shuffle=False)
    tar = (tmp_path / "out" / "shard-000000.tar").read_bytes()
    idx = (tmp_path / "out" / "shard-000000.pkidx").read_bytes()
    pixels = fixed_image().tobytes()
    npy_head = (b"\x93NUMPY\x01\x00\x76\x00{'descr': '|u1', 'fortran_order': False, 'shape': (8, 8, 3), }"
                + b" " * 55 + b"\n")
    assert len(npy_head) == 128
    npy = npy_head + pixels
    meta = b'{"key":"cls/img.png","label":0,"height":8,"width":8}'
    want = b"".join([
        ustar(b"0000000000.npy", len(npy)), npy, bytes(-len(npy) % 512),
        ustar(b"0000000000.cls", 1), b"0", bytes(511),
        ustar(b"0000000000.json", len(meta)), meta, bytes(-len(meta) % 512),
    ])
    want += bytes(10240 - len(want))  # two zero blocks, padded to one 10240-byte record
    assert tar == want
    # the .npy member is a plain NumPy file, readable without pickle
    arr = np.load(io.BytesIO(npy), allow_pickle=False)
    np.testing.assert_array_equal(arr, fixed_image())
    fid, seed = place_seed_by_spec(0, "cls/img.png", npy, 0)
    assert read_manifest(tmp_path / "out").files[0].id == fid
    head = struct.pack("<4sHHQQI", b"PKTI", 2, 48, 1, 0, 11)
    entry = struct.pack("<QQqIIII BB6x", 512, len(npy), 0, 8, 8, crc32c.crc32c(npy, seed), 11, 0, 3)
    body = entry + b"cls/img.png"
    assert idx == head + struct.pack("<I", crc32c.crc32c(body, crc32c.crc32c(head))) + body
    # any change to the layout must be deliberate: update these together with docs/FORMATS.md
    assert hashlib.sha256(tar).hexdigest() == "4cac7ad250d19038c2cc3482d05bf4f3161e7aed3af3b8d3222edb72dbadc681"
    assert hashlib.sha256(idx).hexdigest() == "d76030ea53596046424b6596fb56a601d2f0066d4f8f829c598e2decd05306ca"
    rgb, label = open_dataset(tmp_path / "out", output="numpy")[0]
    np.testing.assert_array_equal(rgb, fixed_image())
    assert label == 0


def test_npy_header_matches_numpy():
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|u1", "fortran_order": False, "shape": (37, 5, 3)})
    assert npy_header(37, 5) == buf.getvalue()


def test_members_headers_and_index_agree_with_tarfile(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", shard_samples=4)
    m = read_manifest(tmp_path / "out")
    shards = [f for f in m.files if f.name.endswith(".tar")]
    assert [f.name for f in shards] == [f"shard-{i:06d}.tar" for i in range(4)]
    for f in shards:
        first, entries, keys = unpack_index((tmp_path / "out" / f.name.replace(".tar", ".pkidx")).read_bytes(), f.name)
        assert first == f.first and len(entries) == f.samples
        with tarfile.open(tmp_path / "out" / f.name) as tf:
            members = tf.getmembers()
            names = [ti.name for ti in members]
            want = [f"{first + i:010d}.{ext}" for i in range(f.samples) for ext in ("jpg", "cls", "json")]
            assert names == want
            for ti in members:
                assert (ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname) == (0, 0o644, 0, 0, "", "")
                assert ti.type == tarfile.REGTYPE and ti.pax_headers == {}
            start = 0
            for i, e in enumerate(entries):
                img, cls, meta = members[3 * i : 3 * i + 3]
                assert (int(e["offset"]), int(e["size"])) == (img.offset_data, img.size)
                data = tf.extractfile(img).read()
                info = json.loads(tf.extractfile(meta).read())
                if i == 0:
                    fid, _ = place_seed_by_spec(int(f.name[6:12]), info["key"], data, 0)
                    assert f.id == fid
                seed = crc32c.crc32c(b"PKPL" + bytes.fromhex(f.id) + struct.pack("<Q", i))
                assert crc32c.crc32c(data, seed) == int(e["crc"])
                label = int(tf.extractfile(cls).read())
                info = json.loads(tf.extractfile(meta).read())
                assert label == int(e["label"]) == info["label"]
                assert keys[start : int(e["key_end"])].decode() == info["key"]
                decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
                assert decoded.shape[:2] == (int(e["height"]), int(e["width"])) == (info["height"], info["width"])
                start = int(e["key_end"])


def test_manifest_lists_shards_and_index_files(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", shard_samples=4)
    m = read_manifest(tmp_path / "out")
    names = [f.name for f in m.files]
    assert names == [f"shard-{i:06d}{ext}" for i in range(4) for ext in (".tar", ".pkidx")] + ["samples.table"]
    assert [f.samples for f in m.files] == [4, 0, 4, 0, 4, 0, 2, 0, 0]
    assert [f.first for f in m.files] == [0, 0, 4, 4, 8, 8, 12, 12, 0]
    for f in m.files:
        assert file_sha256(str(tmp_path / "out" / f.name)) == f.sha256
    assert sorted(os.listdir(tmp_path / "out")) == sorted(names + ["manifest.json"])  # no temp files left
    ds = open_dataset(tmp_path / "out")
    assert ds.shard_sizes == [4, 4, 4, 2] and len(ds.shard_paths) == 4
    assert m.layout["shard_samples"] == 4 and m.layout["shard_bytes"] is None


def test_byte_limit_bounds_every_shard(tiny_folder, tmp_path):
    src, _ = tiny_folder
    limit = 30_000
    convert(src, tmp_path / "out", shard_bytes=limit)
    m = read_manifest(tmp_path / "out")
    shards = [f for f in m.files if f.name.endswith(".tar")]
    assert len(shards) > 2
    for f in shards:
        assert f.bytes <= limit or f.samples == 1
    assert sum(f.samples for f in shards) == 14
    # a limit below one sample: one sample per shard, never an empty shard or an error
    convert(src, tmp_path / "tiny", shard_bytes=1)
    assert open_dataset(tmp_path / "tiny").shard_sizes == [1] * 14


def test_both_limits_and_default(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "both", shard_samples=3, shard_bytes=10**9)
    assert open_dataset(tmp_path / "both").shard_sizes == [3, 3, 3, 3, 2]
    convert(src, tmp_path / "default")
    m = read_manifest(tmp_path / "default")
    assert m.layout["shard_bytes"] == DEFAULT_SHARD_BYTES and open_dataset(tmp_path / "default").shard_sizes == [14]


def test_flipped_payload_byte_is_detected_with_file_sample_offset(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", shard_samples=4)
    ds = open_dataset(tmp_path / "out")
    i = 6  # shard 1, third sample
    path = tmp_path / "out" / "shard-000001.tar"
    _, entries, _ = unpack_index((tmp_path / "out" / "shard-000001.pkidx").read_bytes(), "idx")
    offset, size = int(entries[2]["offset"]), int(entries[2]["size"])
    data = bytearray(path.read_bytes())
    data[offset + size // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError) as err:
        ds[i]
    msg = str(err.value)
    assert "checksum mismatch" in msg and str(path) in msg and f"sample {i}" in msg and f"offset {offset}" in msg
    assert (err.value.path, err.value.sample, err.value.offset) == (str(path), i, offset)
    for j in range(len(ds)):  # every other sample still reads
        if j != i:
            ds[j]
    open_dataset(tmp_path / "out", verify=False).read_record(i)  # no checksum when asked not to
    skip = open_dataset(tmp_path / "out", on_error="skip")
    assert skip[i][1] == ds[i + 1][1] and skip.errors == 1


def test_truncated_shard_is_refused_before_reading(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out")
    path = tmp_path / "out" / "shard-000000.tar"
    ds = open_dataset(tmp_path / "out")
    _, entries, _ = unpack_index((tmp_path / "out" / "shard-000000.pkidx").read_bytes(), "idx")
    cut = int(entries[-1]["offset"]) + 10
    os.truncate(path, cut)
    with pytest.raises(CorruptDataError, match=f"file is {cut} bytes, the manifest says"):
        ds[13]
    forge_manifest_sizes(tmp_path / "out")
    with pytest.raises(CorruptDataError, match="tar index points past the end of its shard"):
        open_dataset(tmp_path / "out")


def test_corrupt_index_is_refused_at_open(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out")
    idx = tmp_path / "out" / "shard-000000.pkidx"
    data = bytearray(idx.read_bytes())
    data[40] ^= 1
    idx.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match="index checksum mismatch.*shard-000000.pkidx"):
        open_dataset(tmp_path / "out")
    idx.write_bytes(b"nonsense")
    with pytest.raises(CorruptDataError, match="file is 8 bytes, the manifest says"):
        open_dataset(tmp_path / "out")
    forge_manifest_sizes(tmp_path / "out")
    with pytest.raises(CorruptDataError, match="shorter than its header"):
        open_dataset(tmp_path / "out")


def test_abort_leaves_no_files(tmp_path):
    w = TarWriter(str(tmp_path), WriterOptions())
    w.add(0, "a/b.png", 1, ProcessedImage("png", b"\x89PNG fake", 1, 1))
    w.abort()
    assert os.listdir(tmp_path) == []
