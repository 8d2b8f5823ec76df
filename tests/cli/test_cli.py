"""The command line, called as ``packer.cli.main([...])``: exit status and what lands on stderr, for
good runs and every bad input of the foundation issue."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from packer.cli import main
from packer.datasets import open_dataset
from packer.description.manifest import MANIFEST_NAME, read_manifest
from packer.description.registry import format_names
from packer.pipeline.engine import ConvertOptions, convert_imagefolder, temp_dir_for
from tests.helpers import make_folder

FMT = "hdf5"


def run(capsys, *argv):
    """(exit status, stdout, stderr lines) of one CLI call."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err.splitlines()


def convert(capsys, src, dst, *extra, fmt=FMT):
    return run(capsys, "convert", "imagefolder", fmt, src, dst, "--workers", "1", *extra)


BAD = {"a/zero.jpg", "a/text.png", "b/trunc.jpg", "b/garbage.jpg"}


# -- good runs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", format_names())
def test_convert_info_verify(tiny_folder, tmp_path, capsys, fmt):
    src, pixels = tiny_folder
    rc, out, err = convert(capsys, src, tmp_path / "out", fmt=fmt)
    assert rc == 0 and err == [] and f"wrote {len(pixels)} images in 3 classes" in out
    rc, out, _ = run(capsys, "info", tmp_path / "out")
    assert rc == 0 and f"format      {fmt}" in out and f"samples     {len(pixels)}" in out
    from packer.description.manifest import read_manifest
    from packer.sizes import format_size

    largest = max(f.bytes for f in read_manifest(str(tmp_path / "out")).files)
    assert f"node cache  cache_limit >= largest file x processes reading at once on a node (ranks x workers): " \
           f"1: {format_size(largest)}, 2: {format_size(2 * largest)}" in out
    rc, out, _ = run(capsys, "info", tmp_path / "out", "--json")
    assert rc == 0 and json.loads(out)["num_samples"] == len(pixels)
    rc, out, err = run(capsys, "verify", tmp_path / "out")
    assert rc == 0 and err == [] and f"{len(pixels)}/{len(pixels)} samples decoded" in out


def test_unicode_and_spaces_in_names(tiny_folder, tmp_path, capsys):
    src, pixels = tiny_folder
    dst = tmp_path / "dést ü"
    rc, _, _ = convert(capsys, src, dst)
    assert rc == 0
    ds = open_dataset(dst)
    keys = {ds.read_record(i).key for i in range(len(ds))}
    assert {"cat/c 2.png", "dog/hund_\u00e9\u00e8.jpg", "ému bird/e0.png"} <= keys
    assert read_manifest(dst).classes == ["cat", "dog", "ému bird"]


@pytest.mark.parametrize("src_fmt, dst_fmt", [("hdf5", "lmdb"), ("lmdb", "hdf5"), ("hdf5", "imagefolder")])
def test_convert_between_formats(tiny_folder, tmp_path, capsys, src_fmt, dst_fmt):
    src, pixels = tiny_folder
    assert convert(capsys, src, tmp_path / "a", "--encode", "keep", fmt=src_fmt)[0] == 0
    rc, out, err = run(capsys, "convert", src_fmt, dst_fmt, tmp_path / "a", tmp_path / "b")
    assert rc == 0 and err == [] and f"wrote {len(pixels)} images" in out
    if dst_fmt == "imagefolder":
        assert (tmp_path / "b" / "cat" / "c 2.png").read_bytes() == open(os.path.join(src, "cat", "c 2.png"), "rb").read()
    else:
        assert read_manifest(tmp_path / "b").source["copied"] is True
    rc, _, _ = run(capsys, "convert", src_fmt, "lmdb", tmp_path / "a", tmp_path / "c", "--resize", "8x8", "--workers", "1")
    assert rc == 0 and read_manifest(tmp_path / "c").processing["resize"] == "8x8"


# -- bad sources -----------------------------------------------------------------------------------
def test_missing_source(tmp_path, capsys):
    rc, _, err = convert(capsys, tmp_path / "nope", tmp_path / "out")
    assert rc == 1 and len(err) == 1 and "does not exist" in err[0]
    rc, _, err = run(capsys, "convert", "lmdb", "hdf5", tmp_path / "nope", tmp_path / "out")
    assert rc == 1 and len(err) == 1 and "does not exist" in err[0]
    assert not (tmp_path / "out").exists()


