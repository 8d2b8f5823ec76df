"""A reader reads only the dataset it opened: an overwrite under an open reader or a streaming
dataset, payload files of another conversion, and a folder without a manifest told for what it is."""

from __future__ import annotations

import os
import shutil

import pytest

from packer.cli import main
from packer.description.registry import format_names
from tests.helpers import make_folder, pack

FORMATS = format_names()


# -- a reader reads only the dataset it opened ---------------------------------------------------
def _two_datasets(tmp_path, fmt):
    """``dst`` packed from one source, and a second conversion of another source ready to replace it."""
    a = str(tmp_path / "a")
    b = str(tmp_path / "b")
    make_folder(a, {"x": [(f"{i}.png", 16, 16) for i in range(6)], "y": [(f"{i}.png", 16, 16) for i in range(6)]}, seed=1)
    make_folder(b, {"x": [(f"{i}.png", 16, 16) for i in range(6)], "y": [(f"{i}.png", 16, 16) for i in range(6)]}, seed=2)
    dst = str(tmp_path / "out")
    pack(a, dst, fmt, encode="png", shuffle=False)
    return dst, lambda: pack(b, dst, fmt, encode="png", shuffle=False, overwrite=True)


#: Every format, the slow ones (about 10 s each: workers wait for the overwrite) in the slow suite.
_LMDB_FAST = [f if f == "lmdb" else pytest.param(f, marks=pytest.mark.slow) for f in FORMATS]


@pytest.mark.parametrize("fmt", _LMDB_FAST)
def test_overwrite_under_an_open_reader_fails_clearly_in_new_workers(tmp_path, fmt):
    import torch

    from packer.datasets import open_dataset
    from packer.errors import DatasetChangedError

    dst, replace = _two_datasets(tmp_path, fmt)
    ds = open_dataset(dst, output="numpy")
    old = [ds[i][0].copy() for i in range(len(ds))]
    replace()
    new = open_dataset(dst, output="numpy")
    assert any(not (new[i][0] == old[i]).all() for i in range(len(ds)))
    # This process's open handles still read the dataset it opened, never the new one.
    assert all((ds[i][0] == old[i]).all() for i in range(len(ds)))
    # A non-persistent worker opens the path again: it must refuse, not read the new dataset.
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1, persistent_workers=False)
    with pytest.raises(DatasetChangedError, match="after this reader opened it"):
        list(loader)
    ds.close()  # and reopening in this process is refused too
    with pytest.raises(DatasetChangedError):
        ds[0]


@pytest.mark.parametrize("fmt", _LMDB_FAST)
def test_overwrite_under_a_streaming_dataset_fails_clearly(tmp_path, fmt):
    import torch

    from packer.datasets import StreamingDataset
    from packer.errors import DatasetChangedError

    dst, replace = _two_datasets(tmp_path, fmt)
    sds = StreamingDataset(dst, shuffle=False)
    replace()
    loader = torch.utils.data.DataLoader(sds, batch_size=4, num_workers=1)
    with pytest.raises(DatasetChangedError):
        list(loader)


@pytest.mark.parametrize("fmt", FORMATS)
def test_payload_file_from_another_conversion_is_refused_at_open(tmp_path, fmt):
    from packer.datasets import open_dataset
    from packer.errors import CorruptDataError

    dst, _ = _two_datasets(tmp_path, fmt)
    other = str(tmp_path / "other")
    make_folder(str(tmp_path / "c"), {"x": [(f"{i}.png", 20, 24) for i in range(5)]}, seed=3)
    pack(str(tmp_path / "c"), other, fmt, encode="png")
    payload = open_dataset(dst).manifest.files[0].name
    shutil.copyfile(os.path.join(other, payload), os.path.join(dst, payload))
    with pytest.raises(CorruptDataError, match="the manifest says"):
        open_dataset(dst)[0]


@pytest.mark.parametrize("kind", ["imagefolder", "foreign-lmdb", "foreign-tar", "unfinished"])
def test_a_directory_without_manifest_is_told_for_what_it_is(tmp_path, capsys, kind):
    import io
    import tarfile

    import lmdb

    from packer.datasets import open_dataset
    from packer.errors import UnfinishedDatasetError

    d = tmp_path / "d"
    if kind == "imagefolder":
        make_folder(str(d), {"a": [("x.png", 8, 8)]})
        want = "an image folder"
    elif kind == "foreign-lmdb":
        env = lmdb.open(str(d), lock=False, map_size=1 << 20)
        with env.begin(write=True) as txn:
            txn.put(b"k", b"v")
        env.close()
        want = "not written by packer"
    elif kind == "foreign-tar":
        d.mkdir()
        with tarfile.open(d / "x.tar", "w") as tf:
            ti = tarfile.TarInfo("k.cls")
            ti.size = 1
            tf.addfile(ti, io.BytesIO(b"1"))
        want = "format='tar'"
    else:
        dst, _ = _two_datasets(tmp_path, "lmdb")
        os.remove(os.path.join(dst, "manifest.json"))
        d = tmp_path / "out"
        want = "did not finish"
    with pytest.raises(UnfinishedDatasetError, match=want):
        open_dataset(str(d))
    for cmd in ("info", "verify"):
        assert main([cmd, str(d)]) == 1
        err = capsys.readouterr().err
        assert want.replace("format='tar'", "format='tar'") in err and len(err.strip().splitlines()) == 1
