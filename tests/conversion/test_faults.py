"""Fault injection over every format: the converter SIGKILLed at moments spread over a run, one byte
flipped or a file cut short. Nothing may be lost (DST absent or complete, ``--resume`` reaches the
uninterrupted result byte for byte) and nothing may be let in (``verify`` fails naming the file and,
where the byte belongs to one, the sample; readers raise CorruptDataError or return correct data).

The default run keeps a small subset (2 kill points, 3 flips, 2 cuts per format); the sweeps that
docs/reliability.md reports are marked slow: ``python -m pytest -m slow tests/conversion/test_faults.py``.
`python -m tools.fault_table` runs the same sweeps and prints the table.
"""

from __future__ import annotations

import os
import random

import pytest

from packer.datasets import open_dataset
from packer.errors import CorruptDataError
from tests.helpers import import_optional, slow_except
from tools import faultlib as fl

FORMATS = fl.FORMATS


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return fl.make_source(str(tmp_path_factory.mktemp("faults") / "src"))


@pytest.fixture(scope="module")
def refs(source, tmp_path_factory):
    """fmt -> (reference dataset, (start of writing, end) of a run in seconds, its snapshot, its regions)."""
    base = tmp_path_factory.mktemp("refs")
    out = {}
    for fmt in FORMATS:
        dst = str(base / fmt)
        timing = fl.timed_run(fmt, source, dst)
        out[fmt] = (dst, timing, fl.snapshot(dst), fl.sample_regions(dst))
    return out


def assert_kill(t: fl.KillTrial) -> None:
    where = f"{t.fmt} killed at {t.delay:.3f} s ({t.outcome}, resumed {t.resumed})"
    assert not t.errors, f"{where}: {t.errors}"
    assert t.dst_ok, f"{where}: DST is neither absent nor a complete, verified dataset"
    assert t.tmp_refused, f"{where}: a reader accepted the unfinished temporary folder"
    assert t.lost == 0, f"{where}: {t.lost} samples lost or wrong after --resume"
    assert t.resume_ok, f"{where}: --resume did not reproduce the reference samples and manifest"
    assert t.identical, f"{where}: --resume did not reproduce the reference files byte for byte"


def assert_bytes(t: fl.ByteTrial) -> None:
    where = f"{t.fmt} {t.kind} {t.file} at {t.offset} (sample {t.expected_sample})"
    assert t.verify_rc != 0, f"{where}: verify passed"
    assert t.verify_named_file, f"{where}: verify did not name the file"
    assert t.verify_named_sample, f"{where}: verify did not name sample {t.expected_sample}"
    assert t.reader_ok, f"{where}: reader {t.reader}: {t.errors[:3]}"


def kill_sweep(fmt, source, refs, tmp_path, n, seed, **kw):
    ref, timing, snap, _ = refs[fmt]
    for k, delay in enumerate(fl.kill_delays(n, timing, seed)):
        assert_kill(fl.kill_trial(fmt, source, ref, snap, str(tmp_path / f"k{k}"), delay, **kw))


def byte_sweep(fmt, refs, tmp_path, uniform, structure, cuts, seed):
    ref, _, snap, regions = refs[fmt]
    rng = random.Random(seed)
    offsets = fl.flip_offsets(ref, uniform, seed) + fl.structure_offsets(ref, regions, structure, seed)
    for name, off in offsets:
        assert_bytes(fl.byte_trial(ref, str(tmp_path / "w"), snap, regions, name, off, rng=rng))
    for name, off in fl.flip_offsets(ref, cuts, seed + 1):
        assert_bytes(fl.byte_trial(ref, str(tmp_path / "w"), snap, regions, name, off, kind="truncate"))


# -- the default run: a few of each ---------------------------------------------------------------
@pytest.mark.parametrize("fmt", slow_except(FORMATS, "tar"))  # the slow sweep: 20 kill points each
def test_sigkill_then_resume(fmt, source, refs, tmp_path):
    kill_sweep(fmt, source, refs, tmp_path, n=2, seed=7)


@pytest.mark.parametrize("fmt", FORMATS)
def test_flipped_and_cut_bytes_are_caught(fmt, refs, tmp_path):
    byte_sweep(fmt, refs, tmp_path, uniform=2, structure=1, cuts=2, seed=11)


@pytest.mark.parametrize("fmt", FORMATS)
def test_skip_policy_counts_a_damaged_sample(fmt, refs, tmp_path):
    ref, _, snap, regions = refs[fmt]
    name, (a, b, sample) = next((n, r) for n, rs in regions.items() for r in rs if not n.endswith((".idx", ".pkidx")))
    t = fl.byte_trial(ref, str(tmp_path / "w"), snap, regions, name, (a + b) // 2)
    assert t.expected_sample == sample and t.reader == "raised"
    ds = open_dataset(tmp_path / "w", on_error="skip", output="numpy")
    with pytest.raises(CorruptDataError, match=f"sample {sample}"):
        open_dataset(tmp_path / "w", output="numpy")[sample]
    got = [ds[i][1] for i in range(len(ds))]
    assert ds.errors == 1 and len(got) == len(snap)
    assert got[sample] == snap[(sample + 1) % len(snap)][1]  # the next readable sample stands in


# -- the sweeps docs/reliability.md reports ---------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_sigkill_sweep(fmt, source, refs, tmp_path):
    kill_sweep(fmt, source, refs, tmp_path, n=20, seed=2024)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_sigkill_sweep_overwrite(fmt, source, refs, tmp_path):
    """--overwrite over an older dataset: DST is always the old one or the new one."""
    old = str(tmp_path / "old")
    import shutil
    import subprocess

    shutil.rmtree(old, ignore_errors=True)
    subprocess.run(fl.convert_argv(fmt, source, old, "--resize", "shorter:64"), check=True, capture_output=True)
    kill_sweep(fmt, source, refs, tmp_path, n=5, seed=99, old=old)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
def test_sigkill_sweep_two_workers(fmt, source, refs, tmp_path):
    ref, _, snap, _ = refs[fmt]
    timing = fl.timed_run(fmt, source, str(tmp_path / "timed"), workers=2)
    for k, delay in enumerate(fl.kill_delays(5, timing, 5)):
        assert_kill(fl.kill_trial(fmt, source, ref, snap, str(tmp_path / f"k{k}"), delay, workers=2))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_byte_sweep(fmt, refs, tmp_path):
    byte_sweep(fmt, refs, tmp_path, uniform=20, structure=20, cuts=10, seed=2024)


def test_reference_runs_are_spread(refs):
    """Sanity for the kill sweeps: each reference run has resume points and takes some time."""
    for fmt, (ref, (start, end), snap, _) in refs.items():
        assert len(snap) == 148 and 0 < start < end, fmt  # 4 classes of 37
        assert not any(n.startswith(".") for n in os.listdir(ref)), fmt


def test_workers_exit_when_the_converter_is_killed(source, tmp_path):
    """SIGKILL of the converter alone (as the OOM killer does): its worker processes exit too."""
    import signal
    import subprocess
    import time

    psutil = import_optional("psutil", "needs psutil (the [test] extra)")
    dst = str(tmp_path / "out")
    proc = subprocess.Popen(fl.convert_argv("lmdb", source, dst, workers=2), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    deadline = time.time() + 30
    workers = []
    while time.time() < deadline and proc.poll() is None:
        workers = [c for c in parent.children() if "spawn_main" in " ".join(c.cmdline())]
        if len(workers) == 2:
            break
        time.sleep(0.01)
    assert len(workers) == 2, "the workers did not start"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"orphaned workers still running: {[p.pid for p in alive]}"
