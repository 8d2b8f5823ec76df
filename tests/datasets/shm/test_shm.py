"""Tests for packer.datasets.shm: region, lock and slot table shared with worker processes, and
nothing left in /dev/shm when a training-like process group is SIGKILLed."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from multiprocessing.reduction import ForkingPickler

import psutil
import pytest

from packer.datasets.shm.locks import ProcessLock
from packer.datasets.shm.region import SharedRegion, SlotTable, int64_rows
from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
from packer.pipeline.engine import ConvertOptions, convert_imagefolder
from tests.helpers import make_folder

SHM = "/dev/shm"
needs_shm = pytest.mark.skipif(not os.path.isdir(SHM), reason="needs /dev/shm (Linux)")


def _count_up(table_region: SharedRegion, lock: ProcessLock, times: int) -> None:
    table = SlotTable(("count", "pid"), table_region)
    for _ in range(times):
        with lock.hold():
            table["count"] += 1
    table["pid"] = os.getpid()


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_region_and_lock_are_shared_with_child_processes(context: str) -> None:
    region, lock = SharedRegion(SlotTable.nbytes(2)), ProcessLock("test")
    table = SlotTable(("count", "pid"), region)
    ctx = multiprocessing.get_context(context)
    children = [ctx.Process(target=_count_up, args=(region, lock, 200)) for _ in range(2)]
    for child in children:
        child.start()
    _count_up(region, lock, 200)
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert table["count"] == 600, "every increment under the lock, none lost"
    assert table.as_dict()["pid"] in {c.pid for c in children} | {os.getpid()}


def test_copies_of_a_lock_in_one_process_share_its_thread_lock() -> None:
    """POSIX record locks do not exclude threads of one process: the thread lock must."""
    lock = ProcessLock("test")
    copy = ForkingPickler.loads(ForkingPickler.dumps(lock))
    assert copy.fd != lock.fd
    entered = threading.Event()
    with lock.hold():
        thread = threading.Thread(target=_hold_briefly, args=(copy, entered))
        thread.start()
        assert not entered.wait(0.3), "the copy waited while the original was held"
    assert entered.wait(10)
    thread.join()


def _hold_briefly(lock: ProcessLock, entered: threading.Event) -> None:
    with lock.hold():
        entered.set()


def test_slot_table_names_and_rows() -> None:
    region = SharedRegion(SlotTable.nbytes(4) + 2 * 16)
    table = SlotTable(("a", "b"), region, slots=4)
    table["b"] = 7
    rows = int64_rows(region, ("key", "value"), 2, SlotTable.nbytes(4))
    rows[1] = (3, 4)
    assert table.as_dict() == {"a": 0, "b": 7}
    assert region.int64().tolist() == [0, 7, 0, 0, 0, 0, 3, 4]
    assert rows["value"].tolist() == [0, 4]
    with pytest.raises(ValueError, match="distinct"):
        SlotTable(("a", "a"), region)
    with pytest.raises(KeyError):
        table["c"]


def test_standard_pickle_is_refused_and_closed_ones_are_not_sent() -> None:
    region, lock = SharedRegion(64, "probe"), ProcessLock("probe")
    with pytest.raises(TypeError, match="only be sent through multiprocessing"):
        pickle.dumps(region)
    with pytest.raises(TypeError, match="only be sent through multiprocessing"):
        pickle.dumps(lock)
    region.close()
    lock.close()
    with pytest.raises(ValueError, match="closed"):
        with lock.hold():
            pass
    ctx = multiprocessing.get_context("spawn")
    with pytest.raises(ValueError, match="closed shared memory 'probe'"):
        ctx.Process(target=print, args=(region,)).start()


# -- a whole process group SIGKILLed ---------------------------------------------------------------

_TRAINING = textwrap.dedent(
    """
    import multiprocessing
    import sys
    import time

    from torch.utils.data import DataLoader

    from packer.datasets import StreamingDataset, collate, open_dataset

    if __name__ == "__main__":
        path, context, mode = sys.argv[1:4]
        if mode == "control":  # what streaming used before: a named POSIX semaphore
            held = multiprocessing.get_context("spawn").Lock()
        if mode == "plain":  # the DataLoaders alone, over lists
            datasets, collate_fn = (list(range(12)), list(range(12))), None
        else:
            datasets = (StreamingDataset(path, batch_size=2, seed=0),
                        open_dataset(path, cache="decoded"))
            collate_fn = collate
        loaders = [DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=True,
                              multiprocessing_context=context, collate_fn=collate_fn)
                   for ds in datasets]
        iterators = [iter(loader) for loader in loaders]
        for _ in range(3):
            for it in iterators:
                next(it)
        print("ready", flush=True)
        time.sleep(300)
    """
)


def _kill_training_group(path: str, context: str, mode: str = "packer") -> set[str]:
    """Run the training script, SIGKILL its process group; return the names it left in /dev/shm.

    Those are the entries that were new while it ran and are still there after it died (other
    test runs on the machine create and remove entries meanwhile: short-lived ones are waited
    out, and ones created after the kill are not counted).
    """
    script = os.path.join(os.path.dirname(path), "train.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(_TRAINING)
    before = set(os.listdir(SHM))
    child = subprocess.Popen([sys.executable, script, path, context, mode],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        tree = [child.pid, *(p.pid for p in psutil.Process(child.pid).children(recursive=True))]
        assert len(tree) >= 5, "main process and two workers per loader"
        during = set(os.listdir(SHM)) - before
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
              for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = during & set(os.listdir(SHM))
    while leaked and time.monotonic() < deadline + 5:
        time.sleep(0.1)
        leaked &= set(os.listdir(SHM))
    return leaked


@pytest.fixture(scope="module")
def training_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("killpg")
    make_folder(str(tmp / "src"), {"a": [(f"a{i}.jpg", 20, 24) for i in range(6)],
                                   "b": [(f"b{i}.jpg", 24, 20) for i in range(6)]})
    opts = ConvertOptions(processing=ProcessOptions(resize=parse_resize("16x16"),
                                                    encoding=parse_encoding("jpeg:90")))
    convert_imagefolder(str(tmp / "src"), str(tmp / "out"), "lmdb", opts)
    return str(tmp / "out")


@needs_shm
def test_sigkilled_process_group_leaves_nothing_in_dev_shm(training_data: str) -> None:
    """Streaming (epoch clock and lock), the shared cache and collate's slots under fork.

    Under spawn and forkserver the DataLoader's own multiprocessing queues are named semaphores
    that such a kill leaves behind, whatever the dataset does, so the group runs fork workers.
    """
    leaked = _kill_training_group(training_data, "fork")
    assert not leaked, f"left in {SHM} by the killed process group: {sorted(leaked)}"


@needs_shm
@pytest.mark.slow
def test_the_leak_check_sees_a_named_semaphore(training_data: str) -> None:
    """The control: a multiprocessing.Lock (what the epoch clock used to be) is caught."""
    leaked = _kill_training_group(training_data, "fork", "control")
    try:
        assert len(leaked) == 1 and next(iter(leaked)).startswith("sem.mp-")
    finally:
        for name in leaked:
            os.unlink(os.path.join(SHM, name))


@needs_shm
@pytest.mark.slow
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_under_spawn_only_the_dataloaders_own_semaphores_are_left(training_data: str,
                                                                  context: str) -> None:
    """As many names are left as by the same DataLoaders over plain lists: none are packer's."""
    leaked: dict[str, set[str]] = {}
    try:
        for mode in ("plain", "packer"):
            leaked[mode] = _kill_training_group(training_data, context, mode)
        assert all(name.startswith("sem.mp-") for name in leaked["packer"])
        assert len(leaked["packer"]) == len(leaked["plain"]) > 0
    finally:
        for name in set().union(*leaked.values()):  # the killed DataLoaders' own semaphores
            os.unlink(os.path.join(SHM, name))
