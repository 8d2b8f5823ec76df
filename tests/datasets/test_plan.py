"""Order 2 of the streaming plan (``partition.epoch_plan``): computed on demand, not stored.

The contract of every order (exactly once, equal counts, what a DataLoader yields) is checked over
many (shards, world size, workers, seed, epoch) combinations without processes; a resume at any
position is the tail of the full plan; and a worker's plan at 100M samples fits a memory bound in
a child process where order 1's does not.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from packer.datasets.partition import World, epoch_counts, epoch_plan, plan, rank_span
from packer.datasets.permutation import permute
from tests.datasets.test_partition import dataloader_order, random_shard_sizes


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 16, 17, 255, 256, 1000, 4097])
def test_permute_is_a_bijection_that_depends_on_the_key(n):
    x = np.arange(n, dtype=np.int64)
    images = [permute(x, n, key) for key in (0, 1, 2**63 + 5)]
    for y in images:
        assert sorted(y.tolist()) == list(range(n))
    if n > 4:
        assert not np.array_equal(images[0], images[1]) and not np.array_equal(images[1], images[2])
    # a window per element: the same map as one call per window
    np.testing.assert_array_equal(permute(x, np.full(n, n), np.full(n, 1, dtype=np.uint64)), images[1])


def cases(count):
    rng = random.Random(7)
    out = []
    for _ in range(count):
        shards = rng.randint(1, 40)
        total = rng.choice([rng.randint(0, 12), rng.randint(1, 900)])
        out.append(dict(sizes=random_shard_sizes(rng, shards, total), world_size=rng.randint(1, 7),
                        workers=rng.randint(1, 4), seed=rng.choice([0, 5, 2**100 + 3]), epoch=rng.randint(0, 4),
                        partition=rng.choice(["pad", "drop", "exact"]), buffer=rng.choice([0, 2, 9, 64, 10**6]),
                        batch=rng.choice([1, 2, 5, 16]), window=rng.choice([None, None, 1, 3])))
    return out


def rank_order(c, rank, skip=0, **kw):
    streams = [epoch_plan(c["sizes"], World(rank, c["world_size"], w, c["workers"]), seed=c["seed"],
                          epoch=c["epoch"], shuffle=True, partition=c["partition"], buffer_size=c["buffer"],
                          batch_size=c["batch"], skip=skip, window_shards=c["window"], **kw)
               for w in range(c["workers"])]
    return dataloader_order([np.asarray(s) for s in streams], c["batch"])


@pytest.mark.parametrize("c", cases(120) + [
    dict(sizes=[1], world_size=8, workers=4, seed=0, epoch=0, partition="pad", buffer=16, batch=4, window=None),
    dict(sizes=[0, 0], world_size=3, workers=2, seed=0, epoch=0, partition="drop", buffer=16, batch=1, window=None),
    dict(sizes=[2, 0, 3], world_size=8, workers=2, seed=1, epoch=3, partition="exact", buffer=4, batch=2, window=1),
    dict(sizes=[1000] * 3, world_size=1, workers=3, seed=2, epoch=1, partition="pad", buffer=3000, batch=7, window=None),
], ids=lambda c: f"S{len(c['sizes'])}N{sum(c['sizes'])}W{c['world_size']}K{c['workers']}{c['partition']}"
                 f"B{c['buffer']}w{c['window']}e{c['epoch']}")
def test_order2_reads_every_sample_exactly_once_and_resumes_anywhere(c):
    n = sum(c["sizes"])
    got = [rank_order(c, r) for r in range(c["world_size"])]
    spans = [rank_span(n, c["world_size"], r, c["partition"])[1] for r in range(c["world_size"])]
    assert [len(g) for g in got] == spans
    times = np.bincount(np.concatenate(got + [np.zeros(0, np.int64)]), minlength=n)
    counts = epoch_counts(n, c["world_size"], c["partition"])
    if c["partition"] == "exact":
        assert (times == 1).all()
    elif c["partition"] == "pad" and n:
        assert times.min() >= 1 and times.max() - times.min() <= 1 and times.sum() == n + counts.padded
    else:
        assert times.max(initial=0) <= 1 and times.sum() == n - counts.dropped
    rng = random.Random(n)
    for r, full in enumerate(got):  # resume at random positions: the tail, with any workers
        for skip in {0, len(full), rng.randint(0, len(full))}:
            np.testing.assert_array_equal(rank_order({**c, "workers": rng.randint(1, 4)}, r, skip), full[skip:])
    # the same epoch again is the same; the next epoch is another order
    np.testing.assert_array_equal(rank_order(c, 0), got[0])
    if len(got[0]) > 8 and c["buffer"] > 8:
        assert not np.array_equal(rank_order({**c, "epoch": c["epoch"] + 1}, 0), got[0])


def test_shuffle_off_is_order_1_and_a_large_buffer_permutes_the_whole_rank():
    sizes = [30, 0, 45, 25]
    for rank in range(3):
        args = dict(seed=4, epoch=2, partition="pad", buffer_size=8, batch_size=3)
        np.testing.assert_array_equal(plan(sizes, World(rank, 3), shuffle=False, **args),
                                      plan(sizes, World(rank, 3), shuffle=False, order=1, **args))
    whole = np.asarray(epoch_plan([100] * 10, World(), seed=1, epoch=0, shuffle=True, partition="pad",
                                  buffer_size=10**9, batch_size=1))
    assert sorted(whole.tolist()) == list(range(1000))
    assert abs(np.corrcoef(whole, np.arange(1000))[0, 1]) < 0.1  # not the stored order, nor near it


def test_mixture_subset_and_elastic_resume_keep_their_guarantees():
    sizes, sources = [40, 40, 20, 7, 7, 7], [3, 3]
    kw = dict(seed=9, epoch=0, shuffle=True, partition="pad", buffer_size=16, batch_size=2)
    takes = [60, 15]
    ranks = [np.asarray(epoch_plan(sizes, World(r, 3), take=takes, sources=sources, **kw)) for r in range(3)]
    both = np.concatenate(ranks)
    assert len(both) == 75 and len(set(both.tolist())) == 75
    assert (both < 100).sum() == 60 and (both >= 100).sum() == 15
    for r in ranks:  # every rank holds each source in proportion
        assert abs(int((r < 100).sum()) - 20) <= 1
    # elastic: 3 ranks consumed 7 each, then the rest on 2 ranks (2 workers): read once
    rest = [np.asarray(epoch_plan(sizes, World(r, 2, w, 2), take=takes, sources=sources,
                                  history=[(3, 7)], **kw)) for r in range(2) for w in range(2)]
    done = np.concatenate([x[:7] for x in ranks])
    later = np.concatenate(rest)
    assert sorted(np.concatenate([done, later]).tolist()) == sorted(both.tolist())
    sub = np.concatenate([np.asarray(epoch_plan([50, 50], World(r, 2), take=30, **{**kw, "epoch": e}))
                          for e in range(4) for r in range(2)])
    assert len(set(sub[:90].tolist())) == 90  # a subset continues one pass: no repeat before it ends


def test_resume_deep_into_a_billion_samples_generates_nothing_skipped():
    sizes = np.full(1_000_000, 1000)  # 1e9 samples in shards of 1,000
    p = epoch_plan(sizes, World(0, 1, 0, 8), seed=1, epoch=0, shuffle=True, partition="pad",
                   buffer_size=65536, batch_size=64, skip=500_000_000)
    assert len(p) == 976_563 * 64  # 7,812,500 batches of 64 over 8 workers: worker 0 takes one more
    head = p.take(0, 4096)
    assert len(set(head.tolist())) == 4096 and head.max() < 10**9
    assert int(p[10**7]) == int(p[10**7:].take(0, 1)[0])


CHILD = textwrap.dedent("""
    import resource, sys
    import numpy as np  # the address space in use now, plus 64 MB, is the bound
    from packer.datasets.partition import World, epoch_plan, plan
    order = int(sys.argv[1])
    sizes = np.full(100_000, 1000)  # 100M samples in shards of 1,000, one worker of 8 on 1 rank
    import os
    vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vm + 64 * 2**20, resource.RLIM_INFINITY))
    args = dict(seed=1, epoch=0, shuffle=True, partition="pad", buffer_size=65536, batch_size=64)
    try:
        if order == 2:
            p = epoch_plan(sizes, World(0, 1, 0, 8), **args)
            for start in range(0, 200_000, 4096):
                p.take(start, start + 4096)
            p[len(p) - 1]
        else:
            plan(sizes, World(0, 1, 0, 8), order=1, **args)
    except MemoryError:
        print("MemoryError")
        sys.exit(0)
    print("fits")
""")


def test_a_worker_plan_at_100m_samples_fits_in_64mb_where_order_1_does_not():
    out = {o: subprocess.run([sys.executable, "-c", CHILD, str(o)], capture_output=True, text=True, timeout=300)
           for o in (2, 1)}
    assert out[2].stdout.strip() == "fits", out[2].stderr[-2000:]
    assert out[1].stdout.strip() == "MemoryError", out[1].stderr[-2000:]
