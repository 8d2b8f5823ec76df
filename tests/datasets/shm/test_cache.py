"""Tests for packer.datasets.shm.cache.SharedCache: bounded, shared by all DataLoader workers."""

from __future__ import annotations

import copy
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

import packer.datasets.shm.budget as budget_module
from packer.datasets.shm.budget import cgroup_free_bytes
from packer.datasets.shm.cache import SharedCache

MiB = 2**20
SHM = "/dev/shm"

needs_shm = pytest.mark.skipif(not os.path.isdir(SHM), reason="needs /dev/shm (Linux)")


def payload(index: int, size: int = 100) -> bytes:
    return bytes([index % 251]) * (size + index)


def shm_entries(pid: int | None = None) -> set[str]:
    """Entries in /dev/shm that a cache of process ``pid`` (this one by default) could leave.

    Only these are checked: other processes on the machine (other test runs, spawned
    DataLoaders with their ``sem.mp-*`` semaphores) come and go in /dev/shm meanwhile. A cache
    without ``identity`` names nothing at all (torch's segments would be ``torch_<pid>_*``).
    """
    prefix = f"torch_{os.getpid() if pid is None else pid}_"
    return {name for name in os.listdir(SHM) if name.startswith(prefix)}


def wait_for_drop(reference: int, amount: int, seconds: float = 5.0) -> int:
    """Poll until shared memory in use is ``amount`` below ``reference``; return the drop seen."""
    deadline = time.monotonic() + seconds
    while reference - shmem_used() < amount and time.monotonic() < deadline:
        time.sleep(0.05)
    return reference - shmem_used()


def shmem_used() -> int:
    """The machine's shared memory in use (``Shmem`` of /proc/meminfo: tmpfs and memfd alike)."""
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Shmem line in /proc/meminfo")


def fake_cgroup(directory, limit: str, usage: int, inactive_file: int | None = None, v1: bool = False) -> str:
    """A directory laid out as a cgroup's memory files (v2 names, or v1's)."""
    os.makedirs(directory, exist_ok=True)
    names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file") if v1 else (
        "memory.max", "memory.current", "inactive_file")
    with open(os.path.join(directory, names[0]), "w") as f:
        f.write(f"{limit}\n")
    with open(os.path.join(directory, names[1]), "w") as f:
        f.write(f"{usage}\n")
    if inactive_file is not None:
        with open(os.path.join(directory, "memory.stat"), "w") as f:
            f.write(f"anon 123\n{names[2]} {inactive_file}\nactive_file 7\n")
    return str(directory)


# -- single process ---------------------------------------------------------------------------


def test_put_get_roundtrip() -> None:
    cache = SharedCache(8, 4096)
    assert cache.get(0) is None
    assert cache.put(0, b"hello")
    view = cache.get(0)
    assert isinstance(view, memoryview) and view.readonly
    assert bytes(view) == b"hello"

    array = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert cache.put(1, array[:, ::2])  # not contiguous: stored as a C-order copy
    assert np.array_equal(np.frombuffer(cache.get(1), np.int32), array[:, ::2].ravel())
    assert cache.put(2, bytearray(b"ba")) and cache.put(3, memoryview(b"mv"))
    assert cache.put(4, torch.tensor([1, 2], dtype=torch.uint8))
    assert cache.put(5, b"")
    assert [bytes(cache.get(i)) for i in range(2, 6)] == [b"ba", b"mv", b"\x01\x02", b""]

    assert len(cache) == 6 and 0 in cache and 7 not in cache and "0" not in cache
    assert cache.hits == 6 and cache.misses == 1
    assert cache.put(0, b"other") is True, "an entry already cached stays as it is"
    assert bytes(cache.get(0)) == b"hello"
    assert cache.nbytes % 64 == 0 and cache.nbytes <= cache.capacity == 4096
    cache.close()


def test_put_of_parts_stores_them_back_to_back() -> None:
    cache = SharedCache(3, 4096)
    pixels = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)[:, ::2]  # not contiguous
    assert cache.put(0, (b"head", pixels, memoryview(b"!")))
    assert bytes(cache.get(0)) == b"head" + pixels.tobytes() + b"!"
    assert cache.put(1, (b"", b"")) and bytes(cache.get(1)) == b""
    assert not cache.put(2, (b"x" * 3000, b"y" * 3000)), "the bound counts every part"
    with pytest.raises(TypeError, match="str"):
        cache.put(2, (b"ok", "text"))
    assert 2 not in cache
    cache.close()


