"""Other tools' shards: tar member names, compressed tar and TFRecord files, TFRecord file names,
labels and conventions, huge or negative labels."""

from __future__ import annotations

import os
import shutil

import pytest

from packer.cli import main
from tests.datasets.test_dataset_identity import _two_datasets
from tests.helpers import _src
from tests.images.test_damaged_images import _jpeg


@pytest.mark.parametrize("label", [b"300000000", b"9223372036854775808", b"-5"])
def test_huge_or_negative_foreign_labels_are_one_clear_error(tmp_path, label):
    import io
    import tarfile

    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    root = tmp_path / "shards"
    root.mkdir()
    with tarfile.open(root / "a-000000.tar", "w") as tf:
        for name, data in (("k.jpg", _jpeg()), ("k.cls", label)):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    with pytest.raises(CorruptDataError, match="label|classes|class number"):
        open_dataset(str(root), format="tar")


@pytest.mark.parametrize("name", ["train.tfrecords", "train.tfr", "train-00000-of-01024"])
def test_other_tools_tfrecord_names_read_every_sample(tmp_path, name):
    from packer.datasets import StreamingDataset, open_dataset

    dst, _ = _two_datasets(tmp_path, "tfrecord")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    shutil.copyfile(os.path.join(dst, "shard-000000.tfrecord"), foreign / name)
    where = str(foreign / name) if "-of-" in name else str(foreign)
    ds = open_dataset(where, format="tfrecord")
    assert len(ds) == 12 and all(ds[i][1] in (0, 1) for i in range(12))
    assert len(list(StreamingDataset(where, format="tfrecord", shuffle=False))) == 12


