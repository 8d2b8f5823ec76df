"""One RAM cache per node: SharedCache(identity=) shared by a job's processes through /dev/shm.

Not to be confused with packer.storage.nodecache, the on-disk cache of files downloaded from object
storage.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from torch.utils.data import DataLoader, Dataset

from packer.datasets.shm.cache import SharedCache, node_key_from_env
from packer.datasets.shm.locks import open_segment
from tests.helpers import make_folder, pack

SHM = "/dev/shm"
MiB = 2**20

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM) or not hasattr(os, "O_TMPFILE"),
                                reason="needs Linux with /dev/shm")


@pytest.fixture
def identity(tmp_path) -> str:
    """An identity no other test run uses (the tmp path), so runs on one machine never meet."""
    return f"test-node-cache:{tmp_path}"


def holder_script(identity: str, key: str, then: str) -> str:
    return textwrap.dedent(
        f"""
        import sys, time
        from packer.datasets.shm.cache import SharedCache
        cache = SharedCache(8, 4 * 2**20, identity={identity!r}, node_key={key!r})
        got = cache.get(1)
        cache.put(2, b"from the child")
        print(cache.name, bytes(got).decode() if got is not None else "-", flush=True)
        {then}
        """
    )


def killed_holder(identity: str, key: str) -> str:
    """Start a process that creates a node cache and holds it, SIGKILL it; the cache's name."""
    child = subprocess.Popen([sys.executable, "-c", holder_script(identity, key, "time.sleep(60)")],
                             stdout=subprocess.PIPE, text=True)
    try:
        name = child.stdout.readline().split()[0]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    return name