def test_get_many_and_put_many_are_get_and_put_for_a_batch() -> None:
    cache = SharedCache(6, 800)
    holds = 0
    real_hold = cache._lock.hold

    def counting_hold():  # noqa: ANN202
        nonlocal holds
        holds += 1
        return real_hold()

    cache._lock.hold = counting_hold
    assert cache.get_many([0, 1, 2]) == [None, None, None] and holds == 1
    stored = cache.put_many([(0, b"zero"), (1, (b"o", np.frombuffer(b"ne", np.uint8))), (1, b"again"),
                             (2, b"x" * 600), (3, b"y" * 200), (4, b"")])
    assert holds == 3, "one hold to reserve the batch, one to publish it"
    # index 1 twice in a batch: the first is stored, the second finds it being stored;
    # 3 does not fit after 2 (600 B from byte 128, the next entry at 768 of the 800): refused, as put refuses
    assert stored == [True, True, False, True, False, True]
    views = cache.get_many([4, 3, 2, 1, 0])
    assert [None if v is None else bytes(v) for v in views] == [b"", None, b"x" * 600, b"one", b"zero"]
    assert all(v.readonly for v in views if v is not None)
    assert cache.hits == 4 and cache.misses == 4 and cache.rejected == 1 and len(cache) == 4
    assert cache.put_many([(0, b"other")]) == [True] and bytes(cache.get(0)) == b"zero"
    with pytest.raises(IndexError, match="out of range"):
        cache.get_many([1, 6])
    with pytest.raises(TypeError, match="str"):
        cache.put_many([(5, b"fine"), (5, "text")])
    assert 5 not in cache, "a bad entry fails the batch before anything is reserved"
    cache.close()


def test_put_many_that_fails_to_write_leaves_nothing_half_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.datasets.shm.cache as cache_module

    cache = SharedCache(4, 4096)
    calls = 0
    real = cache_module._pwrite_all

    def failing(fd, parts, at):  # noqa: ANN001, ANN202
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(28, "No space left on device")
        return real(fd, parts, at)

    monkeypatch.setattr(cache_module, "_pwrite_all", failing)
    with pytest.raises(OSError, match="No space"):
        cache.put_many([(0, b"a"), (1, b"b"), (2, b"c")])
    assert 0 in cache and 1 not in cache and 2 not in cache and len(cache) == 1
    monkeypatch.setattr(cache_module, "_pwrite_all", real)
    assert cache.put_many([(1, b"b"), (2, b"c")]) == [True, True]
    assert [bytes(v) for v in cache.get_many([0, 1, 2])] == [b"a", b"b", b"c"]
    cache.close()


def test_bound_is_honoured_and_data_stays_intact() -> None:
    cache = SharedCache(10, 1000)
    stored = [cache.put(i, payload(i, 300)) for i in range(10)]
    assert stored[:3] == [True] * 3 and not any(stored[3:])
    assert cache.rejected == 7 and len(cache) == 3
    assert cache.nbytes <= 1000
    for i in range(3):
        assert bytes(cache.get(i)) == payload(i, 300)
    for i in range(3, 10):
        assert cache.get(i) is None
    assert cache.put(9, b"x" * 30), "small entries still fit in the rest"
    assert bytes(cache.get(9)) == b"x" * 30

    empty = SharedCache(2, 0)
    assert empty.put(0, b"a") is False and empty.put(1, b"") is True


