"""``packer verify`` on datasets with fields (version 3): each mask and extra image checked and
decoded, the sample table's boxes checked against the image and the file's own copy, damage
named with file, sample, field and offset."""

from __future__ import annotations

import os
import shutil

import crc32c
import h5py
import numpy as np
import pytest

from packer.cli import main
from packer.datasets import open_dataset
from packer.description.manifest import read_manifest, write_manifest
from packer.description.registry import format_names
from packer.description.samples import TABLE_NAME, SampleTable, build_table
from packer.operations.verify import verify_dataset
from tests.helpers import forge_manifest_sizes, write_fields_dataset

FORMATS = format_names()


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("fields-verify")
    for fmt in FORMATS:
        write_fields_dataset(root / fmt, fmt)
    return root


def _copy(datasets, fmt, tmp_path):
    dst = tmp_path / fmt
    shutil.copytree(datasets / fmt, dst)
    return dst


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x04]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_intact_datasets_with_fields_pass(datasets, fmt, capsys):
    rep = verify_dataset(datasets / fmt)
    assert rep.ok and rep.samples_ok == 6, rep.problems
    assert main(["verify", str(datasets / fmt)]) == 0


def test_hdf5_damaged_mask_names_file_sample_field_and_offset(datasets, tmp_path, capsys):
    d = _copy(datasets, "hdf5", tmp_path)
    path = str(d / "data.h5")
    with h5py.File(path, "r") as f:
        start = int(f["fields/mask/offsets"][2])
        addr = f["fields/mask/images"].id.get_chunk_info(0).byte_offset
    _flip(path, addr + start + 40)
    rep = verify_dataset(d)
    assert rep.bad_samples == [2] and rep.samples_ok == 5
    (line,) = [p for p in rep.problems if "sample 2" in p]
    assert "field 'mask' checksum mismatch" in line and f"file {path}" in line and f"offset {addr + start}" in line
    assert main(["verify", str(d)]) == 1
    assert "field 'mask' checksum mismatch" in capsys.readouterr().err


def test_lmdb_damaged_mask_fails_its_record_checksum(datasets, tmp_path):
    d = _copy(datasets, "lmdb", tmp_path)
    path = str(d / "data.mdb")
    with open(path, "rb") as f:
        data = f.read()
    at = data.index(b"mask\x89PNG")  # a record's mask field: its name, then its PNG bytes
    _flip(path, at + 40)
    rep = verify_dataset(d)
    assert len(rep.bad_samples) == 1
    (line,) = [p for p in rep.problems if p.startswith(f"sample {rep.bad_samples[0]}:")]
    assert "record checksum mismatch" in line and f"file {path}" in line


def _rewrite_table(d, boxes_of) -> None:
    """Write the dataset's sample table again with the boxes ``boxes_of(i, boxes)`` gives, and
    the manifest forged to match (what a damaged or tampered table with recomputed checksums is)."""
    path = str(d / TABLE_NAME)
    m = read_manifest(d)
    fd = os.open(path, os.O_RDONLY)
    try:
        t = SampleTable(fd, path, m.num_samples)
        rows = [(t.keys[i], int(t.targets[i]), *boxes_of(i, *t.boxes_of(i))) for i in range(m.num_samples)]
    finally:
        os.close(fd)
    os.remove(path)
    tid = build_table(path, "class", iter(rows), boxes=True)
    forge_manifest_sizes(d)
    m = read_manifest(d)
    m.files[-1].id = tid
    write_manifest(str(d), m)


@pytest.mark.parametrize("fmt", FORMATS)
def test_box_outside_the_stored_image_is_named(datasets, fmt, tmp_path):
    d = _copy(datasets, fmt, tmp_path)
    rec = open_dataset(str(d)).read_record(4)
    h, w = rec.height, rec.width

    def boxes_of(i, b, lab):
        if i == 4:
            b = np.array([[0, 0, w / 2, h + 1]], np.float32)
            lab = np.array([1])
        return b.tolist(), lab.tolist()

    _rewrite_table(d, boxes_of)
    rep = verify_dataset(d)
    problems = [p for p in rep.problems if "box 0" in p]
    assert rep.bad_samples == [4] and len(problems) == 1
    assert f"not an ordered box inside the stored {w}x{h} image" in problems[0]
    assert f"file {d / TABLE_NAME}" in problems[0] and "sample 4" in problems[0]


def test_box_labels_must_match_the_manifest(datasets, tmp_path):
    d = _copy(datasets, "lmdb", tmp_path)
    table = open_dataset(str(d)).sample_table()
    with_boxes = [i for i in range(6) if len(table.boxes_of(i)[0])]
    _rewrite_table(d, lambda i, b, lab: (b.tolist(), [-1] * len(lab)))  # the manifest says labelled
    rep = verify_dataset(d)
    assert rep.bad_samples == with_boxes and len(with_boxes) == 4 and all("labels" in p for p in rep.problems)


def test_hdf5_boxes_copy_must_agree_with_the_table(datasets, tmp_path):
    d = _copy(datasets, "hdf5", tmp_path)
    with h5py.File(d / "data.h5", "r+") as f:
        boxes = f["boxes"][()]
        boxes[1, 2] -= 1.0  # sample 1's last box (samples 1 and 2 have boxes; 0 has none)
        f["boxes"][...] = boxes
        f["boxes"].attrs["crc32c"] = np.uint32(crc32c.crc32c(boxes.astype("<f4").tobytes()))
    forge_manifest_sizes(d)
    rep = verify_dataset(d)
    assert len(rep.bad_samples) == 1 and any("the sample table" in p for p in rep.problems)
    with h5py.File(d / "data.h5", "r+") as f:
        f["boxes"].attrs["crc32c"] = np.uint32(0)
    forge_manifest_sizes(d)
    rep = verify_dataset(d)
    assert any("/boxes" in p and "checksum" in p for p in rep.problems)


def test_hdf5_field_of_another_size_is_named(datasets, tmp_path):
    d = _copy(datasets, "hdf5", tmp_path)
    with h5py.File(d / "data.h5", "r+") as f:
        shapes = f["fields/left/shapes"][()]
        shapes[3] = shapes[3] + 1
        f["fields/left/shapes"][...] = shapes
        f["fields/left/shapes"].attrs["crc32c"] = np.uint32(crc32c.crc32c(shapes.astype("<u4").tobytes()))
    forge_manifest_sizes(d)
    rep = verify_dataset(d)
    assert rep.bad_samples == [3]
    (line,) = [p for p in rep.problems if p.startswith("sample 3")]
    assert "field 'left' is" in line and f"file {d / 'data.h5'}" in line
