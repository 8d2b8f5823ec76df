"""The conversion engine: skips with reasons, strict mode, destinations, crashes, interrupts."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

from packer.datasets import open_dataset
from packer.description.manifest import read_manifest
from packer.errors import ImageError, PackerError, SourceError
from packer.pipeline.engine import ConvertOptions, _results, convert_imagefolder, temp_dir_for
from packer.pipeline.pool import ordered_map
from packer.pipeline.scan import scan_imagefolder
from tests.helpers import make_folder, sigint_as_in_a_terminal
from tests.workerfns import big_answers, chunk_fails_on_three


@pytest.mark.parametrize("workers", [1, 2])
def test_bad_images_are_skipped_and_listed(messy_folder, tmp_path, workers):
    report = convert_imagefolder(messy_folder, tmp_path / "out", "lmdb", ConvertOptions(workers=workers))
    m = read_manifest(tmp_path / "out")
    assert m.num_samples == 3 and len(open_dataset(tmp_path / "out")) == 3
    reasons = {s.path: s.reason for s in m.skipped}
    assert set(reasons) == {"a/zero.jpg", "a/text.png", "b/trunc.jpg", "b/garbage.jpg"}
    assert "empty" in reasons["a/zero.jpg"] and "truncated" in reasons["b/trunc.jpg"]
    assert [s.path for s in report.skipped] == [s.path for s in m.skipped]


def test_strict_makes_a_bad_image_fatal_and_leaves_nothing(messy_folder, tmp_path):
    with pytest.raises(ImageError, match=r"(zero|text|trunc|garbage)"):
        convert_imagefolder(messy_folder, tmp_path / "out", "lmdb", ConvertOptions(strict=True))
    assert not (tmp_path / "out").exists() and not os.path.exists(temp_dir_for(str(tmp_path / "out")))


def test_destination_is_refused_or_replaced_atomically(tiny_folder, tmp_path):
    src, _ = tiny_folder
    dst = tmp_path / "out"
    convert_imagefolder(src, dst, "lmdb", ConvertOptions(shuffle=False))
    with pytest.raises(FileExistsError, match="--overwrite"):
        convert_imagefolder(src, dst, "lmdb")
    # A failing replacement keeps the old dataset intact.
    with pytest.raises(SourceError, match="does not exist"):
        convert_imagefolder(str(tmp_path / "missing"), dst, "lmdb", ConvertOptions(overwrite=True))
    assert read_manifest(dst).shuffle_seed is None
    convert_imagefolder(src, dst, "lmdb", ConvertOptions(overwrite=True, seed=5))
    assert read_manifest(dst).shuffle_seed == 5
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]  # no temp or old folders left


def test_destination_inside_source_is_refused(tiny_folder):
    src, _ = tiny_folder
    with pytest.raises(SourceError, match="inside the source"):
        convert_imagefolder(src, os.path.join(src, "packed"), "lmdb")


def test_a_dying_worker_raises_instead_of_hanging(tmp_path):
    root = tmp_path / "src"
    make_folder(str(root), {"a": [(f"{i}.png", 16, 16) for i in range(1000)]})
    samples = scan_imagefolder(str(root)).samples
    results = _results(samples, ConvertOptions().processing, 2)
    assert next(results)[0] is not None  # the pool is running
    for child in multiprocessing.active_children():
        os.kill(child.pid, signal.SIGKILL)
    with pytest.raises(PackerError, match="worker process died .signal SIGKILL"):
        for _ in results:
            pass
    assert not multiprocessing.active_children()


def test_a_worker_killed_in_the_middle_of_an_answer_raises_instead_of_hanging():
    # 16 MiB answers are far larger than a pipe's buffer: after the first one is taken, every
    # worker is blocked halfway through writing its next answer when it is killed.
    results = ordered_map(big_answers, list(range(12)), 2, lambda i: f"item {i}", chunk=1)
    assert len(next(results)) == 16 << 20
    time.sleep(0.5)
    for child in multiprocessing.active_children():
        os.kill(child.pid, signal.SIGKILL)
    with pytest.raises(PackerError, match=r"worker process died .signal SIGKILL. while processing item \d+"):
        for _ in results:
            pass
    assert not multiprocessing.active_children()


def test_an_exception_in_a_worker_is_raised_in_order():
    results = ordered_map(chunk_fails_on_three, list(range(8)), 2, chunk=1)
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OSError, match="item 3 cannot be read"):
        next(results)
    assert list(ordered_map(chunk_fails_on_three, [0, 1, 2, 4, 5], 2, chunk=2)) == [0, 1, 2, 4, 5]


def test_ctrl_c_stops_cleanly(tmp_path):
    root = tmp_path / "src"
    make_folder(str(root), {"a": [(f"{i}.png", 400, 400) for i in range(300)]})
    proc = subprocess.Popen(
        [sys.executable, "-m", "packer", "convert", "imagefolder", "lmdb", str(root), str(tmp_path / "out"),
         "--workers", "2", "--encode", "png", "--resize", "shorter:1600", "--upscale"],  # seconds of work, not one
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_in_a_terminal,
    )
    tmp = temp_dir_for(str(tmp_path / "out"))
    deadline = time.time() + 30
    while not os.path.exists(tmp) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "packer: interrupted"
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
