"""Importing other tools' datasets: MDS (MosaicML Streaming), LitData and Parquet (Hugging Face
``to_parquet`` and plain files), read from fixtures the real libraries wrote
(tests/data/make_import_fixtures.py), converted to LMDB and tar shards and checked sample by sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

import packer
from packer.datasets import open_dataset
from packer.ops.cli import main
from tests.helpers import import_optional, moto_s3

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "importers")
LABELS = [0, 1, 2, 0, 1, 2]
NAMES = ["cat", "dog", "fox"]

import_optional("zstandard", "MDS and LitData tests need zstandard: pip install 'packer[mds]'")
import_optional("snappy", "MDS tests need python-snappy: pip install 'packer[mds]'")
import_optional("brotli", "MDS tests need brotli: pip install 'packer[mds]'")
pa = import_optional("pyarrow", "Parquet tests need pyarrow: pip install 'packer[parquet]'")
Image = import_optional("PIL.Image", "the fixtures' pixels are compared with Pillow's decode")

#: fixture -> (source format, image column kind: the stored image is the JPEG as is, or lossless pixels)
FIXTURES = {
    **{f"mds-jpeg-{c}": ("mds", "jpeg") for c in ("none", "zstd", "gz", "bz2", "snappy", "br")},
    "mds-png-none": ("mds", "pixels"), "mds-pil-none": ("mds", "pixels"), "mds-bytes-none": ("mds", "jpeg"),
    **{f"litdata-jpeg-{c}": ("litdata", "jpeg") for c in ("none", "zstd-chunk", "zstd-batch", "zstd-sample")},
    "litdata-pil-none": ("litdata", "pixels"), "litdata-pil-zstd-batch": ("litdata", "pixels"),
    "hf.parquet": ("parquet", "jpeg"), "plain.parquet": ("parquet", "jpeg"),
}


def _source(i: int, kind: str) -> np.ndarray:
    """Sample ``i``'s pixels as the fixture holds them: the JPEG decoded as packer decodes it, or
    the pixels Pillow decoded when the fixture was written (stored lossless)."""
    path = os.path.join(HERE, "images", f"{i}.jpg")
    if kind == "jpeg":
        return cv2.cvtColor(cv2.imread(path, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    return np.asarray(Image.open(path).convert("RGB"))


def _check(dst: str, name: str) -> None:
    fmt, kind = FIXTURES[name]
    ds = open_dataset(dst, output="numpy", fields=("image", "label", "key", "meta"))
    assert len(ds) == 6
    assert ds.classes == (NAMES if fmt == "parquet" else ["0", "1", "2"])
    seen = set()
    for image, label, key, meta in (ds[j] for j in range(len(ds))):
        i = int(key.rsplit("-", 1)[1])
        seen.add(i)
        assert label == LABELS[i], key
        np.testing.assert_array_equal(image, _source(i, kind), err_msg=key)
        assert meta["caption"] == f"a {NAMES[LABELS[i]]} number {i}"
        assert meta["score"] == 0.5 + i / 8
        if name.startswith("mds"):
            assert meta["extra"] == {"source": "fixture", "tags": [i, i * 2]}
        assert set(meta) == ({"caption", "score", "extra"} if name.startswith("mds") else {"caption", "score"})
    assert seen == set(range(6))


@pytest.mark.parametrize("dst_format", ["lmdb", "tar"])
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_import_keeps_labels_classes_pixels_and_metadata(tmp_path, name, dst_format):
    dst = str(tmp_path / "out")
    rc = main(["convert", FIXTURES[name][0], dst_format, os.path.join(HERE, name), dst, "--workers", "1", "-q"])
    assert rc == 0
    _check(dst, name)
    manifest = json.load(open(os.path.join(dst, "manifest.json")))
    assert manifest["source"]["kind"] == FIXTURES[name][0]


def test_python_api_is_the_command_line(tmp_path):
    report = packer.convert("mds", "lmdb", os.path.join(HERE, "mds-jpeg-zstd"), tmp_path / "a", workers=1, quiet=True)
    assert report.manifest.num_samples == 6
    main(["convert", "mds", "lmdb", os.path.join(HERE, "mds-jpeg-zstd"), str(tmp_path / "b"), "--workers", "1", "-q"])
    a, b = (open_dataset(str(tmp_path / x), output="encoded", fields=("image", "key")) for x in "ab")
    assert [(bytes(x[0].numpy()), x[1]) for x in a] == [(bytes(x[0].numpy()), x[1]) for x in b]


@pytest.mark.parametrize("fmt,name", [("mds", "mds-pkl"), ("litdata", "litdata-pickle")])
def test_pickled_columns_are_refused_never_unpickled(tmp_path, capsys, fmt, name):
    src = os.path.join(HERE, name)
    assert main(["convert", fmt, "lmdb", src, str(tmp_path / "out"), "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "column 'boxes' is pickled" in err and "never unpickles" in err and "--drop-column boxes" in err
    assert not os.path.exists(tmp_path / "out")
    # left out, the rest converts
    report = packer.convert(fmt, "tar", src, tmp_path / "kept", drop_column=["boxes"], workers=1, quiet=True)
    assert report.manifest.num_samples == 6
    assert open_dataset(str(tmp_path / "kept"), fields=("meta",))[0][0] in (None, {})


def _parquet(path, **columns) -> str:
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), str(path))
    return str(path)


def _jpegs(n: int) -> list[bytes]:
    return [open(os.path.join(HERE, "images", f"{i % 6}.jpg"), "rb").read() for i in range(n)]


def test_integer_labels_keep_their_values_in_numeric_order(tmp_path):
    src = _parquet(tmp_path / "x.parquet", image=_jpegs(12), target=list(range(11, -1, -1)))
    packer.convert("parquet", "lmdb", src, tmp_path / "out", workers=1, quiet=True)
    ds = open_dataset(str(tmp_path / "out"), fields=("label", "key"))
    assert ds.classes == [str(i) for i in range(12)]
    assert {key: label for label, key in ds} == {f"item-{i:010d}": 11 - i for i in range(12)}


def test_ambiguous_or_missing_image_column_names_the_columns_and_the_option(tmp_path, capsys):
    two = _parquet(tmp_path / "two.parquet", front=_jpegs(2), back=_jpegs(2), label=[0, 1])
    assert main(["convert", "parquet", "lmdb", two, str(tmp_path / "o"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "2 image columns (front, back)" in err and "--image-column" in err
    report = packer.convert("parquet", "lmdb", two, tmp_path / "o", image_column="back", drop_column=["front"],
                            workers=1, quiet=True)
    assert report.manifest.num_samples == 2
    none = _parquet(tmp_path / "none.parquet", caption=["a", "b"], label=[0, 1])
    assert main(["convert", "parquet", "lmdb", none, str(tmp_path / "p"), "-q"]) == 1
    assert "no image column" in capsys.readouterr().err
    nolabel = _parquet(tmp_path / "nolabel.parquet", image=_jpegs(2), kind=[0, 1])
    assert main(["convert", "parquet", "lmdb", nolabel, str(tmp_path / "q"), "-q"]) == 1
    assert "no label column" in capsys.readouterr().err
    packer.convert("parquet", "lmdb", nolabel, tmp_path / "q", label_column="kind", workers=1, quiet=True)
    assert open_dataset(str(tmp_path / "q"), fields=("label",))[1] == (1,)


def test_import_options_belong_to_import_sources(tmp_path, capsys):
    rc = main(["convert", "imagefolder", "lmdb", str(tmp_path), str(tmp_path / "o"), "--image-column", "x"])
    assert rc == 2
    assert "--image-column applies to list, mds, litdata and parquet sources only" in capsys.readouterr().err


def test_a_missing_extra_is_one_line_naming_it(tmp_path):
    code = ("import sys; sys.modules['zstandard'] = None; from packer.ops.cli import main; "
            f"sys.exit(main(['convert', 'mds', 'lmdb', {os.path.join(HERE, 'mds-jpeg-zstd')!r}, "
            f"{str(tmp_path / 'o')!r}, '-q']))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1 and "pip install 'packer[mds]'" in run.stderr, run.stderr


def test_mds_read_from_s3(tmp_path):
    """An MDS dataset in object storage (moto's S3 server on 127.0.0.1), read shard by shard."""
    import_optional("s3fs", "s3:// tests need s3fs: pip install 'packer[s3]'")
    import boto3

    with moto_s3("data") as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        src = os.path.join(HERE, "mds-jpeg-zstd")
        for name in os.listdir(src):
            client.upload_file(os.path.join(src, name), "data", f"mds/{name}")
        options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint,
                                                                             "region_name": "us-east-1"}}
        packer.convert("mds", "lmdb", "s3://data/mds", tmp_path / "out", storage_option=options, workers=1,
                       quiet=True)
        _check(str(tmp_path / "out"), "mds-jpeg-zstd")
        rc = main(["convert", "mds", "tar", "s3://data/mds", str(tmp_path / "tar"), "--workers", "1", "-q",
                   "--storage-option", f"client_kwargs.endpoint_url={endpoint}", "--storage-option", "key=testing",
                   "--storage-option", "secret=testing"])
        assert rc == 0
        _check(str(tmp_path / "tar"), "mds-jpeg-zstd")
        assert main(["convert", "mds", "tar", "s3://data/nothing", str(tmp_path / "x"), "-q",
                     "--storage-option", f"client_kwargs.endpoint_url={endpoint}"]) == 1


