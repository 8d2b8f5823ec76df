"""Fields besides the image (masks, extra images, boxes): their processing, the PKS3 record, the
sample table's boxes section and the fields manifest (version 4)."""

from __future__ import annotations

import io
import json
import os
import struct

import cv2
import numpy as np
import pytest

from packer.description.manifest import Manifest, read_manifest
from packer.description.record import pack_record, unpack_record
from packer.description.registry import format_names, writer_class
from packer.description.samples import TABLE_NAME, SampleTable, build_table
from packer.errors import CorruptDataError, ImageError, ManifestError
from packer.images.fields import (
    FieldSources,
    check_field_name,
    process_sample,
    read_mask,
    scale_boxes,
)
from packer.images.imageproc import ProcessedField, ProcessOptions, parse_encoding, parse_resize
from tests.helpers import draw, write_fields_dataset


def _png(a: np.ndarray) -> bytes:
    return cv2.imencode(".png", a)[1].tobytes()


def _opts(resize: str = "shorter:20", encode: str = "png") -> ProcessOptions:
    return ProcessOptions(resize=parse_resize(resize), encoding=parse_encoding(encode))


def test_palette_png_mask_reads_its_indices_not_colours():
    image_mod = pytest.importorskip("PIL.Image")
    idx = (np.arange(30 * 40).reshape(30, 40) % 21).astype(np.uint8)
    idx[0, 0] = 255
    im = image_mod.fromarray(idx, mode="P")
    im.putpalette([(i * 37) % 256 for i in range(256 * 3)])  # colours unrelated to the indices
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    assert buf.getvalue()[25] == 3  # a palette PNG
    np.testing.assert_array_equal(read_mask(buf.getvalue()), idx)


def test_sixteen_bit_and_gray_in_rgb_masks_keep_values():
    m16 = (np.arange(20 * 10).reshape(20, 10) * 300).astype(np.uint16)
    got = read_mask(_png(m16))
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, m16)
    m8 = (np.arange(12).reshape(3, 4) * 20).astype(np.uint8)
    np.testing.assert_array_equal(read_mask(_png(np.dstack([m8] * 3))), m8)


def test_colour_mask_is_refused_with_the_reason():
    colour = np.zeros((4, 4, 3), np.uint8)
    colour[0, 0] = (1, 2, 3)
    with pytest.raises(ImageError, match="3 channels of different values"):
        read_mask(_png(colour))


def test_mask_is_resized_nearest_to_the_image_size_and_stored_png():
    rgb = draw(np.random.default_rng(0), 50, 70)
    mask = (np.arange(50 * 70).reshape(50, 70) % 9).astype(np.uint8)
    out = process_sample(_png(rgb), _opts(), FieldSources(mask=_png(mask)))
    (f,) = out.fields
    assert (f.name, f.codec, f.channels, f.depth, f.height, f.width) == ("mask", "png", 1, 8, out.height, out.width)
    want = cv2.resize(mask, (out.width, out.height), interpolation=cv2.INTER_NEAREST)
    np.testing.assert_array_equal(cv2.imdecode(np.frombuffer(f.payload, np.uint8), cv2.IMREAD_UNCHANGED), want)


def test_mask_of_another_size_is_a_skip_naming_both_sizes():
    rgb = draw(np.random.default_rng(0), 50, 70)
    with pytest.raises(ImageError, match="mask is 69x50 but the image is 70x50"):
        process_sample(_png(rgb), _opts(), FieldSources(mask=_png(np.zeros((50, 69), np.uint8))))


def test_extra_images_take_the_image_size_and_boxes_scale_exactly():
    rng = np.random.default_rng(1)
    rgb, other = draw(rng, 50, 70), draw(rng, 25, 35)
    boxes = [[0, 0, 70, 50], [10.5, 5, 20, 45]]
    out = process_sample(_png(rgb), _opts(encode="jpeg:90"), FieldSources(images=(("depth", _png(other)),),
                                                                           boxes=boxes, box_labels=[3, 0]))
    assert (out.width, out.height) == (28, 20)
    (f,) = out.fields
    assert (f.name, f.codec, f.height, f.width) == ("depth", "jpeg", 20, 28)
    np.testing.assert_allclose(out.boxes, np.array(boxes) * ([28 / 70, 20 / 50] * 2), atol=1e-5)
    assert out.box_labels == (3, 0)


@pytest.mark.parametrize("box, why", [([0, 0, 71, 10], "inside the 70x50"), ([5, 0, 4, 10], "ordered"),
                                      ([0, 0, float("nan"), 1], "not finite")])
def test_boxes_outside_or_disordered_are_refused(box, why):
    with pytest.raises(ImageError, match=why):
        scale_boxes([box], (70, 50), (35, 25))


def test_extra_image_names_are_checked():
    assert check_field_name("left_2") == "left_2"
    for bad in ("mask", "2x", "a.b", "x" * 33):
        with pytest.raises(ValueError):
            check_field_name(bad)


