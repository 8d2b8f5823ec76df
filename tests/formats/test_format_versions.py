"""Datasets written by earlier releases stay readable: a tiny dataset of every format of every
on-disk version is kept in tests/data and read here, pixel for pixel."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile

import pytest

from packer.cli import main
from packer.datasets import StreamingDataset, open_dataset
from packer.description.registry import format_names
from tests.helpers import ROOT

DATA = os.path.join(ROOT, "tests", "data")

#: (key, label, decoded shape, first 16 hex digits of the SHA-256 of the decoded RGB pixels); the
#: same three PNG-encoded images in every format and version.
EXPECTED = [
    ("cat/a.png", 0, (12, 10, 3), "5c554a4c443d3370"),
    ("cat/b.jpg", 0, (9, 14, 3), "e19a827d69701050"),
    ("dog/c.png", 1, (8, 8, 3), "a42f13a66d648f41"),
]
#: Archive folder -> (its archive, the on-disk version, whether it has a sample table). ``v2-early``:
#: version 2 as first written, before the sample table (``samples.table``) and the ``.pkidx`` tar
#: index name; ``v2-no-table-id``: version 2 with the sample table, before the manifest recorded
#: the table's id.
VERSIONS = {"v1": ("v1-datasets.tar.gz", 1, False), "v2-early": ("v2-early-datasets.tar.gz", 2, False),
            "v2-no-table-id": ("v2-no-table-id-datasets.tar.gz", 2, True)}


@pytest.fixture(scope="module")
def archived(tmp_path_factory):
    root = tmp_path_factory.mktemp("versions")
    for archive, _, _ in VERSIONS.values():
        with tarfile.open(os.path.join(DATA, archive)) as tf:
            tf.extractall(root, filter="data")
    return root


def verify_passes(path: str) -> None:
    """``packer verify PATH`` exits 0 (run in this process: a new one would import torch again)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["verify", path])
    assert status == 0, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("name", sorted(VERSIONS))
@pytest.mark.parametrize("fmt", format_names())
def test_old_versions_read_pixel_for_pixel(archived, name, fmt):
    path = str(archived / name / fmt)
    ds = open_dataset(path, output="numpy")
    assert ds.manifest.version == VERSIONS[name][1] and len(ds) == len(EXPECTED)
    # written before there was one, labels and keys come from the files; else from the table
    assert (ds.sample_table() is not None) == VERSIONS[name][2]
    assert list(ds.targets) == [lab for _, lab, _, _ in EXPECTED] and list(ds.keys) == [k for k, _, _, _ in EXPECTED]
    assert open_dataset(path, fields=("key", "meta", "label"))[2] == ("dog/c.png", {}, 1)
    got = []
    for i in range(len(ds)):
        img, label = ds[i]
        got.append((ds.read_record(i).key, label, img.shape, hashlib.sha256(img.tobytes()).hexdigest()[:16]))
    assert got == EXPECTED
    assert sorted(label for _, label in StreamingDataset(path, shuffle=False)) == [0, 0, 1]
    verify_passes(path)


@pytest.mark.parametrize("name", sorted(VERSIONS))
@pytest.mark.parametrize("fmt", format_names())
def test_old_versions_convert_to_the_current_one(archived, tmp_path, fmt, name):
    from packer.description.manifest import MANIFEST_VERSION
    from packer.operations.transcode import convert_dataset

    rep = convert_dataset(str(archived / name / fmt), str(tmp_path / "new"), fmt, fmt)
    ds = open_dataset(str(tmp_path / "new"), output="numpy")
    assert rep.manifest.version == MANIFEST_VERSION == ds.manifest.version
    assert [(ds.read_record(i).key, ds[i][1]) for i in range(len(ds))] == [(k, lab) for k, lab, _, _ in EXPECTED]


@pytest.mark.parametrize("fmt", format_names())
def test_a_foreign_table_in_a_dataset_written_before_table_ids_is_refused(archived, tmp_path, fmt):
    """A version 2 manifest without the table's id binds the table by its SHA-256 instead: a table
    of equal size holding other labels is refused, naming it (before, its labels were read)."""
    import shutil
    import struct

    import crc32c

    from packer.description.samples import TABLE_NAME
    from packer.errors import CorruptDataError

    path = str(tmp_path / fmt)
    shutil.copytree(archived / "v2-no-table-id" / fmt, path)
    table = os.path.join(path, TABLE_NAME)
    data = bytearray(open(table, "rb").read())  # a version 1 table of the same keys and other labels, its CRCs valid
    data[48:48 + 8 * len(EXPECTED)] = struct.pack(f"<{len(EXPECTED)}q", *(1 - lab for _, lab, _, _ in EXPECTED))
    struct.pack_into("<I", data, 40, crc32c.crc32c(bytes(data[48:])))
    struct.pack_into("<I", data, 44, crc32c.crc32c(bytes(data[:44])))
    open(table, "wb").write(bytes(data))
    with pytest.raises(CorruptDataError, match="not this dataset's.*SHA-256") as e:
        _ = open_dataset(path).targets
    assert os.path.join(path, TABLE_NAME) in str(e.value)
    assert [open_dataset(path)[i][1] for i in range(3)] == [lab for _, lab, _, _ in EXPECTED]


def test_codec_ids_on_disk_never_change():
    """Codec ids are written into LMDB records, HDF5 /codecs and tar indexes: they are forever."""
    from packer.images.codecs import CODEC_IDS, CODEC_TABLE

    assert CODEC_IDS == {"raw": 0, "jpeg": 1, "png": 2, "webp": 3, "bmp": 4, "tiff": 5, "pnm": 6, "gif": 7}
    assert len({c.id for c in CODEC_TABLE}) == len(CODEC_TABLE)