@pytest.mark.parametrize("fmt,name,expected", [
    ("mds", "mds-arrays", lambda i: {"fixed": [float(i), 0.5], "free": [list(range(i + 1))], "count": i, "id": 10 * i}),
    ("litdata", "litdata-arrays", lambda i: {"flag": i % 2 == 0, "grid": [[i, i], [i, i]],
                                             "row": [float(x) for x in range(i + 1)]}),
])
def test_numbers_and_small_arrays_become_metadata(tmp_path, fmt, name, expected):
    packer.convert(fmt, "lmdb", os.path.join(HERE, name), tmp_path / "out", workers=1, quiet=True)
    ds = open_dataset(str(tmp_path / "out"), fields=("label", "key", "meta"))
    for label, key, meta in ds:
        i = int(key.rsplit("-", 1)[1])
        assert label == LABELS[i]
        assert meta == expected(i)


def test_a_pinned_class_list_maps_declared_class_names(tmp_path):
    (tmp_path / "classes.txt").write_text("fox\ndog\ncat\nbird\n")
    src = os.path.join(HERE, "hf.parquet")
    packer.convert("parquet", "lmdb", src, tmp_path / "out", classes_from=str(tmp_path / "classes.txt"), workers=1,
                   quiet=True)
    ds = open_dataset(str(tmp_path / "out"), fields=("label", "key"))
    assert ds.classes == ["fox", "dog", "cat", "bird"]
    assert {key: ds.classes[label] for label, key in ds} == {f"item-{i:010d}": NAMES[c] for i, c in enumerate(LABELS)}


