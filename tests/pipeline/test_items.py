"""convert_items: an explicit list of images (paths or bytes) into a packed dataset through the engine."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

import pytest

from packer.datasets import open_dataset
from packer.description.manifest import read_manifest
from packer.errors import ImageError
from packer.images.imageproc import ProcessOptions, parse_encoding
from packer.pipeline.engine import ConvertOptions
from packer.pipeline.items import convert_items, item_classes
from tests.helpers import make_folder, pack

FORMATS = ["lmdb", "hdf5", "tar", "tfrecord"]


@pytest.fixture
def folder(tmp_path):
    root = str(tmp_path / "src")
    make_folder(root, {"cat": [("c0.jpg", 30, 40), ("c1.png", 24, 24)], "dog": [("d0.jpg", 40, 30), ("d1.jpg", 20, 20)]})
    return root


def _records(path):
    ds = open_dataset(path)
    try:
        return [(r.key, r.label, bytes(r.payload)) for r in map(ds.read_record, range(len(ds)))], ds.classes
    finally:
        ds.close()


def _folder_items(root):
    return [(os.path.join(root, c, n), c, {"i": k}) for k, (c, n) in enumerate(
        (c, n) for c in sorted(os.listdir(root)) for n in sorted(os.listdir(os.path.join(root, c))))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_items_match_folder_conversion(folder, tmp_path, fmt):
    """Items in folder order give the same samples as converting the folder without shuffle."""
    pack(folder, str(tmp_path / "ref"), fmt, shuffle=False)
    opts = ConvertOptions(processing=ProcessOptions(encoding=parse_encoding("jpeg:90")), workers=2)
    report = convert_items(_folder_items(folder), tmp_path / "out", fmt, opts, root=folder)
    assert report.manifest.source["kind"] == "items" and len(report.manifest.source["fingerprint"]) == 64
    assert _records(tmp_path / "out") == _records(tmp_path / "ref")


def test_bytes_and_int_labels_and_skips(folder, tmp_path):
    data = open(os.path.join(folder, "cat", "c0.jpg"), "rb").read()
    items = [(data, 1, None), (b"not an image", 0, {}), (os.path.join(folder, "dog", "d0.jpg"), 2, None)]
    report = convert_items(items, str(tmp_path / "out"), "tar")
    recs, classes = _records(tmp_path / "out")
    assert classes == ["0", "1", "2"]
    assert [(k, lab) for k, lab, _ in recs] == [("item-0000000000", 1), (os.path.join(folder, "dog", "d0.jpg"), 2)]
    assert [s.path for s in report.skipped] == ["item-0000000001"]
    with pytest.raises(ImageError, match="item-0000000001"):
        convert_items(items, str(tmp_path / "strict"), "tar", ConvertOptions(strict=True))
    assert not os.path.exists(tmp_path / "strict")


def test_classes_given_and_refused_labels(folder, tmp_path):
    items = [(os.path.join(folder, "dog", "d0.jpg"), "dog", None)]
    convert_items(items, str(tmp_path / "out"), "lmdb", classes=["cat", "dog", "eel"])
    recs, classes = _records(tmp_path / "out")
    assert classes == ["cat", "dog", "eel"] and recs[0][1] == 1
    with pytest.raises(ValueError, match="item 0: label 'cow'"):
        convert_items([(items[0][0], "cow", None)], str(tmp_path / "x"), "lmdb", classes=["cat"])
    with pytest.raises(ValueError, match="mix"):
        item_classes(["cat", 1], None)
    with pytest.raises(TypeError, match="item 0"):
        convert_items([(items[0][0], "cat")], str(tmp_path / "x"), "lmdb")
    with pytest.raises(FileExistsError):
        convert_items(items, str(tmp_path / "out"), "lmdb")
    assert item_classes(["b", "a", "b"], None) == (["a", "b"], [1, 0, 1])


def test_a_class_listed_twice_is_refused_in_one_line(folder, tmp_path, capsys):
    """A pinned class list names each class once (label i is classes[i]: a duplicate gave one class
    two labels and shifted the rest): convert_items, list sources, packer.pack and --classes-from."""
    import packer
    from packer.cli import main
    from packer.sources.listsource import convert_list

    items = [(os.path.join(folder, "dog", "d0.jpg"), "dog", None), (os.path.join(folder, "cat", "c0.jpg"), "cat", None)]
    with pytest.raises(ValueError, match=r"^classes: class 'cat' is listed twice$"):
        convert_items(items, str(tmp_path / "a"), "lmdb", classes=["cat", "cat", "dog"])
    lst = tmp_path / "l.csv"
    lst.write_text("path,label\n" + "".join(f"{p},{c}\n" for p, c, _ in items))
    with pytest.raises(ValueError, match=r"^classes: class 'dog' is listed twice$"):
        convert_list(str(lst), str(tmp_path / "b"), "tar", classes=["dog", "cat", "dog"])
    with pytest.raises(ValueError, match=r"^classes: class 'dog' is listed twice$"):
        convert_list(str(lst), str(tmp_path / "b"), "tar", ConvertOptions(classes=("dog", "dog")))
    with pytest.raises(ValueError, match=r"^packer.pack\(\): classes: class 'a' is listed twice$"):
        packer.pack([{"image": items[0][0], "label": "a"}], tmp_path / "c", "lmdb", classes=["a", "a", "b"], quiet=True)
    with pytest.raises(TypeError, match="a list of class names, not a string"):
        packer.pack([{"image": items[0][0], "label": "a"}], tmp_path / "c", "lmdb", classes="ab", quiet=True)
    names = tmp_path / "classes.txt"
    names.write_text("cat\ndog\ncat\n")
    rc = main(["convert", "list", "lmdb", str(lst), str(tmp_path / "d"), "--classes-from", str(names), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"packer convert: --classes-from {names}: class 'cat' is listed twice"], err
    assert sorted(os.listdir(tmp_path)) == ["classes.txt", "l.csv", "src"]  # nothing written


def test_resume_keeps_a_finished_dataset(folder, tmp_path):
    """A retried call with resume keeps what the same items and options finished; other items or
    options are a new conversion (refused here: the destination exists)."""
    items = _folder_items(folder)
    first = convert_items(items, str(tmp_path / "out"), "tar", root=folder)
    before = os.stat(tmp_path / "out" / "manifest.json").st_mtime_ns
    again = convert_items(items, str(tmp_path / "out"), "tar", ConvertOptions(resume=True), root=folder)
    assert again.manifest == first.manifest and "kept" in again.notes[0]
    assert os.stat(tmp_path / "out" / "manifest.json").st_mtime_ns == before
    with pytest.raises(FileExistsError):
        convert_items(items[1:], str(tmp_path / "out"), "tar", ConvertOptions(resume=True), root=folder)


class _LazyItems(Sequence):
    """Items made when asked for by position; iterating or copying the whole sequence fails."""

    def __init__(self, data, n):
        self.data, self.n, self.peak = data, n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice) or not 0 <= i < self.n:
            raise IndexError(i)
        return (self.data[i % len(self.data)], f"c{i % 3}", None)

    def __iter__(self):
        raise AssertionError("convert_items copied the sequence")


def test_a_sequence_is_read_by_position_not_copied(folder, tmp_path):
    """A lazy Sequence gives the same dataset as the list of its items (classes found from the
    labels, two workers), without being iterated or sliced."""
    data = [open(os.path.join(folder, c, n), "rb").read() for c, n in (("cat", "c0.jpg"), ("dog", "d1.jpg"))]
    lazy = _LazyItems(data, 7)
    opts = ConvertOptions(workers=2)
    report = convert_items(lazy, tmp_path / "lazy", "lmdb", opts)
    convert_items([lazy[i] for i in range(7)], tmp_path / "list", "lmdb", opts)
    assert report.manifest.classes == ["c0", "c1", "c2"] and report.manifest.num_samples == 7
    assert _records(tmp_path / "lazy") == _records(tmp_path / "list")
    assert report.manifest.source["fingerprint"] == read_manifest(str(tmp_path / "list")).source["fingerprint"]


def test_files_are_pinned_to_what_was_listed(folder, tmp_path):
    """``source.converted`` records each item; ``expected_stats`` that a file no longer matches
    fails the call before any image is read, naming the file; nothing is left at or beside DST."""
    from packer.errors import SourceError

    items = _folder_items(folder)
    stats = [(os.stat(p).st_size, os.stat(p).st_mtime_ns) for p, _, _ in items]
    report = convert_items(items, tmp_path / "out", "tar", root=folder, expected_stats=stats)
    assert report.manifest.source["converted"] == [[os.path.relpath(p, folder), *st] for (p, _, _), st in
                                                   zip(items, stats)]
    end = convert_items(items, tmp_path / "end", "tar", root=folder, expected_stats=stats, record_files=False)
    assert "converted" not in end.manifest.source
    shutil.rmtree(tmp_path / "end")
    stats[2] = (stats[2][0], stats[2][1] - 1)
    with pytest.raises(SourceError, match=f"{items[2][0]} is not the file this conversion was planned with: .*"
                                          f"it was {stats[2][0]:,} bytes, modified "):
        convert_items(items, tmp_path / "pinned", "tar", root=folder, expected_stats=stats)
    with pytest.raises(ValueError, match="expected_stats has 1 entries for 4 items"):
        convert_items(items, tmp_path / "pinned", "tar", expected_stats=stats[:1])
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]


class _RewritesFirstFile(Sequence):
    """Items whose first file is rewritten (other bytes, other time) when the last item is first
    asked for: after convert_items listed the first file, before it reads it."""

    def __init__(self, items):
        self.items, self.done = items, False

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        if i == len(self.items) - 1 and not self.done:
            self.done = True
            with open(self.items[0][0], "ab") as f:
                f.write(b"\0" * 7)
        return self.items[i]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_changed_after_it_was_listed_fails_the_conversion(folder, tmp_path, workers):
    """The bytes read must come from the file as listed (checked on the open file, in the worker
    process that reads it): a change fails the conversion naming the file, never stored as good."""
    from packer.errors import SourceError

    items = _RewritesFirstFile(_folder_items(folder))
    with pytest.raises(SourceError, match=f"{items.items[0][0]} is not the file this conversion was planned with"):
        convert_items(items, tmp_path / "out", "lmdb", ConvertOptions(workers=workers), classes=["cat", "dog"],
                      root=folder)
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_memory_per_item_stays_flat_for_bytes_and_unrecorded_files(folder, tmp_path):
    """Images given as bytes before the first file hold no stamp, files after them keep theirs at
    the right positions, and ``record_files=False`` keeps no per-file list at all (both would
    otherwise grow with the number of items)."""
    from packer.pipeline.items import _Rows
    from packer.pipeline.sourcefiles import NO_STAMP

    files = _folder_items(folder)
    data = [(open(p, "rb").read(), c, None) for p, c, _ in files]
    names = ["cat", "dog"]
    only_bytes = _Rows(data, names, None)
    only_bytes.fingerprint()
    assert len(only_bytes.stamps) == 0 and only_bytes.stamp(3) == NO_STAMP
    mixed = _Rows(data[:2] + files + data[:1], names, None)
    _, records = mixed.fingerprint(keep_records=False)
    assert records == [] and mixed.stamp(0) == mixed.stamp(1) == NO_STAMP == mixed.stamp(len(files) + 2)
    st = os.stat(files[1][0])
    assert mixed.stamp(3) == (st.st_size, st.st_mtime_ns) and len(mixed.stamps) == 2 * (len(files) + 1)
    report = convert_items(data[:2] + files, tmp_path / "mixed", "tar", record_files=False)
    assert report.manifest.num_samples == 2 + len(files) and "converted" not in report.manifest.source


def test_a_run_without_checkpoints_keeps_no_row_lengths(tmp_path):
    """The sample table's spill lengths are kept per row only until a checkpoint: a writer never
    asked for one (a merge, an iterable of items) keeps none, so its memory is flat in N."""
    import cv2
    import numpy as np

    from packer.converters.base import WriterOptions
    from packer.converters.lmdb import LMDBWriter
    from packer.description.samples import SampleTableWriter
    from packer.images.imageproc import ProcessedImage

    payload = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))[1].tobytes()
    for checkpoints, kept in ((False, 0), (True, 50)):
        out = tmp_path / str(checkpoints)
        out.mkdir()
        writer = SampleTableWriter(LMDBWriter(str(out), WriterOptions(checkpoint_samples=1000)), checkpoints=checkpoints)
        writer.begin({})
        for i in range(50):
            writer.add(i, f"k{i}", i % 3, ProcessedImage("jpeg", payload, 8, 8))
        assert len(writer._lengths) == len(SampleTableWriter._PARTS) * (1 + kept)
        writer.close()