def test_pks3_record_round_trips_its_fields_under_one_place_checksum():
    fields = (ProcessedField("mask", "png", b"\x89PNGmask", 4, 5, 1, 16), ProcessedField("left", "jpeg", b"jp", 4, 5))
    rec = pack_record("a/b.jpg", 3, "jpeg", 4, 5, b"payload", seed=1234, fields=fields)
    assert rec[:4] == b"PKS3"
    back = unpack_record(rec, seed=1234)
    assert bytes(back.payload) == b"payload"
    assert [(f.name, f.codec, f.depth, bytes(f.payload)) for f in back.fields] == [
        ("mask", "png", 16, b"\x89PNGmask"), ("left", "jpeg", 8, b"jp")]
    with pytest.raises(CorruptDataError, match="checksum"):
        unpack_record(rec, seed=1235)  # the fields are bound to the sample's place too
    damaged = bytearray(rec)
    damaged[-1] ^= 1
    with pytest.raises(CorruptDataError, match="checksum"):
        unpack_record(bytes(damaged), seed=1234)


def test_table_boxes_section_round_trips_and_is_flagged(tmp_path):
    from packer.description.samples import Label

    path = str(tmp_path / TABLE_NAME)
    rows = [("a", 0, [[1, 2, 3, 4]], [1]), ("b", Label(1, meta={"x": 1}), [], []),
            ("c", 1, [[0, 0, 1, 1], [2, 2, 5, 6.5]], None)]
    build_table(path, "class", iter(rows), boxes=True)
    with open(path, "rb") as f:
        head = f.read(176)
        assert struct.unpack_from("<4sH", head) == (b"PKST", 3) and struct.unpack_from("<I", head, 168) == (1,)
    fd = os.open(path, os.O_RDONLY)
    try:
        t = SampleTable(fd, path, 3)
    finally:
        os.close(fd)
    assert t.has_boxes and list(t.keys) == ["a", "b", "c"] and t.meta(1) == {"x": 1}
    b, lab = t.boxes_of(2)
    np.testing.assert_array_equal(b, np.array([[0, 0, 1, 1], [2, 2, 5, 6.5]], np.float32))
    assert lab.tolist() == [-1, -1]
    assert t.boxes_of(1)[0].shape == (0, 4) and t.boxes_of(0)[1].tolist() == [1]


def test_manifest_fields_only_from_version_3_and_a_version_4_mask_declares_its_dtype(tmp_path):
    base = Manifest("lmdb", 0, ["a"], {}, []).to_json()
    for version, fields in ((2, [{"name": "mask", "kind": "mask"}]), (3, []), (3, [{"name": "mask", "kind": "image"}]),
                            (3, [{"name": "left", "kind": "image"}, {"name": "left", "kind": "image"}]),
                            (4, []), (4, [{"name": "mask", "kind": "mask"}]),
                            (4, [{"name": "mask", "kind": "mask", "dtype": "int32"}])):
        d = {**base, "version": version, "fields": fields, "num_samples": 1,
             "files": [{"name": "data.mdb", "samples": 1, "bytes": 1, "sha256": "0" * 64, "first": 0,
                        "id": "0" * 16}]}
        with pytest.raises(ManifestError):
            Manifest.from_json(d)


def test_a_lmdb_dataset_with_fields_is_version_3_with_pks3_records(tmp_path):
    src = write_fields_dataset(tmp_path / "f.lmdb", "lmdb", n=4)
    m = read_manifest(tmp_path / "f.lmdb")
    assert m.version == 4 and m.field_names == ["mask", "left", "boxes"] and m.mask_dtype == "uint8"
    assert json.loads((tmp_path / "f.lmdb" / "manifest.json").read_text())["fields"][2]["labels"] is True
    from packer.datasets import open_dataset

    with open_dataset(tmp_path / "f.lmdb") as ds:
        for i in range(4):
            rec = ds.read_record(i)
            key, _, _, _, mask, _, boxes, labels = src[i]
            assert rec.key == key and [f.name for f in rec.fields] == ["mask", "left"]
            stored = cv2.imdecode(np.frombuffer(rec.fields[0].payload, np.uint8), cv2.IMREAD_UNCHANGED)
            want = cv2.resize(mask, (rec.width, rec.height), interpolation=cv2.INTER_NEAREST)
            np.testing.assert_array_equal(stored, want)
            b, lab = ds.sample_table().boxes_of(i)
            scale = [rec.width / mask.shape[1], rec.height / mask.shape[0]] * 2
            np.testing.assert_allclose(b, np.array(boxes, np.float64).reshape(-1, 4) * scale, atol=0.5)
            assert lab.tolist() == labels


def _fields_of(ds, i):
    rec = ds.read_record(i)
    mask = cv2.imdecode(np.frombuffer(rec.fields[0].payload, np.uint8), cv2.IMREAD_UNCHANGED)
    return rec, mask, ds.sample_table().boxes_of(i)


