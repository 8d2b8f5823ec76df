"""torchrun conversion: real ranks (gloo) convert parts that rank 0 merges; the result holds the
samples of a one-process conversion with the same seed, in order, with the same stored bytes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from packer.conversion.distributed import part_range, torchrun_launch
from packer.datasets import open_dataset
from packer.description.manifest import read_manifest
from tests.helpers import ROOT, make_folder, pack, slow_except


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(nproc: int, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a torchrun conversion (none of this process's ranks)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
           "-m", "packer", "convert", "imagefolder", *args]
    return cmd, {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    cmd, env = torchrun_command(nproc, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)


@pytest.fixture
def folder(tmp_path):
    root = str(tmp_path / "src")
    make_folder(root, {"cat": [(f"c{i}.jpg", 30, 40) for i in range(6)], "dog": [(f"d{i}.png", 24, 20) for i in range(5)],
                       "eel": [("e0.jpg", 20, 20)]})
    os.makedirs(os.path.join(root, "fox"))  # an empty class keeps its label
    with open(os.path.join(root, "dog", "z-bad.jpg"), "wb") as f:
        f.write(b"not an image")
    return root


BAD_REASON = '"not a recognised image format (no JPEG, PNG, GIF, WebP, BMP, TIFF or PNM signature)"'
BAD_SKIP = "skipped dog/z-bad.jpg: " + BAD_REASON.strip('"')


def packer_lines(stderr: str) -> list[str]:
    """What packer printed on stderr, without torchrun's own banner."""
    return [line for line in stderr.splitlines()
            if line.strip() and not line.startswith(("*", "Setting OMP_NUM_THREADS", "W1", "W0"))]


def samples(path):
    ds = open_dataset(str(path))
    try:
        return [(r.key, r.label, bytes(r.payload)) for r in map(ds.read_record, range(len(ds)))]
    finally:
        ds.close()


def leftovers(tmp_path):
    return sorted(n for n in os.listdir(tmp_path) if n.startswith("."))


def check_same_as_one_process(folder, tmp_path, fmt, *extra):
    ref = pack(folder, str(tmp_path / "ref"), fmt, encode="png" if "png" in extra else "jpeg:90", seed=3,
               writer={"gzip": True} if "--gzip" in extra else None)
    encode = () if "--encode" in extra else ("--encode", "jpeg:90")  # as the reference (--resize none keeps bytes)
    out = torchrun(2, fmt, folder, str(tmp_path / "dst"), "--seed", "3", "--workers", "2", "-q", *encode, *extra)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == ""  # -q: no banner, no summary, on any rank
    assert packer_lines(out.stderr) == ["warning: 1 empty class, no image has its label: fox", BAD_SKIP,
                                        f"1 file skipped: 1 for {BAD_REASON}; exit status 0"]
    assert samples(tmp_path / "dst") == samples(tmp_path / "ref")
    got, want = read_manifest(str(tmp_path / "dst")).to_json(), ref.manifest.to_json()
    if fmt in ("lmdb", "hdf5"):  # one file, rewritten record by record: the same bytes as one process
        assert got == want
    for k in ("files", "layout"):
        got.pop(k), want.pop(k)
    assert got == want  # classes, seed, skips in order, source, ignored counts
    assert leftovers(tmp_path) == []


def test_torchrun_tar_matches_one_process(folder, tmp_path):
    check_same_as_one_process(folder, tmp_path, "tar", "--shard-samples", "4")


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "extra"), [("lmdb", ()), ("hdf5", ("--encode", "png")),
                                             ("tfrecord", ("--gzip", "--shard-samples", "3"))])
def test_torchrun_matches_one_process(folder, tmp_path, fmt, extra):
    check_same_as_one_process(folder, tmp_path, fmt, *extra)


@pytest.mark.slow
def test_torchrun_rank_failure_fails_the_job(folder, tmp_path):
    """--strict with the bad image in rank 1's share: every rank fails, nothing at DST. A DST that
    exists fails every rank before any work."""
    out = torchrun(2, "lmdb", folder, str(tmp_path / "dst"), "--no-shuffle", "--strict", "--workers", "1", "-q")
    assert out.returncode != 0
    assert "rank 1 of 2 failed: ImageError" in out.stderr and "z-bad.jpg" in out.stderr
    assert not os.path.exists(tmp_path / "dst") and leftovers(tmp_path) == [".dst.packer-part-0-of-2"]
    os.makedirs(tmp_path / "dst")
    out = torchrun(2, "lmdb", folder, str(tmp_path / "dst"), "-q")
    assert out.returncode != 0 and "destination exists" in out.stderr
    assert os.listdir(tmp_path / "dst") == []


