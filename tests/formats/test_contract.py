"""One contract, every format: the same round trip and the same refusals for each registered format."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packer.datasets import open_dataset
from packer.description.manifest import MANIFEST_NAME, read_manifest
from packer.description.registry import format_names
from packer.errors import UnfinishedDatasetError
from tests.helpers import pack as convert
from tests.helpers import psnr
from tests.helpers import records_by_key as by_key

FORMATS = format_names()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("encode", ["raw", "png"])
def test_lossless_round_trip_is_pixel_exact(tiny_folder, tmp_path, fmt, encode):
    src, pixels = tiny_folder
    convert(src, tmp_path / "out", fmt, encode=encode)
    ds = open_dataset(tmp_path / "out")
    got = by_key(ds)
    assert sorted(got) == sorted(k.replace(os.sep, "/") for k in pixels)
    classes = sorted(os.listdir(src))
    for rel, rgb in pixels.items():
        image, label = got[rel.replace(os.sep, "/")]
        want = rgb if rel.endswith(".png") else None
        if want is None:  # jpeg source: compare with OpenCV's decode of the source file
            import cv2

            want = cv2.cvtColor(cv2.imread(os.path.join(src, rel)), cv2.COLOR_BGR2RGB)
        np.testing.assert_array_equal(image, want, err_msg=rel)
        assert label == classes.index(rel.split(os.sep)[0])


@pytest.mark.parametrize("fmt", FORMATS)
def test_jpeg_round_trip_labels_and_manifest(tiny_folder, tmp_path, fmt):
    src, pixels = tiny_folder
    report = convert(src, tmp_path / "out", fmt, encode="jpeg:90")
    m = read_manifest(tmp_path / "out")
    assert m.format == fmt and m.num_samples == len(pixels) == report.manifest.num_samples
    assert m.classes == ["cat", "dog", "ému bird"]  # sorted folder names = torchvision's class_to_idx
    assert m.processing["encoding"] == "jpeg:90" and m.processing["color"] == "RGB"
    assert sum(f.samples for f in m.files) == len(pixels)
    for f in m.files:
        assert os.path.getsize(tmp_path / "out" / f.name) == f.bytes
    ds = open_dataset(tmp_path / "out")
    assert len(ds) == len(pixels) and ds.class_to_idx == {"cat": 0, "dog": 1, "ému bird": 2}
    got = by_key(ds)
    for rel, rgb in pixels.items():
        image, label = got[rel.replace(os.sep, "/")]
        assert image.shape == rgb.shape
        assert psnr(image, rgb) > 30, rel
        assert label == ds.class_to_idx[rel.split(os.sep)[0]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_outputs_and_transforms(tiny_folder, tmp_path, fmt):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", fmt, encode="png", resize="32x32")
    t = open_dataset(tmp_path / "out")[0]
    n = open_dataset(tmp_path / "out", output="numpy")[0]
    p = open_dataset(tmp_path / "out", output="pil", transform=np.asarray, target_transform=lambda y: y + 100)[0]
    assert t[0].dtype == torch.uint8 and tuple(t[0].shape) == (3, 32, 32)
    assert n[0].shape == (32, 32, 3)
    np.testing.assert_array_equal(t[0].permute(1, 2, 0).numpy(), n[0])
    np.testing.assert_array_equal(p[0], n[0])
    assert p[1] == n[1] + 100


def _loader_labels(ds, ctx):
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=ctx, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    seen = []
    for images, labels in loader:
        assert images.shape[1:] == (3, 24, 24)
        seen.extend(labels.tolist())
    return seen


# spawned workers: one format in the default suite (the others repeat it at a few seconds each)
@pytest.mark.parametrize("ctx, fmt", [(c, f) if c == "fork" or f == "lmdb" else pytest.param(c, f, marks=pytest.mark.slow)
                                      for c in ("fork", "spawn") for f in FORMATS])
def test_dataloader_workers_see_every_sample_once(tiny_folder, tmp_path, fmt, ctx):
    src, pixels = tiny_folder
    convert(src, tmp_path / "out", fmt, encode="jpeg:90", resize="24x24")
    ds = open_dataset(tmp_path / "out")
    ds[0]  # open handles in the parent first: children must not reuse them
    seen = _loader_labels(pickle.loads(pickle.dumps(ds)), ctx)
    want = sorted(ds.read_record(i).label for i in range(len(ds)))
    assert sorted(seen) == want and len(seen) == len(pixels)


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_output_for_one_and_two_workers(tiny_folder, tmp_path, fmt):
    src, _ = tiny_folder
    convert(src, tmp_path / "w1", fmt, workers=1)
    convert(src, tmp_path / "w2", fmt, workers=2)
    m1, m2 = read_manifest(tmp_path / "w1"), read_manifest(tmp_path / "w2")
    assert [f.sha256 for f in m1.files] == [f.sha256 for f in m2.files]
    assert (tmp_path / "w1" / MANIFEST_NAME).read_bytes() == (tmp_path / "w2" / MANIFEST_NAME).read_bytes()


@pytest.mark.parametrize("fmt", FORMATS)
def test_shuffle_is_recorded_and_reproducible(tiny_folder, tmp_path, fmt):
    src, _ = tiny_folder
    convert(src, tmp_path / "a", fmt, seed=3)
    convert(src, tmp_path / "b", fmt, shuffle=False)
    a, b = open_dataset(tmp_path / "a"), open_dataset(tmp_path / "b")
    keys_a = [a.read_record(i).key for i in range(len(a))]
    keys_b = [b.read_record(i).key for i in range(len(b))]
    assert keys_b == sorted(keys_b, key=lambda k: (k.split("/")[0], k))  # folder order
    assert keys_a != keys_b and sorted(keys_a) == sorted(keys_b)
    assert read_manifest(tmp_path / "a").shuffle_seed == 3 and read_manifest(tmp_path / "b").shuffle_seed is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_unfinished_directory_is_refused(tiny_folder, tmp_path, fmt):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", fmt)
    shutil.copytree(tmp_path / "out", tmp_path / "partial")
    os.remove(tmp_path / "partial" / MANIFEST_NAME)
    with pytest.raises(UnfinishedDatasetError, match="did not finish"):
        open_dataset(tmp_path / "partial")


@pytest.mark.parametrize("fmt", [f for f in ("tar", "tfrecord") if f in FORMATS])
def test_sharded_readers_do_one_pread_per_sample(tiny_folder, tmp_path, monkeypatch, fmt):
    src, _ = tiny_folder
    convert(src, tmp_path / "out", fmt, writer={"shard_samples": 4})
    ds = open_dataset(tmp_path / "out")
    calls = []
    real, real_v = os.pread, os.preadv

    def spy(fd, n, offset):
        calls.append((n, offset))
        return real(fd, n, offset)

    def spy_v(fd, buffers, offset):
        calls.append((sum(len(b) for b in buffers), offset))
        return real_v(fd, buffers, offset)

    monkeypatch.setattr(os, "pread", spy)
    monkeypatch.setattr(os, "preadv", spy_v)
    for i in range(len(ds)):
        ds[i]
    assert len(calls) == len(ds)
