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
from packer.cli import main
from packer.datasets import open_dataset
from tests.helpers import DATA, import_optional, moto_s3

HERE = os.path.join(DATA, "importers")
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
    code = ("import sys; sys.modules['zstandard'] = None; from packer.cli import main; "
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


# -- LitData's json serializer ----------------------------------------------------------------------
def test_litdata_lists_and_dicts_become_metadata(tmp_path):
    """LitData's ``json`` leaves (its compact tagged form, every tag: lists of ints, text, floats,
    bools, records, nested and mixed lists, empty ones) read back as the values written."""
    packer.convert("litdata", "lmdb", os.path.join(HERE, "litdata-json"), tmp_path / "out", workers=1, quiet=True)
    ds = open_dataset(str(tmp_path / "out"), fields=("label", "key", "meta"))
    assert len(ds) == 6
    for label, key, meta in ds:
        i = int(key.rsplit("-", 1)[1])
        assert label == LABELS[i]
        assert meta == {"tags": [i, i * 2], "words": ["a", NAMES[LABELS[i]]], "weights": [0.5, i / 4],
                        "flags": [i % 2 == 0, True], "boxes": [[1, 2, 3, 4 + i]], "mixed": [i, "x", None],
                        "objects": [{"name": NAMES[LABELS[i]], "area": i, "hidden": None}], "empty": [],
                        "extra.source": "fixture", "extra.seen": [i]}


def test_litdata_json_text_and_damaged_values():
    """Earlier LitData versions stored a json leaf as JSON text; bytes after a value or an unknown
    tag are damage, never a guess."""
    import struct

    from packer.sources.importers.litreader import _json_value

    assert _json_value(b'{"a": [1, 2], "b": null}') == {"a": [1, 2], "b": None}
    assert _json_value(b"[1.5]") == [1.5]
    ints = bytes([2]) + struct.pack("<I", 2) + struct.pack("<2q", 7, -1)
    assert _json_value(ints) == [7, -1]
    for bad in (ints + b"\0", bytes([2]) + struct.pack("<I", 3) + struct.pack("<2q", 7, -1), bytes([19]),
                bytes([6]) + struct.pack("<II", 10 ** 9, 0)):  # a billion records of no field
        with pytest.raises(ValueError):
            _json_value(bad)


# -- decompression bounds ---------------------------------------------------------------------------
_ZEROS = bytes(10 << 20)


def _bomb(codec: str, raw: bytes, repeat: int = 60) -> bytes:
    """``raw`` compressed, then 600 MB of zeros in the same codec (members or frames appended, as
    each format allows; brotli and snappy in one stream)."""
    import bz2
    import gzip

    import brotli
    import snappy
    import zstandard

    if codec == "br":
        return brotli.compress(raw + _ZEROS * repeat, quality=1)
    if codec == "snappy":
        return snappy.compress(raw + _ZEROS * repeat)
    one = {"zstd": zstandard.ZstdCompressor().compress, "gz": gzip.compress, "bz2": bz2.compress}[codec]
    zeros = one(_ZEROS)
    return one(raw) + zeros * repeat


def _run_bounded(args: list[str], cwd) -> subprocess.CompletedProcess:
    """``packer convert ARGS`` in a child whose address space may grow 400 MB past what it has
    mapped once packer is imported (RLIMIT_AS)."""
    code = ("import resource, sys\n"
            "import packer.sources.importers.common, packer.sources.importers.mdsreader, packer.sources.importers.litreader\n"
            "import zstandard, snappy, brotli, bz2, zlib, cv2, numpy\n"
            "from packer.cli import main\n"
            "vm = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) * 1024\n"
            "resource.setrlimit(resource.RLIMIT_AS, (vm + (400 << 20), vm + (400 << 20)))\n"
            f"sys.exit(main({args!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.parametrize("codec,ext", [("zstd", "zstd"), ("gz", "gz"), ("bz2", "bz2"), ("snappy", "snappy"),
                                       ("br", "br")])
