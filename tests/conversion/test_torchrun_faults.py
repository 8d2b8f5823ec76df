"""torchrun conversions that must fail the job (a rank that stops answering, ranks that see other
files) and merged parts that disagree about a source file."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from packer.cli import main
from packer.errors import SourceError
from packer.files.filesystem import sibling_path
from tests.helpers import ROOT, _src, make_folder

# -- a torchrun rank that stops answering ------------------------------------------------------------

def _children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (from /proc; zombies excluded)."""
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found.update(int(c) for c in f.read().split())
    return {c for c in found if _alive(c)}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_torchrun_stopped_rank_fails_the_job_after_the_timeout(tmp_path):
    """SIGSTOP of rank 1 while it converts: with --rank-timeout 3, rank 0 gives up on it after the
    timeout, naming it, instead of waiting for the collective's own timeout; nothing appears at DST."""
    import json

    from packer.conversion.distributed import part_path
    from tests.conversion.test_distributed_convert import torchrun_command

    root = str(tmp_path / "src")
    make_folder(root, {c: [(f"{c}{i}.png", 96, 128) for i in range(150)] for c in ("a", "b")})
    dst = str(tmp_path / "dst")
    lock = sibling_path(part_path(dst, 1, 2), "lock")
    cmd, env = torchrun_command(2, "tar", root, dst, "--workers", "1", "--encode", "png", "-q", "--rank-timeout", "3")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = None
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and stopped is None and time.monotonic() < deadline:
            try:
                with open(lock) as f:
                    stopped = json.load(f)["pid"]
                os.kill(stopped, signal.SIGSTOP)
            except (OSError, ValueError, KeyError):
                stopped = None
                time.sleep(0.01)
        assert stopped is not None, "rank 1 never started its part"
        others = _children(proc.pid) - {stopped}
        assert others, "rank 0 is not running"
        deadline = time.monotonic() + 60  # the collective's own timeout would be far longer
        while any(map(_alive, others)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, others)), "rank 0 still waits for the stopped rank"
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, err
    assert "rank 1 of 2 has not answered for 3 s (stopped or hung" in err
    assert not os.path.exists(dst)


# -- torchrun ranks and merged parts that see other files ------------------------------------------
def _two_node_torchrun(tmp_path, nodes, *args):
    """Two torchrun launches of one rank each (node ranks 0 and 1, a localhost rendezvous), each
    with its own working folder and SRC argument, as on two machines: [(returncode, stderr)]."""
    from tests.conversion.test_distributed_convert import free_port, torchrun_command

    port = str(free_port())
    out = []
    launches = []
    for node, (cwd, src) in enumerate(nodes):
        cmd, env = torchrun_command(1, "tar", src, str(tmp_path / "dst"), "--no-shuffle", "--workers", "1", "-q",
                                    *args)
        at = cmd.index("--nproc_per_node=1") + 1
        cmd = cmd[:at] + ["--nnodes=2", f"--node_rank={node}", "--master_addr=127.0.0.1",
                          f"--master_port={port}"] + cmd[at + 1:]
        launches.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True))
    for p in launches:
        _, err = p.communicate(timeout=240)
        out.append((p.returncode, err))
    return out


@pytest.mark.parametrize("case", ["stale-copy", pytest.param("other-src", marks=pytest.mark.slow)])
def test_torchrun_ranks_that_see_other_files_fail_the_job(tmp_path, case):
    """Rank 1's node holds a stale copy of the source (the same SRC argument, b/b1.png with other
    bytes and time), or rank 1 is given another SRC (an exact copy): every rank exits non-zero
    naming rank 1 and what differs, before any image is converted; nothing is published. Before,
    rank 0 sent only paths and labels: rank 1's images were packed under rank 0's labels, exit 0."""
    for node in ("n0", "n1"):
        os.makedirs(tmp_path / node)
    first = _src(tmp_path / "n0", n=3)  # a0-a2 for rank 0, b0-b2 for rank 1 (no shuffle)
    copy = shutil.copytree(first, tmp_path / "n1" / "src")  # times kept to the nanosecond
    if case == "stale-copy":
        make_folder(copy, {"b": [("b1.png", 28, 20)]}, seed=7)
        st = os.stat(os.path.join(first, "b", "b1.png"))
        os.utime(os.path.join(copy, "b", "b1.png"), ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        nodes = [(tmp_path / "n0", "src"), (tmp_path / "n1", "src")]  # one SRC argument, two folders
        want = [os.path.join("src", "b", "b1.png") + " is ", "there, ", "on rank 0"]
    else:
        nodes = [(tmp_path, first), (tmp_path, str(copy))]
        want = [f"it was given SRC {copy}, rank 0 {first}"]
    results = _two_node_torchrun(tmp_path, nodes)
    for rc, err in results:
        assert rc != 0, err
        assert "rank 1 of 2 sees other source files than rank 0: " in err, err
        assert all(w in err for w in want), err
    assert not os.path.exists(tmp_path / "dst")
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []  # no part was converted


def test_merge_refuses_parts_that_disagree_about_a_source_file(tmp_path, capsys):
    """Two convert_items parts of the same key made from different copies (b/b1.png with other
    bytes and time in the second): merge names the file and both parts, and writes nothing. Parts
    of exact copies (times kept) merge; items given as bytes (keys by position) are not compared."""
    import json

    from packer.description.manifest import read_manifest, write_manifest
    from packer.operations.merge import merge
    from packer.pipeline.items import convert_items

    first = _src(tmp_path, "one", n=2)
    same = shutil.copytree(first, tmp_path / "same")
    stale = shutil.copytree(first, tmp_path / "stale")
    make_folder(stale, {"b": [("b1.png", 28, 20)]}, seed=7)

    def part(root, name, rels):
        items = [(os.path.join(root, rel), rel.split("/")[0], None) for rel in rels]
        items.append((open(os.path.join(root, rels[0]), "rb").read() + bytes(len(name)), "a", None))
        return convert_items(items, str(tmp_path / name), "tar", classes=["a", "b"], root=root).output

    p1 = part(first, "p1", ["a/a0.jpg", "b/b1.png"])
    p2 = part(same, "p2", ["a/a1.jpg", "b/b1.png"])
    p3 = part(stale, "p3", ["b/b0.png", "b/b1.png"])
    recorded = read_manifest(p1).source["converted"]
    st = os.stat(os.path.join(first, "b", "b1.png"))
    assert recorded == [["a/a0.jpg", *recorded[0][1:]], ["b/b1.png", st.st_size, st.st_mtime_ns]]  # not the bytes
    assert merge([p1, p2], tmp_path / "ok").manifest.num_samples == 6
    assert "converted" not in json.dumps(read_manifest(str(tmp_path / "ok")).source)
    with pytest.raises(SourceError, match=f"parts {p1} and {p3} disagree about the source file b/b1.png: "):
        merge([p1, p3], tmp_path / "bad")
    assert main(["merge", str(tmp_path / "bad"), p2, p3]) == 1
    err = capsys.readouterr().err
    assert f"parts {p2} and {p3} disagree about the source file b/b1.png" in err and len(err.splitlines()) == 1
    assert not os.path.exists(tmp_path / "bad")
    m = read_manifest(p3)
    m.source["converted"][1][2] = str(st.st_mtime_ns)  # forged: a string where the time goes
    write_manifest(p3, m)
    with pytest.raises(SourceError, match=f"part {p3}: its manifest's source.converted.1. is not .key, size, "):
        merge([p1, p3], tmp_path / "bad")
