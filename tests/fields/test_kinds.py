"""Field kinds are objects in one table (packer.fields.KINDS): adding one is one class and one row.

A toy kind, a depth map stored as a 16-bit PNG, is added in a test, converted with
``convert_items`` into each format and read back, values unchanged; no format needed a row for
it (a stored kind needs a storage row only where a format keeps a kind under its own names, as
TFRecord keeps the mask under DeepLab's feature names)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

import packer
from packer import fields
from packer.datasets import open_dataset
from packer.description.manifest import FIELD_KINDS, read_manifest
from packer.errors import ImageError
from packer.fields import FieldKind
from packer.images.imageproc import ProcessedField, ProcessOptions, parse_encoding, parse_resize
from packer.pipeline.engine import ConvertOptions
from packer.pipeline.items import convert_items


class Depth(FieldKind):
    """A depth map: one 16-bit channel, resized by nearest neighbour, stored as PNG."""

    name = field_name = "depth"
    channels, codec = 1, "png"

    def process(self, name, data, source, stored, opts):
        d = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if d is None or d.dtype != np.uint16 or d.ndim != 2:
            raise ImageError("depth: not a one-channel 16-bit PNG")
        d = cv2.resize(d, stored, interpolation=cv2.INTER_NEAREST)
        return ProcessedField(name, "png", cv2.imencode(".png", d)[1].tobytes(), stored[1], stored[0], 1, 16)

    def load(self, f, at):
        d = cv2.imdecode(np.frombuffer(f.payload, np.uint8), cv2.IMREAD_UNCHANGED)
        return fields.mask.cut_mask(d, at.crop, at.window)  # cut like a label map: nearest


@pytest.fixture
def depth_kind(monkeypatch):
    monkeypatch.setitem(fields.KINDS, "depth", Depth())  # the one row


def _png(a: np.ndarray) -> bytes:
    return cv2.imencode(".png", a)[1].tobytes()


def test_the_table_is_the_one_list_of_kinds():
    assert FIELD_KINDS == tuple(fields.KINDS) == ("mask", "image", "boxes")
    assert fields.named("mask") is fields.KINDS["mask"] and fields.named("left") is fields.KINDS["image"]
    with pytest.raises(ValueError, match="no field kind 'depth': the kinds are mask, image, boxes"):
        fields.kind("depth")


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "tar", "tfrecord"])
def test_a_toy_field_kind_converts_and_reads_back(depth_kind, tmp_path, fmt):
    rng = np.random.default_rng(3)
    items = []
    for i in range(3):
        depth = rng.integers(0, 65535, (40, 60), dtype=np.uint16)
        image = rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)
        items.append((_png(image), i % 2, None, {"depth": _png(depth)}))
    opts = ConvertOptions(processing=ProcessOptions(resize=parse_resize("shorter:20"), encoding=parse_encoding("png")),
                          workers=1, shuffle=False)
    convert_items(items, tmp_path / "out", fmt, opts, classes=["a", "b"])
    assert read_manifest(str(tmp_path / "out")).fields == [{"name": "depth", "kind": "depth"}]
    with open_dataset(tmp_path / "out", fields=("image", "label", "depth"), output="numpy") as ds:
        for i, (_, _, _, f) in enumerate(items):
            image, label, depth = ds[i]
            source = cv2.imdecode(np.frombuffer(f["depth"], np.uint8), cv2.IMREAD_UNCHANGED)
            want = cv2.resize(source, (30, 20), interpolation=cv2.INTER_NEAREST)
            assert image.shape == (20, 30, 3) and label == i % 2
            assert depth.dtype == np.uint16 and np.array_equal(depth, want)


def test_a_bad_toy_field_is_a_skip_that_names_it(depth_kind, tmp_path):
    image = _png(np.zeros((8, 8, 3), np.uint8))
    items = [(image, 0, None, {"depth": _png(np.zeros((8, 8), np.uint16))}),
             (image, 0, None, {"depth": _png(np.zeros((8, 8), np.uint8))})]
    report = convert_items(items, tmp_path / "out", "lmdb", ConvertOptions(workers=1, shuffle=False), classes=["a"])
    assert [s.reason for s in report.skipped] == ["depth: not a one-channel 16-bit PNG"]


@pytest.mark.parametrize("workers", [1, 2])
def test_pack_takes_a_toy_field_kind(depth_kind, tmp_path, workers):
    """A user's kind, added by its one row, is a field of ``packer.pack``'s samples under its name
    (a path or a file's bytes), also in spawned workers (the row travels with them)."""
    rng = np.random.default_rng(4)
    depths = [rng.integers(0, 65535, (40, 60), dtype=np.uint16) for _ in range(3)]
    (tmp_path / "d1.png").write_bytes(_png(depths[1]))
    samples = [{"image": rng.integers(0, 255, (40, 60, 3), dtype=np.uint8), "label": "ab"[i % 2],
                "depth": str(tmp_path / "d1.png") if i == 1 else _png(d)} for i, d in enumerate(depths)]
    packer.pack(samples, tmp_path / "out", "tar", resize="shorter:20", workers=workers, no_shuffle=True, quiet=True)
    assert read_manifest(str(tmp_path / "out")).fields == [{"name": "depth", "kind": "depth"}]
    with open_dataset(tmp_path / "out", fields=("label", "depth", "meta"), output="numpy") as ds:
        for i, d in enumerate(depths):
            label, depth, meta = ds[i]
            assert label == i % 2 and not meta
            assert np.array_equal(depth, cv2.resize(d, (30, 20), interpolation=cv2.INTER_NEAREST))
    with pytest.raises(TypeError, match=r"input 0: 'depth' must be a path or a file's bytes, not ndarray"):
        packer.pack([{**samples[0], "depth": depths[0]}], tmp_path / "bad", "lmdb", workers=1, quiet=True)
