"""Shards as users name them: a list of shard files, or a brace pattern, for ``open_dataset``,
``StreamingDataset``, ``packer convert`` (SRC) and ``packer info``; real ``webdataset.ShardWriter``
shards and TFRecord files written by the ``tfrecord`` package, and packer's own."""

from __future__ import annotations

import os
import re

import cv2
import numpy as np
import pytest
import webdataset as wds
from torch.utils.data import DataLoader

from packer.cli import main
from packer.datasets import ShardSpecError, StreamingDataset, open_dataset
from packer.storage.shardspec import expand_braces
from tests.formats.test_interop_wds_tfrecord import _write_tfrecords  # the tfrecord package's files
from tests.helpers import draw, pack


def _encode(rgb, ext=".png"):
    ok, buf = cv2.imencode(ext, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes()


def _write_wds(root, n=11, maxcount=4):
    """WebDataset ShardWriter shards ``shard-000000.tar`` ...; {key: (payload, label)}."""
    rng = np.random.default_rng(3)
    os.makedirs(root, exist_ok=True)
    written = {}
    with wds.ShardWriter(os.path.join(root, "shard-%06d.tar"), maxcount=maxcount, verbose=0) as sink:
        for i in range(n):
            payload = _encode(draw(rng, 20 + i, 24), ".jpg")
            key = f"s{i:04d}"
            sink.write({"__key__": key, "jpg": payload, "cls": i % 3})
            written[key] = (payload, i % 3)
    return written


def _records(ds):
    return {ds.read_record(i).key: (bytes(ds.read_record(i).payload), ds.read_record(i).label) for i in range(len(ds))}


@pytest.fixture
def wds_shards(tmp_path):
    root = str(tmp_path / "wds")
    return root, _write_wds(root)


# -- the expander ------------------------------------------------------------------------------
def test_expand_braces_ranges_padding_and_lists():
    assert expand_braces("d/shard-{000..003}.tar") == [f"d/shard-{i:03d}.tar" for i in range(4)]
    assert expand_braces("x-{8..11}.tar") == ["x-8.tar", "x-9.tar", "x-10.tar", "x-11.tar"]
    assert expand_braces("x-{08..11}.tar") == ["x-08.tar", "x-09.tar", "x-10.tar", "x-11.tar"]
    assert expand_braces("{a,b}-{0..1}") == ["a-0", "a-1", "b-0", "b-1"]
    assert expand_braces("s3://b/p/shard-{000..099}.tfrecord")[-1] == "s3://b/p/shard-099.tfrecord"
    assert expand_braces("plain.tar") == ["plain.tar"]


@pytest.mark.parametrize("bad,why", [
    ("x-{3..1}.tar", "counts down"), ("x-{1..}.tar", "neither"), ("x-{a..c}.tar", "neither"),
    ("x-{1.tar", "unmatched"), ("x-1}.tar", "unmatched"), ("x-{{1..2}}.tar", "unmatched or nested"),
    ("x-{a,,b}.tar", "empty item"), ("x-{solo}.tar", "neither"), ("x-{0..99999999}.tar", "more than"),
])
def test_expand_braces_is_strict(bad, why):
    with pytest.raises(ShardSpecError, match=why):
        expand_braces(bad)


# -- foreign shards from a list and a pattern ----------------------------------------------------
def test_webdataset_shards_from_a_list_and_a_pattern(wds_shards):
    root, written = wds_shards
    files = [os.path.join(root, f"shard-{i:06d}.tar") for i in range(3)]
    by_list = open_dataset(files)
    by_pattern = open_dataset(os.path.join(root, "shard-{000000..000002}.tar"))
    for ds in (by_list, by_pattern):
        assert len(ds) == 11 and ds.shard_sizes == [4, 4, 3]
        assert _records(ds) == written
    # the order given is the sample order
    backwards = open_dataset(files[::-1])
    assert [backwards.read_record(i).key for i in range(3)] == ["s0008", "s0009", "s0010"]
    # a subset is only those shards
    assert len(open_dataset(os.path.join(root, "shard-{000001..000002}.tar"))) == 7


def test_streaming_over_a_pattern_with_two_workers(wds_shards):
    root, written = wds_shards
    pattern = os.path.join(root, "shard-{000000..000002}.tar")
    for spec in (pattern, sorted(os.path.join(root, n) for n in os.listdir(root))):
        ds = StreamingDataset(spec, shuffle=True, seed=1, fields=("key", "label"))
        assert ds._mix is None and len(ds) == 11  # one dataset of those shards, not a mixture
        seen = []
        for keys, labels in DataLoader(ds, batch_size=4, num_workers=2):
            seen.extend(zip(keys, labels.tolist()))
        assert sorted(seen) == sorted((k, lab) for k, (_, lab) in written.items())


def test_tfrecord_package_files_from_a_list_and_a_pattern(tmp_path):
    root = str(tmp_path / "tfr")
    written = [(payload, label) for payload, label, _ in _write_tfrecords(root, files=3, per_file=4)]
    files = [os.path.join(root, f"part-{f:05d}.tfrecord") for f in range(3)]
    for spec in (files, os.path.join(root, "part-{00000..00002}.tfrecord")):
        ds = open_dataset(spec)
        assert type(ds).__name__ == "TFRecordDataset" and len(ds) == 12
        got = [(bytes(ds.read_record(i).payload), ds.read_record(i).label) for i in range(len(ds))]
        assert got == written


def test_files_without_a_known_ending_need_format(tmp_path):
    root = str(tmp_path / "tfr")
    _write_tfrecords(root, files=2)
    for f in range(2):
        os.rename(os.path.join(root, f"part-{f:05d}.tfrecord"), os.path.join(root, f"train-{f:05d}-of-00002"))
    pattern = os.path.join(root, "train-{00000..00001}-of-00002")
    with pytest.raises(ShardSpecError, match=r"cannot tell the format of train-00000-of-00002.*format="):
        open_dataset(pattern)
    assert len(open_dataset(pattern, format="tfrecord")) == 10


# -- packer's own shards ---------------------------------------------------------------------------
@pytest.mark.parametrize(("fmt", "index"), [("tar", ".pkidx"), ("tfrecord", ".idx")])
def test_a_glob_that_catches_the_index_files_says_so(tiny_folder, tmp_path, fmt, index):
    """glob("train-*") also lists each shard's index file, glob("*") the manifest: an error naming the
    file and the pattern that lists the shards, not "pass format=" (which would read an index as data)."""
    import glob

    src, _ = tiny_folder
    out = str(tmp_path / "out")
    pack(src, out, fmt, writer={"shard_samples": 5, "prefix": "train"})
    with pytest.raises(ShardSpecError, match=rf"train-000000\{index} is not a shard but the index file beside "
                                             rf"train-000000\.{fmt}; list only the data files: a pattern that ends "
                                             rf"with their suffix \(train-\*\.{fmt}\)"):
        open_dataset(sorted(glob.glob(os.path.join(out, "train-*"))), format=fmt)
    with pytest.raises(ShardSpecError, match="manifest.json is a packed dataset's own file, not a shard"):
        open_dataset(sorted(glob.glob(os.path.join(out, "*"))))
    assert len(open_dataset(sorted(glob.glob(os.path.join(out, f"train-*.{fmt}"))))) == 14


def test_all_of_a_packer_datasets_shards_open_the_dataset(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "tar", writer={"shard_samples": 5})
    whole = open_dataset(tmp_path / "out")
    shards = whole.shard_paths
    ds = open_dataset(shards)
    assert ds.manifest == whole.manifest  # opened from its manifest: class names, checksums
    part = open_dataset(shards[1:])  # some of its shards: read as shards, labels kept
    assert len(part) == len(whole) - whole.shard_sizes[0]
    first = whole.shard_sizes[0]
    assert [part.read_record(i).label for i in range(len(part))] == \
           [whole.read_record(first + i).label for i in range(len(part))]


def test_info_prints_a_pattern_that_opens(tiny_folder, tmp_path, capsys, monkeypatch):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "tar", writer={"shard_samples": 5})
    monkeypatch.chdir(tmp_path)
    assert main(["info", "out"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("shards"))
    pattern = re.search(r": (\S+) \(a brace pattern", line).group(1)
    assert pattern == os.path.join(str(tmp_path), "out", "shard-{000000..000002}.tar")
    monkeypatch.chdir("/")
    assert len(open_dataset(pattern)) == len(open_dataset(tmp_path / "out"))


def test_info_on_foreign_shards(wds_shards, capsys):
    root, _ = wds_shards
    pattern = os.path.join(root, "shard-{000000..000002}.tar")
    assert main(["info", pattern]) == 0
    out = capsys.readouterr().out
    assert "samples     11" in out and f"shards      3: {pattern} (a brace pattern" in out
    files = [os.path.join(root, f"shard-{i:06d}.tar") for i in range(3)]
    assert main(["info", *files, "--shards"]) == 0
    assert capsys.readouterr().out.split() == files


def test_convert_a_pattern_of_webdataset_shards(wds_shards, tmp_path):
    root, written = wds_shards
    dst = str(tmp_path / "lmdb")
    assert main(["convert", "tar", "lmdb", os.path.join(root, "shard-{000000..000002}.tar"), dst, "-q",
                 "--workers", "1"]) == 0
    ds = open_dataset(dst)
    assert len(ds) == 11 and _records(ds) == written


# -- ambiguous lists: one clear error ----------------------------------------------------------------
def test_ambiguous_lists_are_one_clear_error(wds_shards, tiny_folder, tmp_path, capsys):
    root, _ = wds_shards
    src, _ = tiny_folder
    pack(src, tmp_path / "a", "tar")
    pack(src, tmp_path / "b", "lmdb")
    shard = os.path.join(root, "shard-000000.tar")
    with pytest.raises(ShardSpecError, match=r"1 file \(.*shard-000000.tar\) and 1 dataset .*give one or the other"):
        open_dataset([shard, str(tmp_path / "a")])
    with pytest.raises(ShardSpecError, match=r"1 file .* and 1 dataset "):
        StreamingDataset([shard, str(tmp_path / "a")])
    with pytest.raises(ShardSpecError, match="matches nothing: no file .*shard-000007.tar"):
        open_dataset(os.path.join(root, "shard-{000007..000009}.tar"))
    with pytest.raises(ShardSpecError, match=r"1 of 4 paths do not exist: .*shard-000003.tar"):
        open_dataset(os.path.join(root, "shard-{000000..000003}.tar"))
    tfr = str(tmp_path / "tfr")
    _write_tfrecords(tfr, files=1)
    with pytest.raises(ShardSpecError, match=r"different formats: 1 tar \(shard-000000.tar\); 1 tfrecord"):
        open_dataset([shard, os.path.join(tfr, "part-00000.tfrecord")])
    with pytest.raises(ShardSpecError, match=r"2 datasets .*a mixture; read it with StreamingDataset"):
        open_dataset([str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(ShardSpecError, match="named twice"):
        open_dataset([shard, shard])
    with pytest.raises(ShardSpecError, match="empty list"):
        open_dataset([])
    with pytest.raises(ShardSpecError, match="shards in 2 folders"):
        open_dataset([shard, str(tmp_path / "a" / "shard-000000.tar")])
    with pytest.raises(ShardSpecError, match="named as tar data, not 'tfrecord'"):
        open_dataset([shard], format="tfrecord")
    assert main(["convert", "tar", "lmdb", os.path.join(root, "shard-{000007..000009}.tar"),
                 str(tmp_path / "x"), "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("packer: error: brace pattern") and "matches nothing" in err and "\n" not in err


def test_a_list_of_datasets_stays_a_mixture(tiny_folder, tmp_path):
    src, n = tiny_folder
    pack(src, tmp_path / "a", "tar")
    pack(src, tmp_path / "b", "lmdb")
    ds = StreamingDataset([str(tmp_path / "a"), str(tmp_path / "b")], shuffle=False)
    assert ds._mix is not None


def test_a_list_of_patterns_is_a_mixture_of_their_datasets(wds_shards, tmp_path):
    root, written = wds_shards
    other = str(tmp_path / "other")
    _write_wds(other, n=5)
    ds = StreamingDataset([os.path.join(root, "shard-{000000..000002}.tar"), os.path.join(other, "shard-{000000..000001}.tar")],
                          shuffle=False, return_source=True)
    assert ds._mix is not None and len(ds) == 16
    assert sorted(source for _, _, source in ds).count(1) == 5