def test_processes_of_a_node_share_one_segment(identity: str) -> None:
    first = SharedCache(8, 4 * MiB, identity=identity, node_key="job-1")
    second = SharedCache(8, 1 * MiB, identity=identity, node_key="job-1")
    assert first.name is not None and first.name == second.name
    assert os.path.dirname(first.name) == SHM and os.path.basename(first.name).startswith("packer-cache-")
    assert second.capacity == first.capacity == 4 * MiB, "a joined cache keeps its creator's capacity"
    assert first.put(1, b"from the parent")
    assert bytes(second.get(1)) == b"from the parent" and len(second) == 1

    child = subprocess.run([sys.executable, "-c", holder_script(identity, "job-1", "cache.close()")],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == [first.name, "from", "the", "parent"], "an unrelated process joins"
    assert bytes(first.get(2)) == b"from the child"
    assert first.hits == 3 and first.misses == 0, "the counters are the node's"

    first.close()
    assert os.path.exists(second.name), "the name stays while a process holds the cache"
    assert bytes(second.get(2)) == b"from the child"
    second.close()
    assert not os.path.exists(first.name), "the last holder removes the name"


def test_other_data_other_job_or_no_identity_never_share(identity: str) -> None:
    caches = [SharedCache(8, MiB, identity=identity, node_key="a"),
              SharedCache(8, MiB, identity=identity + "-v2", node_key="a"),
              SharedCache(8, MiB, identity=identity, node_key="b"),
              SharedCache(9, MiB, identity=identity, node_key="a"),
              SharedCache(8, MiB, identity=identity.encode() + b"\0", node_key="a")]
    names = [c.name for c in caches]
    assert None not in names and len(set(names)) == len(names)
    for i, cache in enumerate(caches):
        cache.put(0, bytes([i]))
    assert [bytes(c.get(0)) for c in caches] == [bytes([i]) for i in range(len(caches))]
    private = SharedCache(8, MiB)  # no identity: this process tree's own, nameless
    assert private.name is None and private.get(0) is None
    for cache in caches:
        cache.close()
    assert not any(os.path.exists(name) for name in names)


def test_without_a_job_key_nothing_is_shared(identity: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert node_key_from_env() is None
    assert SharedCache(4, MiB, identity=identity).name is None
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert node_key_from_env() == "master:10.0.0.1:29500"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default rendezvous id
    assert node_key_from_env() == "master:10.0.0.1:29500"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-42")
    assert node_key_from_env() == "run:job-42"
    a, b = SharedCache(4, MiB, identity=identity), SharedCache(4, MiB, identity=identity)
    assert a.name is not None and a.name == b.name
    a.close()
    b.close()


def test_a_sigkilled_jobs_segment_is_replaced_by_the_next_job(identity: str) -> None:
    """The crash MosaicML Streaming users meet: the next job neither fails nor reads garbage."""
    name = killed_holder(identity, "job")
    assert os.path.exists(name), "a killed holder cannot remove the name ..."
    stale = os.stat(name).st_ino
    cache = SharedCache(8, MiB, identity=identity, node_key="job")  # ... the next job does
    assert cache.name == name and os.stat(name).st_ino != stale, "a new segment, not the crashed one"
    assert len(cache) == 0 and cache.get(2) is None, "nothing of the crashed job is read"
    assert cache.put(2, b"fresh") and bytes(cache.get(2)) == b"fresh"
    cache.close()
    assert not os.path.exists(name)


def test_a_crashed_jobs_segment_of_another_key_is_removed_too(identity: str) -> None:
    name = killed_holder(identity, "old-job")
    assert os.path.exists(name)
    SharedCache(2, 4096).close()  # any new cache sweeps segments that nobody holds
    assert not os.path.exists(name)


def test_garbage_under_the_name_is_never_read(identity: str) -> None:
    cache = SharedCache(8, MiB, identity=identity, node_key="job")
    name = cache.name
    cache.close()
    with open(name, "wb") as f:  # a file that no process holds: a crash's leftover, or worse
        f.write(b"\xff" * 8192)
    cache = SharedCache(8, MiB, identity=identity, node_key="job")
    assert cache.name == name and len(cache) == 0 and cache.get(0) is None
    cache.close()

    with open(name, "wb") as f:
        f.write(b"\xff" * 8192)
    held = open_segment(name)  # now a process holds it: it is not ours to remove
    try:
        with pytest.raises(RuntimeError, match=f"{name} is not this dataset's cache"):
            SharedCache(8, MiB, identity=identity, node_key="job")
    finally:
        os.close(held)
        os.unlink(name)


class Payloads(Dataset):
    def __init__(self, cache: SharedCache) -> None:
        self.cache = cache

    def __len__(self) -> int:
        return self.cache.num_items

    def __getitem__(self, index: int) -> bytes:
        view = self.cache.get(index)
        if view is None:
            self.cache.put(index, b"%d" % index * 1000)
            return b"miss"
        return bytes(view)


def test_node_cache_reaches_spawned_workers(identity: str) -> None:
    cache = SharedCache(6, MiB, identity=identity, node_key="job")
    loader = DataLoader(Payloads(cache), batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert list(loader) == [b"miss"] * 6
    assert len(cache) == 6 and os.path.exists(cache.name)
    assert list(loader) == [b"%d" % i * 1000 for i in range(6)]
    del loader
    cache.close()
    assert not os.path.exists(cache.name), "workers' copies are not holders of their own"


# -- two ranks of a torchrun job --------------------------------------------------------------------

RANK = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    from packer.datasets import open_dataset
    from packer.datasets.shm.cache import SharedCache

    def mapping_memory(cache):
        # the node segment by its inode (the creator's mapping shows O_TMPFILE's name), the
        # private one by its memfd name
        inode = str(os.stat(cache.name).st_ino) if cache.name else None
        pss = rss = 0
        mine = False
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split()
                if "-" in head[0] and not head[0].endswith(":"):
                    mine = head[4] == inode if inode else "memfd:packer-shared-cache" in line
                elif mine and head[0] in ("Pss:", "Rss:"):
                    kb = int(head[1]) * 1024
                    pss, rss = (pss + kb, rss) if head[0] == "Pss:" else (pss, rss + kb)
        return pss, rss

    path, out, mode = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plain = open_dataset(path)
    result = {}
    for kind in (["private", "node"] if mode == "direct" else ["wired"]):
        if kind == "wired":  # the reader creates its cache itself
            ds = open_dataset(path, cache="decoded")
            ds[0]
        else:  # the reader's own decoded-cache path, with the cache made here
            ds = open_dataset(path)
            ds.cache_mode = "decoded"
            ds.cache = SharedCache(len(ds), ds._cache_estimate("decoded"),
                                   identity=f"test:{path}" if kind == "node" else None)
        dist.barrier()
        same = 0
        for epoch in range(2):
            for i in range(len(ds)):
                image, label = ds[i]
                want, want_label = plain[i]
                same += int(torch.equal(image, want) and label == want_label)
        dist.barrier()
        pss, rss = mapping_memory(ds.cache)
        result[kind] = {"same": same, "pss": pss, "rss": rss, "nbytes": ds.cache.nbytes,
                        "entries": len(ds.cache), "name": ds.cache.name}
        dist.barrier()
        ds.close()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> str:
    """48 images of 96 x 128 (1.7 MiB decoded), lmdb."""
    tmp = tmp_path_factory.mktemp("node-cache")
    make_folder(str(tmp / "src"), {c: [(f"{c}{i}.jpg", 96, 128) for i in range(24)] for c in "ab"})
    pack(str(tmp / "src"), str(tmp / "lmdb"), "lmdb", "jpeg:90")
    return str(tmp / "lmdb")


def run_ranks(images: str, tmp_path, mode: str) -> list[dict]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={free_port()}", str(script), images, str(tmp_path), mode]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_two_torchrun_ranks_hold_one_copy(images: str, tmp_path) -> None:
    """PSS of the cache's mapping, summed over the two ranks: one copy shared, two private."""
    ranks = run_ranks(images, tmp_path, "direct")
    for kind in ("private", "node"):
        for rank in ranks:
            assert rank[kind]["same"] == 2 * 48, f"{kind}: every sample equals the uncached read"
            assert rank[kind]["entries"] == 48
    node, private = [r["node"] for r in ranks], [r["private"] for r in ranks]
    assert node[0]["name"] == node[1]["name"] is not None and private[0]["name"] is None
    data = node[0]["nbytes"]
    assert data > MiB and node[1]["nbytes"] == data, "one cache: both ranks see all its entries"
    assert min(r["rss"] for r in node) >= data, "each rank maps all the data ..."
    node_pss, private_pss = sum(r["pss"] for r in node), sum(r["pss"] for r in private)
    print(f"\n{data / MiB:.1f} MiB cached; PSS over 2 ranks: shared {node_pss / MiB:.1f} MiB, "
          f"private {private_pss / MiB:.1f} MiB")
    assert node_pss < 1.25 * data, "... and it is in memory once"
    assert private_pss > 1.8 * data, "the control: per-rank caches hold two copies"
    assert not os.path.exists(node[0]["name"]), "the job's last rank removed the name"


@pytest.mark.slow
def test_two_torchrun_ranks_share_the_readers_own_cache(images: str, tmp_path) -> None:
    ranks = run_ranks(images, tmp_path, "wired")
    wired = [r["wired"] for r in ranks]
    assert wired[0]["name"] is not None and wired[0]["name"] == wired[1]["name"]
    assert all(r["same"] == 2 * 48 and r["entries"] == 48 for r in wired)
    assert sum(r["pss"] for r in wired) < 1.25 * wired[0]["nbytes"]


# -- ranks that start at the same instant ------------------------------------------------------------

def _shm_held() -> dict[int, int]:
    """Bytes of each /dev/shm file (by inode) this process holds open or mapped, named or not."""
    dev = os.stat(SHM).st_dev
    held: dict[int, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if st.st_dev == dev:
            held[st.st_ino] = max(held.get(st.st_ino, 0), st.st_blocks * 512)
    device = f"{os.major(dev):02x}:{os.minor(dev):02x}"
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 5 and fields[3] == device and fields[4] != "0":
                start, end = (int(x, 16) for x in fields[0].split("-"))
                held[int(fields[4])] = max(held.get(int(fields[4]), 0), end - start)
    return held


def _rank_at_the_barrier(path: str, run_id: str, start, done, results) -> None:  # noqa: ANN001
    """A rank of a torchrun job (its run id in the environment) that opens the dataset with a
    decoded node cache the moment every rank is at ``start``."""
    from packer.datasets import open_dataset

    os.environ["TORCHELASTIC_RUN_ID"] = run_id
    start.wait()
    ds = open_dataset(path, cache="decoded", cache_bytes=CACHE_BYTES)
    ds[0]
    results.put((ds.cache.name, _shm_held()))
    done.wait()
    ds.close()


CACHE_BYTES = 256 * MiB


def _shm_used() -> int:
    st = os.statvfs(SHM)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _watch_peak(base: int, peak: list[int], stop) -> None:  # noqa: ANN001
    """Poll /dev/shm's use above ``base`` every millisecond into ``peak[0]`` until ``stop``."""
    import time

    while not stop.is_set():
        peak[0] = max(peak[0], _shm_used() - base)
        time.sleep(0.001)


@pytest.mark.slow  # three races of two spawned ranks (tens of seconds alone on the machine)
def test_ranks_started_at_the_same_instant_commit_one_segment(images: str, tmp_path) -> None:
    """Both ranks pass a barrier, then open the dataset: one segment of /dev/shm, never two (the
    loser of the race for the name had committed a whole segment of its own)."""
    import multiprocessing
    import threading

    ctx = multiprocessing.get_context("spawn")
    for trial in range(3):
        start, done, results = ctx.Barrier(2), ctx.Event(), ctx.Queue()
        ranks = [ctx.Process(target=_rank_at_the_barrier,
                             args=(images, f"{tmp_path}-{trial}", start, done, results)) for _ in range(2)]
        base, peak, stop = _shm_used(), [0], threading.Event()
        watcher = threading.Thread(target=_watch_peak, args=(base, peak, stop))
        watcher.start()
        try:
            for rank in ranks:
                rank.start()
            got = [results.get(timeout=120) for _ in ranks]
        finally:
            stop.set()
            watcher.join()
            done.set()
            for rank in ranks:
                rank.join(timeout=60)
        assert got[0][0] == got[1][0] is not None, "one name for both ranks"
        held: dict[int, int] = {}
        for _, files in got:
            for inode, nbytes in files.items():
                held[inode] = max(held.get(inode, 0), nbytes)
        big = {inode: nbytes for inode, nbytes in held.items() if nbytes >= CACHE_BYTES // 2}
        assert len(big) == 1, f"trial {trial}: {len(big)} segments held: {sorted(big.values())}"
        assert peak[0] < 1.5 * CACHE_BYTES, f"trial {trial}: {peak[0] / MiB:.0f} MiB of {SHM} at the peak"
        assert all(rank.exitcode == 0 for rank in ranks)
        assert not os.path.exists(got[0][0])
