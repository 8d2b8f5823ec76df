"""packer.datasets.collate: default_collate's batches, built in reused shared memory."""

from __future__ import annotations

import collections
import gc
import os
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from packer.datasets import collate, collation, open_dataset
from tests.helpers import need_optional, pack

Point = collections.namedtuple("Point", "x y")


class Structured(Dataset):
    """Samples of every kind default_collate handles, reproducible from the index."""

    def __init__(self, n: int = 37, side: int = 24) -> None:
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):  # noqa: ANN204
        rng = np.random.default_rng(i)
        image = torch.from_numpy(rng.integers(0, 256, (self.side, self.side + 3, 3), dtype=np.uint8)).permute(2, 0, 1)
        return (
            image,  # a strided CHW view, as the readers return
            i,
            float(i) / 3,
            f"key{i}",
            {"mask": rng.random((4, 5), dtype=np.float32), "pos": torch.tensor([i, -i], dtype=torch.int16)},
            Point(np.int32(i), [i, i + 1]),
        )


def _assert_same(a, b) -> None:  # noqa: ANN001
    assert type(a) is type(b) or (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor))
    if isinstance(a, torch.Tensor):
        assert type(a) is torch.Tensor, f"a {type(a).__name__} reached the main process"
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


@pytest.fixture
def slot_path():
    """Tests of the shared-memory slots themselves: skipped with the self-test's reason where they
    are off (a failure under PACKER_REQUIRE_OPTIONAL=1)."""
    ok, why = collation.slots_available()
    need_optional(ok, f"packer.datasets.collate's shared-memory batches are off here: {why}")


def _expected(ds, batch_size):  # noqa: ANN001, ANN202
    return [default_collate([ds[i] for i in range(s, min(s + batch_size, len(ds)))]) for s in range(0, len(ds), batch_size)]


@pytest.mark.parametrize("persistent, ctx", [(False, "fork"), (True, "fork"), (True, "spawn"),
                                             pytest.param(False, "spawn", marks=pytest.mark.slow)])
def test_same_batches_as_default_collate(ctx, persistent):
    ds = Structured()
    expected = _expected(ds, 5)
    loader = DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate, multiprocessing_context=ctx,
                        persistent_workers=persistent)
    for _ in range(2):
        got = list(loader) if not persistent else [b for b in loader]
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            _assert_same(g, e)