def test_errors_carry_context() -> None:
    cache = SharedCache(4, 100)
    with pytest.raises(IndexError, match="index 4 out of range for 4 items"):
        cache.get(4)
    with pytest.raises(IndexError):
        cache.put(-1, b"x")
    with pytest.raises(TypeError, match="index must be an int"):
        cache.get("1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="encode it first"):
        cache.put(0, "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Python objects"):
        cache.put(0, np.array([object()]))
    with pytest.raises(TypeError, match="got list"):
        cache.put(0, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="parse_size"):
        SharedCache(4, "8GB")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_items must be >= 0"):
        SharedCache(-1, 10)

    cache.put(0, b"kept")
    view = cache.get(0)
    cache.close()
    cache.close()
    assert cache.closed and "closed" in repr(cache)
    assert bytes(view) == b"kept", "views stay valid after close"
    with pytest.raises(ValueError, match="closed"):
        cache.get(0)
    with pytest.raises(ValueError, match="closed"):
        cache.put(1, b"x")


def test_standard_pickle_is_refused_and_copies_share() -> None:
    cache = SharedCache(2, 100)
    with pytest.raises(TypeError, match="no longer be shared"):
        pickle.dumps(cache)
    assert copy.copy(cache) is cache and copy.deepcopy({"c": cache})["c"] is cache


def test_capacity_is_clamped_to_the_containers_memory_limit(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """memory.max 300 MiB with 20 MiB in use leaves 280 MiB; half of it is kept as headroom."""
    monkeypatch.setenv("PACKER_CGROUP_DIR", fake_cgroup(tmp_path / "cg", str(300 * MiB), 20 * MiB))
    with pytest.warns(RuntimeWarning, match=r"more than shared memory can hold \(293601280 bytes left under "
                      r"the container's memory limit \(cgroup\)"):
        cache = SharedCache(100, 2000 * MiB)
    assert 139 * MiB < cache.capacity <= 140 * MiB and cache.capacity % 64 == 0
    assert cache.put(0, b"x" * MiB) and not cache.put(1, b"x" * 140 * MiB)
    cache.close()
    monkeypatch.setenv("PACKER_CGROUP_DIR", fake_cgroup(tmp_path / "cg", "max", 20 * MiB))
    assert SharedCache(100, 8 * MiB).capacity == 8 * MiB, "no limit: not clamped"


def test_cgroup_free_bytes_reads_v2_and_v1_files(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    v2 = fake_cgroup(tmp_path / "v2", "1000000", 600000, inactive_file=100000)
    assert cgroup_free_bytes(v2) == 1000000 - (600000 - 100000), "inactive page cache counts as free"
    assert cgroup_free_bytes(fake_cgroup(tmp_path / "full", "1000", 5000)) == 0
    assert cgroup_free_bytes(fake_cgroup(tmp_path / "max", "max", 5000)) is None
    v1 = fake_cgroup(tmp_path / "v1", "4096000", 96000, inactive_file=6000, v1=True)
    assert cgroup_free_bytes(v1) == 4096000 - 90000
    assert cgroup_free_bytes(fake_cgroup(tmp_path / "v1max", str(2**63 - 4096), 1, v1=True)) is None
    assert cgroup_free_bytes(str(tmp_path)) is None, "no memory files: no limit known"
    monkeypatch.setenv("PACKER_CGROUP_DIR", v2)
    assert cgroup_free_bytes() == 500000, "the environment variable points at the directory"


# -- across DataLoader workers -----------------------------------------------------------------


class Order:
    """A sampler whose order the test changes between epochs (it runs in the main process)."""

    def __init__(self, order: list) -> None:
        self.order = order

    def __iter__(self):
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


class CachedPayloads(Dataset):
    """Reads through the cache: a miss stores ``payload(index)``; reports what it saw."""

    def __init__(self, cache: SharedCache) -> None:
        self.cache = cache

    def __len__(self) -> int:
        return self.cache.num_items

    def __getitem__(self, index: int) -> tuple:
        view = self.cache.get(index)
        if view is None:
            stored = self.cache.put(index, payload(index))
            return index, get_worker_info().id, False, stored
        return index, get_worker_info().id, True, bytes(view) == payload(index)


@pytest.mark.parametrize(("context", "persistent"), [("fork", False), ("spawn", True)])
def test_shared_across_workers_and_main_process(context: str, persistent: bool) -> None:
    n = 12
    cache = SharedCache(n, 64 * 1024)
    order = Order(list(range(n)))
    loader = DataLoader(
        CachedPayloads(cache),
        batch_size=None,
        sampler=order,
        num_workers=2,
        persistent_workers=persistent,
        multiprocessing_context=context,
    )
    first = list(loader)
    assert [(hit, stored) for _, _, hit, stored in first] == [(False, True)] * n
    # Swap neighbours: index i now goes to the other worker than in epoch 1.
    order.order = [i ^ 1 for i in range(n)]
    second = list(loader)
    del loader
    worker_of = {index: worker for index, worker, _, _ in first}
    for index, worker, hit, intact in second:
        assert hit and intact, f"sample {index} put by worker {worker_of[index]} missed"
        assert worker != worker_of[index]
    for index in range(n):
        assert bytes(cache.get(index)) == payload(index)
    assert cache.misses == n and cache.hits == 2 * n and len(cache) == n


class MemoryProbe(Dataset):
    """Actions chosen by the sampler: report the pid, fill one MiB entry, or touch every page."""

    def __init__(self, cache: SharedCache) -> None:
        self.cache = cache

    def __len__(self) -> int:
        return self.cache.num_items

    def __getitem__(self, key: tuple[str, int]) -> int:
        action, index = key
        if action == "pid":
            return os.getpid()
        if action == "put":
            return int(self.cache.put(index, np.full(MiB, index % 251 + 1, dtype=np.uint8)))
        return touch_all(self.cache)


def touch_all(cache: SharedCache) -> int:
    """Read one byte of every page of every entry; return the checksum."""
    total = 0
    for index in range(cache.num_items):
        total += int(np.frombuffer(cache.get(index), np.uint8)[::4096].sum())
    return total


def pss_and_rss(pids: list[int]) -> tuple[int, int]:
    infos = [psutil.Process(pid).memory_full_info() for pid in pids]
    return sum(info.pss for info in infos), sum(info.rss for info in infos)


@needs_shm
def test_one_copy_in_memory_for_main_and_workers() -> None:
    """Sum of PSS of main + 2 workers grows by about one copy of the data, not three."""
    entries = 200
    cache = SharedCache(entries, (entries + 8) * MiB)
    order = Order([("pid", 0), ("pid", 1)])
    loader = DataLoader(
        MemoryProbe(cache),
        batch_size=None,
        sampler=order,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    worker_pids = list(loader)
    pids = [os.getpid(), *worker_pids]
    assert len(set(pids)) == 3
    pss_before, rss_before = pss_and_rss(pids)

    order.order = [("put", i) for i in range(entries)]
    assert sum(loader) == entries
    order.order = [("touch", 0), ("touch", 1)]
    checksums = list(loader)
    checksums.append(touch_all(cache))
    pss_after, rss_after = pss_and_rss(pids)
    del loader

    expected = sum((i % 251 + 1) * (MiB // 4096) for i in range(entries))
    assert checksums == [expected] * 3, "every process read every page"
    data = entries * MiB
    pss_growth, rss_growth = pss_after - pss_before, rss_after - rss_before
    print(
        f"\ncached {data / MiB:.0f} MiB; sum over main + 2 workers: "
        f"PSS +{pss_growth / MiB:.0f} MiB, RSS +{rss_growth / MiB:.0f} MiB"
    )
    assert rss_growth > 2.5 * data, "each process maps all the data ..."
    assert 0.8 * data < pss_growth < 1.4 * data, "... but it is in memory once"


# -- nothing left in /dev/shm ------------------------------------------------------------------


@needs_shm
def test_no_shm_entries_after_close() -> None:
    assert not shm_entries()
    used_before = shmem_used()
    cache = SharedCache(4, 128 * MiB)
    assert cache.name is None and not shm_entries(), "a cache of one process tree has no name"
    used_alive = shmem_used()
    assert used_alive - used_before >= 96 * MiB, "the capacity is committed at creation"
    cache.put(0, b"x" * MiB)
    cache.close()
    del cache
    assert not shm_entries()
    assert wait_for_drop(used_alive, 96 * MiB) >= 96 * MiB, "the last reference frees it"


@needs_shm
def test_no_shm_entries_or_memory_after_sigkill() -> None:
    script = textwrap.dedent(
        """
        import time
        from packer.datasets.shm.cache import SharedCache
        cache = SharedCache(4, 128 * 2**20)
        cache.put(0, b"x" * (16 * 2**20))
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        used_alive = shmem_used()
        assert not shm_entries(child.pid)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    assert wait_for_drop(used_alive, 96 * MiB) >= 96 * MiB, "the killed process's memory is back"
    assert not shm_entries(child.pid)


@needs_shm
def test_failed_allocation_leaves_no_entry(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node-shared cache too big for /dev/shm fails at once, and leaves no name behind."""
    stat = os.statvfs(SHM)
    too_big = 2 * stat.f_blocks * stat.f_frsize  # refused by tmpfs at once, nothing allocated
    monkeypatch.setattr(budget_module, "_shm_free_bytes", lambda path=SHM: 4 * too_big)
    monkeypatch.setattr(budget_module, "_available_memory_bytes", lambda: 4 * too_big)
    monkeypatch.setenv("PACKER_CGROUP_DIR", str(tmp_path))  # no limit files: no cgroup limit
    before = set(os.listdir(SHM))
    with pytest.raises(RuntimeError, match="SharedCache: cannot allocate .* in /dev/shm"):
        SharedCache(1, too_big, identity=str(tmp_path), node_key="test")
    assert not {n for n in set(os.listdir(SHM)) - before if n.startswith("packer-cache-")}
