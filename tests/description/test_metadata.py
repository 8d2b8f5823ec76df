"""Label kinds, per-sample metadata and the sample table, in every format: what convert_items and
list files store, what ``fields=``, ``ds.targets`` and ``ds.keys`` give back, and what other tools
(WebDataset, the tfrecord package) see in the files."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tarfile

import crc32c
import numpy as np
import pytest
import torch

from packer.converters.base import WriterOptions
from packer.datasets import open_dataset
from packer.description.manifest import read_manifest
from packer.description.registry import format_names
from packer.description.samples import MAX_META_BYTES, TABLE_NAME, Label, build_table
from packer.errors import CorruptDataError, SourceError
from packer.pipeline.engine import ConvertOptions
from packer.pipeline.items import convert_items
from packer.sources.listsource import convert_list, read_list
from tests.helpers import make_folder

FORMATS = format_names()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("meta") / "src")
    make_folder(root, {c: [(f"{i}.png", 20 + i, 26) for i in range(3)] for c in ("cat", "dog")})
    return root, sorted(os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs)


def _opts():
    return ConvertOptions(workers=1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_class_labels_with_metadata_round_trip(fmt, photos, tmp_path):
    root, paths = photos
    items = [(p, os.path.basename(os.path.dirname(p)), {"n": i, "caption": f"photo {i}", "tags": ["a", None]}
              if i % 2 else None) for i, p in enumerate(paths)]
    dst = str(tmp_path / fmt)
    convert_items(items, dst, fmt, _opts(), root=root)
    m = read_manifest(dst)
    assert m.label_kind == "class" and "labels" not in json.load(open(os.path.join(dst, "manifest.json")))
    assert m.files[-1].name == TABLE_NAME and m.files[-1].samples == 0
    ds = open_dataset(dst, fields=("index", "key", "label", "meta", "image"))
    assert ds.classes == ["cat", "dog"]
    assert list(ds.targets) == [0, 0, 0, 1, 1, 1] and ds.targets.dtype == np.uint8  # the narrowest column
    assert list(ds.keys) == [os.path.relpath(p, root) for p in paths]
    for i in range(len(ds)):
        index, key, label, meta, image = ds[i]
        assert index == i and key == ds.keys[i] and label == ds.targets[i]
        assert meta == ({"n": i, "caption": f"photo {i}", "tags": ["a", None]} if i % 2 else {})
        assert isinstance(image, torch.Tensor) and image.shape[0] == 3
    plain = open_dataset(dst)
    assert plain[4][1] == 1 and len(plain[4]) == 2  # the default stays (image, label)


@pytest.mark.parametrize("fmt", FORMATS)
def test_multi_label_and_number_kinds(fmt, photos, tmp_path):
    root, paths = photos
    multi = [(p, [["cat"], ["cat", "dog"], []][i % 3], None) for i, p in enumerate(paths)]
    convert_items(multi, str(tmp_path / "multi"), fmt, _opts(), label_kind="multi")
    ds = open_dataset(str(tmp_path / "multi"), fields=("label",))
    assert ds.label_kind == "multi" and read_manifest(str(tmp_path / "multi")).label_kind == "multi"
    assert ds.targets == [[0], [0, 1], [], [0], [0, 1], []]
    assert torch.equal(ds[1][0], torch.tensor([1.0, 1.0])) and torch.equal(ds[2][0], torch.zeros(2))
    numbers = [(p, 0.25 * i - 1, {"score": i}) for i, p in enumerate(paths)]
    convert_items(numbers, str(tmp_path / "num"), fmt, _opts(), label_kind="number")
    ds = open_dataset(str(tmp_path / "num"))
    assert ds.classes == [] and ds.targets.dtype == np.float64
    assert ds.targets.tolist() == [0.25 * i - 1 for i in range(6)]
    assert ds[5][1] == 0.25 and ds.meta(5) == {"score": 5}


@pytest.mark.parametrize("fmt", FORMATS)
def test_multi_labels_are_one_contract_in_every_reader(fmt, photos, tmp_path):
    """``ds.targets``: class-index lists; the ``label`` field: a float32 multi-hot vector of
    ``len(classes)``, a NumPy array with ``output="numpy"``, else a tensor: map-style, batched
    reads, dicts, streaming and collate alike."""
    from packer.datasets import StreamingDataset, collate

    root, paths = photos
    sets = [["cat"], ["cat", "dog"], []]
    convert_items([(p, sets[i % 3], None) for i, p in enumerate(paths)], str(tmp_path / "m"), fmt, _opts(),
                  label_kind="multi")
    want = [np.isin([0, 1], t).astype(np.float32) for t in open_dataset(str(tmp_path / "m")).targets]
    assert [np.flatnonzero(w).tolist() for w in want] == [[0], [0, 1], [], [0], [0, 1], []]
    for output, kind in (("tensor", torch.Tensor), ("numpy", np.ndarray), ("pil", torch.Tensor)):
        ds = open_dataset(str(tmp_path / "m"), output=output)
        got = [ds[i][1] for i in range(len(ds))] + [s[1] for s in ds.__getitems__([4, 5])]
        got += [open_dataset(str(tmp_path / "m"), output=output, as_dict=True, fields=("label",))[1]["label"]]
        stream = StreamingDataset(str(tmp_path / "m"), shuffle=False, output=output)
        got += [s[1] for s in stream]
        assert all(type(g) is kind and g.dtype in (np.float32, torch.float32) for g in got), (output, got)
        assert all(np.array_equal(np.asarray(g), w) for g, w in zip(got, want + want[4:6] + want[1:2] + want))
    ds = open_dataset(str(tmp_path / "m"), output="numpy", fields=("label", "index"))
    batch = collate([ds[i] for i in range(3)])[0]  # a B x C float32 tensor, from numpy samples too
    assert batch.dtype == torch.float32 and torch.equal(batch, torch.from_numpy(np.stack(want[:3])))


def test_label_kind_checks_every_label(photos, tmp_path):
    _, paths = photos
    report = convert_items([(p, ["x", "y"][: i % 2 + 1], None) for i, p in enumerate(paths)],
                           str(tmp_path / "d"), "lmdb", _opts(), label_kind="multi")
    assert report.manifest.classes == ["x", "y"]
    with pytest.raises(ValueError, match="item 0: label 'x' is not a list of classes"):
        convert_items([(p, "x", None) for p in paths], str(tmp_path / "e"), "lmdb", _opts(), label_kind="multi")
    with pytest.raises(ValueError, match="item 0: label 'x' is not a finite number"):
        convert_items([(p, "x", None) for p in paths], str(tmp_path / "f"), "lmdb", _opts(), label_kind="number")


@pytest.mark.parametrize("meta, why", [
    ({1: "a"}, "key 1 is not a string"),
    ({"x": float("nan")}, "nan is not a JSON number"),
    ({"x": b"bytes"}, "bytes is not JSON"),
    ({"x": "y" * MAX_META_BYTES}, "more than the 65536"),
])
def test_bad_metadata_is_one_error_naming_the_item(meta, why, photos, tmp_path):
    _, paths = photos
    items = [(p, "a", meta if i == 2 else None) for i, p in enumerate(paths)]
    with pytest.raises(ValueError, match=f"item 2: metadata.*{why}"):
        convert_items(items, str(tmp_path / "d"), "tar", _opts())
    assert not os.path.exists(tmp_path / "d")


def test_tar_members_for_other_tools(photos, tmp_path):
    """Single-label shards keep ``KEY.cls`` an ASCII integer (webdataset reads it with int());
    other label kinds and metadata live in ``KEY.json``."""
    root, paths = photos
    convert_items([(p, "cat" if i < 3 else "dog", {"i": i}) for i, p in enumerate(paths)], str(tmp_path / "c"),
                  "tar", _opts(), root=root)
    convert_items([(p, ["cat", "dog"][: i % 2 + 1], None) for i, p in enumerate(paths)], str(tmp_path / "m"),
                  "tar", _opts(), root=root, label_kind="multi")
    with tarfile.open(str(tmp_path / "c" / "shard-000000.tar")) as tf:
        names = tf.getnames()
        assert names[:3] == ["0000000000.jpg", "0000000000.cls", "0000000000.json"]
        assert tf.extractfile("0000000004.cls").read() == b"1"
        assert json.loads(tf.extractfile("0000000004.json").read()) == {
            "key": "dog/1.png", "label": 1, "height": 21, "width": 26, "meta": {"i": 4}}
    with tarfile.open(str(tmp_path / "m" / "shard-000000.tar")) as tf:
        assert not any(n.endswith(".cls") for n in tf.getnames())
        assert json.loads(tf.extractfile("0000000001.json").read())["labels"] == [0, 1]
    wds = pytest.importorskip("webdataset")
    got = [(int(s["cls"]), json.loads(s["json"])["meta"]["i"])
           for s in wds.WebDataset(str(tmp_path / "c" / "shard-000000.tar"), shardshuffle=False, empty_check=False)]
    assert got == [(0, 0), (0, 1), (0, 2), (1, 3), (1, 4), (1, 5)]


def test_tfrecord_features_for_other_tools(photos, tmp_path):
    root, paths = photos
    convert_items([(p, ["cat", "dog"][: i % 2 + 1], {"i": i}) for i, p in enumerate(paths)], str(tmp_path / "m"),
                  "tfrecord", _opts(), root=root, label_kind="multi")
    convert_items([(p, i / 3, None) for i, p in enumerate(paths)], str(tmp_path / "n"), "tfrecord", _opts(),
                  label_kind="number")
    reader = pytest.importorskip("tfrecord.reader")
    rows = list(reader.tfrecord_loader(str(tmp_path / "m" / "shard-000000.tfrecord"), None))
    assert [list(r["image/class/label"]) for r in rows[:2]] == [[0], [0, 1]]
    assert json.loads(bytes(rows[3]["packer/meta"])) == {"i": 3}
    rows = list(reader.tfrecord_loader(str(tmp_path / "n" / "shard-000000.tfrecord"), None))
    assert rows[2]["image/target"].tolist() == pytest.approx([2 / 3]) and list(rows[2]["image/class/label"]) == [-1]


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_interrupted_conversion_resumes_to_the_same_table(fmt, photos, tmp_path, monkeypatch):
    from packer.description.registry import writer_class

    _, paths = photos
    items = [(p, ["cat", "dog"][: i % 2 + 1], {"i": i}) for i, p in enumerate(paths * 3)]
    ref = str(tmp_path / "ref")
    writer = WriterOptions(shard_samples=4) if fmt == "tar" else WriterOptions(checkpoint_samples=4)
    opts = ConvertOptions(workers=1, writer=writer)
    convert_items(items, ref, fmt, opts, label_kind="multi")
    cls = writer_class(fmt)
    orig, count = cls.add, [0]

    def add(self, *a, **kw):
        count[0] += 1
        if count[0] > 11:
            raise KeyboardInterrupt
        return orig(self, *a, **kw)

    monkeypatch.setattr(cls, "add", add)
    with pytest.raises(KeyboardInterrupt):
        convert_items(items, str(tmp_path / "out"), fmt, opts, label_kind="multi")
    monkeypatch.undo()
    from dataclasses import replace

    report = convert_items(items, str(tmp_path / "out"), fmt, replace(opts, resume=True), label_kind="multi")
    assert report.resumed is not None and report.resumed["written"] >= 4
    with open(os.path.join(ref, TABLE_NAME), "rb") as a, open(tmp_path / "out" / TABLE_NAME, "rb") as b:
        assert a.read() == b.read()


def test_sample_table_bytes(tmp_path):
    """The table's layout (version 3), pinned: the header with each section's offset, length and
    CRC32C, then labels in the narrowest column (uint8 here), multi-label ids (none), keys (offsets,
    blob), metadata (offsets, blob), boxes (none), each padded to 8 bytes; and its id as
    docs/FORMATS.md specifies it."""
    path = str(tmp_path / TABLE_NAME)
    tid = build_table(path, "class", iter([("a.jpg", 1), ("bb.png", Label(0, meta={"x": 1}))]))
    data = open(path, "rb").read()
    parts = {"labels": bytes([1, 0]) + bytes(6), "label ids": b"",
             "keys": struct.pack("<2Q", 5, 11) + b"a.jpgbb.png" + bytes(5),
             "metadata": struct.pack("<2Q", 0, 7) + b'{"x":1}' + bytes(1), "boxes": b""}
    head = struct.pack("<4sHBBQQQQQ", b"PKST", 3, 0, 1, 2, 0, 11, 7, 0)
    at = 176
    for section in parts.values():
        head += struct.pack("<QQI4x", at, len(section), crc32c.crc32c(section))
        at += len(section)
    head += struct.pack("<I", 0)  # flags: no boxes section
    assert len(head) == 172 and data == head + struct.pack("<I", crc32c.crc32c(head)) + b"".join(parts.values())
    assert tid == hashlib.sha256(b"packer table" + data[:176]).hexdigest()[:16]


@pytest.mark.parametrize(("labels", "dtype"), [([0, 255], np.uint8), ([0, 256], np.uint16), ([-1, 127], np.int8),
                                               ([-1, 128], np.int16), ([0, 65536], np.int32), ([-1, 2**31], np.int64)])
def test_class_labels_take_the_narrowest_column(tmp_path, labels, dtype):
    """Class labels are stored in the narrowest column holding them, -1 (no class) included, and
    come back as that dtype, a read-only view of the mapped file, values unchanged."""
    from packer.description.samples import SampleTable

    path = str(tmp_path / TABLE_NAME)
    build_table(path, "class", iter([(f"k{i}", v) for i, v in enumerate(labels)]))
    fd = os.open(path, os.O_RDONLY)
    try:
        table = SampleTable(fd, path, len(labels))
    finally:
        os.close(fd)
    assert table.targets.dtype == dtype and table.targets.tolist() == labels and not table.targets.flags.writeable
    assert [table.target_of(i) for i in range(len(labels))] == labels


@pytest.mark.parametrize("section", ["keys", "metadata"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_damaged_table_is_reported(fmt, section, photos, tmp_path):
    """A damaged keys or metadata section: labels (checked at open) still read; the first read
    that needs the section raises one line naming the file and the section; verify reports it."""
    from packer.description.sections import unpack_header
    from packer.operations.verify import verify_dataset

    _, paths = photos
    dst = str(tmp_path / fmt)
    convert_items([(p, "a", {"i": i}) for i, p in enumerate(paths)], dst, fmt, _opts())
    path = os.path.join(dst, TABLE_NAME)
    data = bytearray(open(path, "rb").read())
    offset, length, _ = unpack_header(data, len(data), path, 3).sections[section]
    data[offset + length - 9] ^= 0x20  # in the blob (its last byte before the padding, at most)
    open(path, "wb").write(bytes(data))
    ds = open_dataset(dst, verify=True)
    assert list(ds.targets) == [0] * len(paths)  # what labels need is checked, and intact
    damaged = rf"{section} section is damaged \(checksum mismatch\).*samples.table"
    with pytest.raises(CorruptDataError, match=damaged):
        _ = ds.keys[0] if section == "keys" else ds.meta(0)
    with pytest.raises(CorruptDataError, match=damaged):
        open_dataset(dst, fields=("image", "key", "meta"))[0]
    report = verify_dataset(dst)
    assert not report.ok and any(f"{section} section is damaged" in p and TABLE_NAME in p for p in report.problems)


def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def test_csv_list_with_class_names_and_metadata(photos, tmp_path):
    root, paths = photos
    rows = "\n".join(f"{os.path.relpath(p, root)},{'cat' if i < 3 else 'dog'},{'' if i == 0 else f'ph{i}'},{i * 1.5}"
                     for i, p in enumerate(paths))
    lst = _write(os.path.join(root, "train.csv"), "path,label,photographer,exposure\n" + rows + "\n")
    report = convert_list(lst, str(tmp_path / "d"), "lmdb", ConvertOptions(workers=1, shuffle=False))
    ds = open_dataset(str(tmp_path / "d"), fields=("key", "label", "meta"))
    assert ds.classes == ["cat", "dog"] and report.manifest.source["kind"] == "list"
    assert ds[0] == ("cat/0.png", 0, {"exposure": 0.0})  # an empty cell is left out; a column of numbers is numbers
    assert ds[4] == ("dog/1.png", 1, {"photographer": "ph4", "exposure": 6.0})


TYPED_ROWS = [  # score: numbers; n: integers; ok: booleans; code: leading zeros; note: one text cell; big: past int64
    ("0.5", "3", "true", "007", "x", "12345678901234567890"),
    ("2", "-4", "False", "012", "", "1"),
    ("1e3", "+5", "TRUE", "100", "7", "2"),
    ("-.25", "0", "false", "3", "8", ""),
]


@pytest.mark.parametrize("sep", [",", "\t"])
def test_csv_and_tsv_metadata_is_typed_by_column(photos, tmp_path, sep):
    """A column whose every non-empty cell is an integer, a number or true/false is stored as one
    (the same type in every sample); one text cell, a leading zero or an integer past int64 keeps
    the column text; metadata_types="text" keeps every cell a string."""
    root, paths = photos
    suffix = ".csv" if sep == "," else ".tsv"
    lines = [sep.join(["path", "label", "score", "n", "ok", "code", "note", "big"])] + [
        sep.join([os.path.relpath(paths[i], root), "cat", *cells]) for i, cells in enumerate(TYPED_ROWS)]
    lst = _write(os.path.join(root, "typed" + suffix), "\n".join(lines) + "\n")
    convert_list(lst, str(tmp_path / "d"), "tar", ConvertOptions(workers=1, shuffle=False))
    metas = [m for _, m in open_dataset(str(tmp_path / "d"), fields=("key", "meta"))]
    assert metas[0] == {"score": 0.5, "n": 3, "ok": True, "code": "007", "note": "x", "big": "12345678901234567890"}
    assert metas[1] == {"score": 2.0, "n": -4, "ok": False, "code": "012", "big": "1"}
    assert metas[2] == {"score": 1000.0, "n": 5, "ok": True, "code": "100", "note": "7", "big": "2"}
    assert metas[3] == {"score": -0.25, "n": 0, "ok": False, "code": "3", "note": "8"}
    assert all(type(m["n"]) is int and type(m["score"]) is float for m in metas)
    text = read_list(lst, metadata_types="text")
    assert [meta for _, _, meta in text.items][1] == {"score": "2", "n": "-4", "ok": "False", "code": "012", "big": "1"}
    with pytest.raises(ValueError, match="metadata types must be one of auto, text, not 'typed'"):
        read_list(lst, metadata_types="typed")


def test_cli_metadata_types(photos, tmp_path):
    root, paths = photos
    lst = _write(str(tmp_path / "l.csv"), "path,label,n\n" + "".join(f"{p},cat,{i}\n" for i, p in enumerate(paths)))
    r = _cli("convert", "list", "lmdb", lst, str(tmp_path / "a"), "--root", root, "--no-shuffle", "-q")
    assert r.returncode == 0, r.stderr
    assert open_dataset(str(tmp_path / "a"), fields=("meta",))[1] == ({"n": 1},)
    r = _cli("convert", "list", "lmdb", lst, str(tmp_path / "b"), "--root", root, "--no-shuffle", "-q",
             "--metadata-types", "text")
    assert r.returncode == 0, r.stderr
    assert open_dataset(str(tmp_path / "b"), fields=("meta",))[1] == ({"n": "1"},)
    r = _cli("convert", "imagefolder", "lmdb", root, str(tmp_path / "c"), "--metadata-types", "text")
    assert r.returncode == 2 and "--metadata-types applies to a list source only" in r.stderr


def test_tsv_multi_label_and_jsonl_number_lists(photos, tmp_path):
    root, paths = photos
    lst = _write(str(tmp_path / "l.tsv"), "file\tlabels\n" + "".join(
        f"{p}\t{'cat|dog' if i % 2 else 'dog'}\n" for i, p in enumerate(paths)))
    src = read_list(lst, label_kind="multi", root=root)  # absolute paths inside the root
    assert src.label_kind == "multi" and src.items[1][1] == ["cat", "dog"] and src.path_column == "file"
    convert_list(lst, str(tmp_path / "t"), "tar", ConvertOptions(workers=1, shuffle=False), label_kind="multi",
                 root=root)
    assert open_dataset(str(tmp_path / "t")).targets[:2] == [[1], [0, 1]]
    lst = _write(str(tmp_path / "n.jsonl"), "".join(
        json.dumps({"path": os.path.relpath(p, root), "target": i + 0.5, "box": [1, 2, 3, 4]}) + "\n"
        for i, p in enumerate(paths)))
    assert read_list(lst, root=root).label_kind == "number"
    convert_list(lst, str(tmp_path / "n"), "hdf5", ConvertOptions(workers=1, shuffle=False), root=root)
    ds = open_dataset(str(tmp_path / "n"), fields=("label", "meta"))
    assert ds[2] == (2.5, {"box": [1, 2, 3, 4]})


@pytest.mark.parametrize("text, name, why", [
    ("path,label\na.png,\n", "l.csv", r"l.csv:2: the label is empty"),
    ("name,label\na.png,x\n", "l.csv", r"no path column; name one of path, file"),
    ('{"path": "a.png", "label": "x"}\nnot json\n', "l.jsonl", r"l.jsonl:2: not JSON"),
    ("path,label\na.png,x,extra\n", "l.csv", r"l.csv:2: more fields than the header"),
    ("path,label\n", "l.txt", r"a list must be .csv, .tsv or .jsonl"),
])
def test_bad_lists_are_one_line_errors(text, name, why, tmp_path):
    lst = _write(str(tmp_path / name), text)
    with pytest.raises(SourceError, match=why):
        read_list(lst)


def test_missing_images_in_a_list_are_skipped_with_the_reason(photos, tmp_path):
    root, paths = photos
    lst = _write(str(tmp_path / "l.csv"), "path,label\n" + "".join(f"{p},cat\n" for p in paths) + "gone.png,cat\n")
    report = convert_list(lst, str(tmp_path / "d"), "tfrecord", _opts(), root=root)
    assert report.manifest.num_samples == 6
    assert [s.path for s in report.skipped] == ["gone.png"] and "No such file" in report.skipped[0].reason


@pytest.mark.parametrize("fmt", FORMATS)
def test_merge_and_format_conversion_carry_labels_and_metadata(fmt, photos, tmp_path):
    from packer.operations.merge import merge
    from packer.operations.transcode import convert_dataset

    root, paths = photos
    a = [(p, ["dog"] if i % 2 else ["cat", "dog"], {"part": "a", "i": i}) for i, p in enumerate(paths[:3])]
    b = [(p, ["bird"], {"part": "b", "i": i}) for i, p in enumerate(paths[3:])]
    convert_items(a, str(tmp_path / "a"), fmt, _opts(), root=root, label_kind="multi")
    convert_items(b, str(tmp_path / "b"), fmt, _opts(), root=root, label_kind="multi")
    report = merge([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "m"))
    ds = open_dataset(str(tmp_path / "m"), fields=("key", "meta"))
    assert ds.label_kind == "multi" and ds.classes == ["cat", "dog", "bird"] and report.labels[1] == [2]
    assert ds.targets == [[0, 1], [1], [0, 1], [2], [2], [2]]
    assert [ds[i] for i in (1, 4)] == [("cat/1.png", {"part": "a", "i": 1}), ("dog/1.png", {"part": "b", "i": 1})]
    assert [f.name for f in read_manifest(str(tmp_path / "m")).files].count(TABLE_NAME) == 1
    other = "tar" if fmt != "tar" else "lmdb"
    convert_dataset(str(tmp_path / "m"), str(tmp_path / "c"), fmt, other)
    back = open_dataset(str(tmp_path / "c"), fields=("key", "meta"))
    assert back.label_kind == "multi" and back.targets == ds.targets and [back[i] for i in range(6)] == [
        ds[i] for i in range(6)]
    convert_items([(p, 1.5, None) for p in paths[:2]], str(tmp_path / "n"), fmt, _opts(), label_kind="number")
    with pytest.raises(SourceError, match="has number labels but part .* has multi labels"):
        merge([str(tmp_path / "a"), str(tmp_path / "n")], str(tmp_path / "x"))
    with pytest.raises(SourceError, match="multi labels, which class folders cannot hold"):
        convert_dataset(str(tmp_path / "m"), str(tmp_path / "f"), fmt, "imagefolder")


def _cli(*args):
    from tests.helpers import run_cli

    return run_cli(*args)


def test_cli_list_source_is_shuffled_with_its_seed_and_classes_pinned(photos, tmp_path):
    root, paths = photos
    lst = _write(str(tmp_path / "val.csv"), "path,label,note\n" + "".join(
        f"{os.path.relpath(p, root)},{'dog' if 'dog' in p else 'cat'},n{i}\n" for i, p in enumerate(paths)))
    names = _write(str(tmp_path / "classes.txt"), "zebra\ndog\ncat\n")
    r = _cli("convert", "list", "tar", lst, str(tmp_path / "d"), "--root", root, "--classes-from", names,
             "--seed", "3", "--workers", "1", "-q")
    assert r.returncode == 0, r.stderr
    m = read_manifest(str(tmp_path / "d"))
    assert m.classes == ["zebra", "dog", "cat"] and m.shuffle_seed == 3 and m.source["kind"] == "list"
    ds = open_dataset(str(tmp_path / "d"), fields=("key", "label", "meta"))
    order = list(np.random.default_rng(3).permutation(6))
    assert [ds[i][0] for i in range(6)] == [os.path.relpath(paths[j], root) for j in order]
    assert all(ds[i][1] == (1 if ds[i][0].startswith("dog") else 2) for i in range(6))
    assert ds[0][2] == {"note": f"n{order[0]}"}
    r = _cli("convert", "list", "tar", lst, str(tmp_path / "e"), "--root", root, "--classes-from", str(tmp_path / "d"),
             "--no-shuffle", "-q")
    assert r.returncode == 0 and open_dataset(str(tmp_path / "e")).classes == ["zebra", "dog", "cat"]
    _write(names, "cat\n")
    r = _cli("convert", "list", "tar", lst, str(tmp_path / "f"), "--root", root, "--classes-from", names, "-q")
    assert r.returncode == 1 and "val.csv:5: class 'dog' is not in the pinned class list (1 class)" in r.stderr
    assert "Traceback" not in r.stderr and not os.path.exists(tmp_path / "f")


def test_cli_classes_from_for_an_image_folder(tmp_path):
    make_folder(str(tmp_path / "train"), {c: [("0.png", 20, 20)] for c in ("a", "b", "c")})
    make_folder(str(tmp_path / "val"), {c: [("0.png", 20, 20)] for c in ("c", "a")})
    make_folder(str(tmp_path / "bad"), {c: [("0.png", 20, 20)] for c in ("a", "x")})
    assert _cli("convert", "imagefolder", "lmdb", str(tmp_path / "train"), str(tmp_path / "t"), "-q").returncode == 0
    r = _cli("convert", "imagefolder", "lmdb", str(tmp_path / "val"), str(tmp_path / "v"), "--classes-from",
             str(tmp_path / "t"), "-q")
    assert r.returncode == 0, r.stderr
    v = open_dataset(str(tmp_path / "v"), fields=("key", "label"))
    assert v.classes == ["a", "b", "c"] and sorted(v[i] for i in range(2)) == [("a/0.png", 0), ("c/0.png", 2)]
    assert read_manifest(str(tmp_path / "v")).source["empty_classes"] == ["b"]
    r = _cli("convert", "imagefolder", "lmdb", str(tmp_path / "bad"), str(tmp_path / "b"), "--classes-from",
             str(tmp_path / "t"), "-q")
    assert r.returncode == 1 and "class 'x' is not in the pinned class list (3 classes)" in r.stderr
    r = _cli("convert", "lmdb", "tar", str(tmp_path / "t"), str(tmp_path / "x"), "--classes-from", str(tmp_path / "t"))
    assert r.returncode == 2 and "--classes-from applies to imagefolder and list sources" in r.stderr


def test_shard_prefix_brace_pattern_and_a_pkidx_index(photos, tmp_path):
    """``--prefix`` names the shards; ``info`` prints the brace pattern WebDataset takes and
    ``--shards`` the plain list; the tar index is not ``.idx`` (DALI's name for its own index)."""
    root, _ = photos
    r = _cli("convert", "imagefolder", "tar", root, str(tmp_path / "t"), "--prefix", "train", "--shard-samples", "2",
             "-q")
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(tmp_path / "t"))
    assert names == ["manifest.json", "samples.table"] + [f"train-{i:06d}{e}" for i in range(3) for e in (".pkidx", ".tar")]
    info = _cli("info", str(tmp_path / "t")).stdout
    url = os.path.join(str(tmp_path / "t"), "train-{000000..000002}.tar")
    assert f"shards      3: {url} (a brace pattern: packer, WebDataset)" in info
    listed = _cli("info", str(tmp_path / "t"), "--shards").stdout.split()
    assert listed == [os.path.join(str(tmp_path / "t"), f"train-{i:06d}.tar") for i in range(3)]
    wds = pytest.importorskip("webdataset")
    assert len(list(wds.WebDataset(url, shardshuffle=False, empty_check=False))) == 6
    assert len(open_dataset(str(tmp_path / "t"))) == 6
    r = _cli("convert", "imagefolder", "tar", root, str(tmp_path / "x"), "--prefix", "../evil", "-q")
    assert r.returncode == 2 and "--prefix" in r.stderr
    r = _cli("convert", "imagefolder", "lmdb", root, str(tmp_path / "y"), "--prefix", "train", "-q")
    assert r.returncode == 2 and "--prefix applies to tar and tfrecord output only" in r.stderr