class MixedLayouts(Dataset):
    """Images that are CHW views of HWC pixels (cropped or not), contiguous CHW, and other dtypes."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):  # noqa: ANN204
        rng = np.random.default_rng(i)
        hwc = torch.from_numpy(rng.integers(0, 256, (20, 31, 3), dtype=np.uint8))
        view = hwc.permute(2, 0, 1)[:, 2:18, 5:25]  # what a reader + center crop returns
        image = view if i % 3 else view.contiguous()
        return image, hwc.permute(2, 0, 1)[:2], view.float()


def test_interleaved_views_are_split_into_planes():
    ds = MixedLayouts()
    for ctx_batch, expected in zip(DataLoader(ds, batch_size=4, num_workers=1, collate_fn=collate), _expected(ds, 4)):
        _assert_same(ctx_batch, expected)


def test_main_process_is_default_collate():
    ds = Structured(n=6)
    samples = [ds[i] for i in range(6)]
    _assert_same(collate(samples), default_collate(samples))


def test_main_process_splits_interleaved_views_into_fresh_planes():
    ds = MixedLayouts()
    views = [ds[i] for i in range(1, 3)]  # all CHW views of HWC pixels: the OpenCV split
    for samples in (views, [ds[i] for i in range(4)]):  # and mixed with contiguous images
        got = collate(samples)
        _assert_same(got, default_collate(samples))
        assert got[0].is_contiguous()
        assert got[0].untyped_storage().data_ptr() != samples[0][0].untyped_storage().data_ptr()


def test_packed_dataset_batches_equal_default_loader(tiny_folder, tmp_path):
    dst = str(tmp_path / "lmdb")
    pack(tiny_folder[0], dst, "lmdb", resize="16x16")
    ds = open_dataset(dst)
    plain = list(DataLoader(ds, batch_size=3, num_workers=2))
    ours = list(DataLoader(ds, batch_size=3, num_workers=2, collate_fn=collate))
    assert len(plain) == len(ours)
    for (xa, ya), (xb, yb) in zip(plain, ours):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_slots_are_reused_across_batches(slot_path):
    """100 batches from 2 workers go through a handful of slots, not 100 segments."""
    ds = Structured(n=500, side=64)
    before = set(collation._rx)
    seen = set()
    for batch in DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate, persistent_workers=True):
        seen |= set(collation._rx) - before
        _assert_same(batch[0], default_collate([ds[i] for i in batch[1].tolist()])[0])
    assert 2 <= len(seen) <= 2 * 5, f"{len(seen)} slots for 100 batches"


def test_held_batches_are_never_overwritten(slot_path):
    """Holding every batch exhausts the slots: later batches fall back, earlier ones stay intact."""
    ds = Structured(n=120, side=32)
    expected = _expected(ds, 4)
    got = list(DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate))
    assert len(got) == 30 > 2 * collation.MAX_SLOTS
    for g, e in zip(got, expected):
        _assert_same(g, e)


def test_a_view_keeps_its_slot(slot_path):
    """A slice kept after its batch is dropped must not see later batches written over it."""
    ds = Structured(n=200, side=32)
    kept = []
    for k, batch in enumerate(DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate)):
        if k % 10 == 0:
            kept.append((batch[0][1:3, :, 5:20], batch[1].tolist()))
    for view, labels in kept:
        assert torch.equal(view, torch.stack([ds[i][0] for i in labels[1:3]])[:, :, 5:20])


def test_in_place_changes_in_the_main_process_do_not_leak_into_later_batches():
    ds = Structured(n=80, side=16)
    expected = _expected(ds, 4)
    for batch, e in zip(DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate), expected):
        _assert_same(batch, e)
        batch[0].fill_(255)
        batch[1].zero_()


def _unsent(batch):  # noqa: ANN001, ANN202
    """A collate_fn that builds our batch, then returns copies: the slots are never sent."""
    images, labels = collate([(x, y) for x, y, *_ in batch])
    return images.clone(), labels.clone(), torch.tensor(len(collation._pool.slots))


def test_slots_of_unsent_batches_are_freed_in_the_worker(slot_path):
    ds = Structured(n=400, side=16)
    counts = []
    for images, labels, slots in DataLoader(ds, batch_size=4, num_workers=1, collate_fn=_unsent):
        assert torch.equal(images, torch.stack([ds[i][0] for i in labels.tolist()]))
        counts.append(int(slots))
    assert max(counts) <= 2, counts


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _slot_maps() -> int:
    with open("/proc/self/maps") as maps:
        return sum("packer-batch" in line for line in maps)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_no_mapping_or_descriptor_survives_finished_loaders(slot_path):
    ds = Structured(n=60, side=32)
    gc.collect()
    fds, maps = _fds(), _slot_maps()
    for _ in range(4):  # non-persistent workers: new slots every epoch
        for batch in DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate):
            del batch
        gc.collect()  # the workers have exited and marked their slots closed
    deadline = time.monotonic() + 10  # a loaded machine: the loaders' queue threads may still be closing pipes
    while (_slot_maps() != maps or _fds() > fds + 1) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert _slot_maps() == maps
    assert _fds() <= fds + 1, sorted(os.readlink(f"/proc/self/fd/{n}") for n in os.listdir("/proc/self/fd"))[-20:]


def test_mismatched_shapes_raise_like_default_collate():
    class Ragged(Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.zeros(3, 8 + i)

    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        list(DataLoader(Ragged(), batch_size=4, num_workers=1, collate_fn=collate))


def test_streaming_dataset_with_collate(tiny_folder, tmp_path):
    from packer.datasets import StreamingDataset

    dst = str(tmp_path / "tar")
    pack(tiny_folder[0], dst, "tar", resize="16x16")
    plain = list(DataLoader(StreamingDataset(dst, batch_size=3), batch_size=3, num_workers=2))
    ours = list(DataLoader(StreamingDataset(dst, batch_size=3), batch_size=3, num_workers=2, collate_fn=collate))
    assert [y.tolist() for _, y in plain] == [y.tolist() for _, y in ours]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(plain, ours))


def test_the_self_test_passes_where_the_slot_path_works():
    """The import-time self-test agrees with a fresh run of it, and a run leaves no slot behind."""
    before, pool = set(collation._rx), collation._pool  # an earlier test in this process may have made a pool
    assert (collation._probe() == "") is collation.slots_available()[0]
    assert set(collation._rx) == before and collation._pool is pool


@pytest.mark.parametrize("breakage, reason", [
    ("internals", "torch.utils.data._utils.collate"),
    ("type map", "did not call packer's tensor collate"),
    ("reducer", "did not use packer's reduction"),
    ("release", "did not hand its slot back"),
    ("rebuild", "RuntimeError: rebuilt elsewhere"),
])
def test_the_self_test_names_each_broken_internal(monkeypatch, breakage, reason):
    """Each torch behaviour the slot path leans on, broken as a torch release could break it,
    turns the path off with a reason that says which one."""
    from multiprocessing import reduction

    if breakage == "internals":
        monkeypatch.setattr(collation, "_TORCH", None)
    elif breakage == "type map":
        monkeypatch.setattr(collation, "_COLLATE_MAP", dict(collation._TORCH[2]))
    elif breakage == "reducer":
        monkeypatch.delitem(reduction.ForkingPickler._extra_reducers, collation._SlotTensor)
    elif breakage == "release":
        monkeypatch.setattr(collation, "_rx_release", lambda *args: None)
    else:
        def rebuilt_elsewhere(*args):  # noqa: ANN002, ANN202
            raise RuntimeError("rebuilt elsewhere")

        monkeypatch.setattr(collation, "_map_slot", rebuilt_elsewhere)
    before = set(collation._rx)
    assert reason in collation._probe()
    assert set(collation._rx) == before and collation._pool is None


def test_a_failed_self_test_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(collation, "_TORCH", None)
    with pytest.warns(RuntimeWarning, match=r"shared-memory batches are off \(torch\.utils\.data\._utils"):
        collation._self_test()
    assert collation.slots_available()[0] is False
    ds = Structured(n=12)
    for got, want in zip(DataLoader(ds, batch_size=5, num_workers=1, collate_fn=collate), _expected(ds, 5)):
        _assert_same(got, want)
    monkeypatch.undo()
    collation._self_test()
    assert collation.slots_available()[0] is (collation._probe() == "")


def test_a_mapped_slot_is_sent_without_its_descriptor(monkeypatch, slot_path):
    """A descriptor crosses once per slot and tensor of the slot's first batch, not per batch:
    once the main process has mapped a slot, its worker sends the slot's key alone."""
    sent = collections.Counter()
    map_slot = collation._map_slot

    def counting(key, dup_fd):  # noqa: ANN001, ANN202
        sent[dup_fd is not None] += 1
        return map_slot(key, dup_fd)

    monkeypatch.setattr(collation, "_map_slot", counting)
    ds = Structured(n=400, side=32)
    batches = 0
    for batch in DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate, persistent_workers=True):
        _assert_same(batch[0], default_collate([ds[i] for i in batch[1].tolist()])[0])
        batches += 1
    assert batches == 100
    slots = [m for m in collation._rx.values() if m.header["receiver"] == os.getpid()]
    assert 2 <= len(slots) <= 2 * collation.MAX_SLOTS
    per_batch = sum(sent.values()) / batches  # slot tensors in a batch of Structured samples
    assert sent[True] <= per_batch * len(slots) < sent[False], sent


