"""Ray Data writes and reads packer datasets (``packer.ray``; ``pip install 'packer[ray]'``).

``ds.write_datasink(packer.ray.Sink(dst, format="tar", resize="shorter:256"))``: each write task
packs its rows into a part, and completion merges the parts, in task order, into one dataset
(:mod:`packer.engines.parts`: a failed or retried task never leaves a part in the result).
``ray.data.read_datasource(packer.ray.Source(path))``: the rows of a packed dataset (``image``,
``label``, ``key``, the metadata's keys as columns), one read task per shard.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from typing import Any

from .parts import PartPlan, discard_parts, merge_parts, plan_parts, write_part

try:
    from ray.data import Datasource, ReadTask
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasink
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"packer.ray needs Ray Data: pip install 'packer[ray]' ({e})") from None

__all__ = ["Sink", "Source"]


class Sink(Datasink):
    """A Ray Data ``Datasink`` that packs a Dataset into one packer dataset at ``dst``.

    Rows are sample dicts as :func:`packer.pack` takes them: ``image`` (a file path, an image
    file's bytes or an H x W x 3 uint8 array), ``label``, optional ``key``, ``mask``, ``boxes``,
    ``box_labels`` and the columns named in ``images``; every other column is metadata. A row
    without ``key`` is named ``part-TASK/item-N``. ``options`` are pack's (``resize``, ``encode``,
    ``shard_size``, ``workers`` per write task, default 1, ...), checked here. Give ``classes``
    so every part numbers labels alike. With ``DataContext.get_current().execution_options.
    preserve_order = True`` the result holds the rows in the Dataset's order, sample for sample
    what one ``packer.pack(rows, ..., no_shuffle=True)`` writes. After the write, ``report``
    holds the merge's report (``report.manifest``).
    """

    def __init__(self, dst: str | os.PathLike[str], format: str = "tar", *, classes: Sequence[str] | None = None,
                 label_kind: str = "class", images: Sequence[str] = (), overwrite: bool = False,
                 **options: Any) -> None:
        self.plan: PartPlan = plan_parts("ray", dst, format, classes=classes, label_kind=label_kind, images=images,
                                         overwrite=overwrite, options=options)
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