def test_merge_keeps_the_first_parts_prefix(photos, tmp_path):
    from packer.operations.merge import merge

    root, paths = photos
    for name, part in (("a", paths[:3]), ("b", paths[3:])):
        convert_items([(p, "x", None) for p in part], str(tmp_path / name), "tfrecord",
                      ConvertOptions(workers=1, writer=WriterOptions(prefix="val")))
    merge([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "m"))
    assert [f.name for f in read_manifest(str(tmp_path / "m")).files if f.samples] == [
        "val-000000.tfrecord", "val-000001.tfrecord"]
    assert len(open_dataset(str(tmp_path / "m"))) == 6


def test_other_tools_metadata_is_carried_into_packer_formats(photos, tmp_path):
    """A WebDataset shard's ``.json`` and ``.txt`` members and a TFRecord file's extra features
    become the samples' metadata when converted."""
    from packer.operations.transcode import convert_dataset

    wds = pytest.importorskip("webdataset")
    writer_mod = pytest.importorskip("tfrecord.writer")
    _, paths = photos
    jpgs = [open(p, "rb").read() for p in paths[:3]]
    os.makedirs(tmp_path / "w")
    with wds.TarWriter(str(tmp_path / "w" / "a.tar")) as sink:
        for i, data in enumerate(jpgs):
            sample = {"__key__": f"s{i}", "png": data, "cls": i % 2, "txt": f"caption {i}"}
            if i != 1:
                sample["json"] = {"score": i / 2, "tags": ["x"]}
            sink.write(sample)
    convert_dataset(str(tmp_path / "w"), str(tmp_path / "wl"), "tar", "lmdb")
    ds = open_dataset(str(tmp_path / "wl"), fields=("key", "label", "meta"))
    assert [ds[i] for i in range(3)] == [
        ("s0", 0, {"score": 0.0, "tags": ["x"], "txt": "caption 0"}), ("s1", 1, {"txt": "caption 1"}),
        ("s2", 0, {"score": 1.0, "tags": ["x"], "txt": "caption 2"})]
    os.makedirs(tmp_path / "t")
    w = writer_mod.TFRecordWriter(str(tmp_path / "t" / "a.tfrecord"))
    for i, data in enumerate(jpgs):
        w.write({"image/encoded": (data, "byte"), "image/class/label": (i, "int"),
                 "caption": (f"photo {i}".encode(), "byte"), "box": ([0.5, 1.5], "float")})
    w.close()
    convert_dataset(str(tmp_path / "t"), str(tmp_path / "tl"), "tfrecord", "tar")
    ds = open_dataset(str(tmp_path / "tl"), fields=("label", "meta"))
    assert ds[2] == (2, {"caption": "photo 2", "box": [0.5, 1.5]})
    with tarfile.open(str(tmp_path / "tl" / "shard-000000.tar")) as tf:
        assert json.loads(tf.extractfile("0000000002.json").read())["meta"] == {"caption": "photo 2", "box": [0.5, 1.5]}