#: The formats whose writers store fields.
FIELD_FORMATS = [f for f in format_names() if writer_class(f).writes_fields]


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
def test_format_conversion_copies_fields_and_resizing_keeps_them_aligned(tmp_path, fmt):
    from packer.datasets import open_dataset
    from packer.operations.transcode import convert_dataset, processing_for
    from packer.pipeline.engine import ConvertOptions

    write_fields_dataset(tmp_path / "a.lmdb", "lmdb", n=4, resize="shorter:24")
    convert_dataset(tmp_path / "a.lmdb", tmp_path / "copy.lmdb", "lmdb", fmt)
    half = ConvertOptions(processing=processing_for(None, "shorter:12", "png"))
    convert_dataset(tmp_path / "copy.lmdb", tmp_path / "half.lmdb", fmt, "lmdb", half)
    with open_dataset(tmp_path / "a.lmdb") as a, open_dataset(tmp_path / "copy.lmdb") as c, \
            open_dataset(tmp_path / "half.lmdb") as h:
        assert c.manifest.version == h.manifest.version == 4 and c.manifest.fields == a.manifest.fields
        for i in range(4):
            ra, ma, (ba, la) = _fields_of(a, i)
            rc, mc, (bc, lc) = _fields_of(c, i)
            rh, mh, (bh, lh) = _fields_of(h, i)
            assert bytes(rc.fields[1].payload) == bytes(ra.fields[1].payload)
            np.testing.assert_array_equal(mc, ma)
            np.testing.assert_array_equal(bc, ba)
            assert lc.tolist() == la.tolist() == lh.tolist()
            np.testing.assert_array_equal(mh, cv2.resize(ma, (rh.width, rh.height), interpolation=cv2.INTER_NEAREST))
            assert (rh.fields[1].height, rh.fields[1].width) == (rh.height, rh.width)
            np.testing.assert_allclose(bh, ba * ([rh.width / ra.width, rh.height / ra.height] * 2), atol=1e-4)


def test_fields_are_refused_by_a_writer_without_them_and_by_imagefolder_output(tmp_path):
    from packer.errors import SourceError
    from packer.operations.transcode import convert_dataset

    write_fields_dataset(tmp_path / "a.lmdb", "lmdb", n=2)
    with pytest.raises(SourceError, match=r"fields \(mask, left, boxes\)"):
        convert_dataset(tmp_path / "a.lmdb", tmp_path / "out", "lmdb", "imagefolder")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
def test_merge_keeps_fields_and_renumbers_box_labels(tmp_path, fmt):
    from packer.datasets import open_dataset
    from packer.errors import SourceError
    from packer.operations.merge import merge

    write_fields_dataset(tmp_path / "p0", fmt, n=3, seed=0, classes=("a", "b"))
    write_fields_dataset(tmp_path / "p1", fmt, n=3, seed=1, classes=("b", "a"))
    write_fields_dataset(tmp_path / "same", fmt, n=3, seed=2, classes=("a", "b"))  # copied as it is (shards)
    merge([tmp_path / "p0", tmp_path / "same"], tmp_path / "m0")
    with open_dataset(tmp_path / "m0") as m0, open_dataset(tmp_path / "same") as same:
        for i in range(3):
            np.testing.assert_array_equal(_fields_of(m0, 3 + i)[1], _fields_of(same, i)[1])
            assert bytes(m0.read_record(3 + i).fields[1].payload) == bytes(same.read_record(i).fields[1].payload)
    merge([tmp_path / "p0", tmp_path / "p1"], tmp_path / "m")
    with open_dataset(tmp_path / "m") as m, open_dataset(tmp_path / "p1") as p1:
        assert m.manifest.version == 4 and m.classes == ["a", "b"] and len(m) == 6
        for i in range(3):
            rec, mask, (b, lab) = _fields_of(m, 3 + i)
            rp, mp, (bp, labp) = _fields_of(p1, i)
            np.testing.assert_array_equal(mask, mp)
            np.testing.assert_array_equal(b, bp)
            assert lab.tolist() == [1 - v for v in labp.tolist()]  # "b" was 0 in the part, is 1 merged
    write_fields_dataset(tmp_path / "nomask", fmt, n=2, mask=False)
    with pytest.raises(SourceError, match="have the same fields"):
        merge([tmp_path / "p0", tmp_path / "nomask"], tmp_path / "m2")


def test_info_names_the_fields(tmp_path, capsys):
    from packer.cli import main

    write_fields_dataset(tmp_path / "a.lmdb", "lmdb", n=2)
    assert main(["info", str(tmp_path / "a.lmdb")]) == 0
    out = capsys.readouterr().out
    assert "manifest v4" in out and "fields      mask (mask, uint8), left (image), boxes (boxes)" in out
