"""StreamingDataset over every registered format, with injected ranks and real DataLoaders.

Each sample of the test dataset is a flat PNG whose pixel value names it (``10 * id + 5``), so
what a DataLoader yields can be compared with the exact order :func:`partition.plan` promises.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import pickle
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packer.converters.base import WriterOptions
from packer.datasets import StreamingDataset, open_dataset
from packer.datasets import streaming as streaming_module
from packer.datasets.partition import World, epoch_counts, plan
from packer.description.registry import format_names, get_format
from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
from packer.pipeline.engine import ConvertOptions, convert_imagefolder
from tests.helpers import import_optional, write_image

N = 23  # samples: odd, so two ranks pad one and three ranks pad one
SHARD = 5  # samples per shard for sharded formats: 5 shards, the last one short
BLOCK = 4  # partitioning blocks (every format, sharded or not)
B = 3  # batch size


def make_source(root: str) -> None:
    """N flat images in two classes; sample ``i`` has every pixel ``10 * i + 5``."""
    for i in range(N):
        cls = "odd" if i % 2 else "even"
        write_image(os.path.join(root, cls, f"s{i:02d}.png"), np.full((6, 6, 3), 10 * i + 5, np.uint8))


def convert(tmp_path_factory, fmt: str) -> str:
    tmp = tmp_path_factory.mktemp(f"streaming-{fmt}")
    make_source(str(tmp / "src"))
    opts = ConvertOptions(
        processing=ProcessOptions(resize=parse_resize("none"), encoding=parse_encoding("png")),
        writer=WriterOptions(shard_samples=SHARD) if "shard_samples" in get_format(fmt).options else WriterOptions(),
    )
    convert_imagefolder(str(tmp / "src"), str(tmp / "out"), fmt, opts)
    return str(tmp / "out")


@pytest.fixture(scope="module", params=format_names())
def packed(request, tmp_path_factory):
    """The test dataset in each format, with several shards where the format has them."""
    return convert(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def lmdb_packed(tmp_path_factory):
    """The test dataset in LMDB, for what does not depend on the format."""
    return convert(tmp_path_factory, "lmdb")


def sample_id(image: torch.Tensor) -> int:
    return int(image[0, 0, 0]) // 10


def ids_by_index(path: str) -> list[int]:
    """The id of each global index, read through the map-style reader."""
    reader = open_dataset(path)
    return [sample_id(reader[i][0]) for i in range(len(reader))]


def blocks(path: str, block: int | None = BLOCK) -> list[int]:
    """Partitioning units computed independently: each payload file cut into ``block``s."""
    out = []
    for n in open_dataset(path).shard_sizes:
        out += [n] if block is None else [block] * (n // block) + ([n % block] if n % block else [])
    return out


def expected(path, *, rank=0, world_size=1, epoch=0, seed=0, partition="pad", block=BLOCK):
    """The ids a rank's DataLoader must yield, in order (plan with one worker, buffer 8)."""
    idx = plan(blocks(path, block), World(rank, world_size), seed=seed, epoch=epoch, shuffle=True,
               partition=partition, buffer_size=8, batch_size=B)
    ids = ids_by_index(path)
    return [ids[i] for i in idx]


def stream(path, *, rank=0, world_size=1, **kw) -> StreamingDataset:
    kw.setdefault("shuffle_buffer", 8)
    kw.setdefault("block_samples", BLOCK)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # padding reports are tested on their own
        return StreamingDataset(path, batch_size=B, world=World(rank, world_size), **kw)


def loader(ds, workers=2, ctx="fork", persistent=False, cls=DataLoader):
    if workers == 0:
        return cls(ds, batch_size=B)
    return cls(ds, batch_size=B, num_workers=workers, multiprocessing_context=ctx,
               persistent_workers=persistent)


def epoch_ids(dl) -> list[int]:
    return [sample_id(img) for images, _ in dl for img in images]


# --------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker")
@pytest.mark.parametrize("world_size,workers,partition",
                         [(1, 2, "pad"), (2, 2, "pad"), (3, 0, "pad"), (2, 3, "drop")])
def test_ranks_and_workers_read_the_epoch_exactly(packed, world_size, workers, partition):
    per_rank = []
    for rank in range(world_size):
        ds = stream(packed, rank=rank, world_size=world_size, partition=partition)
        ds.set_epoch(1)
        got = epoch_ids(loader(ds, workers))
        assert got == expected(packed, rank=rank, world_size=world_size, epoch=1,
                               partition=partition)
        assert len(got) == len(ds)
        per_rank.append(got)
    counts = epoch_counts(N, world_size, partition)
    assert {len(p) for p in per_rank} == {counts.per_rank}
    seen = collections.Counter(i for p in per_rank for i in p)
    assert sum(seen.values()) == N + ds.padded - ds.dropped
    assert (ds.padded, ds.dropped) == (counts.padded, counts.dropped)
    if partition == "pad":
        assert set(seen) == set(range(N))  # every sample, the padding repeats some
    else:
        assert max(seen.values()) == 1 and len(seen) == N - ds.dropped


