"""Section 8 of docs/benchmarks.md, ``shuffle-quality``: how close each shuffle's epoch order is to a
uniform shuffle, for a dataset written class by class, and the I/O each order implies.

The statistic is :func:`packer.datasets.orderstats.order_quality`; the orders are each loader's own.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from packer.datasets.orderstats import live_shards, order_quality, uniform_expectation
from tools.bench.common import Subcommand, header, row, timed


# -- the orders compared ---------------------------------------------------------------------------
def _packer(n: int, shard: int, **options: Any) -> Callable[[], np.ndarray]:
    from packer.datasets.partition import World, epoch_plan, plan

    sizes = np.array([min(shard, n - a) for a in range(0, n, shard)], dtype=np.int64)
    order = options.pop("order", 2)
    args = dict(seed=1, epoch=0, shuffle=True, partition="pad", batch_size=64, **options)
    if order == 1:
        return lambda: plan(sizes, World(0, 1, 0, 1), order=1, **args)
    return lambda: np.asarray(epoch_plan(sizes, World(0, 1, 0, 1), **args))


def _full_permutation(n: int) -> Callable[[], np.ndarray]:
    return lambda: np.random.default_rng(1).permutation(n)


def _webdataset(n: int, shard: int, shard_buffer: int, buffer: int) -> Callable[[], np.ndarray]:
    """webdataset's own pipeline stages: its shard list, its shard shuffle (``WebDataset(urls,
    shardshuffle=...)``), each shard's samples in stored order (what its tar expander yields), its
    sample shuffle (``.shuffle(buffer)``, default ``initial``)."""
    import webdataset as wds

    def expand(src: Iterator[dict[str, Any]]) -> Iterator[int]:
        for item in src:
            s = int(item["url"].split("-")[1])
            yield from range(s * shard, min(n, (s + 1) * shard))

    def run() -> np.ndarray:
        urls = [f"shard-{s:06d}" for s in range(-(-n // shard))]
        pipe = wds.DataPipeline(wds.SimpleShardList(urls), wds.shuffle(shard_buffer, seed=1), expand,
                                wds.shuffle(buffer, seed=1))
        return np.fromiter(pipe, dtype=np.int64, count=n)

    return run


def _litdata(n: int, chunk: int) -> Callable[[], np.ndarray]:
    """LitData's documented shuffle (``StreamingDataset(shuffle=True)``): the chunk order permuted
    per (seed, epoch), then the samples permuted within each chunk. Implemented here (litdata's
    wheels pull another torch and CUDA into the environment), one rank and one worker."""
    def run() -> np.ndarray:
        rng = np.random.default_rng(1)
        out = [c * chunk + rng.permutation(min(chunk, n - c * chunk)) for c in rng.permutation(-(-n // chunk))]
        return np.concatenate(out)

    return run


def modes(n: int, shard: int, sample_kb: float) -> list[tuple[str, Callable[[], np.ndarray], str, str]]:
    """(name, the epoch order, shards read at once, bytes read ahead or cached) of each shuffle."""
    window = 65536
    ahead = lambda samples: f"{samples * sample_kb / 1024:,.0f} MB"  # noqa: E731
    return [
        ("full permutation (`PackedDataset` + `RandomSampler`)", _full_permutation(n), "every shard (random reads)",
         "none (one sample per read)"),
        (f"packer `StreamingDataset(shuffle_buffer={n:,})` (one window: exact)", _packer(n, shard, buffer_size=n),
         "every shard (random reads)", "none (one sample per read)"),
        ("packer `StreamingDataset()` (`shuffle_buffer=65536`, the default)", _packer(n, shard, buffer_size=window),
         f"~{window // shard + 1} (one window)", f"none locally; remote: the window's shards ({ahead(window)})"),
        ("packer `StreamingDataset(shuffle_shards=16)`", _packer(n, shard, buffer_size=window, window_shards=16),
         "16-17 (one window)", f"remote: 16 shards ({ahead(16 * shard)})"),
        ("packer order 1 (`shuffle_buffer=65536`, runs started before order 2)",
         _packer(n, shard, buffer_size=window, order=1), "the buffer's span", "none (indices only)"),
        ("webdataset `shardshuffle=100` + `.shuffle(1000)`", _webdataset(n, shard, 100, 1000), "1 (streamed)",
         f"1,000 samples in RAM ({ahead(1000)})"),
        ("webdataset `shardshuffle=100` + `.shuffle(10000)`", _webdataset(n, shard, 100, 10000), "1 (streamed)",
         f"10,000 samples in RAM ({ahead(10000)})"),
        (f"LitData-style chunk shuffle (chunks of {shard:,})", _litdata(n, shard), "1 chunk (downloaded whole)",
         f"one chunk ({ahead(shard)})"),
    ]


def shuffle_quality(a: argparse.Namespace) -> int:
    """Shuffle quality: each shuffle's epoch order against a uniform permutation, and its I/O.

    A dataset of ``--samples`` written class by class (``--classes`` equal classes in stored
    order) in shards of ``--shard``; one epoch on one rank of each shuffle. Columns: mean label
    run, mean distinct shards per window of 1,000 positions, |Spearman rho| of stored against
    epoch position, and the score (the largest residual order: 0 is a uniform permutation's
    expectation, 1 the stored order); live shards is the most shards between their first and
    last read at once; the I/O columns are what the reader holds (at ``--sample-kb`` a sample).
    """
    n, classes, shard = a.samples, a.classes, a.shard
    best = uniform_expectation(n, classes, shard)
    print(f"uniform expectation: label run {best['runs']:.3f}, shards per window {best['shards']:.1f}, rho 0")
    header("shuffle", "label run", "shards / 1,000", "abs(rho)", "score", "live shards", "shards read at once",
           "read ahead / cached", "order s")
    stored = np.arange(n, dtype=np.int64)
    q = order_quality(stored, classes, shard)
    row("stored order (no shuffle)", f"{q['runs']:,.0f}", f"{q['shards']:.1f}", f"{q['rho']:.3f}", f"{q['score']:.2f}",
        live_shards(stored, shard), "1", "none", "")
    for name, make, at_once, ahead in modes(n, shard, a.sample_kb):
        seconds, order = timed(make)
        if len(order) != n or len(np.unique(order)) != n:
            raise SystemExit(f"{name}: the order is not a permutation of the {n} samples")
        q = order_quality(order, classes, shard)
        row(name, f"{q['runs']:.3f}", f"{q['shards']:.1f}", f"{q['rho']:.4f}", f"{q['score']:.3f}",
            f"{live_shards(order, shard):,}", at_once, ahead, f"{seconds:.2f}")
    return 0


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--shard", type=int, default=1000, help="samples per shard (and per LitData chunk)")
    p.add_argument("--sample-kb", type=float, default=110.0, help="mean sample size for the I/O column")


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"shuffle-quality": (shuffle_quality, _args)}
