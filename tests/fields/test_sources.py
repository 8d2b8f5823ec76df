"""Sources of fields besides the image: items with a mask, extra images and boxes
(``convert_items``), list columns (``packer convert list``), ``packer.pack`` and COCO files."""

from __future__ import annotations

import csv
import io
import json
import os

import cv2
import numpy as np
import pytest

from packer.cli import main
from packer.converters.base import WriterOptions
from packer.datasets import open_dataset
from packer.description.manifest import read_manifest
from packer.description.registry import writer_class
from packer.errors import SourceError
from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
from packer.pipeline.engine import ConvertOptions
from packer.pipeline.items import convert_items
from packer.sources.listsource import convert_list, read_list
from tests.conversion.test_resume import interrupt_after
from tests.helpers import fields_sources, run_bounded


def _png(a: np.ndarray) -> bytes:
    return cv2.imencode(".png", a if a.ndim == 2 else cv2.cvtColor(a, cv2.COLOR_RGB2BGR))[1].tobytes()


def _palette_png(idx: np.ndarray) -> bytes:
    from PIL import Image

    im = Image.fromarray(idx, mode="P")
    im.putpalette([(i * 53) % 256 for i in range(256 * 3)])  # colours unrelated to the indices
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def _options(**kw) -> ConvertOptions:
    return ConvertOptions(processing=ProcessOptions(resize=parse_resize("shorter:24"), encoding=parse_encoding("png")),
                          workers=1, shuffle=False, **kw)