def test_empty_source_and_no_class_folders(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc, _, err = convert(capsys, tmp_path / "empty", tmp_path / "out")
    assert rc == 1 and len(err) == 1 and "no class folders" in err[0]
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "x.jpg").write_bytes(b"whatever")
    rc, _, err = convert(capsys, tmp_path / "flat", tmp_path / "out")
    assert rc == 1 and len(err) == 1 and "no class folders" in err[0]
    (tmp_path / "classes" / "a").mkdir(parents=True)
    (tmp_path / "classes" / "a" / "readme.txt").write_text("no images here")
    rc, _, err = convert(capsys, tmp_path / "classes", tmp_path / "out")
    assert rc == 1 and len(err) == 1 and "no images" in err[0]
    assert not (tmp_path / "out").exists()


def test_bad_images_are_skipped_listed_and_exit_3(messy_folder, tmp_path, capsys):
    rc, _, err = convert(capsys, messy_folder, tmp_path / "out")
    assert rc == 3
    assert {line.split(" ", 1)[1].split(":")[0] for line in err if line.startswith("skipped ")} == BAD
    assert err[-1] == ('4 files skipped: 2 for "OpenCV could not decode this jpeg file (corrupt or truncated)"; '
                       '1 for "not a recognised image format (no JPEG, PNG, GIF, WebP, BMP, TIFF or PNM signature)"; '
                       '1 for "empty file (0 bytes)"; exit status 3')
    m = read_manifest(tmp_path / "out")
    assert {s.path for s in m.skipped} == BAD and m.num_samples == 3


def test_strict_makes_a_bad_image_fatal(messy_folder, tmp_path, capsys):
    rc, _, err = convert(capsys, messy_folder, tmp_path / "out", "--strict")
    assert rc == 1 and len(err) == 1 and err[0].startswith("packer: error:")
    assert any(name in err[0] for name in ("zero", "text", "trunc", "garbage"))
    assert not (tmp_path / "out").exists() and not os.path.exists(temp_dir_for(str(tmp_path / "out")))


def test_destination_exists_and_overwrite_is_atomic(tiny_folder, messy_folder, tmp_path, capsys):
    src, pixels = tiny_folder
    dst = tmp_path / "out"
    assert convert(capsys, src, dst)[0] == 0
    before = (dst / MANIFEST_NAME).read_bytes()
    rc, _, err = convert(capsys, src, dst)
    assert rc == 1 and len(err) == 1 and "destination exists" in err[0] and "--overwrite" in err[0]
    # A replacement that fails leaves the old dataset as it was.
    rc, _, err = convert(capsys, messy_folder, dst, "--overwrite", "--strict")
    assert rc == 1 and (dst / MANIFEST_NAME).read_bytes() == before
    rc, _, err = convert(capsys, tmp_path / "missing", dst, "--overwrite")
    assert rc == 1 and (dst / MANIFEST_NAME).read_bytes() == before
    assert len(open_dataset(dst)) == len(pixels)
    rc, _, _ = convert(capsys, messy_folder, dst, "--overwrite")
    assert rc == 3 and read_manifest(dst).num_samples == 3
    assert sorted(os.listdir(tmp_path)) == ["messy", "out", "src"]


def test_symlinked_files_and_folders_are_followed(tmp_path, capsys):
    make_folder(str(tmp_path / "elsewhere"), {"x": [("far.png", 10, 10)], "y": [("lib.jpg", 10, 10)]})
    make_folder(str(tmp_path / "src"), {"a": [("real.png", 10, 10)]})
    os.symlink(tmp_path / "elsewhere" / "x" / "far.png", tmp_path / "src" / "a" / "link.png")
    os.symlink(tmp_path / "elsewhere" / "y", tmp_path / "src" / "b")  # a class folder that is a link
    rc, _, err = convert(capsys, tmp_path / "src", tmp_path / "out")
    assert rc == 0 and err == []
    ds = open_dataset(tmp_path / "out")
    assert sorted(ds.read_record(i).key for i in range(len(ds))) == ["a/link.png", "a/real.png", "b/lib.jpg"]


def test_symlink_loop_is_detected_and_reported(tmp_path, capsys):
    make_folder(str(tmp_path / "src"), {"a": [("1.png", 10, 10)]})
    os.symlink(tmp_path / "src" / "a", tmp_path / "src" / "a" / "loop")
    rc, _, err = convert(capsys, tmp_path / "src", tmp_path / "out")
    assert rc == 3 and any("a/loop" in line and "symlink loop" in line for line in err)
    assert any("symlink loop" in s.reason for s in read_manifest(tmp_path / "out").skipped)
    assert read_manifest(tmp_path / "out").num_samples == 1


