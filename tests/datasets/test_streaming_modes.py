"""Streaming for large jobs: subsets of an epoch, exactly-once evaluation, mixtures, elastic resume.

The pure plan is checked over many (world size, workers, seed, epoch) combinations in-process with
:class:`World` objects; StreamingDataset over the 23-sample test dataset of test_streaming.py.
"""

from __future__ import annotations

import collections
import itertools
import json

import numpy as np
import pytest
from torch.utils.data import DataLoader

from packer.datasets import ExactDistributedSampler, StreamingDataset, open_dataset
from packer.datasets.partition import World, plan, rank_span, stream_indices
from tests.datasets.test_streaming import N, epoch_ids, ids_by_index, lmdb_packed, loader, stream  # noqa: F401
from tests.helpers import pack, write_image


def make_numbered(root: str, count: int, classes: int = 3, prefix: str = "c") -> None:
    """``count`` 4 x 4 PNGs, sample ``i`` in class ``i % classes`` with ``i`` in its first pixel."""
    for i in range(count):
        px = np.zeros((4, 4, 3), np.uint8)
        px[0, 0, :2] = i % 256, i // 256
        write_image(f"{root}/{prefix}{i % classes}/s{i:04d}.png", px)


def numbered(tmp_path_factory, count: int, name: str, **kw) -> str:
    """A tar dataset of ``count`` numbered samples in shards of 100; its path."""
    tmp = tmp_path_factory.mktemp(name)
    make_numbered(str(tmp / "src"), count, **kw)
    pack(str(tmp / "src"), str(tmp / "out"), "tar", encode="png", writer={"shard_samples": 100})
    return str(tmp / "out")


def number(image) -> int:
    return int(image[0, 0, 0]) + 256 * int(image[1, 0, 0])


def numbers(dl) -> list[int]:
    return [number(img) for images, *_ in dl for img in images]


@pytest.fixture(scope="module")
def thousand(tmp_path_factory):
    """1,001 numbered samples in 11 shards (the last of one sample), three classes."""
    return numbered(tmp_path_factory, 1001, "thousand")


def rank_plan(sizes, world_size, workers, *, epoch, take=None, skip=0, seed=3, batch=3,
              partition="pad"):
    """What each rank reads this epoch, in the order its DataLoader yields (workers in turn)."""
    out = []
    for rank in range(world_size):
        parts = [plan(sizes, World(rank, world_size, w, workers), seed=seed, epoch=epoch,
                      shuffle=True, partition=partition, buffer_size=5, batch_size=batch,
                      skip=skip, take=take) for w in range(workers)]
        out.append(np.concatenate(parts) if parts else np.zeros(0, np.int64))
    return out


# -- subsets ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes,take,world_size,workers", [
    ((40, 37, 23), 10, 2, 2), ((100,), 33, 3, 1), ((7, 0, 9, 4), 5, 1, 3), ((50, 50), 100, 4, 2)])