@pytest.mark.parametrize("fmt,name,damaged", [("mds", "mds-jpeg-none", "shard.00000.mds"),
                                              ("mds", "mds-jpeg-zstd", "shard.00001.mds.zstd"),
                                              ("litdata", "litdata-jpeg-none", "chunk-0-1.bin"),
                                              ("litdata", "litdata-jpeg-zstd-batch", "chunk-0-0.bin")])
@pytest.mark.parametrize("damage", ["truncate", "garble"])
def test_damaged_data_is_one_line_naming_the_file(tmp_path, capsys, fmt, name, damaged, damage):
    import shutil

    src = str(tmp_path / "src")
    shutil.copytree(os.path.join(HERE, name), src)
    path = os.path.join(src, damaged)
    data = bytearray(open(path, "rb").read())
    if damage == "truncate":
        data = data[:len(data) // 2]
    else:
        data[4:12] = b"\xee" * 8  # the offset table, or a compressed file's header
    open(path, "wb").write(bytes(data))
    rc = main(["convert", fmt, "lmdb", src, str(tmp_path / "out"), "--workers", "1", "-q"])
    err = capsys.readouterr().err
    if rc == 3:  # the damage fell inside an image's bytes: skipped, named, and reported like any bad image
        assert "item-" in err or "skipped" in err
        return
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert path in err, err


def test_images_by_path_beside_the_parquet_file_and_missing_ones_skipped(tmp_path, capsys):
    import shutil

    for i in range(3):
        shutil.copy(os.path.join(HERE, "images", f"{i}.jpg"), tmp_path / f"{i}.jpg")
    cells = [{"bytes": None, "path": f"{i}.jpg"} for i in range(4)]  # 3.jpg is not there
    src = _parquet(tmp_path / "paths.parquet", image=pa.array(cells), label=["a", "b", "a", "b"])
    assert main(["convert", "parquet", "lmdb", src, str(tmp_path / "out"), "--workers", "1", "-q"]) == 3
    err = capsys.readouterr().err
    assert "skipped item-0000000003: cannot read: No such file" in err, err
    ds = open_dataset(str(tmp_path / "out"), output="numpy", fields=("image", "label", "key"))
    assert ds.classes == ["a", "b"] and len(ds) == 3
    for image, label, key in ds:
        i = int(key.rsplit("-", 1)[1])
        assert label == i % 2
        np.testing.assert_array_equal(image, _source(i, "jpeg"))


def test_a_label_outside_the_declared_classes_names_the_sample(tmp_path, capsys):
    import pyarrow.parquet as pq

    table = pq.read_table(os.path.join(HERE, "hf.parquet"))
    labels = table.column("label").to_pylist()
    labels[4] = -1  # a Hugging Face ClassLabel's "no label"
    table = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels))
    pq.write_table(table, str(tmp_path / "x.parquet"))
    assert main(["convert", "parquet", "lmdb", str(tmp_path / "x.parquet"), str(tmp_path / "o"), "-q"]) == 1
    assert "sample 4: label -1 is not one of the 3 classes" in capsys.readouterr().err


def test_resume_finds_the_same_import_and_no_spool_is_left(tmp_path, capsys):
    src = os.path.join(HERE, "litdata-jpeg-zstd-sample")
    args = ["convert", "litdata", "tar", src, str(tmp_path / "out"), "--workers", "1"]
    assert main(args) == 0
    assert sorted(os.listdir(tmp_path)) == ["out"]  # the images' temporary folder is gone
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    assert "already complete (6 images, same source and options)" in capsys.readouterr().out