def test_streaming_and_mixtures_take_fields(photos, tmp_path):
    """A mixture's source is one more field, not another return shape."""
    from packer.datasets import StreamingDataset

    root, paths = photos
    convert_items([(p, "a", {"i": i}) for i, p in enumerate(paths[:4])], str(tmp_path / "a"), "tar", _opts(), root=root)
    convert_items([(p, "b", None) for p in paths[4:]], str(tmp_path / "b"), "lmdb", _opts(), root=root)
    one = StreamingDataset(str(tmp_path / "a"), shuffle=False, fields=("key", "meta", "label"))
    assert list(one) == [(os.path.relpath(p, root), {"i": i}, 0) for i, p in enumerate(paths[:4])]
    mix = StreamingDataset([str(tmp_path / "a"), str(tmp_path / "b")], shuffle=False, classes="union",
                           fields=("source", "label", "key"))
    got = sorted(mix)
    assert got == sorted([(0, 0, os.path.relpath(p, root)) for p in paths[:4]]
                         + [(1, 1, os.path.relpath(p, root)) for p in paths[4:]])
    with pytest.raises(ValueError, match="source.* is a mixture's"):
        StreamingDataset(str(tmp_path / "a"), fields=("image", "source"))


def test_encoded_output_is_fields_too(photos, tmp_path):
    """``output="encoded"`` is the same interface: the image field holds the stored bytes."""
    from packer.datasets.encoded import collate_encoded

    root, paths = photos
    convert_items([(p, ["a", "b"][: 1 + i % 2], {"i": i}) for i, p in enumerate(paths)], str(tmp_path / "d"), "tar",
                  _opts(), root=root, label_kind="multi")
    enc = open_dataset(str(tmp_path / "d"), output="encoded")
    payload, label, info = enc[1]
    record = enc.read_record(1)
    assert bytes(payload.numpy()) == bytes(record.payload) and info == (record.height, record.width, "jpeg", 1)
    assert torch.equal(label, torch.tensor([1.0, 1.0]))
    batch = collate_encoded([enc[i] for i in range(4)])
    assert batch.labels.shape == (4, 2) and batch.samples.tolist() == [0, 1, 2, 3]
    more = open_dataset(str(tmp_path / "d"), output="encoded", fields=("key", "image", "meta"))
    key, payload2, meta = more[3]
    assert key == ds_key(paths[3], root) and torch.equal(payload2, enc[3][0]) and meta == {"i": 3}


def ds_key(path, root):
    return os.path.relpath(path, root)


def test_a_version_3_table_cut_short_or_with_a_damaged_header_is_refused_at_open(tmp_path):
    """What the open checks of a version 3 table without reading its sections: the header's CRC,
    its sections one after the other as the counts imply, the file's size."""
    from packer.description.samples import SampleTable

    path = str(tmp_path / TABLE_NAME)
    build_table(path, "class", iter([("a.jpg", 1), ("bb.png", Label(0, meta={"x": 1}))]))
    good = open(path, "rb").read()
    moved = bytearray(good)  # the keys section's offset moved by 8, the header's CRC recomputed
    struct.pack_into("<Q", moved, 48 + 2 * 24, struct.unpack_from("<Q", good, 48 + 2 * 24)[0] + 8)
    struct.pack_into("<I", moved, 172, crc32c.crc32c(bytes(moved[:172])))
    for data, said in ((good[:-8], "its header implies"), (good[:20] + b"\x01" + good[21:], "header is damaged"),
                       (good[:100], "shorter than its version 3 header"), (bytes(moved), "keys section is at")):
        open(path, "wb").write(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(CorruptDataError, match=said):
                SampleTable(fd, path, 2)
        finally:
            os.close(fd)