def test_an_mds_decompression_bomb_is_refused_within_its_bound(tmp_path, codec, ext):
    """A shard that inflates to 600 MB where index.json says a few kB is refused once it passes
    raw_data.bytes, in one line naming it, under a 400 MB memory bound."""
    import bz2
    import gzip
    import shutil

    import brotli
    import snappy
    import zstandard

    src = str(tmp_path / "src")
    shutil.copytree(os.path.join(HERE, f"mds-jpeg-{codec}"), src)
    shard = os.path.join(src, f"shard.00000.mds.{ext}")
    unzip = {"zstd": lambda d: zstandard.ZstdDecompressor().decompressobj().decompress(d), "gz": gzip.decompress,
             "bz2": bz2.decompress, "snappy": snappy.decompress, "br": brotli.decompress}[codec]
    raw = unzip(open(shard, "rb").read())
    open(shard, "wb").write(_bomb(codec, raw))
    run = _run_bounded(["convert", "mds", "lmdb", src, str(tmp_path / "out"), "--workers", "1", "-q"], tmp_path)
    assert run.returncode == 1, run.stderr
    assert run.stderr.count("\n") == 1, run.stderr
    bound = json.load(open(os.path.join(src, "index.json")))["shards"][0]["raw_data"]["bytes"]
    assert f"{shard}: decompresses to more than {bound} bytes (the size index.json gives it in raw_data.bytes)" \
        in run.stderr, run.stderr


def _framed(data: bytes, frame: int, payload: bytes) -> bytes:
    """A LitData framed chunk (LDFZ01) with frame ``frame``'s zstd bytes replaced by ``payload``,
    the frame table's offsets and compressed lengths rewritten, its uncompressed lengths kept."""
    import struct

    _, _, _, n, _, frames = struct.unpack_from("<8sHHIII", data)
    table = 24 + 4 * (n + 1)
    specs = [list(struct.unpack_from("<IIQII", data, table + 24 * f)) for f in range(frames)]
    bodies = [payload if f == frame else data[s[2]:s[2] + s[3]] for f, s in enumerate(specs)]
    at = table + 24 * frames
    head = bytearray(data[:at])
    for f, (spec, body) in enumerate(zip(specs, bodies)):
        spec[2], spec[3] = at, len(body)
        struct.pack_into("<IIQII", head, table + 24 * f, *spec)
        at += len(body)
    return bytes(head) + b"".join(bodies)


def _per_item(data: bytes, payload: bytes) -> bytes:
    """A classic LitData chunk with item 0 replaced by ``payload`` and the offsets rewritten."""
    import struct

    n = struct.unpack_from("<I", data)[0]
    offsets = list(struct.unpack_from(f"<{n + 1}I", data, 4))
    items = [payload] + [data[offsets[i]:offsets[i + 1]] for i in range(1, n)]
    at, new = 4 + 4 * (n + 1), []
    for item in items:
        new.append(at)
        at += len(item)
    return struct.pack(f"<I{n + 1}I", n, *new, at) + b"".join(items)


@pytest.mark.parametrize("level", ["chunk", "batch", "sample"])
def test_a_litdata_decompression_bomb_is_refused_within_its_bound(tmp_path, level):
    """A 65 kB-class chunk that inflates to 600 MB: zstd over the whole file (bounded by the chunk's
    chunk_bytes), a frame of a framed chunk (by the frame table's size) or an item (by twice the
    chunk size LitData targets, at least 256 MiB), refused in one line under a 400 MB bound."""
    import shutil

    import zstandard

    src = str(tmp_path / "src")
    shutil.copytree(os.path.join(HERE, f"litdata-jpeg-zstd-{level}"), src)
    name = "chunk-0-0.zstd.bin" if level == "chunk" else "chunk-0-0.bin"
    path = os.path.join(src, name)
    data = open(path, "rb").read()
    if level == "chunk":
        data = _bomb("zstd", zstandard.ZstdDecompressor().decompressobj().decompress(data))
        said = "the size index.json gives the chunk in chunk_bytes"
    elif level == "batch":
        data = _framed(data, 0, _bomb("zstd", b""))
        said = "the size the chunk's frame table gives frame 0"
    else:
        data = _per_item(data, _bomb("zstd", b""))
        said = "twice the chunk size index.json targets, at least 256 MiB"
    assert len(data) < 65_000
    open(path, "wb").write(data)
    run = _run_bounded(["convert", "litdata", "lmdb", src, str(tmp_path / "out"), "--workers", "1", "-q"], tmp_path)
    assert run.returncode == 1, run.stderr
    assert run.stderr.count("\n") == 1, run.stderr
    assert f"{path}: decompresses to more than" in run.stderr and said in run.stderr, run.stderr