def test_idle_slots_of_live_workers_stay_mapped(slot_path):
    """A long-idle mapping is dropped only once its worker is gone (it would otherwise be sent by
    key to a process that no longer maps it)."""
    ds = Structured(n=40, side=16)
    loader = DataLoader(ds, batch_size=4, num_workers=1, collate_fn=collate, persistent_workers=True)
    assert sum(1 for _ in loader) == 10  # no batch kept
    mine = {k for k, m in collation._rx.items() if m.header["owner"] in {w.pid for w in loader._iterator._workers}}
    assert mine
    collation._rx_now += collation._STALE_AFTER + 1
    collation._sweep()
    assert mine <= set(collation._rx)
    del loader  # the worker exits and closes its slots
    gc.collect()
    assert not mine & set(collation._rx)


def _frozen_after_collate(batch):  # noqa: ANN001, ANN202
    images, labels = collate([(x, y) for x, y, *_ in batch])
    return images.clone(), labels.clone(), torch.tensor(gc.get_freeze_count())


class _FreezeCount(Dataset):
    """Not a packer dataset: no packer code runs in its workers."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        return gc.get_freeze_count()


def _freeze_count_to(conn) -> None:  # noqa: ANN001
    conn.send(gc.get_freeze_count())
    conn.close()


def test_forked_children_have_frozen_what_they_inherited_before_their_first_step():
    """A forked worker can make a full collection before packer's first read in it (the main
    process's collector counts come with the fork), so the freeze is made at the fork itself."""
    import multiprocessing

    before = gc.get_freeze_count()
    counts = [int(c) for c in DataLoader(_FreezeCount(), batch_size=1, num_workers=1,
                                         multiprocessing_context="fork")]
    assert min(counts) > 1000
    parent, child = multiprocessing.get_context("fork").Pipe()
    proc = multiprocessing.get_context("fork").Process(target=_freeze_count_to, args=(child,))
    proc.start()
    assert parent.recv() > 1000
    proc.join()
    assert gc.get_freeze_count() == before, "the main process is never changed"


def test_workers_freeze_what_they_inherited():
    """In a worker, the first collate moves the inherited objects to the garbage collector's
    permanent generation (a full collection would copy every page that holds one); the main
    process is left alone."""
    before = gc.get_freeze_count()
    ds = Structured(n=12, side=8)
    counts = [int(c) for _, _, c in DataLoader(ds, batch_size=4, num_workers=1, collate_fn=_frozen_after_collate)]
    assert min(counts) > 1000  # torch, numpy and the test session's objects
    assert gc.get_freeze_count() == before