@pytest.mark.slow
def test_torchrun_resume_keeps_finished_parts(folder, tmp_path):
    """Rank 1 cannot write its part (its lock path is a folder): the job fails, rank 0's finished
    part stays; --resume with the same world size keeps it and converts only rank 1's share."""
    from packer.conversion.distributed import part_path
    from packer.files.filesystem import sibling_path

    dst = str(tmp_path / "dst")
    blocker = sibling_path(part_path(dst, 1, 2), "lock")
    os.makedirs(blocker)
    out = torchrun(2, "hdf5", folder, dst, "--workers", "1", "-q")
    assert out.returncode != 0 and "rank 1 of 2 failed" in out.stderr and "--resume" in out.stderr
    assert not os.path.exists(dst)
    os.rmdir(blocker)
    out = torchrun(2, "hdf5", folder, dst, "--workers", "1", "--resume")
    assert out.returncode == 0, out.stderr
    assert "kept the parts of rank 0" in out.stderr and leftovers(tmp_path) == []
    pack(folder, str(tmp_path / "ref"), "hdf5", encode="keep")  # the CLI default with --resize none
    assert samples(dst) == samples(tmp_path / "ref")


@pytest.mark.slow
def test_torchrun_more_ranks_than_images(tmp_path):
    """A rank with an empty share, and one whose share holds only a bad image, add no part."""
    root = str(tmp_path / "src")
    make_folder(root, {"a": [("x.jpg", 20, 20)]})
    with open(os.path.join(root, "a", "y.jpg"), "wb") as f:
        f.write(b"junk")
    out = torchrun(3, "tar", root, str(tmp_path / "dst"), "--no-shuffle", "--workers", "1", "-q")
    assert out.returncode == 0, out.stderr
    m = read_manifest(str(tmp_path / "dst"))
    assert m.num_samples == 1 and [s.path for s in m.skipped] == ["a/y.jpg"]