def test_padding_and_dropping_are_reported_once(lmdb_packed, monkeypatch):
    monkeypatch.setattr(streaming_module, "_REPORTED", set())
    with pytest.warns(UserWarning, match="repeats 1 sample so every rank reads 12"):
        ds = StreamingDataset(lmdb_packed, world=World(0, 2))
    assert (len(ds), ds.padded, ds.dropped) == (12, 1, 0)
    with pytest.warns(UserWarning, match="leaves out 2 samples so every rank reads 7"):
        ds = StreamingDataset(lmdb_packed, world=World(1, 3), partition="drop")
    assert (len(ds), ds.padded, ds.dropped) == (7, 0, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StreamingDataset(lmdb_packed, world=World(0, 2))  # reported already
        StreamingDataset(lmdb_packed)  # one rank: nothing to report


def test_set_epoch_and_seed_decide_the_order(packed):
    ds = stream(packed)
    dl = loader(ds, workers=2)
    ds.set_epoch(0)
    first = epoch_ids(dl)
    ds.set_epoch(1)
    second = epoch_ids(dl)
    ds.set_epoch(0)
    assert epoch_ids(dl) == first == expected(packed, epoch=0)
    assert second == expected(packed, epoch=1) and second != first
    assert sorted(first) == sorted(second) == list(range(N))
    assert epoch_ids(loader(stream(packed, seed=0), workers=0)) == first
    assert epoch_ids(loader(stream(packed, seed=5), workers=0)) == expected(packed, seed=5) != first


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_epochs_advance_without_set_epoch(packed, workers, persistent):
    ds = stream(packed, rank=1, world_size=2)
    dl = loader(ds, workers, persistent=persistent)
    for epoch in range(3):
        assert epoch_ids(dl) == expected(packed, rank=1, world_size=2, epoch=epoch)
        assert ds.epoch == epoch
    ds.set_epoch(7)  # an explicit epoch wins over the count, and reaches persistent workers
    assert epoch_ids(dl) == expected(packed, rank=1, world_size=2, epoch=7)


def test_epochs_reach_persistent_spawned_workers(lmdb_packed):
    # spawn pickles the dataset: the epoch tensor goes to the workers by file descriptor
    ds = stream(lmdb_packed)
    dl = loader(ds, 2, ctx="spawn", persistent=True)
    assert epoch_ids(dl) == expected(lmdb_packed, epoch=0)
    assert epoch_ids(dl) == expected(lmdb_packed, epoch=1)
    assert ds.epoch == 1  # taken by the workers, seen by the main process
    ds.set_epoch(4)  # reaches workers that are already running
    assert epoch_ids(dl) == expected(lmdb_packed, epoch=4)


@pytest.mark.slow
@pytest.mark.parametrize("ctx", ["spawn", "forkserver"])
def test_new_spawned_workers_continue_the_epoch_count(lmdb_packed, ctx):
    ds = stream(lmdb_packed)
    dl = loader(ds, 2, ctx=ctx)
    assert epoch_ids(dl) == expected(lmdb_packed, epoch=0)
    assert epoch_ids(dl) == expected(lmdb_packed, epoch=1)


def consume(dl, batches: int) -> list[int]:
    out = []
    for step, (images, _) in enumerate(dl):
        out += [sample_id(img) for img in images]
        if step + 1 == batches:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_gives_the_rest_of_the_epoch(packed, workers):
    ds = stream(packed, rank=1, world_size=2)
    dl = loader(ds, workers)
    epoch_ids(dl)  # epoch 0
    head = consume(dl, 2)  # epoch 1, two batches
    state = json.loads(json.dumps(ds.state_dict(samples_consumed=len(head))))
    assert (state["epoch"], state["samples_consumed"], state["explicit_epoch"]) == (1, 6, False)
    fresh = stream(packed, rank=1, world_size=2)
    fresh.load_state_dict(state)
    dl = loader(fresh, workers)
    assert head + epoch_ids(dl) == expected(packed, rank=1, world_size=2, epoch=1)
    assert epoch_ids(dl) == expected(packed, rank=1, world_size=2, epoch=2)  # then as usual
    # resume twice in one epoch: the loop counts from where it resumed, the state from the start
    again = stream(packed, rank=1, world_size=2)
    again.load_state_dict(state)
    more = consume(loader(again, workers), 1)
    state = again.state_dict(samples_consumed=len(more))
    assert (state["epoch"], state["samples_consumed"]) == (1, 9)
    last = stream(packed, rank=1, world_size=2)
    last.load_state_dict(state)
    assert head + more + epoch_ids(loader(last, workers)) == expected(
        packed, rank=1, world_size=2, epoch=1)
    # a state taken at the end of an epoch points at the start of the next one
    end = fresh.state_dict(samples_consumed=len(fresh))
    assert (end["epoch"], end["samples_consumed"]) == (3, 0)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker")
def test_resume_with_set_epoch_and_any_batch_split(packed):
    ds = stream(packed)
    ds.set_epoch(5)
    head = consume(loader(ds, 2), 3)
    state = ds.state_dict(len(head) - 1)  # the loop consumed 8 of the 9 samples it was given
    fresh = stream(packed)
    fresh.load_state_dict(state)
    assert fresh.epoch == 5
    fresh.set_epoch(5)  # the usual loop calls set_epoch again: same epoch, still resumed
    rest = epoch_ids(loader(fresh, 3))
    assert head[:-1] + rest == expected(packed, epoch=5)
    fresh.set_epoch(6)
    assert epoch_ids(loader(fresh, 3)) == expected(packed, epoch=6)


def test_resume_reads_no_skipped_sample(packed, monkeypatch):
    ds = stream(packed)
    want, ids = expected(packed)[15:], ids_by_index(packed)
    reader_cls = type(ds.reader)
    reads = []
    original = reader_cls.load

    def counting_load(self, index):
        reads.append(index)
        return original(self, index)

    monkeypatch.setattr(reader_cls, "load", counting_load)
    fresh = stream(packed)
    fresh.load_state_dict(ds.state_dict(samples_consumed=15))
    rest = epoch_ids(loader(fresh, workers=0))
    assert rest == want
    assert [ids[i] for i in reads] == rest  # one read per sample yielded, none for the skipped


def test_bad_states_are_refused(lmdb_packed):
    ds = stream(lmdb_packed, rank=0, world_size=2)
    state = ds.state_dict(3)
    for key, value, match in [
        ("seed", 1, "seed: saved 1, here 0"),
        ("world_size", 0, "world_size"),  # another world size resumes (test_streaming_modes)
        ("dataset", "0123456789abcdef", "dataset"),
        ("shuffle_buffer", 9, "shuffle_buffer"),
        ("version", 99, "version 99"),
        ("samples_consumed", 13, "samples_consumed"),
        ("epoch", -1, "epoch"),
        ("epoch", "1", "must be an int"),
    ]:
        with pytest.raises(ValueError, match=match):
            stream(lmdb_packed, rank=0, world_size=2).load_state_dict({**state, key: value})
    with pytest.raises(ValueError, match="lacks"):
        ds.load_state_dict({"version": 1})
    with pytest.raises(ValueError, match="at most the 12"):
        ds.state_dict(13)
    resumed = stream(lmdb_packed, rank=0, world_size=2)
    resumed.load_state_dict(state)  # 3 of 12 consumed
    with pytest.raises(ValueError, match="at most the 9 samples left"):
        resumed.state_dict(10)
    with pytest.raises(TypeError, match="samples_consumed"):
        ds.state_dict()
    # a state of rank 0 resumes every rank (all ranks consume the same count)
    stream(lmdb_packed, rank=1, world_size=2).load_state_dict(state)


def test_copies_pickle_and_keep_their_own_epoch(lmdb_packed):
    ds = stream(lmdb_packed)
    ds.set_epoch(3)
    for copied in (pickle.loads(pickle.dumps(ds)), copy.deepcopy(ds)):
        assert copied.epoch == 3
        copied.set_epoch(9)
        assert ds.epoch == 3
        assert epoch_ids(loader(copied, 2)) == expected(lmdb_packed, epoch=9)
    assert len(ds) == N and ds.classes == ["even", "odd"] and "StreamingDataset" in repr(ds)


def test_options_are_checked(lmdb_packed):
    for kw, err in [({"seed": -1}, ValueError), ({"batch_size": 0}, ValueError),
                    ({"partition": "wrap"}, ValueError), ({"shuffle": 1}, TypeError),
                    ({"block_samples": 0}, ValueError), ({"world": (0, 1)}, TypeError)]:
        with pytest.raises(err):
            StreamingDataset(lmdb_packed, **kw)
    with pytest.raises(ValueError):
        stream(lmdb_packed).set_epoch(-1)


def test_unshuffled_single_rank_reads_in_stored_order(packed):
    ds = stream(packed, shuffle=False)
    assert epoch_ids(loader(ds, 2)) == ids_by_index(packed)


# -- torchdata's StatefulDataLoader ------------------------------------------------------------


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_stateful_dataloader_resumes_the_epoch(packed, workers, persistent):
    tdl = import_optional("torchdata.stateful_dataloader", "needs torchdata (the [test] extra)")
    ds = stream(packed, rank=1, world_size=2)
    dl = loader(ds, workers, persistent=persistent, cls=tdl.StatefulDataLoader)
    epoch_ids(dl)  # epoch 0
    head = consume(dl, 3)  # epoch 1, three batches
    state = dl.state_dict()
    fresh = stream(packed, rank=1, world_size=2)
    dl2 = loader(fresh, workers, persistent=persistent, cls=tdl.StatefulDataLoader)
    dl2.load_state_dict(state)
    assert head + epoch_ids(dl2) == expected(packed, rank=1, world_size=2, epoch=1)
    assert epoch_ids(dl2) == expected(packed, rank=1, world_size=2, epoch=2)
