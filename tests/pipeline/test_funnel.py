"""One funnel: every source's samples are written in the one write-time order
(packer.pipeline.order) and processed by the one item pipeline (packer.pipeline.engine.convert_source)."""

from __future__ import annotations

import csv
import os
from dataclasses import replace

import pytest

from packer.converters.base import WriterOptions
from packer.datasets import open_dataset
from packer.pipeline.engine import ConvertOptions, convert_imagefolder
from packer.pipeline.order import recorded_seed, write_order
from packer.sources.listsource import convert_list
from tests.conversion.test_resume import interrupt_after
from tests.helpers import ROOT


def _keys(path):
    ds = open_dataset(path)
    try:
        return [ds.read_record(i).key for i in range(len(ds))]
    finally:
        ds.close()


def test_the_write_order_is_the_seeded_permutation():
    # pinned: the order decides the bytes of every shuffled dataset already written
    assert write_order(10, ConvertOptions(seed=0)) == [4, 6, 2, 7, 3, 5, 9, 0, 8, 1]
    assert write_order(10, ConvertOptions(seed=0)) == write_order(10, ConvertOptions(seed=0))
    assert write_order(10, ConvertOptions(seed=1)) != write_order(10, ConvertOptions(seed=0))
    assert write_order(5, ConvertOptions(shuffle=False)) == [0, 1, 2, 3, 4]
    assert write_order(0, ConvertOptions()) == []
    assert (recorded_seed(ConvertOptions(seed=7)), recorded_seed(ConvertOptions(seed=7, shuffle=False))) == (7, None)


@pytest.mark.parametrize("seed", [0, 5])
def test_a_folder_and_a_list_of_its_files_are_written_in_the_same_order(tiny_folder, tmp_path, seed):
    root, _ = tiny_folder
    files = [(f"{c}/{n}", c) for c in sorted(os.listdir(root)) for n in sorted(os.listdir(os.path.join(root, c)))]
    listfile = tmp_path / "list.csv"
    with open(listfile, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("path", "label"), *files])
    options = ConvertOptions(seed=seed)
    convert_imagefolder(root, tmp_path / "folder.lmdb", "lmdb", options)
    convert_list(listfile, tmp_path / "list.lmdb", "lmdb", options, root=root)
    folder_keys = _keys(tmp_path / "folder.lmdb")
    assert folder_keys == [files[i][0] for i in write_order(len(files), options)]
    assert _keys(tmp_path / "list.lmdb") == folder_keys


def test_the_write_time_shuffle_is_drawn_in_one_place():
    # loaderbench draws the samples a read benchmark reads, not a write order
    drawn = []
    rooms = [os.path.join(ROOT, "packer", room) for room in ("pipeline", "operations", "sources", "conversion", "cli")]
    walked = [(os.path.join(ROOT, "packer"), None, ["api.py"]), *(w for room in rooms for w in os.walk(room))]
    for folder, _, names in walked:
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, ROOT)
            if name.endswith(".py") and rel not in ("packer/pipeline/order.py", "packer/operations/loaderbench.py"):
                with open(path, encoding="utf-8") as f:
                    if ".permutation(" in f.read():
                        drawn.append(rel)
    assert not drawn, f"use packer.pipeline.order.write_order in {drawn}"


def test_an_image_folder_journals_the_fingerprint_earlier_runs_wrote(tiny_folder, tmp_path, monkeypatch):
    # a conversion interrupted by an earlier packer resumes only if the journal's source
    # fingerprint is computed as then: each file's (path under the root, label, size, mtime_ns)
    import packer.pipeline.engine as engine
    from packer.files.journal import digest, read_journal
    from packer.pipeline.scan import scan_imagefolder

    root, _ = tiny_folder
    options = ConvertOptions(seed=2, writer=WriterOptions(checkpoint_samples=3))
    interrupt_after(monkeypatch, "lmdb", 7)
    dst = str(tmp_path / "out")
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(root, dst, "lmdb", options)
    samples = scan_imagefolder(root).samples
    ordered = [samples[i] for i in write_order(len(samples), options)]
    rows = [(s.relpath, s.label, os.stat(s.path).st_size, os.stat(s.path).st_mtime_ns) for s in ordered]
    journal = read_journal(engine.temp_dir_for(dst))
    assert journal.fingerprint["source"] == digest(rows)
    assert journal.written == 6
    monkeypatch.undo()
    report = convert_imagefolder(root, dst, "lmdb", replace(options, resume=True))
    assert report.resumed == {"consumed": journal.consumed, "written": 6}
    convert_imagefolder(root, tmp_path / "ref", "lmdb", options)
    assert _keys(dst) == _keys(tmp_path / "ref")
    with open(os.path.join(dst, "data.mdb"), "rb") as a, open(tmp_path / "ref" / "data.mdb", "rb") as b:
        assert a.read() == b.read()


def test_images_reach_the_writers_through_one_pipeline():
    # every image source ends in engine.convert_source, packed sources (convert_dataset) included;
    # merge copies stored records into the writer half (write_packed / write_packed_result) directly
    import ast

    callers = {}
    for folder, _, names in os.walk(os.path.join(ROOT, "packer")):
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for fn in ast.walk(tree):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for node in ast.walk(fn):
                        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                                "write_packed", "write_packed_result"):
                            callers.setdefault(os.path.relpath(path, ROOT), set()).add(fn.name)
    assert callers == {"packer/pipeline/engine.py": {"write_packed", "convert_source"},
                       "packer/operations/merge.py": {"_merge_records"}}, callers
