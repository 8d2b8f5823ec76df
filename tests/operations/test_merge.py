"""merge: one dataset from parts made separately; stored bytes copied, classes united by name."""

from __future__ import annotations

import os

import pytest

from packer.cli import main
from packer.datasets import open_dataset
from packer.description.manifest import read_manifest
from packer.errors import SourceError, UnfinishedDatasetError
from packer.images.imageproc import ProcessOptions, parse_encoding
from packer.operations.merge import merge, merged_classes
from packer.operations.verify import verify_dataset
from packer.pipeline.engine import ConvertOptions
from packer.pipeline.items import convert_items
from tests.helpers import DATA, make_folder

FORMATS = ["lmdb", "hdf5", "tar", "tfrecord"]
CLASSES = ["cat", "dog", "eel"]


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("merge") / "src")
    make_folder(root, {"cat": [("c0.jpg", 30, 40), ("c1.png", 24, 24), ("c2.jpg", 20, 28)],
                       "dog": [("d0.jpg", 40, 30), ("d1.jpg", 20, 20)], "eel": [("e0.png", 22, 26), ("e1.jpg", 18, 30)]})
    return [(os.path.join(root, c, n), c, None) for c in CLASSES for n in sorted(os.listdir(os.path.join(root, c)))]


def _convert(items, dst, fmt, encode="jpeg:90", classes=CLASSES, **writer):
    from packer.converters.base import WriterOptions

    opts = ConvertOptions(processing=ProcessOptions(encoding=parse_encoding(encode)), writer=WriterOptions(**writer))
    return convert_items(items, str(dst), fmt, opts, classes=classes)


def _samples(path):
    """(key, class name, stored bytes) of every sample, through read_record (checksums checked)."""
    ds = open_dataset(str(path))
    try:
        return [(r.key, ds.classes[r.label], bytes(r.payload)) for r in map(ds.read_record, range(len(ds)))]
    finally:
        ds.close()


def _shard_writer(fmt):
    return {"shard_samples": 2} if fmt in ("tar", "tfrecord") else {}


