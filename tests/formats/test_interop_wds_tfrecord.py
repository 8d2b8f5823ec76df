"""Other ecosystems read what we write, and we read what they write: the real ``webdataset`` and
``tfrecord`` packages against our tar shards and TFRecord files, both directions."""

from __future__ import annotations

import glob
import os
import pickle

import cv2
import numpy as np
import pytest
import torch
import webdataset as wds
from tfrecord.reader import tfrecord_loader
from tfrecord.torch.dataset import TFRecordDataset as TFRecordPackageDataset
from tfrecord.writer import TFRecordWriter as TFRecordPackageWriter
from torch.utils.data import DataLoader

from packer.datasets import open_dataset
from packer.errors import CorruptDataError
from tests.helpers import draw, pack, records_by_key


def convert(src, dst, fmt, encode="jpeg:90", resize="none", **writer):
    return pack(src, dst, fmt, encode, resize, writer=writer)


def encode_rgb(rgb, ext):
    ok, buf = cv2.imencode(ext, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes()


# -- webdataset reads our tar shards ---------------------------------------------------------
@pytest.mark.parametrize("encode,ext", [("jpeg:90", "jpg"), ("png", "png"), ("webp:90", "webp"), ("raw", "npy")])
def test_webdataset_reads_our_shards(tiny_folder, tmp_path, encode, ext):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", "tar", encode=encode, shard_samples=4)
    urls = sorted(glob.glob(str(tmp_path / "out" / "*.tar")))
    assert len(urls) == 4
    pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8").to_tuple(ext, "cls", "json", "__key__")
    ours = records_by_key(open_dataset(tmp_path / "out"))
    seen = []
    for image, label, meta, wkey in pipeline:
        assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
        want_image, want_label = ours[meta["key"]]
        np.testing.assert_array_equal(image, want_image, err_msg=meta["key"])
        assert label == want_label == meta["label"]
        assert (meta["height"], meta["width"]) == image.shape[:2]
        assert "." not in wkey and len(wkey) == 10
        seen.append(meta["key"])
    assert sorted(seen) == sorted(ours)


def test_webdataset_order_is_sample_order(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", "tar", shard_samples=5)
    urls = sorted(glob.glob(str(tmp_path / "out" / "*.tar")))
    keys = [m["key"] for (m,) in wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode().to_tuple("json")]
    ds = open_dataset(tmp_path / "out")
    assert keys == [ds.read_record(i).key for i in range(len(ds))]


# -- the tfrecord package reads our files with our .idx --------------------------------------
DESCRIPTION = {
    "image/encoded": "byte", "image/format": "byte", "image/class/label": "int", "image/height": "int",
    "image/width": "int", "image/channels": "int", "image/filename": "byte",
}


def _check_tfrecord_package(out, ours, gzip=False):
    files = sorted(glob.glob(os.path.join(out, "*.tfrecord.gz" if gzip else "*.tfrecord")))
    assert len(files) > 1
    seen = []
    for f in files:
        idx = f.replace(".tfrecord.gz" if gzip else ".tfrecord", ".idx")
        if gzip:
            records = tfrecord_loader(f, idx, DESCRIPTION, compression_type="gzip")
        else:
            records = TFRecordPackageDataset(f, idx, DESCRIPTION)
        for r in records:
            key = bytes(r["image/filename"]).decode("utf-8")
            rec = ours[key]
            assert bytes(r["image/encoded"]) == bytes(rec.payload)
            assert int(r["image/class/label"][0]) == rec.label
            assert (int(r["image/height"][0]), int(r["image/width"][0])) == (rec.height, rec.width)
            assert int(r["image/channels"][0]) == 3
            assert bytes(r["image/format"]).decode() == rec.codec
            seen.append(key)
    assert sorted(seen) == sorted(ours)


@pytest.mark.parametrize("encode", ["jpeg:90", "png", "raw"])
def test_tfrecord_package_reads_our_files(tiny_folder, tmp_path, encode):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", "tfrecord", encode=encode, shard_samples=5)
    ds = open_dataset(tmp_path / "out")
    ours = {rec.key: rec for rec in (ds.read_record(i) for i in range(len(ds)))}
    _check_tfrecord_package(str(tmp_path / "out"), ours)


def test_tfrecord_package_reads_our_gzip_files_with_idx(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", "tfrecord", shard_samples=5, gzip=True)
    ds = open_dataset(tmp_path / "out")
    ours = {rec.key: rec for rec in (ds.read_record(i) for i in range(len(ds)))}
    _check_tfrecord_package(str(tmp_path / "out"), ours, gzip=True)


def test_tfrecord_package_dataloader_sharding_with_our_idx(tiny_folder, tmp_path):
    """With workers the tfrecord package splits a file by our index offsets."""
    src, pixels = tiny_folder
    convert(src, tmp_path / "out", "tfrecord")
    (f,) = glob.glob(str(tmp_path / "out" / "*.tfrecord"))
    ds = TFRecordPackageDataset(f, f.replace(".tfrecord", ".idx"), {"image/filename": "byte"})
    keys = [bytes(k).decode() for b in DataLoader(ds, batch_size=None, num_workers=2) for k in [b["image/filename"]]]
    assert sorted(keys) == sorted(k.replace(os.sep, "/") for k in pixels)


# -- we read what webdataset's ShardWriter writes --------------------------------------------
def _write_wds(root, n=11, maxcount=4, ext="jpg"):
    rng = np.random.default_rng(5)
    os.makedirs(root, exist_ok=True)
    written = {}
    with wds.ShardWriter(os.path.join(root, "train-%06d.tar"), maxcount=maxcount, verbose=0) as sink:
        for i in range(n):
            rgb = draw(rng, 20 + i, 30)
            payload = encode_rgb(rgb, "." + ext)
            label = (i * 7) % 5
            key = f"sample{i:04d}"
            sink.write({"__key__": key, ext: payload, "cls": label, "txt": "ignored"})
            written[key] = (payload, label)
    return written


@pytest.mark.parametrize("ext", ["jpg", "png"])
def test_open_foreign_webdataset_shards(tmp_path, ext):
    root = str(tmp_path / "wds")
    written = _write_wds(root, ext=ext)
    ds = open_dataset(root, format="tar", output="numpy")
    assert len(ds) == len(written)
    assert ds.shard_sizes == [4, 4, 3]
    assert ds.classes == ["0", "1", "2", "3", "4"] and ds.manifest.format == "tar"
    keys = [ds.read_record(i).key for i in range(len(ds))]
    assert keys == sorted(written)  # shard order, then member order
    for i, key in enumerate(keys):
        payload, label = written[key]
        image, got_label = ds[i]
        assert got_label == label
        want = cv2.cvtColor(cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        np.testing.assert_array_equal(image, want)
        assert bytes(ds.read_record(i).payload) == payload
    # it pickles with its index (no rescan in workers) and works in DataLoader workers
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.read_record(3).key == keys[3]
    loader = DataLoader(open_dataset(root, format="tar", transform=lambda t: t.float().mean()),
                        batch_size=3, num_workers=2)
    labels = torch.cat([y for _, y in loader]).tolist()
    assert sorted(labels) == sorted(v[1] for v in written.values())


def test_open_foreign_single_tar_file(tmp_path):
    root = str(tmp_path / "wds")
    written = _write_wds(root, n=3, maxcount=10)
    ds = open_dataset(os.path.join(root, "train-000000.tar"), format="tar")
    assert len(ds) == 3 and ds[2][1] == written["sample0002"][1]


def test_open_foreign_tar_without_labels_is_refused(tmp_path):
    root = tmp_path / "wds"
    root.mkdir()
    with wds.TarWriter(str(root / "a.tar")) as sink:
        sink.write({"__key__": "x", "jpg": encode_rgb(np.zeros((4, 4, 3), np.uint8), ".jpg")})
    with pytest.raises(CorruptDataError, match=r"no \.cls label member.*a\.tar"):
        open_dataset(root, format="tar")


def test_open_foreign_refuses_wrong_format_and_missing(tmp_path, tiny_folder):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", "tar")
    with pytest.raises(ValueError, match="holds a 'tar' dataset, not 'tfrecord'"):
        open_dataset(tmp_path / "out", format="tfrecord")
    assert open_dataset(tmp_path / "out", format="tar").manifest.source["kind"] == "imagefolder"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        open_dataset(tmp_path / "empty", format="tar")
    with pytest.raises(FileNotFoundError):
        open_dataset(tmp_path / "empty", format="tfrecord")


# -- we read what the tfrecord package writes ------------------------------------------------
def _write_tfrecords(root, files=2, per_file=5):
    rng = np.random.default_rng(9)
    os.makedirs(root, exist_ok=True)
    written = []
    for f in range(files):
        w = TFRecordPackageWriter(os.path.join(root, f"part-{f:05d}.tfrecord"))
        for i in range(per_file):
            rgb = draw(rng, 16 + i, 24)
            payload = encode_rgb(rgb, ".png")
            label = (f * per_file + i) % 3
            w.write({"image/encoded": (payload, "byte"), "image/class/label": (label, "int")})
            written.append((payload, label, rgb))
        w.close()
    return written


def test_open_foreign_tfrecord_files(tmp_path):
    root = str(tmp_path / "tfr")
    written = _write_tfrecords(root)
    ds = open_dataset(root, format="tfrecord", output="numpy")
    assert len(ds) == len(written) and ds.shard_sizes == [5, 5]
    assert ds.classes == ["0", "1", "2"]
    for i, (_, label, rgb) in enumerate(written):
        image, got = ds[i]
        assert got == label
        np.testing.assert_array_equal(image, rgb)
        assert ds.read_record(i).key == f"part-{i // 5:05d}.tfrecord:{i}"
    clone = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(clone[7][0], written[7][2])
    one = open_dataset(os.path.join(root, "part-00001.tfrecord"), format="tfrecord")
    assert len(one) == 5 and one[0][1] == written[5][1]


def test_open_foreign_tfrecord_with_crafted_length_is_refused(tmp_path):
    root = tmp_path / "tfr"
    _write_tfrecords(str(root), files=1, per_file=3)
    path = root / "part-00000.tfrecord"
    data = bytearray(path.read_bytes())
    first = int.from_bytes(data[:8], "little")
    second = 16 + first  # offset of the second record
    from packer.layouts.tfrecord import masked_crc32c

    huge = (1 << 60).to_bytes(8, "little")
    data[second : second + 12] = huge + masked_crc32c(huge).to_bytes(4, "little")  # a valid CRC, a lie
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match=rf"runs past the end.*part-00000\.tfrecord.*sample 1.*offset {second}"):
        open_dataset(root, format="tfrecord")


def test_open_foreign_gzip_tfrecord_is_refused(tmp_path):
    import gzip

    root = tmp_path / "tfr"
    _write_tfrecords(str(root), files=1, per_file=2)
    raw = (root / "part-00000.tfrecord").read_bytes()
    (root / "part-00000.tfrecord").write_bytes(gzip.compress(raw))
    with pytest.raises(ValueError, match="gzip"):
        open_dataset(root, format="tfrecord")