def _v3_masks() -> list:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_v3_fields", os.path.join(DATA, "make_v3_fields.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.masks()


@pytest.fixture(scope="module")
def archived_v3(tmp_path_factory):
    root = tmp_path_factory.mktemp("v3")
    with tarfile.open(os.path.join(DATA, "v3-fields-datasets.tar.gz")) as tf:
        tf.extractall(root, filter="data")
    return root / "v3-fields"


@pytest.mark.parametrize("fmt", format_names())
def test_version_3_fields_read_as_written(archived_v3, fmt):
    """A version 3 dataset (no mask dtype declared) reads its masks as stored, 8 or 16 bits a
    sample, its boxes and labels as written, and verifies."""
    import numpy as np

    path = str(archived_v3 / fmt)
    ds = open_dataset(path, output="numpy", fields=("key", "label", "mask", "boxes", "box_labels"))
    assert ds.manifest.version == 3 and len(ds) == 3
    for k, want in enumerate(_v3_masks()):
        key, label, mask, boxes, labels = ds[k]
        assert (key, label) == (f"s{k}", k % 2)
        assert mask.dtype == want.dtype
        np.testing.assert_array_equal(mask, want)
        np.testing.assert_array_equal(boxes, np.array([[0, 0, 4, 3], [1, 2, 8, 6], [2, 1, 5, 5]][: k + 1], np.float32))
        assert labels.tolist() == [k % 2] * (k + 1)
    verify_passes(path)


@pytest.mark.parametrize("fmt", format_names())
def test_version_3_masks_of_mixed_dtypes_batch_as_the_widest(archived_v3, fmt):
    """A batch of a version 3 dataset whose masks are 8-bit and 16-bit stacks them as uint16,
    values unchanged (torch cannot stack uint8 with uint16), in the main process and in workers."""
    import numpy as np
    import torch

    from packer.datasets import collate

    want = np.stack([m.astype(np.uint16) for m in _v3_masks()])
    ds = open_dataset(str(archived_v3 / fmt), fields=("image", "mask", "boxes"))
    for workers in (0, 1):
        loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=workers, collate_fn=collate)
        ((images, masks, boxes),) = list(loader)
        assert masks.dtype == torch.uint16 and images.shape == (3, 3, 6, 8) and len(boxes) == 3
        np.testing.assert_array_equal(masks.numpy(), want)
    by_dict = open_dataset(str(archived_v3 / fmt), fields=("mask",), as_dict=True)
    assert collate([by_dict[i] for i in range(3)])["mask"].dtype == torch.uint16


def test_info_shows_a_version_3_mask_as_stored(archived_v3, capsys):
    from packer.cli import main

    assert main(["info", str(archived_v3 / "lmdb")]) == 0
    assert "fields      mask (mask, uint8 or uint16 as each is stored), boxes (boxes)" in capsys.readouterr().out


def _table_v3_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_table_v3", os.path.join(DATA, "make_table_v3.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def archived_table_v3(tmp_path_factory):
    root = tmp_path_factory.mktemp("table-v3")
    with tarfile.open(os.path.join(DATA, "table-v3-datasets.tar.gz")) as tf:
        tf.extractall(root, filter="data")
    return root / "table-v3"


@pytest.mark.parametrize("fmt", format_names())
def test_sample_table_version_3_reads_as_written(archived_table_v3, fmt):
    """The first datasets with a version 3 sample table: labels from a uint8 column, keys and
    metadata from their own sections, pixels as stored; packer verify checks every section."""
    import cv2
    import numpy as np

    script = _table_v3_script()
    path = str(archived_table_v3 / fmt)
    with open(os.path.join(path, "samples.table"), "rb") as f:
        assert f.read(8) == b"PKST\x03\x00\x00\x01"  # version 3, class labels, uint8 column
    ds = open_dataset(path, output="numpy", fields=("image", "label", "key", "meta"))
    assert ds.targets.dtype == np.uint8 and ds.targets.tolist() == script.LABELS
    assert list(ds.keys) == ["s0", "s1", "s2"]
    for k, png in enumerate(script.images()):
        want = cv2.cvtColor(cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        image, label, key, meta = ds[k]
        np.testing.assert_array_equal(image, want)
        assert (label, key, meta) == (script.LABELS[k], f"s{k}", script.META[k] or {})
    verify_passes(path)


def test_sample_table_version_3_label_kinds_and_boxes_read_as_written(archived_table_v3):
    import numpy as np

    multi = open_dataset(str(archived_table_v3 / "lmdb-multi"), output="numpy")
    assert multi.targets == [[0, 2], [], [1]]
    assert multi[0][1].tolist() == [1.0, 0.0, 1.0]
    number = open_dataset(str(archived_table_v3 / "lmdb-number"), output="numpy")
    assert number.targets.dtype == np.float64 and number.targets.tolist() == [0.5, -2.0, 7.25]
    boxes = open_dataset(str(archived_table_v3 / "lmdb-boxes"), output="numpy", fields=("label", "boxes", "box_labels"))
    assert [(label, b.tolist(), lab.tolist()) for label, b, lab in (boxes[k] for k in range(3))] == [
        (0, [], []), (2, [[0.0, 0.0, 4.0, 3.0]], [1]), (1, [[0.0, 0.0, 4.0, 3.0], [1.0, 2.0, 8.0, 6.0]], [1, 1])]
    for name in ("lmdb-multi", "lmdb-number", "lmdb-boxes"):
        verify_passes(str(archived_table_v3 / name))
