"""Fields in the sharded formats (version 3): tar members ``KEY.mask.png`` / ``KEY.NAME.<ext>``
with the version 3 ``.pkidx`` that locates them, boxes in ``KEY.json``; TFRecord's DeepLab mask
and Object Detection API box features. Exact bytes, read-back, damage, and the real webdataset,
tfrecord and (where installed) TensorFlow readers."""

from __future__ import annotations

import glob
import importlib.util
import io
import json
import struct
import subprocess
import sys
import tarfile

import crc32c
import cv2
import numpy as np
import pytest
import webdataset as wds
from tfrecord import example_pb2
from tfrecord.reader import tfrecord_loader
from tfrecord.writer import TFRecordWriter as PackageWriter

from packer.converters.base import WriterOptions
from packer.datasets import open_dataset
from packer.description.manifest import FIELDS_VERSION, Manifest, read_manifest
from packer.errors import CorruptDataError
from packer.images.fields import FieldSources, process_sample
from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
from packer.layouts.tar import read_index
from packer.pipeline.engine import ConvertOptions, write_packed
from tests.formats.test_tar import ustar
from tests.helpers import place_seed_by_spec, write_fields_dataset

SHARDED = [("tar", {}), ("tfrecord", {}), ("tfrecord", {"gzip": True})]


def _decode(payload, flags=cv2.IMREAD_UNCHANGED) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(bytes(payload), np.uint8), flags)


def _nearest(mask: np.ndarray, height: int, width: int) -> np.ndarray:
    return cv2.resize(mask, (width, height), interpolation=cv2.INTER_NEAREST)


def _scaled(boxes, source: np.ndarray, height: int, width: int) -> np.ndarray:
    scale = [width / source.shape[1], height / source.shape[0]] * 2
    return np.array(boxes, np.float64).reshape(-1, 4) * scale