@pytest.mark.parametrize("fmt", FORMATS)
def test_merge_same_classes(items, tmp_path, fmt):
    """Parts with the full class list merge into what one conversion of all items holds; shards are
    copied unchanged (same bytes, same ids), and verify passes."""
    _convert(items, tmp_path / "all", fmt, **_shard_writer(fmt))
    _convert(items[:3], tmp_path / "a", fmt, **_shard_writer(fmt))
    _convert(items[3:], tmp_path / "b", fmt, **_shard_writer(fmt))
    report = merge([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
    assert _samples(tmp_path / "m") == _samples(tmp_path / "all")
    m = read_manifest(str(tmp_path / "m"))
    assert m.num_samples == len(items) and m.classes == CLASSES and report.labels == [[0, 1, 2], [0, 1, 2]]
    assert m.source["kind"] == "merge" and [p["samples"] for p in m.source["parts"]] == [3, 4]
    assert verify_dataset(str(tmp_path / "m")).ok
    if fmt in ("tar", "tfrecord"):
        parts = [f for p in ("a", "b") for f in read_manifest(str(tmp_path / p)).files if f.samples]
        merged = [f for f in m.files if f.samples]
        assert [(f.sha256, f.id) for f in merged] == [(f.sha256, f.id) for f in parts]
        assert [f.first for f in merged] == [0, 2, 3, 5]
        assert report.copied_files == 4 and report.rewritten_files == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_merge_renumbers_labels(items, tmp_path, fmt):
    """Classes are united in first-seen order; the second part's labels are renumbered without
    re-encoding (shards rewritten with new ids, checksums valid)."""
    a = [it for it in items if it[1] in ("cat", "dog")]
    b = [it for it in items if it[1] == "eel"][::-1]
    _convert(a, tmp_path / "a", fmt, classes=None)
    _convert(b, tmp_path / "b", fmt, classes=["eel", "dog"])
    report = merge([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "m"))
    assert report.manifest.classes == ["cat", "dog", "eel"] and report.labels == [[0, 1], [2, 1]]
    assert _samples(tmp_path / "m") == _samples(tmp_path / "a") + _samples(tmp_path / "b")
    assert verify_dataset(str(tmp_path / "m")).ok
    if fmt in ("tar", "tfrecord"):
        old = {f.id for f in read_manifest(str(tmp_path / "b")).files if f.samples}
        new = [f.id for f in report.manifest.files if f.samples]
        assert report.copied_files == 1 and report.rewritten_files == 1 and new[0] not in old and new[1] not in old


def test_merged_classes_first_seen():
    assert merged_classes([["b", "a"], ["c", "a"], []]) == (["b", "a", "c"], [[0, 1], [2, 1], []])


def test_merge_refusals(items, tmp_path):
    _convert(items[:2], tmp_path / "a", "tar")
    _convert(items[2:4], tmp_path / "b", "tar", encode="jpeg:80")
    _convert(items[4:], tmp_path / "c", "lmdb")
    with pytest.raises(SourceError, match=r"encoding is 'jpeg:80' in .*b but 'jpeg:90' in .*a"):
        merge([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
    with pytest.raises(SourceError, match="is lmdb but part .* is tar"):
        merge([tmp_path / "a", tmp_path / "c"], tmp_path / "m")
    with pytest.raises(SourceError, match="given twice"):
        merge([tmp_path / "a", tmp_path / "a"], tmp_path / "m")
    os.makedirs(tmp_path / "unfinished")
    with pytest.raises(UnfinishedDatasetError):
        merge([tmp_path / "a", tmp_path / "unfinished"], tmp_path / "m")
    with pytest.raises(FileExistsError):
        merge([tmp_path / "a"], tmp_path / "c")
    with pytest.raises(SourceError):
        merge([tmp_path / "a"], tmp_path / "a" / "inside")
    assert not os.path.exists(tmp_path / "m") and not os.path.exists(tmp_path / ".m.packer-tmp")


def test_merge_cli(items, tmp_path, capsys):
    _convert(items[:3], tmp_path / "a", "tfrecord", classes=None)
    _convert(items[3:], tmp_path / "b", "tfrecord", classes=None)
    rc = main(["merge", str(tmp_path / "m"), str(tmp_path / "a"), str(tmp_path / "b")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"labels of {tmp_path / 'a'}: unchanged" in out
    assert f"labels of {tmp_path / 'b'}: 'dog' 0 -> 1, 'eel' 1 -> 2" in out
    assert "merged 7 images in 3 classes from 2 parts" in out
    rc = main(["merge", str(tmp_path / "m"), str(tmp_path / "a")])
    assert rc == 1 and "destination exists" in capsys.readouterr().err
    assert main(["merge", str(tmp_path / "m"), str(tmp_path / "a"), "--overwrite"]) == 0
    assert read_manifest(str(tmp_path / "m")).num_samples == 3


@pytest.mark.parametrize(("fmt", "encode", "writer"), [("tfrecord", "png", {"gzip": True}), ("tar", "raw", {}),
                                                        ("hdf5", "raw", {})])
def test_merge_gzip_and_raw(items, tmp_path, fmt, encode, writer):
    """gzip TFRecord (``.zidx`` copied, shards rewritten compressed) and raw pixels merge, copied
    and renumbered."""
    _convert(items[:3], tmp_path / "a", fmt, encode, classes=None, **writer)
    _convert(items[3:], tmp_path / "b", fmt, encode, classes=None, **writer)
    _convert(items[3:], tmp_path / "c", fmt, encode, classes=["dog", "eel", "cat"], **writer)
    merge([tmp_path / "a", tmp_path / "c", tmp_path / "b"], tmp_path / "m")
    want = _samples(tmp_path / "a") + _samples(tmp_path / "c") + _samples(tmp_path / "b")
    assert _samples(tmp_path / "m") == want
    assert verify_dataset(str(tmp_path / "m")).ok


def test_merge_damaged_part(items, tmp_path):
    """A part whose shard no longer matches its manifest is refused, naming it; nothing is left."""
    _convert(items[:3], tmp_path / "a", "tar")
    shard = tmp_path / "a" / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"part .*a: shard-000000.tar differs from its manifest"):
        merge([tmp_path / "a"], tmp_path / "m")
    assert not os.path.exists(tmp_path / "m") and not os.path.exists(tmp_path / ".m.packer-tmp")


def test_merge_refuses_version_1(items, tmp_path):
    """A packer 0.1 part has no file ids to keep: converting it first is the way."""
    import tarfile

    with tarfile.open(os.path.join(DATA, "v1-datasets.tar.gz")) as tf:
        tf.extractall(tmp_path, filter="data")
    _convert(items[:2], tmp_path / "a", "tar")
    with pytest.raises(SourceError, match="version 1; merge needs version 2"):
        merge([tmp_path / "a", tmp_path / "v1" / "tar"], tmp_path / "m")


def test_verify_names_the_one_damaged_sample_of_a_copied_tar_shard(items, tmp_path):
    """A copied shard keeps its part's member names; verify still names exactly the sample hit."""
    _convert(items[:3], tmp_path / "a", "tar", shard_samples=2)
    _convert(items[3:], tmp_path / "b", "tar", shard_samples=2)
    merge([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
    shard = next(f for f in read_manifest(str(tmp_path / "m")).files if f.samples and f.first == 3)
    idx = read_manifest(str(tmp_path / "m")).files.index(shard)
    path = tmp_path / "m" / shard.name
    data = bytearray(path.read_bytes())
    data[512 + 5] ^= 0xFF  # inside the first sample's image bytes
    path.write_bytes(bytes(data))
    report = verify_dataset(str(tmp_path / "m"), decode=False)
    named = [p for p in report.problems if "sample" in p]
    assert idx >= 0 and len(named) == 1 and "sample 3" in named[0], report.problems


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_merge_link_shares_the_shard_files(items, tmp_path, fmt):
    """With link=True a shard taken whole is the part's file (one inode), the samples those of a
    copying merge; a damaged shard is still refused, with nothing left at the destination."""
    _convert(items[:3], tmp_path / "a", fmt, **_shard_writer(fmt))
    _convert(items[3:], tmp_path / "b", fmt, **_shard_writer(fmt))
    merge([tmp_path / "a", tmp_path / "b"], tmp_path / "copy")
    report = merge([tmp_path / "a", tmp_path / "b"], tmp_path / "link", link=True)
    assert _samples(tmp_path / "link") == _samples(tmp_path / "copy")
    data = [f.name for f in report.manifest.files if f.samples]
    part_a = [f.name for f in read_manifest(str(tmp_path / "a")).files if f.samples]
    assert os.path.samefile(tmp_path / "link" / data[0], tmp_path / "a" / part_a[0])
    assert not os.path.samefile(tmp_path / "copy" / data[0], tmp_path / "a" / part_a[0])
    shard = tmp_path / "b" / [f.name for f in read_manifest(str(tmp_path / "b")).files if f.samples][0]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="differs from its manifest"):
        merge([tmp_path / "a", tmp_path / "b"], tmp_path / "bad", link=True)
    assert not os.path.exists(tmp_path / "bad")


def test_merge_command_line_link(items, tmp_path):
    from packer.cli import main

    _convert(items[:3], tmp_path / "a", "tar", **_shard_writer("tar"))
    _convert(items[3:], tmp_path / "b", "tar", **_shard_writer("tar"))
    assert main(["merge", str(tmp_path / "m"), str(tmp_path / "a"), str(tmp_path / "b"), "--link"]) == 0
    first = [f.name for f in read_manifest(str(tmp_path / "m")).files if f.samples][0]
    part = [f.name for f in read_manifest(str(tmp_path / "a")).files if f.samples][0]
    assert os.path.samefile(tmp_path / "m" / first, tmp_path / "a" / part)
