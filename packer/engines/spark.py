"""Spark packs a DataFrame into a packer dataset (``packer.spark``; ``pip install 'packer[spark]'``).

:func:`write` runs one task per partition (``mapPartitionsWithIndex``), each packing its rows
into a part; the driver merges the parts in partition order (:mod:`packer.engines.parts`: only
the attempt Spark reports for each partition is taken, so a retried or speculative task never
leaves a duplicate or a half-written part in the result).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .parts import PartPlan, discard_parts, merge_parts, plan_parts, write_part, write_positions

__all__ = ["write"]


def write(df: Any, dst: str | os.PathLike[str], format: str = "tar", *, image: str = "image", label: str = "label",
          key: str | None = None, columns: Sequence[str] | None = None, classes: Sequence[str] | None = None,
          label_kind: str = "class", overwrite: bool = False, seed: int | None = None,
          storage_options: dict[str, Any] | None = None, local_dir: str | None = None, **options: Any) -> Any:
    """Pack the Spark DataFrame ``df`` into one packer dataset of ``format`` at ``dst`` (a local
    or shared-file-system path every executor and the driver see, or an ``s3://`` URL reached with
    ``storage_options``) and return the merge's report.

    ``image`` names the column of image file bytes (or file paths the executors can read),
    ``label`` the label column, ``key`` an optional column of sample names (default
    ``part-PARTITION/item-N``); ``columns`` are kept as per-sample metadata (default: every other
    column). ``options`` are :func:`packer.pack`'s (``resize``, ``encode``, ``shard_size``,
    ``workers`` per task, default 1, ...), checked before any task runs. Give ``classes`` so every
    part numbers labels alike (required for a URL). The result holds the rows in the DataFrame's
    partition order, sample for sample what one ``packer.pack(rows, ..., no_shuffle=True)``
    writes; with ``seed``, in the order ``packer.pack(rows, ..., seed=seed)`` writes them (the
    rows numbered by ``zipWithIndex``, each given its place, computed on the driver and
    broadcast, 8 bytes a row, then sorted by it into as many partitions). ``local_dir``: the
    executors' folder where parts are built, shard by shard (default: in place for a local
    ``dst``, the system's temporary folder for a URL).
    """
    plan = plan_parts("spark", dst, format, classes=classes, label_kind=label_kind, overwrite=overwrite,
                      options=options, seed=seed, storage_options=storage_options, local_dir=local_dir)
    taken = [c for c in (image, label, key) if c is not None]
    missing = [c for c in taken if c not in df.columns]
    if missing:
        raise ValueError(f"packer.spark.write(): the DataFrame has no column {missing[0]!r} (it has "
                         f"{', '.join(df.columns)})")
    meta = [c for c in df.columns if c not in taken] if columns is None else list(columns)
    names = {"image": image, "label": label, "key": key, "meta": tuple(meta)}
    task = functools.partial(_part_task, plan, names)
    try:
        rdd = df.select(*taken, *meta).rdd
        if plan.seed is not None:
            import numpy as np

            n = rdd.count()
            places = df.sparkSession.sparkContext.broadcast(np.asarray(write_positions(n, plan.seed), dtype=np.int64))
            rdd = rdd.zipWithIndex().map(functools.partial(_placed, places)) \
                .sortByKey(numPartitions=max(1, rdd.getNumPartitions())).values()
        results = rdd.mapPartitionsWithIndex(task).collect()
    except BaseException:
        discard_parts(plan)
        raise
    return merge_parts(plan, results)


def _placed(places: Any, row_number: tuple[Any, int]) -> tuple[int, Any]:
    """A row numbered by zipWithIndex, keyed by its place in the written dataset."""
    row, number = row_number
    return int(places.value[number]), row


def _part_task(plan: PartPlan, names: dict[str, Any], index: int, rows: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """In a Spark task: partition ``index``'s rows packed into its part; its one result."""
    yield write_part(plan, index, (_sample(row, names) for row in rows))


def _sample(row: Any, names: dict[str, Any]) -> dict[str, Any]:
    """A Spark Row as a sample dict for packer.pack (binary columns arrive as bytearray)."""
    image = row[names["image"]]
    sample = {"image": bytes(image) if isinstance(image, (bytearray, memoryview)) else image,
              "label": row[names["label"]]}
    if names["key"] is not None:
        sample["key"] = row[names["key"]]
    for c in names["meta"]:
        sample[c] = row[c]
    return sample
