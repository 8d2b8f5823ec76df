"""List sources as hostile input: rows outside the root or through links, FIFOs, devices and huge
files, lists that are endless or nested, byte-order marks, keys named twice, conflicting labels."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from packer.cli import main
from packer.errors import SourceError
from tests.helpers import ROOT, _src


# -- list rows that lead out of the folder they are relative to ------------------------------------
def _list_outside_root(tmp_path):
    """A list whose rows 4 and 5 lead out of --root, to a real image beside it; row 6 goes out and
    back in (``a/../b/b0.png``)."""
    root = _src(tmp_path, "root")
    secret = str(tmp_path / "secret.png")
    shutil.copy(os.path.join(root, "b", "b0.png"), secret)
    rows = ["a/a0.jpg,a", "b/b1.png,b", "../secret.png,a", f"{secret},a", "a/../b/b0.png,b"]
    lst = tmp_path / "root" / "train.csv"
    lst.write_text("path,label\n" + "\n".join(rows) + "\n")
    return root, secret, str(lst)


def test_list_rows_outside_the_root_are_refused_naming_them(tmp_path, capsys):
    from packer.sources.listsource import read_list

    root, secret, lst = _list_outside_root(tmp_path)
    dst = str(tmp_path / "d")
    for extra in ([], ["--root", root]):  # the list's own folder is the root when none is given
        assert main(["convert", "list", "tar", lst, dst, "--workers", "1", "-q", *extra]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "2 rows lie outside" in err[0] and "Traceback" not in err[0], err
        assert err[0].count(lst) == 1 and "line 4: '../secret.png'" in err[0] and f"line 5: '{secret}'" in err[0] and "line 6" not in err[0]
        assert "--allow-outside-root" in err[0] and not os.path.exists(dst)
    assert main(["convert", "list", "tar", lst, dst, "--workers", "1", "-q", "--allow-outside-root"]) == 0
    from packer.description.manifest import read_manifest

    assert read_manifest(dst).num_samples == 5
    src = read_list(lst, allow_outside_root=True)
    assert [p for p, _, _ in src.items][2:] == [secret, secret, os.path.join(root, "b", "b0.png")]
    assert main(["convert", "imagefolder", "tar", root, str(tmp_path / "e"), "--allow-outside-root"]) == 2
    assert "--allow-outside-root applies to list and parquet sources only" in capsys.readouterr().err


def test_list_rows_through_a_symlink_in_the_root_are_followed(tmp_path):
    """The rule is on the path the list writes; a symlink inside the root (the user's own folder)
    is followed wherever it leads, as in an image folder."""
    from packer.pipeline.engine import ConvertOptions
    from packer.sources.listsource import convert_list

    elsewhere = _src(tmp_path, "elsewhere")
    root = tmp_path / "root"
    root.mkdir()
    (root / "more").symlink_to(os.path.join(elsewhere, "a"))
    (root / "l.csv").write_text("path,label\nmore/a0.jpg,a\n")
    report = convert_list(str(root / "l.csv"), str(tmp_path / "d"), "tar", ConvertOptions(workers=1))
    assert report.manifest.num_samples == 1 and not report.skipped


@pytest.mark.parametrize("text, name, why", [
    ('{"path": "a/a0.jpg", "label": "a"}\n{"path": "a/a1.jpg", "label": "a", "path": "../x.png"}\n',
     "l.jsonl", r"l\.jsonl:2: key 'path' appears twice"),
    ('{"path": "a/a0.jpg", "label": "a", "label": "b"}\n', "l.jsonl", r"l\.jsonl:1: key 'label' appears twice"),
    ("path,label,path\na/a0.jpg,a,../x.png\n", "l.csv", r"l\.csv:1: column 'path' appears twice in the header"),
    ("file\tlabel\tnote\tnote\na/a0.jpg\ta\tx\ty\n", "l.tsv", r"l\.tsv:1: column 'note' appears twice"),
])
def test_a_list_key_or_column_named_twice_is_an_error(tmp_path, text, name, why):
    from packer.sources.listsource import read_list

    root = _src(tmp_path, "root")
    lst = os.path.join(root, name)
    with open(lst, "w", encoding="utf-8") as f:
        f.write(text)
    with pytest.raises(SourceError, match=why):
        read_list(lst)


# -- list rows and lists that are not regular files, endless, or nested without bound ---------------
def test_list_rows_that_are_fifos_devices_or_huge_are_skipped_unread(tmp_path):
    """A FIFO row blocked for ever, /dev/zero was read whole into a MemoryError: each is skipped with
    the reason, checked on the opened descriptor; a file larger than any image within --max-pixels
    is skipped unread."""
    root = _src(tmp_path, "root")
    os.mkfifo(os.path.join(root, "pipe.jpg"))
    os.symlink("/dev/zero", os.path.join(root, "zero.jpg"))
    with open(os.path.join(root, "huge.png"), "wb") as f:
        f.truncate(65 << 20)  # sparse: above 1,000 pixels x 16 bytes + 64 MiB
    lst = os.path.join(root, "l.csv")
    with open(lst, "w") as f:
        f.write("path,label\na/a0.jpg,a\npipe.jpg,a\nzero.jpg,b\nhuge.png,b\nb/b0.png,b\n")
    dst = str(tmp_path / "d")
    r = subprocess.run([sys.executable, "-m", "packer", "convert", "list", "tar", lst, dst, "--workers", "1",
                        "--max-pixels", "1000", "-q"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    from packer.description.manifest import read_manifest

    m = read_manifest(dst)
    reasons = {s.path: s.reason for s in m.skipped}
    assert m.num_samples == 2 and sorted(reasons) == ["huge.png", "pipe.jpg", "zero.jpg"], reasons
    assert reasons["pipe.jpg"] == "not a regular file (a FIFO); not read"
    assert reasons["zero.jpg"] == "not a regular file (a character device); not read"
    assert reasons["huge.png"].startswith(f"{65 << 20} bytes, more than the {1000 * 16 + (64 << 20)} read")


@pytest.mark.parametrize("case", ["fifo", "device", "endless-line", "deep-json", "deep-meta"])
def test_lists_that_are_not_files_endless_or_deeply_nested_are_one_line(tmp_path, case):
    from packer.sources.listsource import read_list

    root = _src(tmp_path, "root")
    lst = os.path.join(root, "l.jsonl" if case.startswith("deep") else "l.csv")
    if case == "fifo":
        os.mkfifo(lst)
        why = r"l\.csv: not a regular file \(a FIFO\); not read$"
    elif case == "device":
        os.symlink("/dev/zero", lst)
        why = r"l\.csv: not a regular file \(a character device\); not read$"
    elif case == "endless-line":
        with open(lst, "w") as f:
            f.write("path,label\n" + "x" * (4 << 20))
        why = r"l\.csv:2: line longer than \d+ characters; not a list row$"
    else:
        depth = 100_000 if case == "deep-json" else 100
        with open(lst, "w") as f:
            f.write('{"path": "a/a0.jpg", "label": "a"}\n{"path": "a/a1.jpg", "label": "a", "x": '
                    + "[" * depth + "]" * depth + "}\n")
        why = (r"l\.jsonl:2: JSON nested too deeply to read" if case == "deep-json"
               else r"l\.jsonl:2: metadata\.x(\[0\]){63}: nested more than 64 deep$")
    with pytest.raises(SourceError, match=why):
        read_list(lst)


def test_a_list_with_a_byte_order_mark_is_read(tmp_path):
    from packer.sources.listsource import read_list

    root = _src(tmp_path, "root")
    for name, text in (("l.csv", "path,label\na/a0.jpg,a\n"), ("l.tsv", "path\tlabel\na/a0.jpg\ta\n"),
                       ("l.jsonl", '{"path": "a/a0.jpg", "label": "a"}\n')):
        lst = os.path.join(root, name)
        with open(lst, "w", encoding="utf-8-sig") as f:  # what Excel's "CSV UTF-8" writes
            f.write(text)
        src = read_list(lst)
        assert src.path_column == "path" and src.items == [(os.path.join(root, "a", "a0.jpg"), "a", None)]


def test_list_rows_naming_one_file_with_conflicting_labels_are_refused(tmp_path):
    from packer.sources.listsource import read_list

    root = _src(tmp_path, "root")
    lst = os.path.join(root, "l.csv")
    with open(lst, "w") as f:
        f.write("path,label\na/a0.jpg,a\nb/b0.png,b\n./a/a0.jpg,b\n")
    with pytest.raises(SourceError, match=r"l\.csv:4: './a/a0.jpg' is also on line 2 with label 'a', here 'b'"):
        read_list(lst)
    with open(lst, "w") as f:  # the same label twice is not a conflict
        f.write("path,labels\na/a0.jpg,a|b\nb/b0.png,b\na/a0.jpg,b|a\n")
    assert len(read_list(lst, label_kind="multi").items) == 3
