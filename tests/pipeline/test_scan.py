"""Source scanning: torchvision's class discovery, extensions, hidden files, symlinks, bad folders."""

from __future__ import annotations

import os

import pytest

from packer.errors import SourceError
from packer.pipeline.scan import scan_imagefolder
from tests.helpers import make_folder


def test_classes_and_order_match_torchvision_rules(tmp_path):
    root = str(tmp_path / "src")
    make_folder(root, {"b": [("x.JPEG", 8, 8), ("a.png", 8, 8)], "a": [("z.jpg", 8, 8)], "a/sub": [("y.Jpg", 8, 8)]})
    (tmp_path / "src" / "b" / "notes.txt").write_text("x")
    (tmp_path / "src" / "readme.md").write_text("x")
    s = scan_imagefolder(root)
    assert s.classes == ["a", "b"] and s.class_to_idx == {"a": 0, "b": 1}
    assert [(x.relpath, x.label) for x in s.samples] == [
        ("a/z.jpg", 0), ("a/sub/y.Jpg", 0), ("b/a.png", 1), ("b/x.JPEG", 1)]
    assert sorted(os.path.basename(p) for p in s.ignored_other) == ["notes.txt"]
    assert [os.path.basename(p) for p in s.ignored_root] == ["readme.md"]


def test_files_at_the_root_are_outside_every_class_not_non_images(tmp_path):
    from tests.helpers import pack

    root = str(tmp_path / "src")
    make_folder(root, {"a": [("x.jpg", 8, 8)], ".": [("stray.jpg", 8, 8)]})
    (tmp_path / "src" / "a" / "notes.txt").write_text("x")
    rep = pack(root, str(tmp_path / "out"), "tar")
    assert rep.manifest.ignored == {"hidden": 0, "not_images": 1, "outside_classes": 1}


def test_hidden_entries_are_ignored_and_counted(tmp_path):
    root = str(tmp_path / "src")
    make_folder(root, {"a": [("x.jpg", 8, 8), (".hidden.jpg", 8, 8)], ".ipynb_checkpoints": [("y.jpg", 8, 8)]})
    s = scan_imagefolder(root)
    assert s.classes == ["a"] and len(s.samples) == 1
    assert len(s.ignored_hidden) == 2


def test_symlinks_are_followed_and_loops_reported(tmp_path):
    root = tmp_path / "src"
    make_folder(str(tmp_path / "elsewhere"), {"c": [("far.jpg", 8, 8)]})
    make_folder(str(root), {"a": [("x.jpg", 8, 8)]})
    os.symlink(tmp_path / "elsewhere" / "c", root / "linked_class")
    os.symlink(tmp_path / "elsewhere" / "c" / "far.jpg", root / "a" / "link.jpg")
    os.symlink(root / "a", root / "a" / "loop")
    s = scan_imagefolder(str(root))
    assert s.classes == ["a", "linked_class"]
    assert sorted(x.relpath for x in s.samples) == ["a/link.jpg", "a/x.jpg", "linked_class/far.jpg"]
    assert any("symlink loop" in reason for _, reason in s.errors)


def test_broken_symlink_is_reported(tmp_path):
    root = tmp_path / "src"
    make_folder(str(root), {"a": [("x.jpg", 8, 8)]})
    os.symlink(tmp_path / "nowhere.jpg", root / "a" / "gone.jpg")
    s = scan_imagefolder(str(root))
    assert [r for _, r in s.errors] == ["broken symlink"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads folders whatever their mode")
def test_unreadable_folder_is_reported(tmp_path):
    root = tmp_path / "src"
    make_folder(str(root), {"a": [("x.jpg", 8, 8)], "a/locked": [("y.jpg", 8, 8)]})
    os.chmod(root / "a" / "locked", 0)
    try:
        s = scan_imagefolder(str(root))
    finally:
        os.chmod(root / "a" / "locked", 0o755)
    assert any("cannot read folder" in r for _, r in s.errors)


def test_empty_class_is_kept_for_stable_labels(tmp_path):
    root = tmp_path / "src"
    make_folder(str(root), {"a": [("x.jpg", 8, 8)], "c": [("y.jpg", 8, 8)]})
    (root / "b").mkdir()
    s = scan_imagefolder(str(root))
    assert s.classes == ["a", "b", "c"] and s.empty_classes == ["b"]
    assert [x.label for x in s.samples] == [0, 2]


@pytest.mark.parametrize("setup,msg", [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "no class folders"),
    (lambda p: (p.mkdir(), (p / "x.jpg").write_bytes(b"x")), "no class folders"),
    (lambda p: (p.mkdir(), (p / "a").mkdir()), "no images"),
    (lambda p: p.write_text("x"), "not a folder"),
])
def test_unusable_sources(tmp_path, setup, msg):
    src = tmp_path / "src"
    setup(src)
    with pytest.raises(SourceError, match=msg):
        scan_imagefolder(str(src))
