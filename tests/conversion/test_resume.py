"""``--resume``: what an interrupted conversion keeps, when resuming is refused, what the user is
told, and crash safety of publishing (``--overwrite`` included). The SIGKILL sweeps are in
test_faults.py; here interruptions are injected in-process at chosen samples, so every case is
exact."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

import packer.files.filesystem as filesystem
import packer.pipeline.engine as engine
from packer.cli import main
from packer.converters.base import WriterOptions
from packer.datasets import open_dataset
from packer.description.manifest import read_manifest
from packer.description.registry import writer_class
from packer.errors import ResumeError, UnfinishedDatasetError
from packer.files.journal import JOURNAL_NAME, read_journal
from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
from packer.operations.transcode import convert_dataset
from packer.pipeline.engine import (
    ConvertOptions,
    convert_imagefolder,
    recover_publish,
    temp_dir_for,
)
from tests.helpers import make_folder, sigint_as_in_a_terminal
from tools import faultlib as fl

FORMATS = fl.FORMATS


def options(fmt: str, **kw) -> ConvertOptions:
    w = WriterOptions(shard_samples=5) if fmt in ("tar", "tfrecord") else WriterOptions(checkpoint_samples=5)
    return ConvertOptions(processing=ProcessOptions(encoding=parse_encoding("png")), writer=w, workers=1, **kw)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("resume") / "src")
    make_folder(root, {c: [(f"{i}.png", 24 + i, 30) for i in range(9)] for c in ("a", "b", "c")})
    return root


@pytest.fixture(scope="module")
def refs(src, tmp_path_factory):
    base = tmp_path_factory.mktemp("refs")
    return {fmt: convert_imagefolder(src, str(base / fmt), fmt, options(fmt)).output for fmt in FORMATS}


def interrupt_after(monkeypatch, fmt: str, n: int, exc: BaseException | None = None) -> None:
    """Make the ``fmt`` writer raise (KeyboardInterrupt by default) on its ``n + 1``-th add."""
    cls = writer_class(fmt)
    orig = cls.add
    count = [0]

    def add(self, *a, **kw):
        count[0] += 1
        if count[0] > n:
            raise exc if exc is not None else KeyboardInterrupt
        return orig(self, *a, **kw)

    monkeypatch.setattr(cls, "add", add)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("at", [3, 12, 26])
def test_interrupted_then_resumed_equals_uninterrupted(fmt, at, src, refs, tmp_path, monkeypatch):
    dst = str(tmp_path / "out")
    interrupt_after(monkeypatch, fmt, at)
    with pytest.raises(KeyboardInterrupt) as info:
        convert_imagefolder(src, dst, fmt, options(fmt))
    monkeypatch.undo()
    tmp = temp_dir_for(dst)
    assert not os.path.exists(dst)
    assert os.path.exists(tmp) == (at >= 5)  # kept only when a checkpoint makes it worth resuming
    if at >= 5:
        with pytest.raises(UnfinishedDatasetError):
            open_dataset(tmp)
    kept = read_journal(tmp)
    if at >= 5:
        assert kept is not None and kept.written >= 5 and info.value.partial_output == tmp
    report = convert_imagefolder(src, dst, fmt, options(fmt, resume=True))
    assert fl.identical_dirs(dst, refs[fmt])
    assert report.resumed is None if kept is None else report.resumed["written"] == kept.written
    assert not os.path.exists(tmp)
    written_now = report.manifest.num_samples - (kept.written if kept is not None else 0)
    assert report.rate == pytest.approx(written_now / report.seconds)  # kept samples are not this run's work


@pytest.mark.parametrize("fmt", FORMATS)
def test_left_small_counts_the_whole_output_after_a_resume(fmt, src, tmp_path, monkeypatch):
    # sides 24..32 x 30 against shorter:28: 4 of the 9 images of each class stay small
    opts = options(fmt)
    opts = replace(opts, processing=replace(opts.processing, resize=parse_resize("shorter:28")))
    whole = convert_imagefolder(src, str(tmp_path / "whole"), fmt, opts)
    assert whole.left_small == 12
    dst = str(tmp_path / "out")
    interrupt_after(monkeypatch, fmt, 17)
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(src, dst, fmt, opts)
    monkeypatch.undo()
    kept = read_journal(temp_dir_for(dst))
    assert kept is not None and 0 < kept.left_small < 12 and kept.written < 27
    report = convert_imagefolder(src, dst, fmt, replace(opts, resume=True))
    assert report.resumed["written"] == kept.written and report.left_small == 12


@pytest.mark.parametrize("fmt", FORMATS)
def test_resume_refuses_other_options_or_source(fmt, src, tmp_path, monkeypatch):
    dst = str(tmp_path / "out")
    interrupt_after(monkeypatch, fmt, 12)
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(src, dst, fmt, options(fmt))
    monkeypatch.undo()
    tmp = temp_dir_for(dst)
    before = sorted(os.listdir(tmp))
    with pytest.raises(ResumeError, match="the options changed.*without --resume"):
        convert_imagefolder(src, dst, fmt, options(fmt, resume=True, seed=1))
    changed = tmp_path / "src2"
    shutil.copytree(src, changed)
    with open(changed / "a" / "0.png", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ResumeError, match="the source changed"):
        convert_imagefolder(str(changed), dst, fmt, options(fmt, resume=True))
    assert sorted(os.listdir(tmp)) == before  # refusing touches nothing
    convert_imagefolder(src, dst, fmt, options(fmt))  # without --resume: starts over
    assert len(open_dataset(dst)) == 27 and not os.path.exists(tmp)


def test_resume_with_nothing_to_resume_starts_over(src, refs, tmp_path, capsys):
    dst = tmp_path / "out"
    rc = main(["convert", "imagefolder", "tar", src, str(dst), "--workers", "1", "--encode", "png",
               "--shard-samples", "5", "--resume"])
    err = capsys.readouterr().err
    assert rc == 0 and "nothing to resume" in err
    assert fl.identical_dirs(str(dst), refs["tar"])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("killed_at", ["manifest", "final journal"])
def test_killed_at_the_end_resumes(fmt, killed_at, src, refs, tmp_path, monkeypatch):
    """Killed between the final journal and the manifest (or the publish): resume only checks the
    files and publishes. Killed after the writers closed but before that journal (the SIGKILL
    sweep found it): the last checkpoint's resume state, the sample table's spill files included,
    is still there, and the resume rebuilds the same dataset."""
    dst = str(tmp_path / "out")
    orig = engine.write_journal

    def journal(tmp, j, *a, **kw):  # noqa: ANN001, ANN202
        if j.phase == "closed":
            raise KeyboardInterrupt
        return orig(tmp, j, *a, **kw)

    def boom(*a, **kw):  # noqa: ANN202
        raise KeyboardInterrupt

    if killed_at == "manifest":
        monkeypatch.setattr(engine, "write_manifest", boom)
    else:
        monkeypatch.setattr(engine, "write_journal", journal)
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(src, dst, fmt, options(fmt))
    monkeypatch.undo()
    assert read_journal(temp_dir_for(dst)).phase == ("closed" if killed_at == "manifest" else "writing")
    report = convert_imagefolder(src, dst, fmt, options(fmt, resume=True))
    if killed_at == "manifest":
        assert report.resumed["written"] == 27
    assert report.resumed is not None and fl.identical_dirs(dst, refs[fmt])


@pytest.mark.parametrize("fmt", FORMATS)
def test_killed_while_resuming_resumes_again(fmt, src, refs, tmp_path, monkeypatch):
    dst = str(tmp_path / "out")
    interrupt_after(monkeypatch, fmt, 16)
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(src, dst, fmt, options(fmt))
    monkeypatch.undo()
    # the resume is interrupted too: while replaying (LMDB, HDF5) or right after it
    interrupt_after(monkeypatch, fmt, 8)
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(src, dst, fmt, options(fmt, resume=True))
    monkeypatch.undo()
    convert_imagefolder(src, dst, fmt, options(fmt, resume=True))
    assert fl.identical_dirs(dst, refs[fmt])


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_commits_after_the_last_journal_are_dropped(fmt, src, refs, tmp_path, monkeypatch):
    """Killed after a commit but before its journal: the extra samples are not trusted."""
    dst = str(tmp_path / "out")
    orig = engine.write_journal
    calls = [0]

    def journal(*a, **kw):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return orig(*a, **kw)

    monkeypatch.setattr(engine, "write_journal", journal)
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(src, dst, fmt, options(fmt))
    monkeypatch.undo()
    assert read_journal(temp_dir_for(dst)).written == 10  # the third commit (15) is not journaled
    report = convert_imagefolder(src, dst, fmt, options(fmt, resume=True))
    assert report.resumed["written"] == 10 and fl.identical_dirs(dst, refs[fmt])


def test_skips_before_the_interruption_are_kept(tmp_path, monkeypatch):
    root = tmp_path / "src"
    make_folder(str(root), {"a": [(f"{i}.png", 20, 20) for i in range(12)]})
    (root / "a" / "00bad.png").write_bytes(b"not an image")
    (root / "a" / "01bad.png").write_bytes(b"")
    opts = options("tar", shuffle=False)
    ref = convert_imagefolder(str(root), str(tmp_path / "ref"), "tar", opts)
    interrupt_after(monkeypatch, "tar", 11)
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(str(root), str(tmp_path / "out"), "tar", opts)
    monkeypatch.undo()
    assert len(read_journal(temp_dir_for(str(tmp_path / "out"))).skipped) == 2
    report = convert_imagefolder(str(root), str(tmp_path / "out"), "tar", replace(opts, resume=True))
    assert [s.path for s in report.skipped] == [s.path for s in ref.skipped] == ["a/00bad.png", "a/01bad.png"]
    assert fl.identical_dirs(str(tmp_path / "out"), str(tmp_path / "ref"))


def test_strict_or_empty_source_errors_remove_the_partial_output(src, tmp_path, monkeypatch):
    from packer.errors import ImageError

    dst = str(tmp_path / "out")
    interrupt_after(monkeypatch, "tar", 12, ImageError("bad image"))
    with pytest.raises(ImageError):
        convert_imagefolder(src, dst, "tar", options("tar"))
    assert not os.path.exists(temp_dir_for(dst))


def test_other_errors_keep_resumable_output_and_say_so(src, refs, tmp_path, monkeypatch, capsys):
    dst = str(tmp_path / "out")
    interrupt_after(monkeypatch, "lmdb", 12, OSError(5, "Input/output error"))
    rc = main(["convert", "imagefolder", "lmdb", src, dst, "--workers", "1", "--encode", "png",
               "--checkpoint-samples", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    tmp = temp_dir_for(dst)
    assert rc == 1 and len(err) == 1
    assert err[0] == (f"packer: error: [Errno 5] Input/output error; partial output kept in {tmp}; "
                      f"run again with --resume to continue")
    monkeypatch.undo()
    rc = main(["convert", "imagefolder", "lmdb", src, dst, "--workers", "1", "--encode", "png",
               "--checkpoint-samples", "5", "--resume"])
    err = capsys.readouterr().err
    assert rc == 0 and "resumed: kept 10 samples" in err
    assert fl.identical_dirs(dst, refs["lmdb"])


def test_packed_to_packed_resumes_and_imagefolder_refuses(refs, tmp_path, monkeypatch):
    src = refs["lmdb"]
    want = str(tmp_path / "want")
    convert_dataset(src, want, "lmdb", "tar", replace(options("tar"), processing=ProcessOptions(
        encoding=parse_encoding("keep"))))
    dst = str(tmp_path / "out")
    opts = replace(options("tar"), processing=ProcessOptions(encoding=parse_encoding("keep")))
    interrupt_after(monkeypatch, "tar", 13)
    with pytest.raises(KeyboardInterrupt):
        convert_dataset(src, dst, "lmdb", "tar", opts)
    monkeypatch.undo()
    report = convert_dataset(src, dst, "lmdb", "tar", replace(opts, resume=True))
    assert report.resumed["written"] == 10 and fl.identical_dirs(dst, want)
    with pytest.raises(ResumeError, match="imagefolder"):
        convert_dataset(src, str(tmp_path / "folder"), "lmdb", "imagefolder", replace(opts, resume=True))


def test_checkpoint_samples_is_a_recorded_option(src, tmp_path, capsys):
    rc = main(["convert", "imagefolder", "tar", src, str(tmp_path / "x"), "--checkpoint-samples", "5"])
    assert rc == 2 and "lmdb and hdf5 output only" in capsys.readouterr().err
    convert_imagefolder(src, str(tmp_path / "a"), "lmdb", options("lmdb"))
    assert read_manifest(tmp_path / "a").layout["checkpoint_samples"] == 5


def test_overwrite_is_atomic_and_a_crash_between_renames_is_repaired(src, refs, tmp_path, monkeypatch):
    dst = str(tmp_path / "out")
    shutil.copytree(refs["tar"], dst)
    old_manifest = read_manifest(dst)
    # Without RENAME_EXCHANGE: a crash after the old dataset moved aside and before the new one
    # moved in leaves no DST; the next conversion puts the old one back first.
    monkeypatch.setattr(filesystem, "_exchange", lambda a, b: False)
    real_replace = os.replace

    def replace_then_crash(a, b):
        real_replace(a, b)
        if b.endswith(".packer-old"):
            raise KeyboardInterrupt

    monkeypatch.setattr(filesystem.os, "replace", replace_then_crash)
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(src, dst, "lmdb", options("lmdb", overwrite=True))
    monkeypatch.undo()
    assert not os.path.exists(dst)
    recover_publish(dst)
    assert read_manifest(dst) == old_manifest
    # With the exchange (Linux), DST always names a complete dataset; leftovers are cleaned up.
    convert_imagefolder(src, dst, "lmdb", options("lmdb", overwrite=True))
    assert fl.identical_dirs(dst, refs["lmdb"])
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_journal_is_json_and_never_published(src, tmp_path, monkeypatch):
    dst = str(tmp_path / "out")
    interrupt_after(monkeypatch, "hdf5", 12)
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(src, dst, "hdf5", options("hdf5"))
    with open(os.path.join(temp_dir_for(dst), JOURNAL_NAME)) as f:
        j = json.load(f)
    assert j["version"] == 1 and j["phase"] == "writing" and j["written"] == 10
    assert set(j["fingerprint"]) == {"source", "options"} and j["writer"]["samples"] == 10
    monkeypatch.undo()
    convert_imagefolder(src, dst, "hdf5", options("hdf5", resume=True))
    assert sorted(os.listdir(dst)) == ["data.h5", "manifest.json", "samples.table"]


@pytest.mark.parametrize("at", [7, 11, 12, 14, 16])
def test_hdf5_resume_across_the_switch_to_flat_storage(tmp_path, monkeypatch, at):
    """Raw samples of one shape start an (N, H, W, 3) array; sample 11 has another shape and moves
    everything into a new file. Interrupted before, at and after the switch, resume still gives
    the uninterrupted bytes."""
    root = tmp_path / "src"
    make_folder(str(root), {"a": [(f"{i:02d}.png", 16, 16) for i in range(11)] + [("11.png", 17, 16)]
                            + [(f"{i:02d}.png", 16, 16) for i in range(12, 20)]})
    o = ConvertOptions(processing=ProcessOptions(encoding=parse_encoding("raw")),
                       writer=WriterOptions(checkpoint_samples=5), workers=1, shuffle=False)
    convert_imagefolder(str(root), str(tmp_path / "ref"), "hdf5", o)
    assert read_manifest(tmp_path / "ref").layout["storage"] == "flat"
    dst = str(tmp_path / "out")
    interrupt_after(monkeypatch, "hdf5", at)
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(str(root), dst, "hdf5", o)
    monkeypatch.undo()
    convert_imagefolder(str(root), dst, "hdf5", replace(o, resume=True))
    assert fl.identical_dirs(dst, str(tmp_path / "ref"))


def test_resume_to_an_imagefolder_is_a_usage_error(refs, tmp_path, capsys):
    rc = main(["convert", "lmdb", "imagefolder", refs["lmdb"], str(tmp_path / "x"), "--resume"])
    assert rc == 2 and "--resume applies to packed output" in capsys.readouterr().err


# -- SIGTERM, starting over, already complete ------------------------------------------------------
def _slow_source(root) -> list[str]:
    """150 images that take seconds to encode as PNG with one worker; the argv that converts them."""
    make_folder(str(root / "src"), {"a": [(f"{i}.png", 300, 300) for i in range(150)]})
    return [sys.executable, "-m", "packer", "convert", "imagefolder", "tar", str(root / "src"), str(root / "out"),
            "--workers", "1", "--encode", "png", "--shard-samples", "5"]


def _wait_for_checkpoint(proc, dst: str) -> None:
    journal = os.path.join(temp_dir_for(dst), JOURNAL_NAME)
    deadline = time.time() + 60
    while not os.path.exists(journal) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None, "the conversion finished before it could be stopped"


@pytest.mark.parametrize("sig, status, said", [  # Ctrl-C stopping a conversion: also tests/pipeline/test_engine.py
    pytest.param(signal.SIGINT, 130, "interrupted", marks=pytest.mark.slow), (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_ctrl_c_or_sigterm_keeps_resumable_output_and_resume_completes_it(tmp_path, sig, status, said):
    argv = _slow_source(tmp_path)
    dst = argv[7]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_in_a_terminal)
    _wait_for_checkpoint(proc, dst)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    tmp = temp_dir_for(dst)
    assert proc.returncode == status, err
    assert err.strip().splitlines()[-1] == (f"packer: {said}; partial output kept in {tmp}; "
                                            f"run again with --resume to continue")
    kept = read_journal(tmp)
    assert kept is not None and 0 < kept.written < 150 and not os.path.exists(dst)
    r = subprocess.run(argv + ["--resume"], capture_output=True, text=True)
    assert r.returncode == 0 and f"resumed: kept {kept.written} samples" in r.stderr
    ref = str(tmp_path / "ref")
    subprocess.run(argv[:7] + [ref] + argv[8:], check=True, capture_output=True)
    assert fl.identical_dirs(dst, ref)


def test_sigterm_to_the_whole_job_with_workers_is_still_an_interruption(tmp_path):
    """SLURM signals every process of the job: the workers die of it too, which is not a crash."""
    argv = _slow_source(tmp_path)
    argv[argv.index("--workers") + 1] = "2"
    dst = argv[7]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for_checkpoint(proc, dst)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1].startswith("packer: terminated (SIGTERM); partial output kept in ")
    assert read_journal(temp_dir_for(dst)).written > 0


def test_a_plain_rerun_says_it_drops_the_partial_output(src, refs, tmp_path, monkeypatch, capsys):
    dst = str(tmp_path / "out")
    interrupt_after(monkeypatch, "tar", 12)
    with pytest.raises(KeyboardInterrupt):
        convert_imagefolder(src, dst, "tar", options("tar"))
    monkeypatch.undo()
    written = read_journal(temp_dir_for(dst)).written
    assert written == 10
    rc = main(["convert", "imagefolder", "tar", src, dst, "--workers", "1", "--encode", "png", "--shard-samples", "5"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 0 and err[0] == (f"packer: starting over: deleting the partial output of an interrupted conversion "
                                  f"in {temp_dir_for(dst)} ({written} samples written); --resume continues from it instead")
    assert fl.identical_dirs(dst, refs["tar"])
    rc = main(["convert", "imagefolder", "tar", src, str(tmp_path / "fresh"), "--workers", "1", "--encode", "png"])
    assert rc == 0 and "starting over" not in capsys.readouterr().err  # nothing to drop: nothing said


@pytest.mark.parametrize("fmt", FORMATS)
def test_resume_of_a_complete_destination_says_so_and_exits_0(fmt, src, refs, tmp_path, capsys):
    dst = tmp_path / "out"
    shutil.copytree(refs[fmt], dst)
    before = {n: (dst / n).read_bytes() for n in os.listdir(dst)}
    option = "--shard-samples" if fmt in ("tar", "tfrecord") else "--checkpoint-samples"
    argv = ["convert", "imagefolder", fmt, src, str(dst), "--workers", "1", "--encode", "png", option, "5", "--resume"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out == f"{dst} is already complete (27 images, same source and options); nothing to do\n"
    assert {n: (dst / n).read_bytes() for n in os.listdir(dst)} == before
    assert main(argv[:-1] + ["--seed", "3", "--resume"]) == 1  # other options: not this conversion's output
    assert f"destination exists: {dst}, and it is not what this conversion makes (other shuffle seed)" in \
        capsys.readouterr().err
    assert main(argv[:-3] + [option, "7", "--resume"]) == 1
    assert f"(other {option[2:].replace('-', '_')})" in capsys.readouterr().err
    assert main(argv[:-1] + ["--encode", "jpeg:80", "--resume"]) == 1
    assert "(other processing)" in capsys.readouterr().err
    changed = tmp_path / "src2"
    shutil.copytree(src, changed)
    argv2 = [str(changed) if a == src else a for a in argv]
    assert main(argv2) == 0 and "already complete" in capsys.readouterr().out  # a copy is the same source
    with open(changed / "b" / "3.png", "ab") as f:
        f.write(b"\0")
    assert main(argv2) == 1
    assert f"({changed / 'b' / '3.png'} changed after it was written)" in capsys.readouterr().err
    os.remove(changed / "c" / "8.png")
    assert main(argv2) == 1
    assert "27 samples + 0 skipped, the source has 26 files" in capsys.readouterr().err
    assert {n: (dst / n).read_bytes() for n in os.listdir(dst)} == before  # refusing touches nothing