@pytest.fixture
def src(tmp_path):
    """Image, mask (sample 1: a palette PNG), extra image ``left`` files and a JSON Lines list."""
    root = tmp_path / "src"
    root.mkdir()
    samples = fields_sources(6)
    rows = []
    for i, (key, data, label, _rgb, mask, left, boxes, box_labels) in enumerate(samples):
        (root / key).write_bytes(data)
        (root / f"m{i}.png").write_bytes(_palette_png(mask) if i == 1 else _png(mask))
        (root / f"l{i}.png").write_bytes(_png(left))
        rows.append({"path": key, "label": ["a", "b"][label], "mask": f"m{i}.png", "left": f"l{i}.png",
                     "boxes": boxes, "classes": [["a", "b"][x] for x in box_labels], "note": i})
    (root / "list.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, samples, rows


def _check(dst, samples, order=None):
    """Every stored mask is the nearest resize of its source bit for bit, boxes the scaled source
    boxes within 0.5 px, box labels the classes."""
    by_key = {s[0]: s for s in samples}
    with open_dataset(dst) as ds:
        assert len(ds) == len(order if order is not None else samples)
        table = ds.sample_table()
        for i in range(len(ds)):
            rec = ds.read_record(i)
            key, _, _, _, mask, _, boxes, labels = by_key[rec.key]
            assert [f.name for f in rec.fields] == ["mask", "left"]
            stored = cv2.imdecode(np.frombuffer(rec.fields[0].payload, np.uint8), cv2.IMREAD_UNCHANGED)
            np.testing.assert_array_equal(stored, cv2.resize(mask, (rec.width, rec.height),
                                                             interpolation=cv2.INTER_NEAREST))
            assert (rec.fields[1].width, rec.fields[1].height) == (rec.width, rec.height)
            b, lab = table.boxes_of(i)
            scale = [rec.width / mask.shape[1], rec.height / mask.shape[0]] * 2
            np.testing.assert_allclose(b, np.array(boxes, np.float64).reshape(-1, 4) * scale, atol=0.5)
            assert lab.tolist() == labels


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "tar", "tfrecord"])
def test_jsonl_list_with_masks_images_and_boxes_converts(src, tmp_path, fmt):
    if not writer_class(fmt).writes_fields:
        pytest.skip(f"the {fmt} writer does not store fields yet")
    root, samples, rows = src
    report = convert_list(root / "list.jsonl", tmp_path / "out", fmt, _options(), mask_column="mask",
                          image_columns=["left"], boxes_column="boxes", box_labels_column="classes")
    assert report.skipped == []
    m = read_manifest(tmp_path / "out")
    assert m.version == 4 and m.field_names == ["mask", "left", "boxes"] and m.fields[2]["labels"] is True
    assert m.classes == ["a", "b"]
    _check(tmp_path / "out", samples)
    with open_dataset(tmp_path / "out") as ds:  # the field columns are not metadata
        assert ds.sample_table().meta(0) == {"note": 0}
    two = ConvertOptions(processing=_options().processing, workers=2, shuffle=False)  # fields cross to workers
    convert_list(root / "list.jsonl", tmp_path / "two", fmt, two, mask_column="mask", image_columns=["left"],
                 boxes_column="boxes", box_labels_column="classes")
    assert sorted(os.listdir(tmp_path / "out")) == sorted(os.listdir(tmp_path / "two"))
    for name in os.listdir(tmp_path / "out"):  # the same bytes whatever the number of workers
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    zoo = [{**r, "classes": ["zebra"] * len(r["boxes"])} for r in rows]
    (root / "zoo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in zoo))
    with pytest.raises(SourceError, match=r"zoo.jsonl:2: class 'zebra' is not in the pinned class list"):
        convert_list(root / "zoo.jsonl", tmp_path / "pinned", "lmdb", _options(), classes=["a", "b"],
                     boxes_column="boxes", box_labels_column="classes")


def test_csv_list_through_the_command_line(src, tmp_path):
    root, samples, rows = src
    with open(root / "list.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "mask", "left", "boxes", "classes"])
        for r in rows:
            w.writerow([r["path"], r["label"], r["mask"], r["left"], json.dumps(r["boxes"]), json.dumps(r["classes"])])
    assert main(["convert", "list", "lmdb", str(root / "list.csv"), str(tmp_path / "out"), "--resize", "shorter:24",
                 "--encode", "png", "--workers", "1", "--no-shuffle", "-q", "--mask-column", "mask",
                 "--image-column", "left", "--boxes-column", "boxes", "--box-labels-column", "classes"]) == 0
    _check(tmp_path / "out", samples)
    import packer

    packer.convert("list", "lmdb", root / "list.csv", tmp_path / "api", resize="shorter:24", encode="png", workers=1,
                   no_shuffle=True, quiet=True, mask_column="mask", image_column="left", boxes_column="boxes",
                   box_labels_column="classes")  # the flags as keywords, one extra image as a plain string
    assert (tmp_path / "api" / "data.mdb").read_bytes() == (tmp_path / "out" / "data.mdb").read_bytes()
    with pytest.raises(ValueError, match="mask_column applies to a list source only"):
        packer.convert("imagefolder", "lmdb", root, tmp_path / "x", mask_column="mask")


def test_list_field_paths_outside_the_root_are_refused(src):
    root, _, rows = src
    rows[2]["mask"] = "../elsewhere.png"
    (root / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SourceError, match=r"outside .*line 3: '../elsewhere.png'"):
        read_list(root / "bad.jsonl", mask_column="mask")
    with pytest.raises(SourceError, match="image column 'label'"):
        read_list(root / "list.jsonl", label_column="note", image_columns=["label"])
    with pytest.raises(SourceError, match="no field column 'nope'"):
        read_list(root / "list.jsonl", mask_column="nope")


def test_list_bad_boxes_name_the_line(src):
    root, _, rows = src
    rows[3]["boxes"] = [[1, 2, 3]]
    (root / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SourceError, match=r"bad.jsonl:4: column 'boxes': box 0 \[1, 2, 3\] is not"):
        read_list(root / "bad.jsonl", boxes_column="boxes")
    rows[3]["boxes"], rows[3]["classes"] = [[1, 2, 3, 4]], []
    (root / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SourceError, match="bad.jsonl:4: 0 box labels for 1 boxes"):
        read_list(root / "bad.jsonl", boxes_column="boxes", box_labels_column="classes")


def _items(root, rows):
    return [(str(root / r["path"]), r["label"], None,
             {"mask": str(root / r["mask"]), "images": {"left": str(root / r["left"])}, "boxes": r["boxes"],
              "box_labels": r["classes"]}) for r in rows]


def test_skips_name_the_field_file_and_the_reason(src, tmp_path):
    root, samples, rows = src
    (root / "m0.png").write_bytes(_png(np.zeros((5, 7), np.uint8)))  # another size than its image
    rows[2]["boxes"], rows[2]["classes"] = [[0, 0, 1000, 5]], ["a"]  # outside the image
    (root / "l4.png").unlink()
    report = convert_items(_items(root, rows), tmp_path / "out", "lmdb", _options(), root=root)
    reasons = {s.path: s.reason for s in report.skipped}
    assert set(reasons) == {"s000.png", "s002.png", "s004.png"}
    assert "mask is 7x5 but the image is 64x48" in reasons["s000.png"] and str(root / "m0.png") in reasons["s000.png"]
    assert "box 0 [0, 0, 1000, 5] is not an ordered box inside the 57x33 image" in reasons["s002.png"]
    assert reasons["s004.png"].startswith(f"image 'left' file {root / 'l4.png'}: cannot read")
    _check(tmp_path / "out", samples, order=[1, 3, 5])


def test_items_must_all_have_the_same_fields(src, tmp_path):
    root, _, rows = src
    items = _items(root, rows)
    items[3] = items[3][:3] + ({"mask": items[3][3]["mask"]},)
    with pytest.raises(ValueError, match="item 3 has mask, item 0 mask, image 'left', boxes, box_labels"):
        convert_items(items, tmp_path / "out", "lmdb", _options(), root=root)
    items[3] = items[3][:3]
    with pytest.raises(ValueError, match="item 3 has no fields"):
        convert_items(items, tmp_path / "out", "lmdb", _options(), root=root)
    with pytest.raises(ValueError, match="item 0: unknown field 'depth'"):
        convert_items([(items[0][0], "a", None, {"depth": "x.png"})], tmp_path / "out", "lmdb", _options())
    with pytest.raises(ValueError, match="item 0: 1 box labels for 2 boxes"):
        convert_items([(items[0][0], "a", None, {"boxes": [[0, 0, 1, 1]] * 2, "box_labels": ["a"]})],
                      tmp_path / "out", "lmdb", _options())


def test_box_label_names_join_the_inferred_classes(src, tmp_path):
    root, _, rows = src
    items = [(str(root / r["path"]), r["label"], None, {"boxes": [[0, 0, 2, 2]], "box_labels": ["zebra"]})
             for r in rows]
    report = convert_items(items, tmp_path / "out", "lmdb", _options(), root=root)
    assert report.manifest.classes == ["a", "b", "zebra"]
    with open_dataset(tmp_path / "out") as ds:
        assert ds.sample_table().boxes_of(0)[1].tolist() == [2]
        assert report.manifest.version == 4 and report.manifest.field_names == ["boxes"]


def test_items_with_no_fields_are_plain_items(src, tmp_path):
    root, _, rows = src
    plain = [(str(root / r["path"]), r["label"], None) for r in rows]
    a = convert_items(plain, tmp_path / "a", "lmdb", _options(), root=root)
    convert_items([x + (None if i % 2 else {},) for i, x in enumerate(plain)], tmp_path / "b", "lmdb", _options(),
                  root=root)
    assert a.manifest.version == 2 and a.manifest.fields == []
    for name in ("manifest.json", "data.mdb"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_resume_continues_with_fields_and_notices_a_changed_mask(src, tmp_path, monkeypatch):
    root, samples, rows = src
    items = _items(root, rows)
    opts = _options(writer=WriterOptions(checkpoint_samples=2))
    ref = convert_items(items, tmp_path / "ref", "lmdb", opts, root=root)
    interrupt_after(monkeypatch, "lmdb", 4)
    with pytest.raises(KeyboardInterrupt):
        convert_items(items, tmp_path / "out", "lmdb", opts, root=root)
    monkeypatch.undo()
    again = _options(writer=WriterOptions(checkpoint_samples=2), resume=True)
    report = convert_items(items, tmp_path / "out", "lmdb", again, root=root)
    assert report.resumed is not None and report.resumed["written"] >= 2
    assert report.manifest.source["fingerprint"] == ref.manifest.source["fingerprint"]
    _check(tmp_path / "out", samples)
    assert convert_items(items, tmp_path / "out", "lmdb", again, root=root).already_complete
    os.utime(root / "m3.png", ns=(1, 1))  # the mask changed: not the finished conversion any more
    with pytest.raises(FileExistsError):
        convert_items(items, tmp_path / "out", "lmdb", again, root=root)


def _sample_with_arrays(i: int) -> dict:
    rng = np.random.default_rng(i)
    h, w = 30 + 4 * i, 40
    mask = (np.arange(h * w).reshape(h, w) * 7 % 1000).astype(np.uint16)  # 16-bit label values
    return {"image": rng.integers(0, 256, (h, w, 3), np.uint8), "label": i % 2, "mask": mask,
            "left": rng.integers(0, 256, (h, w, 3), np.uint8), "boxes": np.array([[0, 0, w, h], [2.5, 3, 10, 12.5]]),
            "box_labels": np.array([1, 0]), "score": i}


def test_pack_stores_array_masks_extra_images_and_boxes(tmp_path):
    import packer

    report = packer.pack(range(4), tmp_path / "out", "lmdb", fn=_sample_with_arrays, images=("left",), workers=1,
                         resize="shorter:20", encode="png", no_shuffle=True, quiet=True)
    assert report.manifest.field_names == ["mask", "left", "boxes"] and report.manifest.classes == ["0", "1"]
    with open_dataset(tmp_path / "out") as ds:
        for i in range(4):
            want, rec = _sample_with_arrays(i), ds.read_record(i)
            stored = cv2.imdecode(np.frombuffer(rec.fields[0].payload, np.uint8), cv2.IMREAD_UNCHANGED)
            assert stored.dtype == np.uint16
            np.testing.assert_array_equal(stored, cv2.resize(want["mask"], (rec.width, rec.height),
                                                             interpolation=cv2.INTER_NEAREST))
            left = cv2.imdecode(np.frombuffer(rec.fields[1].payload, np.uint8), cv2.IMREAD_COLOR)
            assert left.shape == (rec.height, rec.width, 3)
            b, lab = ds.sample_table().boxes_of(i)
            scale = np.array([rec.width / 40, rec.height / want["mask"].shape[0]] * 2)
            np.testing.assert_allclose(b, want["boxes"] * scale, atol=0.5)
            assert lab.tolist() == [1, 0] and ds.sample_table().meta(i) == {"score": i}


def test_pack_refuses_samples_with_other_fields_naming_the_input(tmp_path):
    import packer

    first = _sample_with_arrays(0)
    second = {k: v for k, v in _sample_with_arrays(1).items() if k != "mask"}
    with pytest.raises(ValueError, match=r"input 1: the sample has the fields \['box_labels', 'boxes', 'left'\], "
                                         r"input 0 \['box_labels', 'boxes', 'mask', 'left'\]"):
        packer.pack([first, second], tmp_path / "out", "lmdb", images=("left",), workers=1, quiet=True)
    with pytest.raises(ValueError, match="input 0: the sample has no 'right'"):
        packer.pack([first], tmp_path / "out", "lmdb", images=("right",), workers=1, quiet=True)
    with pytest.raises(ValueError, match="images: extra image name 'mask' is reserved"):
        packer.pack([first], tmp_path / "out", "lmdb", images=("mask",), workers=1, quiet=True)
    with pytest.raises(ValueError, match=r"input 0: box 0 \[1, 2\] is not four numbers"):
        packer.pack([{**first, "boxes": [[1, 2]], "box_labels": None}], tmp_path / "out", "lmdb", workers=1,
                    quiet=True)
    assert not os.path.exists(tmp_path / "out")


def _rle_string(counts: list[int]) -> str:
    """COCO's compressed RLE string of ``counts`` (the inverse of packer's reader, written here)."""
    out = []
    for i, x in enumerate(counts):
        if i > 2:
            x -= counts[i - 2]
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = x != -1 if c & 0x10 else x != 0
            out.append(chr((c | 0x20 if more else c) + 48))
    return "".join(out)


def _runs(binary: np.ndarray) -> list[int]:
    """Run lengths of a binary mask, column by column, zeros first (COCO's RLE order)."""
    flat = binary.T.reshape(-1)
    runs, value, n = [], 0, 0
    for v in flat:
        if v != value:
            runs.append(n)
            value, n = v, 0
        n += 1
    return runs + [n]


def test_rle_strings_decode_to_their_runs():
    from packer.sources.coco import decode_rle, rle_counts

    rng = np.random.default_rng(3)
    for _ in range(50):
        counts = rng.integers(0, 5000, rng.integers(1, 30)).tolist()
        assert rle_counts(_rle_string(counts)) == counts
    blob = np.zeros((7, 9), np.uint8)
    blob[2:5, 3:8] = 1
    np.testing.assert_array_equal(decode_rle(_runs(blob), 7, 9), blob)


@pytest.fixture
def coco(tmp_path):
    """Three images (one without annotations), categories listed out of id order, polygons, a
    crowd region as a compressed RLE and one as an uncompressed RLE; the masks they draw."""
    root = tmp_path / "coco"
    (root / "img").mkdir(parents=True)
    rng = np.random.default_rng(0)
    sizes = {1: (30, 40), 2: (36, 24), 3: (20, 20)}
    for i, (h, w) in sizes.items():
        (root / "img" / f"{i:03d}.png").write_bytes(_png(rng.integers(0, 256, (h, w, 3), np.uint8)))
    crowd = np.zeros((30, 40), np.uint8)
    crowd[20:28, 2:12] = 1
    crowd2 = np.zeros((36, 24), np.uint8)
    crowd2[1:4, 1:20] = 1

    def rect(x0, y0, x1, y1):
        return [[x0, y0, x1, y0, x1, y1, x0, y1]]

    anns = [
        {"id": 10, "image_id": 1, "category_id": 3, "bbox": [5, 4, 10, 8], "iscrowd": 0, "segmentation": rect(5, 4, 15, 12)},
        {"id": 11, "image_id": 1, "category_id": 1, "bbox": [20, 10, 20.4, 12], "iscrowd": 0,  # to 40.4: clipped
         "segmentation": rect(20, 10, 35, 22)},
        {"id": 12, "image_id": 1, "category_id": 2, "bbox": [2, 20, 10, 8], "iscrowd": 1,
         "segmentation": {"counts": _rle_string(_runs(crowd)), "size": [30, 40]}},
        {"id": 13, "image_id": 2, "category_id": 1, "bbox": [1, 1, 19, 3], "iscrowd": 1,
         "segmentation": {"counts": _runs(crowd2), "size": [36, 24]}},
    ]
    doc = {"images": [{"id": i, "file_name": f"img/{i:03d}.png", "height": h, "width": w,
                       "coco_url": f"http://example.org/{i}.png"} for i, (h, w) in sizes.items()],
           "annotations": anns,
           "categories": [{"id": 3, "name": "car"}, {"id": 1, "name": "person"}, {"id": 2, "name": "dog"}]}
    (root / "instances.json").write_text(json.dumps(doc))
    semantic = {i: np.zeros(s, np.uint8) for i, s in sizes.items()}
    instance = {i: np.zeros(s, np.uint8) for i, s in sizes.items()}
    for k, (img, cat, region) in enumerate([(1, 3, (slice(4, 13), slice(5, 16))), (1, 1, (slice(10, 23), slice(20, 36))),
                                            (1, 2, crowd.astype(bool))]):
        semantic[img][region] = {1: 1, 2: 2, 3: 3}[cat]  # person, dog, car: indices 0, 1, 2 (+1)
        instance[img][region] = k + 1
    semantic[2][crowd2.astype(bool)], instance[2][crowd2.astype(bool)] = 1, 1
    return root, doc, semantic, instance


@pytest.mark.parametrize("masks", ["semantic", "instance"])
def test_coco_file_converts_with_boxes_categories_crowd_and_masks(coco, tmp_path, masks):
    root, doc, semantic, instance = coco
    assert main(["convert", "coco", "lmdb", str(root / "instances.json"), str(tmp_path / "out"), "--images",
                 str(root), "--masks", masks, "--resize", "shorter:15", "--encode", "png", "--workers", "2", "-q"]) == 0
    m = read_manifest(tmp_path / "out")
    assert m.classes == ["person", "dog", "car"] and m.label_kind == "multi"
    assert m.field_names == ["mask", "boxes"] and m.num_samples == 3
    want_masks = semantic if masks == "semantic" else instance
    anns = {im["id"]: [a for a in doc["annotations"] if a["image_id"] == im["id"]] for im in doc["images"]}
    with open_dataset(tmp_path / "out") as ds:
        table = ds.sample_table()
        for i in range(3):
            rec, meta = ds.read_record(i), table.meta(i)
            image_id = meta["id"]
            assert rec.key == meta["file_name"] == f"img/{image_id:03d}.png"
            assert meta["coco_url"] == f"http://example.org/{image_id}.png"
            assert meta["iscrowd"] == [a["iscrowd"] for a in anns[image_id]]
            h, w = want_masks[image_id].shape
            stored = cv2.imdecode(np.frombuffer(rec.fields[0].payload, np.uint8), cv2.IMREAD_UNCHANGED)
            np.testing.assert_array_equal(stored, cv2.resize(want_masks[image_id], (rec.width, rec.height),
                                                             interpolation=cv2.INTER_NEAREST))
            b, lab = table.boxes_of(i)
            want = [[x, y, min(x + bw, w), y + bh] for x, y, bw, bh in (a["bbox"] for a in anns[image_id])]
            scale = np.array([rec.width / w, rec.height / h] * 2)
            np.testing.assert_allclose(b, np.array(want, np.float64).reshape(-1, 4) * scale, atol=0.5)
            cats = [{1: 0, 2: 1, 3: 2}[a["category_id"]] for a in anns[image_id]]
            assert lab.tolist() == cats and table.labels_of(i) == sorted(set(cats))


def test_coco_problems_name_the_entry_or_skip_the_image(coco, tmp_path):
    from packer.sources.coco import convert_coco, read_coco

    root, doc, _, _ = coco
    bad = json.loads(json.dumps(doc))
    bad["annotations"][1]["category_id"] = 9
    (root / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(SourceError, match=r"bad.json: annotations\[1\]: category_id 9 is not a category"):
        read_coco(root / "bad.json", root)
    bad = json.loads(json.dumps(doc))
    bad["annotations"][2]["segmentation"]["size"] = [3, 4]
    (root / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(SourceError, match=r"annotations\[2\]: RLE size \[3, 4\] is not the image's \[30, 40\]"):
        read_coco(root / "bad.json", root, masks="semantic")
    bad = json.loads(json.dumps(doc))
    bad["annotations"][3]["bbox"] = [10, 1, 19, 3]  # 29 > the image's width 24
    (root / "bad.json").write_text(json.dumps(bad))
    (root / "img" / "003.png").unlink()
    report = convert_coco(root / "bad.json", tmp_path / "out", "lmdb", _options(), images=root)
    reasons = {s.path: s.reason for s in report.skipped}
    assert "is not an ordered box inside the 24x36 image" in reasons["img/002.png"]
    assert reasons["img/003.png"].startswith("images[2]: cannot read")
    assert report.manifest.num_samples == 1
    assert main(["convert", "coco", "lmdb", str(root / "instances.json"), str(tmp_path / "o2"), "-q"]) == 2


def test_a_coco_image_file_that_does_not_decode_is_a_skip_naming_its_entry(coco, tmp_path):
    from packer.sources.coco import convert_coco

    root, _, _, _ = coco
    data = (root / "img" / "002.png").read_bytes()
    (root / "img" / "002.png").write_bytes(data[:40] + bytes(len(data) - 40))  # the header kept, pixels gone
    for masks in ("semantic", None):
        report = convert_coco(root / "instances.json", tmp_path / f"out-{masks}", "lmdb", _options(), images=root,
                              masks=masks)
        reasons = {s.path: s.reason for s in report.skipped}
        assert list(reasons) == ["img/002.png"] and reasons["img/002.png"].startswith("images[1]: "), reasons
        assert report.manifest.num_samples == 2


def test_a_field_file_that_changes_after_listing_is_an_error_naming_it(src, tmp_path, monkeypatch):
    import packer.pipeline.items as items_module

    root, _, rows = src
    listed = items_module._Rows.fingerprint

    def then_touch(self, *a, **kw):  # the mask changes between the listing and the read
        out = listed(self, *a, **kw)
        os.utime(root / "m2.png", ns=(10**18, 10**18))
        return out

    monkeypatch.setattr(items_module._Rows, "fingerprint", then_touch)
    with pytest.raises(SourceError, match=r"m2.png is not the file this conversion was planned with"):
        convert_items(_items(root, rows), tmp_path / "out", "lmdb", _options(), root=root)
    assert not os.path.exists(tmp_path / "out")


def test_source_flags_belong_to_their_sources(tmp_path, capsys):
    dst = str(tmp_path / "o")
    assert main(["convert", "parquet", "lmdb", "x.parquet", dst, "--image-column", "a", "--image-column", "b"]) == 2
    assert "a parquet source has one image column; --image-column is given 2 times" in capsys.readouterr().err
    assert main(["convert", "list", "lmdb", "x.csv", dst, "--images", "img"]) == 2
    assert "--images applies to a coco source only" in capsys.readouterr().err
    assert main(["convert", "coco", "lmdb", "x.json", dst, "--images", "img", "--mask-column", "m"]) == 2
    assert "--mask-column applies to a list source only" in capsys.readouterr().err
    assert main(["convert", "coco", "lmdb", "x.json", dst, "--images", "img", "--masks", "panoptic"]) == 2


def test_a_coco_entry_of_another_size_than_its_file_is_skipped_before_its_mask_is_drawn(coco, tmp_path):
    """images[0] declares 60000 x 60000 (an RLE of that size: 3.4 GB drawn) for a 40 x 30 file:
    a skip naming the entry, in a process allowed 300 MB more than its imports; images[1]
    declares twice its file's size with boxes inside the file: a skip too, not boxes as given."""
    root, doc, _, _ = coco
    bad = json.loads(json.dumps(doc))
    bad["images"][0].update(height=60000, width=60000)
    bad["annotations"][2]["segmentation"] = {"counts": [60000 * 60000], "size": [60000, 60000]}
    bad["images"][1].update(height=72, width=48)
    bad["annotations"][3]["segmentation"] = [[1, 1, 5, 1, 5, 4]]  # its box and polygon inside the file
    (root / "bad.json").write_text(json.dumps(bad))
    out = run_bounded(f"""
from packer.sources.coco import convert_coco
from packer.pipeline.engine import ConvertOptions
for masks in ("semantic", None):
    r = convert_coco({str(root / "bad.json")!r}, {str(tmp_path)!r} + f"/out-{{masks}}", "tar",
                     ConvertOptions(workers=1), images={str(root)!r}, masks=masks)
    print(masks, r.manifest.num_samples, sorted((s.path, s.reason) for s in r.skipped))
""", 300, tmp_path)
    for masks in ("semantic", "None"):
        line = next(x for x in out.splitlines() if x.startswith(masks))
        assert line.startswith(f"{masks} 1 ")
        assert ("'img/001.png', 'images[0] declares 60000x60000 but the image file is 40x30; its boxes and mask "
                "are given for the declared size'") in line
        assert "'img/002.png', 'images[1] declares 48x72 but the image file is 24x36" in line


def test_coco_metadata_and_crowd_problems_name_the_entry_not_an_item_number(coco, tmp_path):
    from packer.sources.coco import convert_coco, read_coco

    root, doc, _, _ = coco
    bad = json.loads(json.dumps(doc))
    bad["images"][1]["license"] = float("nan")
    (root / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(SourceError, match=r"bad.json: images\[1\] \(img/002.png\): its metadata.license: nan is not"):
        convert_coco(root / "bad.json", tmp_path / "out", "lmdb", _options(), images=root)
    assert main(["convert", "coco", "lmdb", str(root / "bad.json"), str(tmp_path / "o"), "--images", str(root),
                 "-q"]) == 2 or not os.path.exists(tmp_path / "o")
    bad = json.loads(json.dumps(doc))
    bad["annotations"][3]["iscrowd"] = "yes"
    (root / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(SourceError, match=r"annotations\[3\]: iscrowd 'yes' is not 0 or 1"):
        read_coco(root / "bad.json", root)