def _drop_dac_capabilities() -> None:
    """In the child before exec: drop the capabilities that let root ignore file permissions."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_unreadable_folder_is_reported(tmp_path):
    """chmod 000 on a folder. Root reads it anyway, so as root the CLI runs in a child process
    whose capability bounding set lacks CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH: it is still
    uid 0 (it can run the interpreter under /root) but obeys permission bits like anyone else."""
    make_folder(str(tmp_path / "src"), {"a": [("1.png", 10, 10)], "b": [("2.png", 10, 10)]})
    locked = tmp_path / "src" / "b"
    os.chmod(locked, 0)
    preexec = None
    if os.geteuid() == 0:
        try:
            subprocess.run(["true"], preexec_fn=_drop_dac_capabilities, check=True)
        except (OSError, subprocess.SubprocessError) as e:
            os.chmod(locked, 0o755)
            pytest.skip(f"running as root and cannot drop CAP_DAC_OVERRIDE to make chmod 000 bite: {e}")
        preexec = _drop_dac_capabilities
    try:
        code = "import sys; from packer.cli import main; sys.exit(main(sys.argv[1:]))"
        proc = subprocess.run(
            [sys.executable, "-c", code, "convert", "imagefolder", FMT, str(tmp_path / "src"), str(tmp_path / "out"),
             "--workers", "1"],
            preexec_fn=preexec, capture_output=True, text=True, timeout=120,
        )
    finally:
        os.chmod(locked, 0o755)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert any(str(locked) in line or "b:" in line for line in proc.stderr.splitlines() if "cannot read folder" in line)
    m = read_manifest(tmp_path / "out")
    assert m.num_samples == 1 and any("cannot read folder" in s.reason for s in m.skipped)


# -- bad command lines -----------------------------------------------------------------------------
BAD_COMMAND_LINES = [
    ["convert", "imagefolder", "zip", "SRC", "DST"],
    ["convert", "rar", "hdf5", "SRC", "DST"],
    ["convert", "imagefolder", "imagefolder", "SRC", "DST"],
    ["convert", "imagefolder", "hdf5", "SRC", "DST", "--resize", "big"],
    ["convert", "imagefolder", "hdf5", "SRC", "DST", "--resize", "0x10"],
    ["convert", "imagefolder", "hdf5", "SRC", "DST", "--encode", "gif"],
    ["convert", "imagefolder", "hdf5", "SRC", "DST", "--encode", "jpeg:101"],
    ["convert", "imagefolder", "tar", "SRC", "DST", "--shard-size", "lots"],
    ["convert", "imagefolder", "tar", "SRC", "DST", "--shard-size", "-5MB"],
    ["convert", "imagefolder", "hdf5", "SRC", "DST", "--workers", "0"],
    ["convert", "imagefolder", "hdf5", "SRC", "DST", "--workers", "two"],
    ["convert", "hdf5", "lmdb", "SRC", "DST", "--encode", "bogus"],
    ["convert", "imagefolder", "hdf5", "SRC"],
    ["convert", "imagefolder", "hdf5", "SRC", "DST", "--no-such-option"],
    ["frobnicate"],
    [],
    ["verify"],
]


@pytest.mark.parametrize("argv", BAD_COMMAND_LINES, ids=lambda a: " ".join(a) or "(none)")
def test_bad_command_line_is_one_line_and_exit_2(tmp_path, capsys, argv):
    argv = [str(tmp_path / a) if a in ("SRC", "DST") else a for a in argv]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("packer") and not (tmp_path / "DST").exists()


# -- verify on damaged data ------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["hdf5", "lmdb"])
def test_verify_names_the_corrupt_sample(tiny_folder, tmp_path, capsys, fmt):
    src, _ = tiny_folder
    dst = tmp_path / "out"
    assert convert(capsys, src, dst, "--encode", "png", fmt=fmt)[0] == 0
    ds = open_dataset(dst)
    victim = 4
    payload = bytes(ds.read_record(victim).payload)
    data = (dst / read_manifest(dst).files[0].name).read_bytes()
    at = data.index(payload) + len(payload) // 2
    with open(dst / read_manifest(dst).files[0].name, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0x55]))
    rc, out, err = run(capsys, "verify", dst)
    assert rc == 1 and "CORRUPT" in out
    assert any("SHA-256" in line for line in err)
    assert any(line.startswith(f"sample {victim}:") and "checksum" in line for line in err)
    rc, out, _ = run(capsys, "verify", dst, "--no-decode")
    assert rc == 1 and "samples not decoded (--no-decode)" in out
    rc, _, err = run(capsys, "info", tmp_path / "nothing")
    assert rc == 1 and len(err) == 1


def test_a_closed_output_pipe_is_not_an_error_message(tiny_folder, tmp_path):
    src, _ = tiny_folder
    convert_imagefolder(src, tmp_path / "out", "lmdb", ConvertOptions())
    proc = subprocess.Popen([sys.executable, "-m", "packer", "info", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # like `packer info DST | head -0`
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Broken pipe" not in err and "Traceback" not in err


# -- what the last lines say -----------------------------------------------------------------------
def test_last_lines_count_ignored_left_small_and_empty_classes(tmp_path, capsys):
    src = tmp_path / "src"
    sizes = {"big": [("b0.jpg", 80, 60), ("b1.png", 64, 90)], "small": [("s0.jpg", 30, 50), ("s1.png", 47, 47)],
             "edge": [("e0.jpg", 48, 70)]}  # shorter side exactly 48: reaches the target, not left small
    make_folder(str(src), sizes)
    for d in ("empty", "also empty/sub"):
        os.makedirs(src / d)
    for hidden in (".ipynb_checkpoints/big/x.jpg", ".DS_Store", "big/._b0.jpg", "big/.cache/y.jpg"):
        (src / hidden).parent.mkdir(parents=True, exist_ok=True)
        (src / hidden).write_bytes((src / "big" / "b0.jpg").read_bytes())
    (src / "loose.jpg").write_bytes((src / "big" / "b0.jpg").read_bytes())  # outside every class folder
    (src / "notes.txt").write_text("hello")  # outside, too
    (src / "small" / "labels.csv").write_text("x")  # not an image
    (src / "small" / "thumbs.db").write_bytes(b"\0")
    rc, out, err = convert(capsys, src, tmp_path / "out", "--resize", "shorter:48")
    assert rc == 0 and "wrote 5 images in 5 classes" in out
    assert err == [
        "ignored: 4 hidden (names starting with '.'), 2 not images (no image extension), 2 outside class folders",
        "left small: 2 images below --resize shorter:48 kept their size (--upscale enlarges them)",
        "warning: 2 empty classes, no image has their label: also empty, empty",
    ]
    ds = open_dataset(tmp_path / "out")
    stored = {ds.read_record(i).key: (ds.read_record(i).height, ds.read_record(i).width) for i in range(len(ds))}
    assert stored["small/s0.jpg"] == (30, 50) and stored["big/b0.jpg"] == (64, 48)
    rc, out, err = convert(capsys, src, tmp_path / "up", "--resize", "shorter:48", "--upscale")
    assert rc == 0 and not any(line.startswith("left small") for line in err)


def test_no_resize_keeps_the_original_bytes_by_default(tiny_folder, tmp_path, capsys):
    src, pixels = tiny_folder
    assert convert(capsys, src, tmp_path / "keep", fmt="lmdb")[0] == 0
    assert read_manifest(tmp_path / "keep").processing["encoding"] == "keep"
    ds = open_dataset(tmp_path / "keep")
    for i in range(len(ds)):
        rec = ds.read_record(i)
        with open(os.path.join(src, rec.key), "rb") as f:
            assert bytes(rec.payload) == f.read(), rec.key  # no silent lossy re-encode
    assert convert(capsys, src, tmp_path / "small", "--resize", "shorter:32", fmt="lmdb")[0] == 0
    assert read_manifest(tmp_path / "small").processing["encoding"] == "jpeg:90"
    assert convert(capsys, src, tmp_path / "png", "--resize", "none", "--encode", "png", fmt="lmdb")[0] == 0
    assert read_manifest(tmp_path / "png").processing["encoding"] == "png"


def test_convert_help_lists_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "3 done with skipped files, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM)" in text


# -- messages a user can act on ------------------------------------------------------------------
def test_a_list_where_nothing_converts_names_the_reasons(messy_folder, tmp_path, capsys):
    """Every row skipped: one error line that counts the skips by reason and names the first
    files of each, not a bare count; nothing at DST."""
    lst = tmp_path / "val.csv"
    rows = [f"gone{i}.jpg,a" for i in range(4)] + ["messy/a/zero.jpg,a", "messy/a/text.png,b"]
    lst.write_text("path,label\n" + "\n".join(rows) + "\n")
    rc, out, err = run(capsys, "convert", "list", "lmdb", lst, tmp_path / "out", "--workers", "1", "--no-shuffle")
    assert rc == 1 and out == "" and len(err) == 1
    assert err[0] == (f'packer: error: no image in {lst} could be converted; all 6 were skipped: 4 for "cannot read: '
                      f'No such file or directory" (gone0.jpg, gone1.jpg, gone2.jpg, ...); 1 for "empty file (0 bytes)" '
                      '(messy/a/zero.jpg); 1 for "not a recognised image format (no JPEG, PNG, GIF, WebP, '
                      'BMP, TIFF or PNM signature)" (messy/a/text.png)')
    assert not (tmp_path / "out").exists()
    lst.write_text("path,label\ngone.jpg,a\n")
    rc, _, err = run(capsys, "convert", "list", "tar", lst, tmp_path / "out", "--workers", "1")
    assert rc == 1 and err == [f"packer: error: no image in {lst} could be converted; the only one, gone.jpg, was "
                               f"skipped: cannot read: No such file or directory"]


def test_an_image_folder_where_nothing_converts_names_the_reasons(messy_folder, tmp_path, capsys):
    for ok in ("a/ok1.jpg", "a/ok2.png", "b/ok3.jpg"):
        os.remove(os.path.join(messy_folder, ok))
    rc, _, err = convert(capsys, messy_folder, tmp_path / "out", "--no-shuffle")
    assert rc == 1 and len(err) == 1
    assert err[0].startswith(f'packer: error: no image in {messy_folder} could be converted; all 4 were skipped: '
                             f'2 for "OpenCV could not decode this jpeg file (corrupt or truncated)" (b/')
    assert '1 for "empty file (0 bytes)" (a/zero.jpg)' in err[0]


def test_counts_in_the_summary_are_singular_or_plural(tmp_path, capsys):
    make_folder(str(tmp_path / "one"), {"only": [("x.png", 20, 20)]})
    (tmp_path / "one" / "only" / "bad.jpg").write_bytes(b"")
    (tmp_path / "one" / "only" / "notes.txt").write_text("not an image")
    os.makedirs(tmp_path / "one" / "none")
    rc, out, err = convert(capsys, tmp_path / "one", tmp_path / "out", "--resize", "shorter:48", fmt="lmdb")
    assert rc == 3 and out.startswith(f"wrote 1 image in 2 classes to {tmp_path / 'out'} (lmdb, ")
    assert err == ["ignored: 1 not an image (no image extension)",
                   "left small: 1 image below --resize shorter:48 kept its size (--upscale enlarges it)",
                   "warning: 1 empty class, no image has its label: none",
                   "skipped only/bad.jpg: empty file (0 bytes)",
                   '1 file skipped: 1 for "empty file (0 bytes)"; exit status 3']
    rc, out, _ = run(capsys, "verify", tmp_path / "out")
    assert rc == 0 and "1/1 sample decoded" in out


def test_quiet_prints_only_warnings_and_skips(tmp_path, capsys):
    """-q: no summary, no notes; the warnings, the skipped files and their count stay."""
    make_folder(str(tmp_path / "src"), {"a": [("x.png", 20, 20), ("y.png", 30, 30)]})
    (tmp_path / "src" / "a" / "bad.jpg").write_bytes(b"")
    os.makedirs(tmp_path / "src" / "b")
    rc, out, err = convert(capsys, tmp_path / "src", tmp_path / "out", "--resize", "shorter:48", "-q")
    assert rc == 3 and out == ""
    assert err == ["warning: 1 empty class, no image has its label: b", "skipped a/bad.jpg: empty file (0 bytes)",
                   '1 file skipped: 1 for "empty file (0 bytes)"; exit status 3']
    os.remove(tmp_path / "src" / "a" / "bad.jpg")
    os.rmdir(tmp_path / "src" / "b")
    rc, out, err = convert(capsys, tmp_path / "src", tmp_path / "ok", "-q")
    assert (rc, out, err) == (0, "", [])
