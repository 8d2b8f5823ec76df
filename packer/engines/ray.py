"""Ray Data writes and reads packer datasets (``packer.ray``; ``pip install 'packer[ray]'``).

``ds.write_datasink(packer.ray.Sink(dst, format="tar", resize="shorter:256"))``: each write task
packs its rows into a part, and completion merges the parts, in task order, into one dataset
(:mod:`packer.engines.parts`: a failed or retried task never leaves a part in the result).
``packer.ray.write(ds, dst, format, seed=...)`` does the same, the rows first put in the order a
one-process conversion with that seed writes (the write-time shuffle). ``ray.data.read_datasource(packer.ray.Source(path))``: the rows of a packed dataset (``image``,
``label``, ``key``, the metadata's keys as columns), one read task per shard.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from .parts import PartPlan, discard_parts, merge_parts, plan_parts, write_part, write_positions

try:
    from ray.data import Datasource, ReadTask
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasink
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"packer.ray needs Ray Data: pip install 'packer[ray]' ({e})") from None

__all__ = ["Sink", "Source", "write"]


class Sink(Datasink):
    """A Ray Data ``Datasink`` that packs a Dataset into one packer dataset at ``dst``.

    Rows are sample dicts as :func:`packer.pack` takes them: ``image`` (a file path, an image
    file's bytes or an H x W x 3 uint8 array), ``label``, optional ``key``, ``mask``, ``boxes``,
    ``box_labels`` and the columns named in ``images``; every other column is metadata. A row
    without ``key`` is named by its path, or ``part-TASK/item-N`` for bytes and arrays.
    ``options`` are pack's (``resize``, ``encode``, ``shard_size``, ``workers`` per write task,
    default 1, ...), checked here. Give ``classes`` so every part numbers labels alike (required
    for an ``s3://`` destination, reached with ``storage_options``). ``local_dir``: the folder on
    each worker where parts are built, shard by shard (default: in place for a local ``dst``, the
    system's temporary folder for a URL). For the write-time shuffle use :func:`write`. With ``DataContext.get_current().execution_options.
    preserve_order = True`` the result holds the rows in the Dataset's order, sample for sample
    what one ``packer.pack(rows, ..., no_shuffle=True)`` writes. After the write, ``report``
    holds the merge's report (``report.manifest``).
    """

    def __init__(self, dst: str | os.PathLike[str], format: str = "tar", *, classes: Sequence[str] | None = None,
                 label_kind: str = "class", images: Sequence[str] = (), overwrite: bool = False,
                 storage_options: dict[str, Any] | None = None, local_dir: str | None = None,
                 **options: Any) -> None:
        if "seed" in options:
            raise TypeError("packer.ray.Sink: option 'seed' is not taken: a Datasink cannot reorder rows; "
                            "use packer.ray.write(ds, dst, ..., seed=...)")
        self.plan: PartPlan = plan_parts("ray", dst, format, classes=classes, label_kind=label_kind, images=images,
                                         overwrite=overwrite, options=options, storage_options=storage_options,
                                         local_dir=local_dir)
        self.report: Any = None

    def get_name(self) -> str:
        """The name Ray's progress shows."""
        return "packer"

    def write(self, blocks: Iterable[Any], ctx: Any) -> dict[str, Any]:
        """In a write task: this task's rows packed into its part (see :func:`write_part`)."""
        rows = (row for block in blocks for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True))
        return write_part(self.plan, ctx.task_idx, rows)

    def on_write_complete(self, write_result: Any) -> None:
        """On the driver: the finished tasks' parts merged into the destination."""
        returns = write_result.write_returns if hasattr(write_result, "write_returns") else write_result
        self.report = merge_parts(self.plan, [r for r in returns if r])

    def on_write_failed(self, error: Exception) -> None:
        """On the driver: the write failed; the staged parts are removed, nothing is published."""
        discard_parts(self.plan)


def write(ds: Any, dst: str | os.PathLike[str], format: str = "tar", *, seed: int | None = None,
          **sink_options: Any) -> Any:
    """Pack the Ray Dataset ``ds`` into one packer dataset at ``dst`` through a :class:`Sink`
    (``sink_options`` are its keywords), with Ray's ``preserve_order`` on for the write and its
    per-operator resource reservation off (on a small cluster it runs the write tasks one after
    another: on 2 CPUs, the second task started when the first ended), both as they were after,
    and return the merge's report. With ``seed``, the rows are first put in the order that a
    one-process conversion of them with that seed writes (``packer.pack(rows, ..., seed=seed)``):
    each row's place is computed on the driver (8 bytes a row, shared with the tasks through
    Ray's object store) and the Dataset sorted by it; the manifest records the seed. The rows
    are numbered with ``Dataset.zip`` of a range, in order under ``preserve_order`` (Ray
    deprecates ``zip`` for the order it gives otherwise)."""
    from dataclasses import replace

    import ray
    from ray.data import DataContext

    sink = Sink(dst, format, **sink_options)
    if seed is not None:
        sink.plan = replace(sink.plan, seed=_checked_seed(seed))
    context = DataContext.get_current()
    options = context.execution_options
    kept = options.preserve_order, context.op_resource_reservation_enabled
    options.preserve_order = True
    context.op_resource_reservation_enabled = False
    try:
        if seed is not None:
            import numpy as np

            n = ds.count()
            where = ray.put(np.asarray(write_positions(n, seed), dtype=np.int64))
            column = "__packer_position"
            with warnings.catch_warnings():  # zip is deprecated for its order, which preserve_order fixes here
                warnings.filterwarnings("ignore", message=".*zip.*")
                ds = ds.zip(ray.data.range(n).rename_columns({"id": column}))
            ds = ds.map_batches(functools.partial(_placed, column=column, where=[where]), batch_format="numpy")
            ds = ds.sort(column).drop_columns([column])
        ds.write_datasink(sink)
    finally:
        options.preserve_order, context.op_resource_reservation_enabled = kept
    return sink.report


def _checked_seed(seed: Any) -> int:
    """``seed`` checked: an int (TypeError otherwise)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"packer.ray.write(): seed must be an int, not {type(seed).__name__}")
    return seed


def _placed(batch: dict[str, Any], column: str, where: list[Any]) -> dict[str, Any]:
    """In a task: the batch's row numbers replaced by their places in the written dataset."""
    import ray

    positions = ray.get(where[0])
    batch[column] = positions[batch[column]]
    return batch


class Source(Datasource):
    """A Ray Data ``Datasource`` of a packed dataset's samples, one read task per shard (LMDB and
    HDF5, one file each, are split into contiguous ranges of samples).

    Rows: ``image`` (decoded H x W x 3 uint8 array, or the stored bytes with
    ``output="encoded"``), ``label`` (the class number, as the readers give it), ``key`` and, with
    ``meta=True`` (the default), each metadata key as a column (None where a sample lacks it).
    ``fields`` adds other fields the dataset has (``"mask"``, ``"boxes"``, an extra image's name).
    """

    def __init__(self, path: str | os.PathLike[str], *, output: str = "numpy", fields: Sequence[str] = (),
                 meta: bool = True, **reader_options: Any) -> None:
        super().__init__()
        from ..formats import read_manifest

        self.path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        self.manifest = read_manifest(self.path)
        self.fields = ("image", "label", "key", *fields, *(("meta",) if meta else ()))
        self.reader = {"output": output, **reader_options}

    def get_name(self) -> str:
        """The name Ray's progress shows."""
        return "packer"

    def estimate_inmemory_data_size(self) -> int | None:
        """The stored bytes (decoded images take more)."""
        return sum(f.bytes for f in self.manifest.files)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        """One read task per shard, or per range of samples where the dataset is one file."""
        tasks = []
        for start, stop, size, name in shard_ranges(self.manifest, parallelism):
            meta = BlockMetadata(num_rows=stop - start, size_bytes=size, input_files=[os.path.join(self.path, name)],
                                 exec_stats=None)
            read = functools.partial(_read_rows, self.path, start, stop, self.fields, self.reader)
            tasks.append(ReadTask(read, meta, per_task_row_limit=per_task_row_limit))
        return tasks


def shard_ranges(manifest: Any, parallelism: int) -> list[tuple[int, int, int, str]]:
    """``(start, stop, stored bytes, file name)`` of each shard's samples, in order; a dataset of
    one data file (LMDB, HDF5) in ``parallelism`` contiguous ranges."""
    data = sorted((f for f in manifest.files if f.samples > 0), key=lambda f: f.first)
    n = manifest.num_samples
    if len(data) == 1 and n > 1:
        f, k = data[0], max(1, min(parallelism, n))
        return [(n * i // k, n * (i + 1) // k, f.bytes // k, f.name) for i in range(k)]
    return [(f.first, f.first + f.samples, f.bytes, f.name) for f in data]


def _read_rows(path: str, start: int, stop: int, fields: tuple[str, ...], reader: dict[str, Any]) -> list[Any]:
    """In a read task: samples ``start`` .. ``stop - 1`` as one block."""
    import numpy as np

    from .. import open_dataset

    ds = open_dataset(path, fields=fields, as_dict=True, **reader)
    try:
        samples = [ds[i] for i in range(start, stop)]
    finally:
        getattr(ds, "close", lambda: None)()
    meta = [s.pop("meta", None) or {} for s in samples]
    names = list(dict.fromkeys(k for m in meta for k in m))
    columns: dict[str, Any] = {}
    for name in samples[0] if samples else ():
        values = [s[name] for s in samples]
        columns[name] = _column(values, np)
    for name in names:
        if name not in columns:
            columns[name] = _column([m.get(name) for m in meta], np)
    return [BlockAccessor.batch_to_block(columns)]


def _column(values: list[Any], np: Any) -> Any:
    """A block column: arrays as one object array (Ray makes it a tensor column), else a list."""
    if values and all(isinstance(v, np.ndarray) for v in values):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return np.array(values, dtype=object) if values and isinstance(values[0], (bytes, str)) else np.array(values)