def test_a_frame_table_that_declares_too_much_is_refused_before_decompressing(tmp_path):
    import shutil
    import struct

    src = str(tmp_path / "src")
    shutil.copytree(os.path.join(HERE, "litdata-jpeg-zstd-batch"), src)
    path = os.path.join(src, "chunk-0-0.bin")
    data = bytearray(open(path, "rb").read())
    n = struct.unpack_from("<I", data, 12)[0]
    struct.pack_into("<I", data, 24 + 4 * (n + 1) + 20, 0xFFFFFFFF)  # frame 0's uncompressed length
    open(path, "wb").write(bytes(data))
    run = _run_bounded(["convert", "litdata", "lmdb", src, str(tmp_path / "out"), "-q"], tmp_path)
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert f"{path}: its frame table declares 4294967" in run.stderr, run.stderr


def _mds(tmp_path, columns: dict[str, str], samples: list[dict[str, bytes]], name: str = "src",
         shards: int = 1) -> str:
    """An uncompressed MDS dataset written byte by byte as Streaming writes it (index.json version
    2; each sample: the sizes of its variable-size columns, then the columns), ``shards`` copies of
    the samples in as many shards."""
    import struct

    fixed = {"int": 8, "int64": 8, "uint8": 1, "float64": 8}
    out = tmp_path / name
    out.mkdir()
    entries = []
    for k in range(shards):
        blobs = []
        for s in samples:
            sizes = b"".join(struct.pack("<I", len(s[c])) for c, e in columns.items() if e not in fixed)
            blobs.append(sizes + b"".join(s[c] for c in columns))
        at = 4 + 4 * (len(blobs) + 1)
        offsets = []
        for b in blobs:
            offsets.append(at)
            at += len(b)
        data = struct.pack(f"<I{len(blobs) + 1}I", len(blobs), *offsets, at) + b"".join(blobs)
        basename = f"shard.{k:05d}.mds"
        (out / basename).write_bytes(data)
        entries.append({"column_encodings": list(columns.values()), "column_names": list(columns),
                        "column_sizes": [fixed.get(e) for e in columns.values()], "compression": None,
                        "format": "mds", "hashes": [], "raw_data": {"basename": basename, "bytes": len(data),
                                                                    "hashes": {}},
                        "samples": len(blobs), "size_limit": 1 << 26, "version": 2, "zip_data": None})
    (out / "index.json").write_text(json.dumps({"shards": entries, "version": 2}))
    return str(out)