def test_subset_epochs_continue_one_pass(sizes, take, world_size, workers):
    total = sum(sizes)
    epochs = -(-total // take)
    seen: list[int] = []
    for epoch in range(epochs):
        per_rank = rank_plan(sizes, world_size, workers, epoch=epoch, take=take)
        assert len({len(r) for r in per_rank}) == 1  # every rank the same count
        assert len(per_rank[0]) == -(-take // world_size)
        window = stream_indices(sizes, np.arange(epoch * take, (epoch + 1) * take), seed=3)
        got = np.concatenate(per_rank)
        assert set(got.tolist()) == set(window.tolist())  # the epoch is its window, padded
        seen += window.tolist()
    assert sorted(seen[:total]) == list(range(total))  # one pass: each sample once, then again
    assert len(set(seen)) == total


def test_full_take_is_the_default_order():
    sizes = (11, 5, 20)
    for epoch in range(3):
        assert all(np.array_equal(a, b) for a, b in zip(
            rank_plan(sizes, 3, 2, epoch=epoch), rank_plan(sizes, 3, 2, epoch=epoch, take=36)))
    assert not np.array_equal(stream_indices(sizes, np.arange(36), seed=3),
                              stream_indices(sizes, np.arange(36, 72), seed=3))


def test_subset_stream_dataset(lmdb_packed):  # noqa: F811
    ds = stream(lmdb_packed, rank=1, world_size=2, subset=0.2)  # 5 of 23 a epoch, padded to 6
    assert (ds.samples_per_epoch, len(ds), ds.padded) == (5, 3, 1)
    assert stream(lmdb_packed, subset=7).samples_per_epoch == 7
    seen = collections.Counter()
    for epoch in range(5):  # 25 stream positions: the first pass and two of the next
        for rank in range(2):
            ds = stream(lmdb_packed, rank=rank, world_size=2, subset=0.2)
            ds.set_epoch(epoch)
            ids = epoch_ids(loader(ds, 2))
            assert len(ids) == 3
            seen.update(ids)
    assert set(seen) == set(range(N))
    for bad, err in [(0.0, ValueError), (1.5, ValueError), (0, ValueError), (24, ValueError),
                     ("all", TypeError)]:
        with pytest.raises(err):
            stream(lmdb_packed, subset=bad)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker")
def test_subset_resumes_and_is_checked(lmdb_packed):  # noqa: F811
    ds = stream(lmdb_packed, subset=10)
    ds.set_epoch(2)
    whole = epoch_ids(loader(ds, 2))
    assert len(whole) == 10
    state = json.loads(json.dumps(ds.state_dict(samples_consumed=4)))
    fresh = stream(lmdb_packed, subset=10)
    fresh.load_state_dict(state)
    assert epoch_ids(loader(fresh, 3)) == whole[4:]
    with pytest.raises(ValueError, match="subset: saved 10, here 0.5"):
        stream(lmdb_packed, subset=0.5).load_state_dict(state)
    with pytest.raises(ValueError, match="order: saved 0"):
        stream(lmdb_packed, subset=10).load_state_dict({**state, "order": 0})
    plain = stream(lmdb_packed).state_dict(samples_consumed=3)
    del plain["order"], plain["subset"]  # a state saved before these fields existed
    stream(lmdb_packed).load_state_dict(plain)


def test_subset_ids_match_the_plan(lmdb_packed):  # noqa: F811
    ids = ids_by_index(lmdb_packed)
    ds = stream(lmdb_packed, subset=0.5)
    ds.set_epoch(1)
    sizes = [4] * 5 + [3]
    idx = plan(sizes, World(), seed=0, epoch=1, shuffle=True, partition="pad", buffer_size=8,
               batch_size=3, take=12)
    assert epoch_ids(loader(ds, 0)) == [ids[i] for i in idx]


# -- exactly once, for evaluation ---------------------------------------------------------------


@pytest.mark.parametrize("total,world_size", [(1001, 3), (5, 8), (0, 2), (64, 4), (7, 1)])
def test_exact_spans_cover_every_position_once(total, world_size):
    spans = [rank_span(total, world_size, r, "exact") for r in range(world_size)]
    assert [s for s, _ in spans] == [sum(c for _, c in spans[:r]) for r in range(world_size)]
    assert sum(c for _, c in spans) == total
    assert max(c for _, c in spans) - min(c for _, c in spans) <= 1


@pytest.mark.parametrize("take", [None, 500])
def test_exact_plan_reads_every_sample_once(take):
    sizes = [100] * 10 + [1]
    for epoch in range(2):
        per_rank = rank_plan(sizes, 3, 2, epoch=epoch, take=take, partition="exact")
        want = 1001 if take is None else take
        assert [len(r) for r in per_rank] == [-(-want // 3)] * (want % 3) + [want // 3] * (
            3 - want % 3)
        got = np.concatenate(per_rank)
        assert len(set(got.tolist())) == len(got) == want


def test_exact_streaming_under_three_ranks(thousand):
    seen = []
    for rank in range(3):
        ds = StreamingDataset(thousand, partition="exact", batch_size=16, world=World(rank, 3))
        assert (ds.padded, ds.dropped) == (0, 0)
        ids = numbers(DataLoader(ds, batch_size=16, num_workers=2))
        assert len(ids) == len(ds) == (334 if rank < 2 else 333)
        seen += ids
        state = ds.state_dict(samples_consumed=len(ds))
        assert (state["epoch"], state["samples_consumed"]) == (1, 0)
    assert sorted(seen) == list(range(1001))


@pytest.mark.parametrize("shuffle", [False, True])
def test_exact_sampler_gives_disjoint_parts(thousand, shuffle):
    ds = open_dataset(thousand)
    seen = []
    for rank in range(3):
        sampler = ExactDistributedSampler(ds, world=World(rank, 3), shuffle=shuffle, seed=4)
        sampler.set_epoch(2)
        ids = numbers(DataLoader(ds, batch_size=50, sampler=sampler, num_workers=2))
        assert len(ids) == len(sampler) == (334 if rank < 2 else 333)
        seen += ids
    assert sorted(seen) == list(range(1001))
    stored = [number(ds[i][0]) for i in range(len(ds))]
    assert (seen == stored) != shuffle
    with pytest.raises(TypeError):
        ExactDistributedSampler(ds, world=(0, 3))


# -- weighted mixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Source a: 1,000 numbered samples in classes a0..a2; source b: 100 in classes b0, b1."""
    return (numbered(tmp_path_factory, 1000, "mix-a", prefix="a"),
            numbered(tmp_path_factory, 100, "mix-b", classes=2, prefix="b"))


def mixed(sources, rank=0, world_size=1, **kw):  # noqa: F811
    kw.setdefault("weights", [0.7, 0.3])
    kw.setdefault("epoch_samples", 2000)
    return StreamingDataset(list(sources), batch_size=25, world=World(rank, world_size),
                            return_source=True, **kw)


def read_mixed(ds, workers=2):
    out = []
    for images, labels, source in DataLoader(ds, batch_size=25, num_workers=workers):
        out += [(int(s), number(img), int(lab)) for img, lab, s in zip(images, labels, source)]
    return out


def test_mixture_draws_in_proportion_without_early_repeats(sources):
    counts = collections.Counter()
    per_sample = collections.Counter()
    for rank in range(2):
        ds = mixed(sources, rank, 2)
        assert ds.source_takes == [1400, 600] and len(ds) == 1000 and ds.padded == 0
        got = read_mixed(ds)
        assert len(got) == 1000
        by_source = collections.Counter(s for s, _, _ in got)
        assert abs(by_source[0] - 700) <= 1 and abs(by_source[1] - 300) <= 1
        counts.update(by_source)
        per_sample.update((s, n) for s, n, _ in got)
        assert all(lab == n % (3 if s == 0 else 2) for s, n, lab in got)  # own class lists
    assert abs(counts[0] / 2000 - 0.7) <= 0.01 and abs(counts[1] / 2000 - 0.3) <= 0.01
    assert sorted(n for s, n in per_sample if s == 1) == list(range(100))
    assert {per_sample[1, n] for n in range(100)} == {6}  # six whole passes over b
    a = [per_sample[0, n] for n in range(1000)]
    assert min(a) == 1 and sum(a) == 1400 and a.count(2) == 400  # one pass, then 400 of the next


def test_mixture_passes_do_not_repeat_early(sources):
    """Before the shuffle buffer each source's draws run through whole passes."""
    ds = mixed(sources, shuffle_buffer=0)
    for epoch in range(2):
        ds.set_epoch(epoch)
        got = read_mixed(ds, workers=0)
        for s, size in ((0, 1000), (1, 100)):
            seq = [n for src, n, _ in got if src == s]
            first = epoch * ds.source_takes[s] % size  # where this epoch's window starts
            for start in range((size - first) % size, len(seq), size):
                window = seq[start : start + size]
                assert len(set(window)) == len(window)
    assert not np.array_equal(*[np.array([n for _, n, _ in read_mixed(mixed(sources, seed=sd),
                                                                         0)]) for sd in (1, 2)])


def test_mixture_labels_by_name_and_options(sources):
    ds = mixed(sources, classes="union")
    assert ds.classes == ["a0", "a1", "a2", "b0", "b1"]
    got = read_mixed(ds, workers=0)[:200]
    assert all(lab == (n % 3 if s == 0 else 3 + n % 2) for s, n, lab in got)
    plain = mixed(sources)
    assert plain.source_classes == [["a0", "a1", "a2"], ["b0", "b1"]]
    with pytest.raises(ValueError, match="different class lists"):
        _ = plain.classes
    by_size = StreamingDataset(list(sources), world=World())  # weights: the sizes, one pass each
    assert by_size.source_takes == [1000, 100] and len(by_size) == 1100
    for kw, err in [({"weights": [1]}, ValueError), ({"weights": [-1, 1]}, ValueError),
                    ({"weights": [0, 0]}, ValueError), ({"weights": ["a", 1]}, TypeError),
                    ({"classes": "merge"}, ValueError), ({"subset": 0.5}, ValueError)]:
        with pytest.raises(err):
            mixed(sources, **kw)
    with pytest.raises(ValueError, match="list of dataset paths"):
        StreamingDataset(sources[0], weights=[1])
    encoded = mixed(sources, output="encoded", classes="union", target_transform=lambda x: -x)
    for _, label, meta, source in itertools.islice(iter(encoded), 20):  # every field kept
        assert isinstance(meta, tuple) and (label <= -3) == (source == 1)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker")
def test_mixture_resumes_mid_epoch(sources):
    ds = mixed(sources, rank=1, world_size=2)
    ds.set_epoch(3)
    whole = read_mixed(ds)
    state = json.loads(json.dumps(ds.state_dict(samples_consumed=300)))
    assert state["mixture"] == [1400, 600]
    fresh = mixed(sources, rank=1, world_size=2)
    fresh.load_state_dict(state)
    assert fresh.epoch == 3
    assert read_mixed(fresh, workers=3) == whole[300:]
    with pytest.raises(ValueError, match="mixture"):
        mixed(sources, rank=1, world_size=2, weights=[0.5, 0.5]).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset"):
        mixed(sources[::-1], rank=1, world_size=2, weights=[0.7, 0.3]).load_state_dict(state)


# -- elastic resume ---------------------------------------------------------------------------


def in_order(sizes, world, *, epoch=1, skip=0, history=()):
    """What one rank's DataLoader yields: plan per worker, batches taken in turn (batch 3)."""
    from tests.datasets.test_partition import dataloader_order

    parts = [plan(sizes, World(world.rank, world.world_size, w, world.num_workers), seed=3,
                  epoch=epoch, shuffle=True, partition="pad", buffer_size=7, batch_size=3,
                  skip=skip, history=history) for w in range(world.num_workers)]
    return dataloader_order(parts, 3).tolist()


@pytest.mark.parametrize("consumed", [3, 9, 12])
@pytest.mark.parametrize("new_world,new_workers", [(1, 3), (3, 1), (4, 2)])
def test_elastic_plan_reads_the_rest_once(consumed, new_world, new_workers):
    sizes = [10, 7, 0, 12, 5]  # 34 samples: 17 per rank on 2 ranks
    full = [in_order(sizes, World(r, 2, 0, 2)) for r in range(2)]
    heads = [seq[:consumed] for seq in full]
    rest = collections.Counter(sum((seq[consumed:] for seq in full), []))
    history = [(2, consumed)]
    got = [in_order(sizes, World(r, new_world, 0, new_workers), history=history)
           for r in range(new_world)]
    assert len({len(g) for g in got}) == 1  # every rank the same count
    read = collections.Counter(sum(got, []))
    left = sum(rest.values())
    assert len(got[0]) == -(-left // new_world)
    assert read - rest == collections.Counter() or sum((read - rest).values()) < new_world
    assert rest - read == collections.Counter()  # nothing owed is left out
    assert sorted(sum(heads, []) + list(rest.elements())) == sorted(sum(full, []))
    if left % new_world == 0:
        assert read == rest  # exactly once
    # resumed again on 2 ranks after 3 more each: the chain of changes
    more = [g[:3] for g in got]
    after = [in_order(sizes, World(r, 2), history=[*history, (new_world, 3)]) for r in range(2)]
    assert collections.Counter(sum(more, []) + sum(after, [])) >= read


@pytest.fixture(scope="module")
def elastic_data(tmp_path_factory):
    return numbered(tmp_path_factory, 1001, "elastic")


def elastic_stream(path, world, state=None):
    ds = StreamingDataset(path, batch_size=27, seed=5, world=world, block_samples=50)
    if state is not None:
        ds.load_state_dict(json.loads(json.dumps(state)))
    return ds


def head_and_state(path, world, consume):
    """The numbers one rank reads before it stops after ``consume`` samples, and its state."""
    ds = elastic_stream(path, world)
    out = []
    for images, _ in DataLoader(ds, batch_size=27, num_workers=2):
        out += [number(img) for img in images]
        if len(out) == consume:
            return out, ds.state_dict(samples_consumed=consume)
    raise AssertionError(f"the epoch ended before {consume} samples")


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker")
@pytest.mark.filterwarnings("ignore:.*do not divide")
@pytest.mark.parametrize("new_world,new_workers", [(1, 3), (3, 1)])
def test_elastic_resume_of_a_dataset(elastic_data, new_world, new_workers):
    """2 ranks x 2 workers stop after 81 samples each (3 batches); 1 x 3 or 3 x 1 go on."""
    heads, full = [], []
    for rank in range(2):
        head, state = head_and_state(elastic_data, World(rank, 2), 81)
        heads += head
        full += numbers(DataLoader(elastic_stream(elastic_data, World(rank, 2)), batch_size=27))
    assert (state["epoch"], state["world_size"], state["samples_consumed"]) == (0, 2, 81)
    rests = []
    for rank in range(new_world):
        ds = elastic_stream(elastic_data, World(rank, new_world), state)
        dl = DataLoader(ds, batch_size=27, num_workers=new_workers, persistent_workers=True)
        rest = numbers(dl)
        assert len(rest) == 2 * (501 - 81) // new_world  # the 840 left, split evenly
        rests += rest
        assert ds.state_dict(samples_consumed=len(rest))["epoch"] == 1
        ordinary = elastic_stream(elastic_data, World(rank, new_world))
        ordinary.set_epoch(1)
        assert numbers(dl) == numbers(DataLoader(ordinary, batch_size=27))  # then as usual
    assert sorted(heads + rests) == sorted(full)  # the epoch's 1,002 reads, each once
    assert set(full) == set(range(1001))


@pytest.mark.filterwarnings("ignore:.*do not divide")
def test_elastic_states_are_checked(elastic_data):
    state = elastic_stream(elastic_data, World(0, 2)).state_dict(81)
    ds = elastic_stream(elastic_data, World(0, 3), state)
    mid = ds.state_dict(samples_consumed=27)
    assert mid["elastic"] == [[2, 81]] and mid["world_size"] == 3
    again = elastic_stream(elastic_data, World(1, 2), mid)  # a chain: 2 ranks, then 3, then 2 again
    assert again._history_of(0) == ((2, 81), (3, 27))
    with pytest.raises(ValueError, match="samples_consumed"):
        ds.state_dict(samples_consumed=281)  # 840 / 3 = 280 per rank in the resumed epoch
    with pytest.raises(ValueError, match="exact"):
        StreamingDataset(elastic_data, world=World(0, 3), partition="exact").load_state_dict(
            {**StreamingDataset(elastic_data, world=World(0, 2), partition="exact").state_dict(4)})
    with pytest.raises(ValueError, match="elastic must be"):
        ds.load_state_dict({**state, "elastic": [[2]]})
    with pytest.raises(ValueError, match="samples_consumed"):
        elastic_stream(elastic_data, World(0, 4)).load_state_dict({**state, "samples_consumed": 502})


@pytest.mark.parametrize("ctx", ["spawn", "fork"])
def test_mixture_epochs_advance_in_persistent_workers(sources, ctx):
    ds = mixed(sources, epoch_samples=200, rank=1, world_size=2)
    dl = DataLoader(ds, batch_size=25, num_workers=2, multiprocessing_context=ctx,
                    persistent_workers=True)
    epochs = [[(int(s), number(i)) for images, _, src in dl for i, s in zip(images, src)]
              for _ in range(2)]
    for epoch, got in enumerate(epochs):
        ref = mixed(sources, epoch_samples=200, rank=1, world_size=2)
        ref.set_epoch(epoch)
        assert got == [(s, n) for s, n, _ in read_mixed(ref, workers=0)]
    assert epochs[0] != epochs[1]


def test_elastic_plan_of_a_mixture_and_a_subset():
    sizes = [10, 7, 12, 5]  # source 0: the first two shards, source 1: the last two
    for kw in ({"take": [30, 10], "sources": [2, 2]}, {"take": 20}):
        full = [plan(sizes, World(r, 2), seed=1, epoch=2, shuffle=True, partition="pad",
                     buffer_size=4, batch_size=2, **kw).tolist() for r in range(2)]
        rest = collections.Counter(full[0][6:] + full[1][6:])
        got = [plan(sizes, World(r, 4, w, 2), seed=1, epoch=2, shuffle=True, partition="pad",
                    buffer_size=4, batch_size=2, history=[(2, 6)], **kw).tolist()
               for r in range(4) for w in range(2)]
        assert collections.Counter(sum(got, [])) == rest