# -- other tools' files: names, compression ------------------------------------------------------------------
@pytest.mark.parametrize("dst_kind", ["lmdb", "imagefolder"])
def test_foreign_tar_member_names_that_are_not_utf8_are_read(tmp_path, capsys, dst_kind):
    import io
    import tarfile

    from packer.datasets import open_dataset

    root = tmp_path / "shards"
    root.mkdir()
    with tarfile.open(root / "s-000000.tar", "w", format=tarfile.GNU_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as tf:
        for key in (b"ok", b"caf\xe9", b"caf\xe8"):
            for ext, data in ((b".jpg", _jpeg()), (b".cls", b"1")):
                ti = tarfile.TarInfo((key + ext).decode("utf-8", "surrogateescape"))
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    dst = str(tmp_path / "out")
    assert main(["convert", "tar", dst_kind, str(root), dst, "-q"]) == 0, capsys.readouterr().err
    if dst_kind == "imagefolder":
        names = sorted(os.listdir(os.path.join(dst, "1")))
        assert len(names) == 3 and "ok.jpg" in names and all(n.encode("utf-8") for n in names)
    else:
        ds = open_dataset(dst)
        assert sorted(ds.read_record(i).key for i in range(3)) == ["caf\ufffd", "caf\ufffd", "ok"]


@pytest.mark.parametrize("length", [2**63 - 1, 2**64 - 1, -16])
def test_tfrecord_index_lengths_beyond_int64_are_one_line(tmp_path, length):
    """A packer .idx (manifest forged to match) with a record length of 2^63-1 overflowed numpy with
    a RuntimeWarning and a negative size in the message; 2^64-1 raised OverflowError."""
    from tests.helpers import forge_manifest_sizes

    dst, _ = _two_datasets(tmp_path, "tfrecord")
    idx = os.path.join(dst, "shard-000000.idx")
    lines = open(idx).read().split("\n")
    lines[1] = f"{lines[1].split()[0]} {length}"
    open(idx, "w").write("\n".join(lines))
    forge_manifest_sizes(dst)
    import warnings

    from packer.operations.verify import verify_dataset

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rep = verify_dataset(dst)
    assert not rep.ok and any("cannot open: TFRecord index" in p for p in rep.problems), rep.problems


@pytest.mark.parametrize("compression", ["ZLIB", "gzip"])
def test_compressed_foreign_tfrecord_is_told_for_what_it_is(tmp_path, capsys, compression):
    import gzip
    import zlib

    dst, _ = _two_datasets(tmp_path, "tfrecord")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    raw = open(os.path.join(dst, "shard-000000.tfrecord"), "rb").read()
    (foreign / "train.tfrecord").write_bytes(zlib.compress(raw) if compression == "ZLIB" else gzip.compress(raw))
    for argv in (["convert", "tfrecord", "lmdb", str(foreign), str(tmp_path / "o")], ["info", str(foreign)]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{compression}-compressed" in err and "checksum" not in err, err


def test_compressed_tar_shards_are_told_for_what_they_are(tmp_path, capsys):
    import gzip

    from packer.datasets import open_dataset

    dst, _ = _two_datasets(tmp_path, "tar")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "a-000000.tar.gz").write_bytes(gzip.compress(open(os.path.join(dst, "shard-000000.tar"), "rb").read()))
    for argv in (["convert", "tar", "lmdb", str(foreign), str(tmp_path / "o")], ["info", str(foreign)]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "compressed tar shards" in err and "gunzip a-000000.tar.gz" in err, err
    with pytest.raises(ValueError, match="compressed tar shards"):
        open_dataset(str(foreign / "a-000000.tar.gz"), format="tar")


# -- TFRecord labels other tools read, and other tools' TFRecord conventions ------------------------
def _jpgs(tmp_path, n=3):
    root = _src(tmp_path, "jpgs", n)
    return [open(os.path.join(root, "a", f"a{i}.jpg"), "rb").read() for i in range(n)]


def test_an_unlabelled_multi_label_sample_is_an_empty_int64_list(tmp_path):
    """TensorFlow's parse_single_example stopped at an empty *bytes* list under an int64 key; the
    ``tfrecord`` package's typed loader refuses it the same way."""
    from tfrecord.reader import tfrecord_loader

    from packer.datasets import open_dataset
    from packer.layouts.tfexample import example_class
    from packer.layouts.tfrecord import image_record
    from packer.pipeline.engine import ConvertOptions
    from packer.pipeline.items import convert_items

    root = _src(tmp_path, "root")
    items = [(os.path.join(root, "a", "a0.jpg"), [], None), (os.path.join(root, "a", "a1.jpg"), ["a", "b"], None),
             (os.path.join(root, "b", "b0.png"), [], None)]
    dst = str(tmp_path / "d")
    convert_items(items, dst, "tfrecord", ConvertOptions(workers=1, shuffle=False), root=root, label_kind="multi")
    rows = list(tfrecord_loader(os.path.join(dst, "shard-000000.tfrecord"), None, {"image/class/label": "int"}))
    assert [r["image/class/label"].tolist() for r in rows] == [[], [0, 1], []]
    assert open_dataset(dst).targets == [[], [0, 1], []]
    old = example_class()()  # what earlier versions wrote: an empty bytes list, still read as no class
    old.features.feature["image/encoded"].bytes_list.value.append(b"x")
    old.features.feature["image/class/label"].bytes_list.SetInParent()
    assert image_record(example_class(), memoryview(old.SerializeToString()), "f", 0, 0).label == -1


def _foreign(tmp_path, records):
    from tfrecord.writer import TFRecordWriter

    where = tmp_path / "foreign"
    where.mkdir()
    w = TFRecordWriter(str(where / "part-00000.tfrecord"))
    for r in records:
        w.write(r)
    w.close()
    return str(where)


@pytest.mark.parametrize("label, why", [
    (([1, 2], "int"), r"image/class/label holds 2 values \(1, 2\); packer reads one class per record"),
    ((b"cat", "byte"), r"image/class/label holds bytes \(b'cat'\), not int64 class numbers"),
    (([0.5], "float"), r"image/class/label holds floats \(0.5\), not int64 class numbers"),
    (([], "int"), r"image/class/label holds no value"),
])
def test_foreign_tfrecord_labels_that_are_not_one_class_number_are_refused_naming_the_record(tmp_path, label,
                                                                                              why):
    """A multi-valued label was read as its first value, a bytes label said '-1 is negative'."""
    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    jpgs = _jpgs(tmp_path)
    where = _foreign(tmp_path, [{"image/encoded": (jpgs[0], "byte"), "image/class/label": (0, "int")},
                                {"image/encoded": (jpgs[1], "byte"), "image/class/label": label}])
    with pytest.raises(CorruptDataError, match=why) as e:
        open_dataset(where, format="tfrecord")
    assert e.value.path.endswith("part-00000.tfrecord") and e.value.sample == 1
    assert main(["info", where]) == 1


def test_foreign_tfrecords_in_tensorflows_image_raw_and_label_convention_are_read(tmp_path):
    import cv2
    import numpy as np

    from packer.datasets import open_dataset

    jpgs = _jpgs(tmp_path)
    where = _foreign(tmp_path, [{"image_raw": (data, "byte"), "label": (i % 2, "int"), "height": (24, "int"),
                                 "width": (24, "int"), "depth": (3, "int")} for i, data in enumerate(jpgs)])
    ds = open_dataset(where, format="tfrecord", output="numpy", fields=("image", "label", "meta"))
    assert [ds[i][1] for i in range(3)] == [0, 1, 0] and ds.classes == ["0", "1"]
    want = cv2.cvtColor(cv2.imdecode(np.frombuffer(jpgs[2], np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    np.testing.assert_array_equal(ds[2][0], want)
    assert ds[2][2] == {"depth": 3} and ds.read_record(2).height == 24
    assert main(["convert", "tfrecord", "lmdb", where, str(tmp_path / "l"), "-q"]) == 0
