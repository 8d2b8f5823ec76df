"""Format -> format and format -> ImageFolder (packer.operations.transcode)."""

from __future__ import annotations

import inspect
import os

import cv2
import numpy as np
import pytest

from packer.datasets import open_dataset
from packer.description.manifest import MANIFEST_NAME, Manifest, read_manifest
from packer.description.registry import format_names
from packer.errors import ImageError, SourceError, UnfinishedDatasetError
from packer.images.imageproc import ProcessedImage, ProcessOptions, parse_encoding, parse_resize
from packer.operations.transcode import COPY, convert_dataset, processing_for, safe_relpath
from packer.pipeline.engine import ConvertOptions, temp_dir_for, write_packed
from packer.pipeline.scan import scan_imagefolder
from tests.helpers import draw, make_folder, tree
from tests.helpers import pack as _pack

FORMATS = format_names()


def pack(src, dst, fmt, encode="keep", resize="none", **kw):
    return _pack(src, dst, fmt, encode, resize, workers=1, **kw)


def reprocessing(encode="keep", resize="none", reduced_decode=True, **kw):
    processing = ProcessOptions(resize=parse_resize(resize), encoding=parse_encoding(encode), reduced_decode=reduced_decode)
    return ConvertOptions(processing=processing, **kw)


def records(path):
    ds = open_dataset(path, output="numpy")
    return [(r.key, r.label, r.codec, r.height, r.width, bytes(r.payload)) for r in map(ds.read_record, range(len(ds)))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_imagefolder_round_trip_with_keep_is_byte_identical(tiny_folder, tmp_path, fmt):
    src, _ = tiny_folder
    pack(src, tmp_path / "packed", fmt, encode="keep")
    report = convert_dataset(tmp_path / "packed", tmp_path / "back", fmt, "imagefolder")
    assert tree(tmp_path / "back") == tree(src)
    assert report.renamed == [] and report.skipped == [] and report.copied
    assert scan_imagefolder(str(tmp_path / "back")).classes == scan_imagefolder(src).classes
    assert sorted(os.listdir(tmp_path)) == ["back", "packed", "src"]  # no temp folder left


@pytest.mark.parametrize("src_fmt", FORMATS)
@pytest.mark.parametrize("dst_fmt", FORMATS)
def test_packed_to_packed_copies_bytes_labels_keys_and_facts(tiny_folder, tmp_path, src_fmt, dst_fmt):
    src, _ = tiny_folder
    (tmp_path / "src" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    pack(src, tmp_path / "a", src_fmt, encode="jpeg:80", seed=7)
    convert_dataset(tmp_path / "a", tmp_path / "b", src_fmt, dst_fmt)
    ma, mb = read_manifest(tmp_path / "a"), read_manifest(tmp_path / "b")
    assert records(tmp_path / "a") == records(tmp_path / "b")
    assert mb.format == dst_fmt and mb.classes == ma.classes and mb.processing == ma.processing
    assert mb.shuffle_seed == 7 and mb.num_samples == ma.num_samples
    assert [s.path for s in mb.skipped] == [s.path for s in ma.skipped] == ["dog/broken.jpg"]
    assert mb.source["kind"] == src_fmt and mb.source["copied"] is True
    assert mb.source["source"]["kind"] == "imagefolder"


@pytest.mark.parametrize("dst_fmt", FORMATS)
def test_a_copy_writes_the_bytes_a_conversion_of_the_same_items_writes(tiny_folder, tmp_path, dst_fmt):
    """Through the one funnel, a packed source's copy gives the files (payload files, indexes, the
    sample table) that the image folder gives converted straight to that format: byte for byte;
    the manifests differ only in the source they name."""
    src, _ = tiny_folder
    (tmp_path / "src" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    pack(src, tmp_path / "straight", dst_fmt, encode="jpeg:80", seed=7)
    pack(src, tmp_path / "a", "lmdb", encode="jpeg:80", seed=7)
    convert_dataset(tmp_path / "a", tmp_path / "b", "lmdb", dst_fmt, ConvertOptions(processing=COPY, workers=2))
    straight, copied = tree(tmp_path / "straight"), tree(tmp_path / "b")
    assert straight.keys() == copied.keys()
    inside = {"data.h5"} if dst_fmt == "hdf5" else set()  # HDF5 keeps the manifest inside its file too
    assert {k: v for k, v in straight.items() if k not in {MANIFEST_NAME, *inside}} == {
        k: v for k, v in copied.items() if k not in {MANIFEST_NAME, *inside}}
    ms, mb = read_manifest(tmp_path / "straight").to_json(), read_manifest(tmp_path / "b").to_json()
    for entry in (*ms["files"], *mb["files"]):
        if entry["name"] in inside:
            del entry["sha256"]
    assert mb.pop("source")["source"] == ms.pop("source") and mb == ms
    if inside:
        assert _hdf5_contents(tmp_path / "straight" / "data.h5") == _hdf5_contents(tmp_path / "b" / "data.h5")


def _hdf5_contents(path) -> dict[str, bytes | str]:
    """Every dataset's bytes and every attribute of an HDF5 file, the manifest attribute left out."""
    import h5py

    out: dict[str, bytes | str] = {}
    with h5py.File(path, "r") as f:
        def add(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()].tobytes() if obj.dtype.kind != "O" else repr(obj[()].tolist())
            out.update({f"{name}@{k}": repr(v) for k, v in obj.attrs.items()})
        f.visititems(add)
        out.update({f"@{k}": repr(v) for k, v in f.attrs.items() if k != "manifest"})
    return out


def test_copy_is_deterministic(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "a", "lmdb", encode="png")
    convert_dataset(tmp_path / "a", tmp_path / "b1", "lmdb", "hdf5")
    convert_dataset(tmp_path / "a", tmp_path / "b2", "lmdb", "hdf5", ConvertOptions(processing=COPY, workers=2))
    assert (tmp_path / "b1" / "data.h5").read_bytes() == (tmp_path / "b2" / "data.h5").read_bytes()
    assert (tmp_path / "b1" / MANIFEST_NAME).read_bytes() == (tmp_path / "b2" / MANIFEST_NAME).read_bytes()


@pytest.mark.parametrize("workers", [1, 2])
def test_asking_for_other_processing_reprocesses(tiny_folder, tmp_path, workers):
    src, _ = tiny_folder
    pack(src, tmp_path / "a", "hdf5", encode="jpeg:90")
    report = convert_dataset(tmp_path / "a", tmp_path / "b", "hdf5", "lmdb",
                             reprocessing("png", "16x12", reduced_decode=False, workers=workers))
    assert not report.copied
    m = read_manifest(tmp_path / "b")
    assert m.processing["resize"] == "16x12" and m.processing["encoding"] == "png"
    assert m.source["processing"]["encoding"] == "jpeg:90" and m.source["copied"] is False
    a, b = open_dataset(tmp_path / "a", output="numpy"), open_dataset(tmp_path / "b", output="numpy")
    keys_a = [a.read_record(i).key for i in range(len(a))]
    assert keys_a == [b.read_record(i).key for i in range(len(b))]  # same order
    for i in range(len(b)):
        rec = b.read_record(i)
        assert rec.codec == "png" and (rec.height, rec.width) == (12, 16)
        want = cv2.resize(a.load(i)[0], (16, 12), interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(b.load(i)[0], want)


def test_raw_source_reprocessed_with_keep_stays_raw(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "a", "hdf5", encode="raw")
    convert_dataset(tmp_path / "a", tmp_path / "b", "hdf5", "hdf5", reprocessing("keep", "shorter:20"))
    b = open_dataset(tmp_path / "b", output="numpy")
    assert {b.read_record(i).codec for i in range(len(b))} == {"raw"}
    assert all(min(b.load(i)[0].shape[:2]) == 20 for i in range(len(b)))


def test_raw_unpacks_to_lossless_png_with_matching_extensions(tiny_folder, tmp_path):
    src, pixels = tiny_folder
    pack(src, tmp_path / "a", "hdf5", encode="raw")
    convert_dataset(tmp_path / "a", tmp_path / "back", "hdf5", "imagefolder")
    files = tree(tmp_path / "back")
    want = {os.path.splitext(rel)[0] + ".png" for rel in pixels}
    assert set(files) == want
    for rel, rgb in pixels.items():
        got = cv2.cvtColor(cv2.imread(str(tmp_path / "back" / (os.path.splitext(rel)[0] + ".png"))), cv2.COLOR_BGR2RGB)
        if rel.endswith(".png"):
            np.testing.assert_array_equal(got, rgb)


def test_reprocessed_unpack_uses_the_new_codec(tiny_folder, tmp_path):
    src, pixels = tiny_folder
    pack(src, tmp_path / "a", "lmdb", encode="png")
    convert_dataset(tmp_path / "a", tmp_path / "back", "lmdb", "imagefolder", reprocessing("jpeg:70"))
    want = {r if r.lower().endswith((".jpg", ".jpeg")) else os.path.splitext(r)[0] + ".jpg" for r in pixels}
    assert set(tree(tmp_path / "back")) == want  # .png names now holding JPEGs are renamed


def _hostile(tmp_path, fmt):
    """A packed dataset whose keys and class names try to escape, collide or hide."""
    rng = np.random.default_rng(0)
    ok, buf = cv2.imencode(".png", draw(rng, 6, 6))
    img = ProcessedImage("png", buf.tobytes(), 6, 6)
    keys = [
        ("../../escape.png", 0), ("/etc/passwd.png", 0), ("a/../../../b.png", 0), ("..\\..\\win.png", 1),
        (".hidden.png", 1), ("good/x.png", 0), ("good/x.png", 0), ("", 1), ("ctrl\x00\x07name.png", 1),
        ("../up/ok.png", 2), ("n" * 300 + ".png", 0),
    ]
    template = Manifest(format=fmt, num_samples=0, classes=["good", "..", "../up"], processing={}, files=[])
    items = ((k, lab, img, None) for k, lab in keys)
    write_packed(str(tmp_path / "evil"), fmt, items, template, ConvertOptions())
    return keys


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_hostile_keys_stay_inside_the_destination(tmp_path, fmt):
    keys = _hostile(tmp_path, fmt)
    (tmp_path / "dst_parent").mkdir()
    dst = tmp_path / "dst_parent" / "out"
    report = convert_dataset(tmp_path / "evil", dst, fmt, "imagefolder")
    assert os.listdir(tmp_path / "dst_parent") == ["out"]
    assert sorted(os.listdir(tmp_path)) == ["dst_parent", "evil"]  # nothing escaped
    files = tree(dst)
    assert len(files) == len(keys) and report.manifest.num_samples == len(keys)
    real = os.path.realpath(dst)
    for rel in files:
        parts = rel.split(os.sep)
        assert not any(p in ("", ".", "..") or p.startswith(".") for p in parts), rel
        assert os.path.realpath(os.path.join(dst, rel)).startswith(real + os.sep)
        assert all(len(p.encode()) <= 255 and "\x00" not in p for p in parts)
    renamed = {k for k, _, _ in report.renamed}
    assert {"../../escape.png", "/etc/passwd.png", "a/../../../b.png", ".hidden.png", "good/x.png", ""} <= renamed
    assert "class '..'" in renamed and "class '../up'" in renamed
    # Every class has its folder, in the same sorted order, so labels survive a re-scan.
    assert len(scan_imagefolder(str(dst)).classes) == 3


def test_safe_relpath():
    assert safe_relpath("cat/a.jpg") == (["cat", "a.jpg"], [])
    assert safe_relpath("../../x")[0] == ["x"]
    assert safe_relpath("/abs/x")[0] == ["abs", "x"] and "absolute path" in safe_relpath("/abs/x")[1]
    assert safe_relpath("a\\..\\..\\b")[0] == ["a", "b"]
    assert safe_relpath(".git/config")[0] == ["_.git", "config"]


def test_corrupt_source_samples_are_skipped_or_fatal(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "a", "hdf5", encode="png")
    ds = open_dataset(tmp_path / "a")
    ds._ensure_open()
    start = int(ds._meta.offsets[3])
    off = int(ds._meta.table[start // ds._meta.chunk]) + start % ds._meta.chunk + 20
    with open(tmp_path / "a" / "data.h5", "r+b") as f:
        f.seek(off)
        f.write(b"\x00\x01\x02\x03")
    report = convert_dataset(tmp_path / "a", tmp_path / "b", "hdf5", "lmdb")
    assert [s.path for s in report.skipped] == ["sample 3"] and "checksum" in report.skipped[0].reason
    assert read_manifest(tmp_path / "b").num_samples == len(ds) - 1
    assert "sample 3" in [s.path for s in read_manifest(tmp_path / "b").skipped]
    with pytest.raises(ImageError, match="sample 3"):
        convert_dataset(tmp_path / "a", tmp_path / "c", "hdf5", "imagefolder", ConvertOptions(processing=COPY, strict=True))
    assert not (tmp_path / "c").exists() and not os.path.exists(temp_dir_for(str(tmp_path / "c")))


def test_destination_rules(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "a", "lmdb")
    pack(src, tmp_path / "b", "hdf5", seed=1)
    with pytest.raises(FileExistsError, match="--overwrite"):
        convert_dataset(tmp_path / "a", tmp_path / "b", "lmdb", "hdf5")
    with pytest.raises(SourceError, match="is the source"):
        convert_dataset(tmp_path / "a", tmp_path / "a", "lmdb", "lmdb", ConvertOptions(processing=COPY, overwrite=True))
    with pytest.raises(SourceError, match="inside the source"):
        convert_dataset(tmp_path / "a", tmp_path / "a" / "x", "lmdb", "imagefolder")
    with pytest.raises(SourceError, match="holds a lmdb dataset"):
        convert_dataset(tmp_path / "a", tmp_path / "c", "hdf5", "lmdb")
    with pytest.raises(SourceError, match="does not exist"):
        convert_dataset(tmp_path / "missing", tmp_path / "b", "lmdb", "hdf5", ConvertOptions(processing=COPY, overwrite=True))
    with pytest.raises(ValueError, match="unknown format"):
        convert_dataset(tmp_path / "a", tmp_path / "c", "lmdb", "zip")
    assert read_manifest(tmp_path / "b").shuffle_seed == 1  # failed replacements left it alone
    convert_dataset(tmp_path / "a", tmp_path / "b", "lmdb", "hdf5", ConvertOptions(processing=COPY, overwrite=True))
    assert read_manifest(tmp_path / "b").shuffle_seed == 0
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "src"]


def test_source_without_manifest(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "a", "lmdb")
    os.remove(tmp_path / "a" / MANIFEST_NAME)
    with pytest.raises(UnfinishedDatasetError, match="did not finish"):
        convert_dataset(tmp_path / "a", tmp_path / "b", "lmdb", "hdf5")


def _has_format_kw():
    return "format" in inspect.signature(open_dataset).parameters and "tar" in FORMATS


@pytest.mark.skipif(not _has_format_kw(), reason="needs open_dataset(path, format='tar') and the tar format")
def test_foreign_webdataset_shards_convert_without_a_manifest(tmp_path):
    import webdataset as wds

    rng = np.random.default_rng(0)
    (tmp_path / "shards").mkdir()
    want = {}
    with wds.ShardWriter(str(tmp_path / "shards" / "s-%06d.tar"), maxcount=5, verbose=0) as sink:
        for i in range(12):
            ok, buf = cv2.imencode(".jpg", draw(rng, 10, 14))
            want[f"k{i:03d}"] = (buf.tobytes(), i % 3)
            sink.write({"__key__": f"k{i:03d}", "jpg": buf.tobytes(), "cls": i % 3})
    convert_dataset(tmp_path / "shards", tmp_path / "h", "tar", "hdf5")
    got = {r[0]: (r[5], r[1]) for r in records(tmp_path / "h")}
    assert got == want
    convert_dataset(tmp_path / "h", tmp_path / "folder", "hdf5", "imagefolder")
    assert len(tree(tmp_path / "folder")) == 12


def test_processing_for_cli_rules(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "a", "lmdb", encode="webp:70")
    m = read_manifest(tmp_path / "a")
    assert processing_for(m, None, None) == COPY
    p = processing_for(m, "shorter:8", None)
    assert str(p.resize) == "shorter:8" and str(p.encoding) == "webp:70"  # the source's encoding
    p = processing_for(m, None, "png")
    assert str(p.resize) == "none" and str(p.encoding) == "png"
    assert str(processing_for(None, "8x8", None).encoding) == "keep"


def test_empty_classes_keep_their_folder(tmp_path):
    make_folder(str(tmp_path / "src"), {"a": [("1.png", 8, 8)], "c": [("2.png", 8, 8)]})
    (tmp_path / "src" / "b").mkdir()
    pack(str(tmp_path / "src"), tmp_path / "p", "hdf5")
    convert_dataset(tmp_path / "p", tmp_path / "back", "hdf5", "imagefolder")
    assert sorted(os.listdir(tmp_path / "back")) == ["a", "b", "c"]
    assert tree(tmp_path / "back") == tree(tmp_path / "src")
