"""A destination never destroys its source, and one conversion owns a destination: data is never
lost or wrong with exit status 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from packer.cli import main
from packer.description.registry import format_names
from packer.errors import DestinationBusyError, SourceError
from packer.files.filesystem import check_destination, claim_destination, sibling_path
from tests.helpers import ROOT, _src, pack, slow_except

FORMATS = format_names()


def _files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


# -- a destination that is, contains or lies inside the source ---------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("where", ["same", "same-slash", "same-dotdot", "parent", "inside", "symlink-to-src",
                                   "symlink-parent"])
def test_destination_overlapping_source_is_refused(tmp_path, capsys, fmt, where):
    src = _src(tmp_path)
    before = _files(str(tmp_path))
    os.symlink(src, tmp_path / "link")
    dst = {
        "same": src, "same-slash": src + "/", "same-dotdot": os.path.join(src, "a", ".."),
        "parent": str(tmp_path), "inside": os.path.join(src, "packed"), "symlink-to-src": str(tmp_path / "link"),
        "symlink-parent": str(tmp_path / "link" / "a"),
    }[where]
    assert main(["convert", "imagefolder", fmt, src, dst, "--overwrite", "--resize", "none"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "source" in err[0] and "Traceback" not in err[0]
    assert _files(str(tmp_path)) == before  # nothing deleted, nothing written


@pytest.mark.parametrize("dst_kind", ["lmdb", "imagefolder"])
def test_packed_source_overlapping_destination_is_refused(tmp_path, capsys, dst_kind):
    src = _src(tmp_path)
    packed = str(tmp_path / "p" / "packed")
    pack(src, packed, "tar")
    before = _files(str(tmp_path))
    for dst in (packed, str(tmp_path / "p"), os.path.join(packed, "x")):
        assert main(["convert", "tar", dst_kind, packed, dst, "--overwrite"]) == 1
        assert "source" in capsys.readouterr().err
    assert _files(str(tmp_path)) == before


def test_check_destination_by_identity_bind_or_hardlinked_path(tmp_path):
    src = _src(tmp_path)
    # Same folder reached through a different spelling that realpath cannot see through: a
    # second hard link is impossible for folders, so use the inode comparison on a symlinked
    # grandparent instead (resolved) and on the folder itself.
    check_destination(src, str(tmp_path / "elsewhere"))  # disjoint: fine
    with pytest.raises(SourceError, match="is the source"):
        check_destination(src, os.path.join(str(tmp_path), ".", "src"))
    with pytest.raises(SourceError, match="inside the destination"):
        check_destination(os.path.join(src, "a"), src)


# -- one conversion owns a destination ---------------------------------------------------------
_HOLDER = textwrap.dedent("""
    import sys, time
    from packer.files.filesystem import claim_destination
    with claim_destination(sys.argv[1]):
        print("claimed", flush=True)
        time.sleep(60)
""")


def _hold(dst):
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, dst], stdout=subprocess.PIPE, cwd=ROOT)
    assert p.stdout.readline().strip() == b"claimed"
    return p


@pytest.mark.parametrize("fmt", FORMATS)
def test_second_conversion_to_a_claimed_destination_fails_at_once(tmp_path, capsys, fmt):
    src = _src(tmp_path)
    dst = str(tmp_path / "out")
    holder = _hold(dst)
    try:
        t0 = time.monotonic()
        assert main(["convert", "imagefolder", fmt, src, dst, "--resize", "none", "--workers", "1"]) == 1
        assert time.monotonic() - t0 < 5
        err = capsys.readouterr().err.strip()
        assert "being written by another conversion" in err and f"pid {holder.pid}" in err and len(err.splitlines()) == 1
        assert not os.path.exists(dst)
    finally:
        holder.kill()
        holder.wait()
    # The killed holder's claim does not block the next run.
    assert os.path.exists(sibling_path(dst, "lock"))
    assert main(["convert", "imagefolder", fmt, src, dst, "--resize", "none", "--workers", "1"]) == 0
    assert not os.path.exists(sibling_path(dst, "lock"))


def test_stale_claim_of_a_killed_conversion_does_not_block_resume(tmp_path):
    from packer.datasets import open_dataset
    from packer.files.journal import JOURNAL_NAME
    from tools.faultlib import make_source

    src = make_source(str(tmp_path / "src"), n=160)
    dst = str(tmp_path / "out")
    args = ["convert", "imagefolder", "tar", src, dst, "--resize", "shorter:200", "--shard-samples", "4",
            "--workers", "1"]
    p = subprocess.Popen([sys.executable, "-m", "packer", *args], cwd=ROOT, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    journal = os.path.join(sibling_path(dst, "tmp"), JOURNAL_NAME)
    while p.poll() is None and not os.path.exists(journal):
        time.sleep(0.002)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    if p.returncode == 0:
        pytest.skip("the conversion finished before it could be killed")
    assert os.path.exists(sibling_path(dst, "lock"))  # the killed run's claim file is still there
    assert main([*args, "--resume"]) == 0
    ds = open_dataset(dst)
    assert len(ds) == 160


def test_claim_is_exclusive_between_processes_and_reentrant_within_one(tmp_path):
    dst = str(tmp_path / "d")
    with claim_destination(dst):
        with claim_destination(dst):  # the same process: fine
            pass
        assert os.path.exists(sibling_path(dst, "lock"))
        code = f"from packer.files.filesystem import claim_destination\nwith claim_destination({dst!r}): pass"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 1 and "DestinationBusyError" in r.stderr and f"pid {os.getpid()}" in r.stderr
    assert not os.path.exists(sibling_path(dst, "lock"))


def test_claim_error_names_owner_and_survives_pickling(tmp_path):
    import pickle

    e = DestinationBusyError("busy", path="/x")
    f = pickle.loads(pickle.dumps(e))
    assert str(f) == "busy" and f.path == "/x"


@pytest.mark.parametrize("fmt", slow_except(FORMATS, "tar", "hdf5"))
def test_concurrent_conversions_never_publish_a_mismatched_dataset(tmp_path, fmt):
    """Two real CLI runs at once: each exits 0 or fails naming the other; what is published verifies."""
    src = _src(tmp_path, n=30)
    dst = str(tmp_path / "out")
    cmd = [sys.executable, "-m", "packer", "convert", "imagefolder", fmt, src, dst, "--resize", "none",
           "--overwrite", "--workers", "1", "--shard-samples", "7"]
    if fmt in ("lmdb", "hdf5"):
        cmd = cmd[:-2]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [(p.wait(), p.stderr.read()) for p in procs]
    assert any(rc == 0 for rc, _ in outs)
    for rc, err in outs:
        assert rc == 0 or (rc == 1 and "being written by another conversion" in err), err
    r = subprocess.run([sys.executable, "-m", "packer", "verify", dst], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
