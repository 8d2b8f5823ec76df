"""Source names and links: names that are not UTF-8, folders whose name is not, folder symlinks out
of a class folder, and skip reasons that never show a file's bytes."""

from __future__ import annotations

import os
import shutil

import pytest

from packer.cli import main
from packer.description.registry import format_names
from tests.helpers import _src, make_folder, pack

FORMATS = format_names()


# -- source names and links ------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_names_that_are_not_utf8_are_skipped_shown_escaped_not_a_crash(tmp_path, capsys, fmt):
    import json

    from packer.datasets import open_dataset

    src = _src(tmp_path, n=2)
    a, root = os.path.join(src, "a").encode(), src.encode()
    os.rename(a + b"/a1.jpg", a + b"/caf\xe9.jpg")
    os.mkdir(a + b"/sub\xff")
    shutil.copyfile(a + b"/a0.jpg", a + b"/sub\xff/in.jpg")
    make_folder(os.path.join(src, "c"), {"x": [("x.png", 8, 8)]})
    os.rename(root + b"/c/x", root + b"/cl\xe9ss")
    os.rmdir(root + b"/c")
    dst = str(tmp_path / "out")
    assert main(["convert", "imagefolder", fmt, src, dst, "--resize", "none", "-q"]) == 3
    out = capsys.readouterr()
    for shown in ("a/caf\\xe9.jpg", "a/sub\\xff", "cl\\xe9ss"):
        assert shown in out.out + out.err and "not valid UTF-8" in out.out + out.err
    raw = open(os.path.join(dst, "manifest.json"), "rb").read()
    m = json.loads(raw.decode("utf-8"))  # valid UTF-8
    assert sorted(s["path"] for s in m["skipped"]) == ["a/caf\\xe9.jpg", "a/sub\\xff", "cl\\xe9ss"]
    assert m["classes"] == ["a", "b"] and len(open_dataset(dst)) == 3


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_source_and_destination_inside_a_folder_whose_name_is_not_utf8(tmp_path, fmt):
    """py-lmdb encodes paths as strict UTF-8: an LMDB conversion there failed with a raw codec error."""
    from packer.operations.transcode import convert_dataset
    from packer.operations.verify import verify_dataset

    top = tmp_path / os.fsdecode(b"d\xe9j\xe0")
    dst = os.path.join(top, "out")
    assert pack(_src(top, n=2), dst, fmt).manifest.num_samples == 4
    assert verify_dataset(dst).ok
    assert convert_dataset(dst, os.path.join(top, "again"), fmt, "tar").manifest.num_samples == 4


def test_folder_symlinks_out_of_a_class_folder_are_not_followed(tmp_path):
    from packer.datasets import open_dataset

    src = _src(tmp_path, n=2)
    os.symlink("..", os.path.join(src, "a", "loop"))  # would repack b's images as a's
    os.symlink("../b", os.path.join(src, "a", "other"))
    make_folder(str(tmp_path / "elsewhere"), {"x": [("e.png", 8, 8)]})
    os.symlink(tmp_path / "elsewhere" / "x", os.path.join(src, "a", "ext"))  # followed, as torchvision does
    os.makedirs(os.path.join(src, "a", "sub"))
    os.symlink("..", os.path.join(src, "a", "sub", "up"))  # inside the class, but a loop
    rep = pack(src, str(tmp_path / "out"), "tar")
    keys = sorted(rec.key for rec in map(open_dataset(str(tmp_path / "out")).read_record, range(5)))
    assert rep.manifest.num_samples == 5
    assert keys == ["a/a0.jpg", "a/a1.jpg", "a/ext/e.png", "b/b0.png", "b/b1.png"]
    reasons = {s.path: s.reason for s in rep.manifest.skipped}
    assert "outside this class folder; not followed" in reasons["a/other"]
    assert "symlink loop" in reasons["a/loop"] and "symlink loop" in reasons["a/sub/up"]
    assert all(str(tmp_path) not in r for r in reasons.values())


def test_a_skip_reason_never_shows_the_files_bytes(tmp_path):
    src = _src(tmp_path, n=1)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"PASSWORD=hunter2\n")
    os.symlink(secret, os.path.join(src, "a", "leak.jpg"))
    rep = pack(src, str(tmp_path / "out"), "lmdb")
    [skip] = rep.manifest.skipped
    assert skip.path == "a/leak.jpg" and "not a recognised image format" in skip.reason
    assert "PASSW" not in skip.reason and "PASSW" not in open(os.path.join(tmp_path, "out", "manifest.json")).read()