@pytest.mark.parametrize("fmt,writer", SHARDED)
@pytest.mark.parametrize("shard_samples", [2, None])
def test_fields_read_back_across_shards(tmp_path, fmt, writer, shard_samples):
    src = write_fields_dataset(tmp_path / "d", fmt, n=7, shard_samples=shard_samples, **writer)
    m = read_manifest(tmp_path / "d")
    assert m.version == FIELDS_VERSION and m.stored_fields == ["mask", "left"]
    with open_dataset(tmp_path / "d") as ds:
        if shard_samples:
            assert ds.shard_sizes == [2, 2, 2, 1]
        for i, (key, _png, label, _rgb, mask, left, boxes, box_labels) in enumerate(src):
            rec = ds.read_record(i)
            assert (rec.key, rec.label) == (key, label)
            got_mask, got_left = rec.fields
            assert (got_mask.name, got_mask.codec, got_mask.channels, got_mask.depth) == ("mask", "png", 1, 8)
            assert (got_mask.height, got_mask.width) == (rec.height, rec.width)
            stored = _decode(got_mask.payload)
            assert stored.dtype == np.uint8 and stored.shape == (rec.height, rec.width)
            np.testing.assert_array_equal(stored, _nearest(mask, rec.height, rec.width))
            assert (got_left.name, got_left.codec, got_left.channels) == ("left", "png", 3)
            pixels = cv2.cvtColor(_decode(got_left.payload, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
            assert pixels.shape == (rec.height, rec.width, 3)
            want = cv2.resize(left, (rec.width, rec.height), interpolation=cv2.INTER_AREA)
            assert np.abs(pixels.astype(int) - want).max() <= 1  # processed like the image
            assert (got_left.height, got_left.width) == (rec.height, rec.width)
            b, lab = ds.sample_table().boxes_of(i)
            np.testing.assert_allclose(b, _scaled(boxes, mask, rec.height, rec.width), atol=0.5)
            assert lab.tolist() == box_labels


@pytest.mark.parametrize("fmt,writer", SHARDED)
def test_only_the_fields_asked_for_are_read(tmp_path, fmt, writer):
    write_fields_dataset(tmp_path / "d", fmt, n=3, **writer)
    ds = open_dataset(tmp_path / "d")
    ds._ensure_open()
    assert [f.name for f in ds._read(1, fields=("mask",)).fields] == ["mask"]
    assert [f.name for f in ds._read(1, fields=("left",)).fields] == ["left"]
    assert ds._read(1, fields=()).fields == ()
    assert [f.name for f in ds._read(1).fields] == ["mask", "left"]


def test_tar_reads_no_member_it_was_not_asked_for(tmp_path):
    write_fields_dataset(tmp_path / "d", "tar", n=3)
    _, _, _, _, rows = read_index((tmp_path / "d" / "shard-000000.pkidx").read_bytes(), "idx")
    left = rows[1 * 2 + 1]  # sample 1's second field
    path = tmp_path / "d" / "shard-000000.tar"
    data = bytearray(path.read_bytes())
    data[int(left["offset"]) + 40] ^= 0xFF
    path.write_bytes(bytes(data))
    ds = open_dataset(tmp_path / "d", verify=True)
    ds._ensure_open()
    assert [f.name for f in ds._read(1, fields=("mask",)).fields] == ["mask"]  # left is not read
    with pytest.raises(CorruptDataError, match="left member checksum mismatch"):
        ds._read(1)


def test_exact_bytes_of_a_version_3_tar_sample_and_its_index(tmp_path):
    write_fields_dataset(tmp_path / "d", "tar", n=2)
    tar = (tmp_path / "d" / "shard-000000.tar").read_bytes()
    idx = (tmp_path / "d" / "shard-000000.pkidx").read_bytes()
    with tarfile.open(tmp_path / "d" / "shard-000000.tar") as tf:
        names = tf.getnames()
        member = {n: tf.extractfile(n).read() for n in names}
    assert names == [f"000000000{j}.{ext}" for j in range(2) for ext in ("png", "mask.png", "left.png", "cls", "json")]
    metas = [b'{"key":"s000.png","label":0,"height":24,"width":32,"boxes":[],"box_labels":[]}',
             b'{"key":"s001.png","label":1,"height":32,"width":24,"boxes":[[0.8,1.6,12.0,16.0]],"box_labels":[1]}']
    want, entries, fields, pos = b"", b"", b"", 0
    first_image = member["0000000000.png"]
    fid, _ = place_seed_by_spec(0, "s000.png", first_image, 0)
    assert read_manifest(tmp_path / "d").files[0].id == fid
    for j, (label, (h, w)) in enumerate([(0, (24, 32)), (1, (32, 24))]):
        _, seed = place_seed_by_spec(0, "s000.png", first_image, j)
        stem = f"000000000{j}"
        image, mask, left = (member[f"{stem}.{x}"] for x in ("png", "mask.png", "left.png"))
        assert member[f"{stem}.json"] == metas[j] and member[f"{stem}.cls"] == b"%d" % label
        sample = b""
        for name, data in [("png", image), ("mask.png", mask), ("left.png", left), ("cls", b"%d" % label),
                           ("json", metas[j])]:
            sample += ustar(f"{stem}.{name}".encode(), len(data)) + data + bytes(-len(data) % 512)
        entries += struct.pack("<QQqIIIIBB6x", pos + 512, len(image), label, h, w, crc32c.crc32c(image, seed),
                               8 * (j + 1), 2, 3)
        for data, channels in ((mask, 1), (left, 3)):
            fields += struct.pack("<QQIIIBBBx", pos + sample.index(data), len(data), h, w,
                                  crc32c.crc32c(data, seed), 2, channels, 8)
        want += sample
        pos += len(sample)
    assert tar == want + bytes(-(len(want) + 1024) % 10240 + 1024)
    head = struct.pack("<4sHHQQI", b"PKTI", 3, 48, 2, 0, 16)
    body = entries + b"s000.pngs001.png" + struct.pack("<HH", 2, 32) + b"\x04mask\x04left" + fields
    assert idx == head + struct.pack("<I", crc32c.crc32c(body, crc32c.crc32c(head))) + body


def _reference(features: dict) -> bytes:
    """The Example protobuf itself serialises (the tfrecord package's generated classes)."""
    ex = example_pb2.Example()
    for k, v in features.items():
        f = ex.features.feature[k]
        if isinstance(v, bytes):
            f.bytes_list.value.append(v)
        elif isinstance(v, tuple):  # floats, maybe none
            f.float_list.SetInParent()
            f.float_list.value.extend(v)
        else:
            f.int64_list.value.extend(v if isinstance(v, list) else [v])
    return ex.SerializeToString(deterministic=True)


def test_exact_bytes_of_version_3_tfrecord_examples(tmp_path):
    write_fields_dataset(tmp_path / "d", "tfrecord", n=2)
    data = (tmp_path / "d" / "shard-000000.tfrecord").read_bytes()
    records = list(tfrecord_loader(str(tmp_path / "d" / "shard-000000.tfrecord"), None, None))
    pos, first_image = 0, bytes(records[0]["image/encoded"])
    boxes = [(), (0.8 / 24, 1.6 / 32, 12 / 24, 16 / 32)]
    for j, (label, (h, w)) in enumerate([(0, (24, 32)), (1, (32, 24))]):
        r = records[j]
        _, seed = place_seed_by_spec(0, "s000.png", first_image, j)
        example = _reference({
            "image/encoded": bytes(r["image/encoded"]), "image/format": b"png", "image/class/label": label,
            "image/height": h, "image/width": w, "image/channels": 3, "image/filename": f"s00{j}.png".encode(),
            "image/segmentation/class/encoded": bytes(r["image/segmentation/class/encoded"]),
            "image/segmentation/class/format": b"png",
            "image/left/encoded": bytes(r["image/left/encoded"]), "image/left/format": b"png",
            "image/object/bbox/xmin": boxes[j][0:1], "image/object/bbox/ymin": boxes[j][1:2],
            "image/object/bbox/xmax": boxes[j][2:3], "image/object/bbox/ymax": boxes[j][3:4],
            "image/object/class/label": [1] if j else [],
            "packer/place": struct.pack("<I", seed),
        })
        length = struct.pack("<Q", len(example))
        framed = length + PackageWriter.masked_crc(length) + example + PackageWriter.masked_crc(example)
        assert data[pos : pos + len(framed)] == framed
        pos += len(framed)
    assert pos == len(data)
    layout = read_manifest(tmp_path / "d").layout["features"]
    assert "image/segmentation/class/encoded" in layout and "image/object/class/label" in layout


def test_damaged_tar_mask_member_names_file_sample_offset(tmp_path):
    write_fields_dataset(tmp_path / "d", "tar", n=5, shard_samples=2)
    _, _, _, names, rows = read_index((tmp_path / "d" / "shard-000001.pkidx").read_bytes(), "idx")
    assert names == ["mask", "left"]
    offset, size = int(rows[1 * 2]["offset"]), int(rows[1 * 2]["size"])  # sample 3: shard 1's second
    path = tmp_path / "d" / "shard-000001.tar"
    data = bytearray(path.read_bytes())
    data[offset + size // 2] ^= 0x20
    path.write_bytes(bytes(data))
    ds = open_dataset(tmp_path / "d")
    with pytest.raises(CorruptDataError, match="mask member checksum mismatch") as err:
        ds.read_record(3)
    assert (err.value.path, err.value.sample, err.value.offset) == (str(path), 3, offset)
    for j in (0, 1, 2, 4):
        ds.read_record(j)
    assert bytes(open_dataset(tmp_path / "d", verify=False).read_record(3).fields[0].payload) == bytes(
        data[offset : offset + size])


def test_damaged_tfrecord_mask_is_a_record_checksum_error(tmp_path):
    write_fields_dataset(tmp_path / "d", "tfrecord", n=3)
    mask = bytes(open_dataset(tmp_path / "d").read_record(1).fields[0].payload)
    path = tmp_path / "d" / "shard-000000.tfrecord"
    raw = path.read_bytes()
    at = raw.index(mask) + len(mask) // 2
    raw = raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :]
    path.write_bytes(raw)
    with pytest.raises(CorruptDataError, match="record data checksum mismatch") as err:
        open_dataset(tmp_path / "d").read_record(1)
    assert err.value.sample == 1 and err.value.path == str(path)


def _write_16bit(dst, fmt: str, n: int = 2) -> list[np.ndarray]:
    """A dataset whose masks are 16-bit (values above 255); returns the source masks."""
    opts = ProcessOptions(resize=parse_resize("none"), encoding=parse_encoding("png"))
    items, masks = [], []
    for i in range(n):
        rgb = np.full((6, 9, 3), 40 * i, np.uint8)
        mask = (np.arange(54).reshape(6, 9) * 997 + i).astype(np.uint16)
        masks.append(mask)
        fs = FieldSources(cv2.imencode(".png", mask)[1].tobytes())
        items.append((f"m{i}.png", 0, process_sample(cv2.imencode(".png", rgb)[1].tobytes(), opts, fs), None))
    template = Manifest(format=fmt, num_samples=0, classes=["a"], processing=opts.to_json(), files=[],
                        version=FIELDS_VERSION, fields=[{"name": "mask", "kind": "mask"}], source={"kind": "test"})
    write_packed(str(dst), fmt, items, template, ConvertOptions(processing=opts, writer=WriterOptions()))
    return masks


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_sixteen_bit_masks_keep_their_values(tmp_path, fmt):
    masks = _write_16bit(tmp_path / "d", fmt)
    ds = open_dataset(tmp_path / "d")
    for i, mask in enumerate(masks):
        (f,) = ds.read_record(i).fields
        assert (f.depth, f.channels, f.height, f.width) == (16, 1, 6, 9)
        got = _decode(f.payload)
        assert got.dtype == np.uint16
        np.testing.assert_array_equal(got, mask)


# -- other ecosystems read the fields ---------------------------------------------------------
def test_webdataset_reads_masks_extra_images_and_boxes(tmp_path):
    src = write_fields_dataset(tmp_path / "d", "tar", n=5, shard_samples=2)
    urls = sorted(glob.glob(str(tmp_path / "d" / "*.tar")))
    ours = open_dataset(tmp_path / "d", output="numpy")
    pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8")
    seen = 0
    for i, sample in enumerate(pipeline):
        meta = sample["json"]
        _, _, _, _, mask, _, boxes, box_labels = src[i]
        h, w = meta["height"], meta["width"]
        # "rgb8" gives an 8-bit mask as three equal channels holding its values
        assert sample["mask.png"].shape == (h, w, 3) and sample["mask.png"].dtype == np.uint8
        for c in range(3):
            np.testing.assert_array_equal(sample["mask.png"][..., c], _nearest(mask, h, w))
        rec = ours.read_record(i)
        np.testing.assert_array_equal(sample["left.png"], ours.decode(rec.fields[1]))
        np.testing.assert_array_equal(sample["png"], ours[i][0])
        np.testing.assert_allclose(meta["boxes"], _scaled(boxes, mask, h, w).tolist(), atol=0.5)
        assert meta["box_labels"] == box_labels and sample["cls"] == meta["label"]
        seen += 1
    assert seen == 5
    gray = next(iter(wds.WebDataset(urls[:1], shardshuffle=False, empty_check=False).decode("l8")))
    np.testing.assert_array_equal(gray["mask.png"], _nearest(src[0][4], *gray["mask.png"].shape))


def test_webdataset_sixteen_bit_masks(tmp_path):
    masks = _write_16bit(tmp_path / "d", "tar", n=1)
    urls = sorted(glob.glob(str(tmp_path / "d" / "*.tar")))
    rgb8 = next(iter(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8")))
    np.testing.assert_array_equal(rgb8["mask.png"][..., 0], np.minimum(masks[0], 255))  # clipped to 8 bits
    exact = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode(
        wds.handle_extension("mask.png", _decode), "rgb8")
    got = next(iter(exact))["mask.png"]
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, masks[0])


@pytest.mark.parametrize("writer", [{}, {"gzip": True}])
def test_tfrecord_package_reads_the_field_features(tmp_path, writer):
    src = write_fields_dataset(tmp_path / "d", "tfrecord", n=5, shard_samples=3, **writer)
    by_key = {s[0]: s for s in src}
    description = {"image/filename": "byte", "image/height": "int", "image/width": "int",
                   "image/segmentation/class/encoded": "byte",
                   "image/segmentation/class/format": "byte", "image/left/encoded": "byte",
                   "image/object/bbox/xmin": "float", "image/object/bbox/ymin": "float",
                   "image/object/bbox/xmax": "float", "image/object/bbox/ymax": "float",
                   "image/object/class/label": "int"}
    i = 0
    for f in sorted(glob.glob(str(tmp_path / "d" / "*.tfrecord*"))):
        idx = f.replace(".tfrecord.gz", ".idx").replace(".tfrecord", ".idx")
        for r in tfrecord_loader(f, idx, description, compression_type="gzip" if writer else None):
            _, _, _, _, mask, _, boxes, box_labels = by_key[bytes(r["image/filename"]).decode()]
            h, w = int(r["image/height"][0]), int(r["image/width"][0])
            assert bytes(r["image/segmentation/class/format"]) == b"png"
            np.testing.assert_array_equal(_decode(r["image/segmentation/class/encoded"]), _nearest(mask, h, w))
            assert _decode(r["image/left/encoded"], cv2.IMREAD_COLOR).shape == (h, w, 3)
            got = np.stack([r[f"image/object/bbox/{k}"] for k in ("xmin", "ymin", "xmax", "ymax")], 1).reshape(-1, 4)
            want = _scaled(boxes, mask, h, w) / [w, h, w, h]
            np.testing.assert_allclose(got, want, atol=1e-6)
            assert np.all((got >= 0) & (got <= 1))
            assert list(r["image/object/class/label"]) == box_labels
            i += 1
    assert i == 5


_TF_READER = """
import json, sys
import tensorflow as tf
spec = {
    "image/filename": tf.io.FixedLenFeature([], tf.string),
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/segmentation/class/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/segmentation/class/format": tf.io.FixedLenFeature([], tf.string),
    **{f"image/object/bbox/{k}": tf.io.VarLenFeature(tf.float32) for k in ("xmin", "ymin", "xmax", "ymax")},
    "image/object/class/label": tf.io.VarLenFeature(tf.int64),
}
records = tf.data.TFRecordDataset(sys.argv[1:], compression_type="GZIP").map(lambda r: tf.io.parse_single_example(r, spec))
for ex in records:
    dense = {k: tf.sparse.to_dense(v).numpy().tolist() for k, v in ex.items() if isinstance(v, tf.SparseTensor)}
    print(json.dumps({"key": ex["image/filename"].numpy().decode(), "format": ex["image/segmentation/class/format"].numpy().decode(),
                      "size": tf.io.decode_png(ex["image/encoded"]).shape[:2].as_list(),
                      "seg": tf.io.decode_png(ex["image/segmentation/class/encoded"], channels=1).numpy()[..., 0].tolist(),
                      **dense}))
"""


def test_tensorflow_parses_the_segmentation_and_box_features(tmp_path):
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    src = {s[0]: s for s in write_fields_dataset(tmp_path / "d", "tfrecord", n=4, gzip=True, shard_samples=3)}
    files = sorted(glob.glob(str(tmp_path / "d" / "*.tfrecord.gz")))
    # its own process: TensorFlow and the tfrecord package register the same protobuf names
    out = subprocess.run([sys.executable, "-c", _TF_READER, *files], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(r["key"] for r in rows) == sorted(src)
    for r in rows:
        _, _, _, _, mask, _, boxes, box_labels = src[r["key"]]
        h, w = r["size"]
        assert r["format"] == "png"
        np.testing.assert_array_equal(np.array(r["seg"], np.uint8), _nearest(mask, h, w))
        want = _scaled(boxes, mask, h, w) / [w, h, w, h]
        got = np.array([r[f"image/object/bbox/{k}"] for k in ("xmin", "ymin", "xmax", "ymax")]).T.reshape(-1, 4)
        np.testing.assert_allclose(got, want, atol=1e-6)
        assert r["image/object/class/label"] == box_labels


# -- other tools' shards with masks and boxes -------------------------------------------------
def _png(a: np.ndarray) -> bytes:
    return cv2.imencode(".png", a)[1].tobytes()


def test_foreign_webdataset_mask_members_and_json_boxes(tmp_path):
    root = tmp_path / "wds"
    root.mkdir()
    masks, boxes = [], [[[1.0, 2.0, 5.5, 7.0]], [], None]
    with wds.ShardWriter(str(root / "train-%06d.tar"), maxcount=2, verbose=0) as sink:
        for i in range(3):
            mask = (np.arange(8 * 10).reshape(8, 10) % (3 + i)).astype(np.uint8)
            masks.append(mask)
            meta = {"source": f"x{i}"} if boxes[i] is None else {"boxes": boxes[i], "box_labels": [4] * len(boxes[i])}
            sink.write({"__key__": f"k{i}", "png": _png(np.zeros((8, 10, 3), np.uint8)), "mask.png": _png(mask),
                        "cls": i, "json": meta})
    ds = open_dataset(root, format="tar")
    for i in range(3):
        rec = ds.read_record(i)
        (f,) = rec.fields
        assert (f.name, f.codec, f.height, f.width, f.channels, f.depth) == ("mask", "png", 8, 10, 1, 8)
        np.testing.assert_array_equal(_decode(f.payload), masks[i])
        if boxes[i] is None:
            assert rec.boxes is None and rec.box_labels is None
        else:
            assert rec.boxes == tuple(tuple(b) for b in boxes[i]) and rec.box_labels == (4,) * len(boxes[i])
    ds._ensure_open()
    assert ds._read(0, fields=("image",)).fields == () and ds._read(0, fields=("image",)).boxes is None


def test_foreign_tfrecord_segmentation_and_box_features(tmp_path):
    root = tmp_path / "tfr"
    root.mkdir()
    mask = (np.arange(6 * 12).reshape(6, 12) * 40).astype(np.uint16)
    w = PackageWriter(str(root / "part-00000.tfrecord"))
    w.write({"image/encoded": (_png(np.zeros((6, 12, 3), np.uint8)), "byte"), "image/class/label": (2, "int"),
             "image/height": (6, "int"), "image/width": (12, "int"),
             "image/segmentation/class/encoded": (_png(mask), "byte"), "image/segmentation/class/format": (b"png", "byte"),
             "image/object/bbox/xmin": ([0.25], "float"), "image/object/bbox/ymin": ([0.5], "float"),
             "image/object/bbox/xmax": ([0.75], "float"), "image/object/bbox/ymax": ([1.0], "float"),
             "image/object/class/label": ([7], "int"), "source": (b"cam", "byte")})
    w.write({"image/encoded": (_png(np.zeros((4, 4, 3), np.uint8)), "byte"), "image/class/label": (0, "int")})
    w.close()
    ds = open_dataset(root, format="tfrecord")
    rec = ds.read_record(0)
    (f,) = rec.fields
    assert (f.name, f.codec, f.height, f.width, f.channels, f.depth) == ("mask", "png", 6, 12, 1, 16)
    np.testing.assert_array_equal(_decode(f.payload), mask)
    assert rec.boxes == ((3.0, 3.0, 9.0, 6.0),) and rec.box_labels == (7,)
    assert ds.read_record(1).fields == () and ds.read_record(1).boxes is None
    ds._ensure_open()
    assert ds._meta_without_table(0) == {"source": "cam"}  # the fields' features are not metadata


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_raw_extra_images_are_stored_as_the_image_is(tmp_path, fmt):
    src = write_fields_dataset(tmp_path / "d", fmt, n=3, encode="raw")
    ds = open_dataset(tmp_path / "d", output="numpy")
    for i in range(3):
        rec = ds.read_record(i)
        left = rec.fields[1]
        assert (left.codec, left.height, left.width, left.channels) == ("raw", rec.height, rec.width, 3)
        pixels = np.frombuffer(left.payload, np.uint8).reshape(rec.height, rec.width, 3)
        want = cv2.resize(src[i][5], (rec.width, rec.height), interpolation=cv2.INTER_AREA)
        assert np.abs(pixels.astype(int) - want).max() <= 1
    if fmt == "tar":
        with tarfile.open(tmp_path / "d" / "shard-000000.tar") as tf:
            assert tf.getnames()[:3] == ["0000000000.npy", "0000000000.mask.png", "0000000000.left.npy"]
            arr = np.load(io.BytesIO(tf.extractfile("0000000000.left.npy").read()), allow_pickle=False)
        np.testing.assert_array_equal(arr.reshape(-1), np.frombuffer(ds.read_record(0).fields[1].payload, np.uint8))


# -- packer verify names the sample a damaged version 3 shard or index is wrong about ---------
@pytest.mark.parametrize("encode", ["png", "raw"])
def test_verify_locates_damage_in_a_version_3_tar_shard(tmp_path, encode):
    from packer.operations.verify import verify_dataset

    write_fields_dataset(tmp_path / "d", "tar", n=5, encode=encode, shard_samples=3)
    assert verify_dataset(tmp_path / "d").ok
    _, _, _, _, rows = read_index((tmp_path / "d" / "shard-000001.pkidx").read_bytes(), "idx")
    left = rows[1 * 2 + 1]  # sample 4's extra image
    path = tmp_path / "d" / "shard-000001.tar"
    data = bytearray(path.read_bytes())
    data[int(left["offset"]) + int(left["size"]) // 2] ^= 0x08
    path.write_bytes(bytes(data))
    rep = verify_dataset(tmp_path / "d", decode=False)
    located = [p for p in rep.problems if "SHA-256" not in p]
    assert located == [f"{path}: sample 4: left member checksum mismatch at offset {int(left['offset'])}"], rep.problems


def test_verify_locates_damage_in_a_version_3_tar_index(tmp_path):
    from packer.operations.verify import verify_dataset

    write_fields_dataset(tmp_path / "d", "tar", n=5, shard_samples=3)
    path = tmp_path / "d" / "shard-000000.pkidx"
    raw = bytearray(path.read_bytes())
    at = len(raw) - 32 * 2 + 20  # the last sample's (2) second field entry, its CRC
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))
    rep = verify_dataset(tmp_path / "d", decode=False)
    located = [p for p in rep.problems if "SHA-256" not in p]
    assert located == [f"{path}: sample 2: index bytes differ from what the shard implies at offset {at}"], rep.problems


def test_a_version_3_dataset_refuses_an_index_without_its_fields(tmp_path):
    from packer.layouts.tar import pack_index
    from tests.helpers import forge_manifest_sizes

    write_fields_dataset(tmp_path / "d", "tar", n=2)
    path = tmp_path / "d" / "shard-000000.pkidx"
    first, entries, keys, names, rows = read_index(path.read_bytes(), str(path))
    path.write_bytes(pack_index(first, entries, keys))  # a version 2 index: no field section
    forge_manifest_sizes(tmp_path / "d")
    with pytest.raises(CorruptDataError, match=r"lists the fields \[\], the manifest \['mask', 'left'\]"):
        open_dataset(tmp_path / "d")
    path.write_bytes(pack_index(first, entries, keys, fields=(["left", "mask"], rows)))  # another order
    forge_manifest_sizes(tmp_path / "d")
    with pytest.raises(CorruptDataError, match="another dataset"):
        open_dataset(tmp_path / "d")


def test_other_tools_masks_and_boxes_convert_and_a_sample_without_them_is_a_named_skip(tmp_path):
    from packer.operations.transcode import convert_dataset

    root = tmp_path / "wds"
    root.mkdir()
    masks = [(np.arange(8 * 10).reshape(8, 10) % (3 + i)).astype(np.uint8) for i in range(3)]
    with wds.ShardWriter(str(root / "train-%06d.tar"), maxcount=2, verbose=0) as sink:
        for i in range(3):
            meta = {"boxes": [[1.0, 2.0, 5.5, 7.0]], "box_labels": [1]} if i < 2 else {"note": "no boxes"}
            sink.write({"__key__": f"k{i}", "png": _png(np.zeros((8, 10, 3), np.uint8)), "mask.png": _png(masks[i]),
                        "cls": i % 2, "json": meta})
    rep = convert_dataset(str(root), str(tmp_path / "out"), "tar", "lmdb")
    assert [(s.path, s.reason) for s in rep.skipped] == [
        ("k2", "has the fields mask, the dataset's samples mask, boxes")]
    ds = open_dataset(tmp_path / "out")
    assert ds.manifest.version == 4 and ds.manifest.field_names == ["mask", "boxes"] and len(ds) == 2
    for i in range(2):
        np.testing.assert_array_equal(_decode(ds.read_record(i).fields[0].payload), masks[i])
        b, lab = ds.sample_table().boxes_of(i)
        assert b.tolist() == [[1.0, 2.0, 5.5, 7.0]] and lab.tolist() == [1]