def test_a_large_value_column_is_refused_before_it_is_decoded(tmp_path, capsys):
    """An 8 MB ndarray per sample: refused at its size, before a list of a million numbers is built."""
    import struct

    jpeg = _jpegs(1)[0]
    big = np.zeros(1 << 20, np.float64).tobytes()
    src = _mds(tmp_path, {"image": "jpeg", "label": "int", "emb": "ndarray:float64:1048576"},
               [{"image": jpeg, "label": struct.pack("<q", 0), "emb": big}])
    assert main(["convert", "mds", "lmdb", src, str(tmp_path / "out"), "-q"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{src}/shard.00000.mds: sample 0: column 'emb' holds {len(big)} bytes, more than metadata can keep" in err
    assert "--drop-column emb" in err
    report = packer.convert("mds", "lmdb", src, tmp_path / "kept", drop_column=["emb"], workers=1, quiet=True)
    assert report.manifest.num_samples == 1


# -- MDS shards unlike shard 0 ---------------------------------------------------------------------
@pytest.mark.parametrize("change,expected", [
    (lambda s: s.update(column_names=["caption", "extra", "image", "lbl", "score"]),
     "shard 1 (shard.00001.mds) is unlike shard 0: it has column 'lbl' where shard 0 has 'label'"),
    (lambda s: s.update(column_encodings=["str", "json", "jpeg", "pkl", "float64"]),
     "shard 1 (shard.00001.mds) is unlike shard 0: its column 'label' has encoding 'pkl' where shard 0's has 'int'"),
    (lambda s: s.update(column_encodings=["str", "json", "jpeg", "int"]),
     "shard 1 (shard.00001.mds): its column_names, column_encodings and column_sizes are missing or do not pair up"),
])
def test_a_shard_unlike_shard_0_is_refused_at_open_naming_shard_and_column(tmp_path, capsys, change, expected):
    import shutil

    src = str(tmp_path / "src")
    shutil.copytree(os.path.join(HERE, "mds-jpeg-none"), src)
    index = json.load(open(os.path.join(src, "index.json")))
    assert len(index["shards"]) > 1
    change(index["shards"][1])
    json.dump(index, open(os.path.join(src, "index.json"), "w"))
    assert main(["convert", "mds", "lmdb", src, str(tmp_path / "out"), "-q"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{src}/index.json: {expected}" in err, err


def test_a_mode_1_image_short_of_bytes_and_numbers_read_as_text_are_refused(tmp_path, capsys):
    import struct

    # an MDS pil value: width, height, mode length, mode, the pixels (mode 1: rows of packed bits)
    short = struct.pack("<3I", 16, 4, 1) + b"1" + b"\xff" * 6  # 16x4 at 1 bit needs 8 bytes
    src = _mds(tmp_path, {"image": "pil", "label": "int"}, [{"image": short, "label": struct.pack("<q", 0)}])
    assert main(["convert", "mds", "lmdb", src, str(tmp_path / "out"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "sample 0, column 'image': a 16x4 mode-1 image needs 8 bytes, not 6" in err, err
    # int64 labels under a str encoding: NUL bytes, not class names
    labels = [{"image": j, "label": struct.pack("<q", i)} for i, j in enumerate(_jpegs(2))]
    src = _mds(tmp_path, {"image": "jpeg", "label": "str"}, labels, name="text")
    assert main(["convert", "mds", "lmdb", src, str(tmp_path / "o2"), "-q"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "sample 0, column 'label' (MDS encoding str): a text value with a NUL byte" in err, err


# -- Parquet images by path ------------------------------------------------------------------------
def test_parquet_paths_outside_the_root_are_refused_unless_allowed(tmp_path, capsys):
    import shutil

    (tmp_path / "data").mkdir()
    (tmp_path / "outside").mkdir()
    shutil.copy(os.path.join(HERE, "images", "0.jpg"), tmp_path / "data" / "0.jpg")
    shutil.copy(os.path.join(HERE, "images", "1.jpg"), tmp_path / "outside" / "1.jpg")
    for name, rel in (("up", "../outside/1.jpg"), ("abs", str(tmp_path / "outside" / "1.jpg"))):
        cells = [{"bytes": None, "path": "0.jpg"}, {"bytes": None, "path": rel}]
        src = _parquet(tmp_path / "data" / f"{name}.parquet", image=pa.array(cells), label=["a", "b"])
        assert main(["convert", "parquet", "lmdb", src, str(tmp_path / name), "--workers", "1", "-q"]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert (f"{src}: 1 row lies outside the Parquet file's folder {tmp_path / 'data'} (no --root given): "
                f"row 1: {rel!r}") in err and "--allow-outside-root" in err, err
        assert not os.path.exists(tmp_path / name)
        assert main(["convert", "parquet", "lmdb", src, str(tmp_path / name), "--workers", "1", "-q",
                     "--allow-outside-root"]) == 0
        assert len(open_dataset(str(tmp_path / name))) == 2
    # --root: the folder paths are relative to, and inside which they must lie
    cells = [{"bytes": None, "path": "data/0.jpg"}, {"bytes": None, "path": "outside/1.jpg"}]
    src = _parquet(tmp_path / "data" / "rooted.parquet", image=pa.array(cells), label=["a", "b"])
    report = packer.convert("parquet", "lmdb", src, tmp_path / "rooted", root=str(tmp_path), workers=1, quiet=True)
    assert report.manifest.num_samples == 2
    src = str(tmp_path / "data" / "up.parquet")  # its row 1: ../outside/1.jpg
    assert main(["convert", "parquet", "lmdb", src, str(tmp_path / "r2"), "-q", "--root",
                 str(tmp_path / "data")]) == 1
    assert f"outside --root {tmp_path / 'data'}: row 1: '../outside/1.jpg'" in capsys.readouterr().err


def test_parquet_text_in_an_image_bytes_field_names_its_column(tmp_path, capsys):
    cells = pa.array([{"bytes": "0.jpg", "path": None}], pa.struct([("bytes", pa.string()), ("path", pa.string())]))
    src = _parquet(tmp_path / "x.parquet", image=cells, label=["a"])
    assert main(["convert", "parquet", "lmdb", src, str(tmp_path / "o"), "-q"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{src}: row 0, column 'image': its bytes hold text ('0.jpg'), not an image file's bytes" in err, err