def test_torchrun_prints_the_summary_of_one_process_once(folder, tmp_path):
    """Without -q: rank 0 prints what one process prints (images, classes, left small, empty
    classes, skips by reason), once; only the exit status of a run with skips differs (0, as
    torchrun takes any other for a failed job)."""
    # a short --rank-timeout makes the ranks look at each other more often: a quicker test
    args = ["--resize", "shorter:32", "--workers", "1", "--shard-samples", "4", "--rank-timeout", "20"]
    one = subprocess.run([sys.executable, "-m", "packer", "convert", "imagefolder", "tar", folder,
                          str(tmp_path / "one"), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = torchrun(2, "tar", folder, str(tmp_path / "dst"), *args)
    assert (one.returncode, out.returncode) == (3, 0), out.stderr
    left = "left small: 12 images below --resize shorter:32 kept their size (--upscale enlarges them)"
    assert packer_lines(one.stderr) == [left, "warning: 1 empty class, no image has its label: fox", BAD_SKIP,
                                        f"1 file skipped: 1 for {BAD_REASON}; exit status 3"]
    assert packer_lines(out.stderr) == packer_lines(one.stderr)[:-1] + [
        f"1 file skipped: 1 for {BAD_REASON}; exit status 0"]
    wrote = [line for line in out.stdout.splitlines() if line.startswith("wrote ")]
    assert len(wrote) == 1 and wrote[0].startswith(f"wrote 12 images in 4 classes to {tmp_path / 'dst'} (tar, "), (
        out.stdout, out.stderr)
    assert one.stdout.startswith(f"wrote 12 images in 4 classes to {tmp_path / 'one'} (tar, ")


def test_part_range_and_launch():
    for n in range(0, 12):
        for world in range(1, 5):
            ranges = [part_range(n, world, r) for r in range(world)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "5"}
    launch = torchrun_launch(env)
    assert launch is not None and (launch.rank, launch.world_size, launch.master) == (1, 2, "h:5")
    assert torchrun_launch({"RANK": "0", "WORLD_SIZE": "1"}) is None
    with pytest.raises(ValueError, match="rank 2 is not within world size 2"):
        torchrun_launch({**env, "RANK": "2"})


def test_torchrun_environment_in_process(folder, tmp_path, monkeypatch, capsys):
    """A world of one in this process: the torchrun path end to end (scan, part, merge), and
    --no-torchrun for a conversion started by a process that torchrun runs."""
    from packer.cli import main

    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)
    assert main(["convert", "imagefolder", "tfrecord", folder, str(tmp_path / "dst"), "--workers", "1",
                 "--encode", "jpeg:90"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("packer: torchrun detected: rank 0 of 1 (local rank 0, master 127.0.0.1:")
    ref = pack(folder, str(tmp_path / "ref"), "tfrecord")
    assert samples(tmp_path / "dst") == samples(tmp_path / "ref") and leftovers(tmp_path) == []
    assert read_manifest(str(tmp_path / "dst")).skipped == ref.manifest.skipped
    assert main(["convert", "imagefolder", "lmdb", folder, str(tmp_path / "one"), "--no-torchrun"]) == 3
    assert capsys.readouterr().out.startswith("wrote 12 images")



def test_a_source_that_does_not_split_says_so_under_torchrun(tmp_path, monkeypatch, capsys):
    """Under torchrun a list or COCO source is refused before any work, with the flag that runs it
    in one process; the list's row adds how to convert it in parts by hand."""
    import packer
    from packer.cli import main
    from packer.conversion.options import OptionError

    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "l.csv").write_text("")
    (tmp_path / "c.json").write_text("")
    hint = " (or split the list and merge the parts: packer merge)"
    assert main(["convert", "list", "lmdb", str(tmp_path / "l.csv"), str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err.strip() == ("packer convert: a list source converts in one process; under "
                                               "torchrun add --no-torchrun" + hint)
    assert main(["convert", "coco", "lmdb", str(tmp_path / "c.json"), str(tmp_path / "b"), "--images",
                 str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == ("packer convert: a coco source converts in one process; under "
                                               "torchrun add --no-torchrun")
    with pytest.raises(OptionError, match=r"under torchrun add no_torchrun \(or split the list"):
        packer.convert("list", "lmdb", tmp_path / "l.csv", tmp_path / "c")
    assert sorted(os.listdir(tmp_path)) == ["c.json", "l.csv"]

@pytest.mark.slow
def _kill_the_lock_holder(proc: subprocess.Popen, lock: str) -> bool:
    """SIGKILL the process whose pid the claim file ``lock`` names, as soon as it is written,
    while ``proc`` (the torchrun job) runs; whether it was killed within 120 s."""
    import json
    import signal
    import time

    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with open(lock) as f:
                os.kill(json.load(f)["pid"], signal.SIGKILL)
            return True
        except (OSError, ValueError, KeyError):
            time.sleep(0.01)
    return False


def test_torchrun_rank_killed_fails_the_job(tmp_path):
    """SIGKILL of rank 1 while it converts (its pid read from its part's claim): torchrun stops the
    job, and nothing appears at DST."""

    from packer.conversion.distributed import part_path
    from packer.files.filesystem import sibling_path

    root = str(tmp_path / "src")
    make_folder(root, {c: [(f"{c}{i}.png", 96, 128) for i in range(150)] for c in ("a", "b")})
    dst = str(tmp_path / "dst")
    lock = sibling_path(part_path(dst, 1, 2), "lock")
    cmd, env = torchrun_command(2, "tar", root, dst, "--workers", "1", "--encode", "png", "-q")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = _kill_the_lock_holder(proc, lock)
    _, err = proc.communicate(timeout=120)
    assert killed and proc.returncode != 0, err
    assert not os.path.exists(dst)


@pytest.mark.slow  # the one-node run of test_torchrun_tar_matches_one_process checks the same result
def test_torchrun_two_nodes_match_one_process(folder, tmp_path):
    """--nnodes=2 with a localhost rendezvous: two torchrun launches (node ranks 0 and 1, one rank
    each) convert to the same DST; the result holds the one-process samples and manifest facts."""
    ref = pack(folder, str(tmp_path / "ref"), "tar", seed=3)
    port = str(free_port())
    cmd, env = torchrun_command(1, "tar", folder, str(tmp_path / "dst"), "--seed", "3", "--workers", "1",
                                "--encode", "jpeg:90", "--shard-samples", "4")
    at = cmd.index("--nproc_per_node=1") + 1
    launches = [subprocess.Popen(cmd[:at] + ["--nnodes=2", f"--node_rank={node}", "--master_addr=127.0.0.1",
                                             f"--master_port={port}"] + cmd[at + 1:],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
                for node in (0, 1)]
    outs = [p.communicate(timeout=240) for p in launches]
    assert [p.returncode for p in launches] == [0, 0], outs
    firsts = sorted(out.splitlines()[0] for out, _ in outs)
    assert firsts[0].startswith("packer: torchrun detected: rank 0 of 2") and "rank 1 of 2" in firsts[1]
    assert samples(tmp_path / "dst") == samples(tmp_path / "ref")
    got, want = read_manifest(str(tmp_path / "dst")).to_json(), ref.manifest.to_json()
    for k in ("files", "layout"):
        got.pop(k), want.pop(k)
    assert got == want
    assert leftovers(tmp_path) == []


def test_rank_timeout_from_the_environment():
    from datetime import timedelta

    from packer.conversion.distributed import DEFAULT_TIMEOUT, rank_timeout

    assert rank_timeout({}) == DEFAULT_TIMEOUT <= timedelta(hours=1)
    assert rank_timeout({"PACKER_TORCHRUN_TIMEOUT": "2.5"}) == timedelta(seconds=2.5)
    for bad in ("0", "-1", "soon", "nan"):
        with pytest.raises(ValueError, match="PACKER_TORCHRUN_TIMEOUT"):
            rank_timeout({"PACKER_TORCHRUN_TIMEOUT": bad})


def test_a_rank_sees_the_last_arrival_long_before_its_next_beat():
    """Ranks meet before each collective through the store: the one that arrived first sees the
    last one come within a few polls, not after a whole beat interval (5 s at the default rank
    timeout, several times per conversion), while a silent rank is still named after the timeout."""
    import threading
    from datetime import timedelta

    from torch.distributed import TCPStore

    from packer.conversion.distributed import Launch, _Peers

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    master = TCPStore("127.0.0.1", port, 2, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    worker = TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=30))
    timeout = timedelta(minutes=30)  # the default: beats every 5 s
    first = _Peers(worker, Launch(1, 2, 1, "here"), timeout)
    last = _Peers(master, Launch(0, 2, 0, "here"), timeout)
    assert first.interval == 5.0
    arrived = threading.Thread(target=first.arrive)
    arrived.start()
    while int(master.add(f"{first.prefix}at/1", 0)) < 1:  # rank 1 waits in the store
        threading.Event().wait(0.01)
    last.arrive()
    arrived.join(first.interval / 2)
    assert not arrived.is_alive(), "rank 1 slept through rank 0's arrival"
    first.close()
    last.close()


# -- a rank that dies, stops or leaves is named by the others, in packer's words ----------------------
_PEER = """
import os, sys, time
from datetime import timedelta
from torch.distributed import TCPStore
from packer.files.filesystem import claim_destination
from packer.conversion.distributed import Launch, _Peers
port, rank, mode, dst = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
store = TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=30), wait_for_workers=False)
with claim_destination(dst):
    peers = _Peers(store, Launch(rank, 2, rank, "here"), timedelta(seconds=float(sys.argv[5])))
    print("up", flush=True)
    peers.arrive()
    print("met", flush=True)
    if mode == "leave":
        peers.leave("terminated (SIGTERM)")
        os._exit(143)
    if mode == "exit":
        os._exit(3)
    time.sleep(60)
"""


def _peer(port: int, rank: int, mode: str, dst: str, timeout: float = 2.0) -> subprocess.Popen:
    """A rank in a child process, its beat started once it prints "up" (torch imported)."""
    p = subprocess.Popen([sys.executable, "-c", _PEER, str(port), str(rank), mode, dst, str(timeout)],
                         stdout=subprocess.PIPE, text=True, cwd=ROOT)
    if rank == 1:
        assert p.stdout.readline().strip() == "up"
    return p


@pytest.mark.parametrize("mode", slow_except(["kill", "stop", "exit", "leave"], "kill", "stop"))
def test_a_rank_that_dies_stops_or_leaves_is_named(tmp_path, mode):
    """Rank 1 is a real process beating in a real store: SIGKILLed, or exiting without a word, it
    is named as dead within a few beats (not after the rank timeout); one that says why it leaves
    is named with its reason at once; a stopped one (SIGSTOP) after the timeout, said to be stopped."""
    import signal
    import time
    from datetime import timedelta

    from torch.distributed import TCPStore

    from packer.conversion.distributed import DistributedError, Launch, _Peers

    port = free_port()
    store = TCPStore("127.0.0.1", port, 2, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    child = _peer(port, 1, mode, str(tmp_path / "part"))
    try:
        peers = _Peers(store, Launch(0, 2, 0, "here"), timedelta(seconds=2))
        peers.arrive()
        assert child.stdout.readline().strip() == "met"
        if mode in ("kill", "stop"):
            os.kill(child.pid, signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(DistributedError) as info:
            peers.arrive()
        took = time.monotonic() - t0
        host = socket.gethostname()
        if mode == "stop":
            assert str(info.value).startswith(f"rank 1 of 2 has not answered for 2 s (stopped or hung: it is stopped "
                                              f"(pid {child.pid} on host {host}, by SIGSTOP or Ctrl-Z")
            assert 2 <= took < 4
        elif mode == "leave":
            assert str(info.value) == "rank 1 of 2 stopped: terminated (SIGTERM)" and took < 1
        else:
            assert str(info.value).startswith(f"rank 1 of 2 died (pid {child.pid} on host {host} ended without a word")
            assert took < 1.5
        peers.close()
    finally:
        child.kill()
        child.wait()


def test_a_dead_store_host_is_named_and_its_claim_removed(tmp_path):
    """Rank 0 hosts the store and claims DST; SIGKILLed, torch's store fails on rank 1 in its own
    words (a connection error), and packer's message names rank 0 instead; the claim file rank 0
    could not remove is removed, so nothing looks like a conversion under way."""
    import signal
    from datetime import timedelta

    from torch.distributed import TCPStore

    from packer.conversion.distributed import Launch, _peer_failure, _Peers
    from packer.errors import PackerError
    from packer.files.filesystem import sibling_path

    port, dst = free_port(), str(tmp_path / "dst")
    child = _peer(port, 0, "kill", dst, timeout=30)
    try:
        assert child.stdout.readline().strip() == "up"
        store = TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=30))
        launch = Launch(1, 2, 1, "here")
        peers = _Peers(store, launch, timedelta(seconds=30))
        peers.arrive()
        assert child.stdout.readline().strip() == "met"
        assert os.path.exists(sibling_path(dst, "lock"))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        with pytest.raises(RuntimeError) as info:
            peers.arrive()
        assert not isinstance(info.value, PackerError)  # torch's own error, which the user must not see
        error = _peer_failure(launch, peers, dst, None)
        assert str(error).startswith(f"rank 0 of 2 died (pid {child.pid} on host {socket.gethostname()}")
        assert not os.path.exists(sibling_path(dst, "lock"))
        peers.close()
    finally:
        child.kill()
        child.wait()


def _kill_a_rank(tmp_path, victim: int, nproc_args=()):
    """A real torchrun job over a folder large enough to be caught converting; SIGKILL of rank
    ``victim`` once it holds its claim (rank 0: DST's, another: its part's). (stderr, dst)."""

    from packer.conversion.distributed import part_path
    from packer.files.filesystem import sibling_path

    root = str(tmp_path / "src")
    make_folder(root, {c: [(f"{c}{i}.png", 96, 128) for i in range(150)] for c in ("a", "b")})
    dst = str(tmp_path / "dst")
    lock = sibling_path(dst if victim == 0 else part_path(dst, victim, 2), "lock")
    cmd, env = torchrun_command(2, "tar", root, dst, "--workers", "1", "--encode", "png", "-q", "--rank-timeout", "5")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = _kill_the_lock_holder(proc, lock)
    _, err = proc.communicate(timeout=120)
    assert killed and proc.returncode != 0, err
    return err, dst, cmd, env


def _no_torch_words(err: str) -> None:
    """No rank printed torch's or gloo's text or a traceback (torchrun's own report of the failed
    job, one traceback ending in ChildFailedError, is the launcher's)."""
    for words in ("DistStoreError", "GLHF", "Connection closed", "Failed to recv", "frame #"):
        assert words not in err, err
    assert err.count("Traceback") == err.count("ChildFailedError:"), err


@pytest.mark.slow
def test_torchrun_killed_rank_is_named_by_the_others(tmp_path):
    """SIGKILL of rank 1: torchrun stops rank 0, which says in one line that rank 1 died (not
    "terminated", not torch's words)."""
    err, dst, _, _ = _kill_a_rank(tmp_path, 1)
    said = [line for line in err.splitlines() if line.startswith("packer:")]
    assert len(said) == 1 and said[0].startswith("packer: error: rank 1 of 2 died (pid "), err
    _no_torch_words(err)
    assert not os.path.exists(dst)


@pytest.mark.slow
def test_torchrun_killed_rank_0_leaves_no_claim_and_resumes(tmp_path):
    """SIGKILL of rank 0 (the holder of DST's claim): rank 1 names it and removes the claim file it
    left, so nothing looks like a conversion under way; --resume then finishes the job."""
    from packer.files.filesystem import sibling_path

    err, dst, cmd, env = _kill_a_rank(tmp_path, 0)
    said = [line for line in err.splitlines() if line.startswith("packer:")]
    assert len(said) == 1 and said[0].startswith("packer: error: rank 0 of 2 died (pid "), err
    _no_torch_words(err)
    assert not os.path.exists(sibling_path(dst, "lock"))
    again = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert again.returncode == 0, again.stderr
    assert read_manifest(dst).num_samples == 300 and leftovers(tmp_path) == []
