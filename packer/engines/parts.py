"""Parts made by a cluster engine's tasks (Ray Data, Spark) and their merge into one dataset.

The driver plans the conversion (:func:`plan_parts`: options checked before any task runs) and
stages it in a hidden folder beside the destination (``.DST.packer-ENGINE-ID``, a local or shared
folder, or a prefix in the destination's bucket). Each task packs its rows, in the order it was
given them, into a part named by its task index and a new attempt id (:func:`write_part`), through
the same pipeline as ``packer.convert_items`` (the rows' image bytes are processed from memory,
never spooled). Where the part is built on the worker's own disk (an ``s3://`` destination, or a
``local_dir``), each shard is moved to the staging folder as soon as it is finished, so a worker
holds about one finished shard and the open one, whatever its share (LMDB and HDF5 write one
file: it stays on the worker until the part is done). The part's manifest goes last.

The driver merges exactly the parts the engine reports as finished, one per task index, in index
order (:func:`merge_parts`; shards are linked or copied server-side, never through the driver:
:mod:`packer.engines.assemble`), and removes the staging folder: a failed, retried or
speculative attempt's part is never taken, so nothing is duplicated or half-written in the result.
The merged dataset equals a one-process conversion of the same rows in the same order, sample for
sample (keys, labels, stored bytes, metadata); with a seed the engine first puts the rows in the
order a one-process conversion with that seed writes (:func:`write_positions`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import SourceError
from ..files.filesystem import is_url
from .store import Store, parent_and_name

__all__ = ["PartPlan", "plan_parts", "write_part", "merge_parts", "discard_parts", "write_positions"]

#: pack's options a part takes from the driver (the rest would make parts differ or shuffle them).
_REFUSED = {"no_shuffle": "parts keep the rows' order; give seed= to the engine's call for the write-time shuffle",
            "resume": "a retried task writes its part again", "overwrite": "give overwrite= to the engine's call"}
#: Sample dict names that are not metadata (pack's own, with the extra images named in ``images``).
_TAKEN = ("image", "label", "key", "mask", "boxes", "box_labels")


@dataclass(frozen=True)
class PartPlan:
    """What every task needs to make its part (sent to the tasks, so plain data)."""

    engine: str
    dst: str
    format: str
    store: Store
    name: str
    staging: str
    options: Mapping[str, Any] = field(default_factory=dict)
    classes: tuple[str, ...] | None = None
    label_kind: str = "class"
    images: tuple[str, ...] = ()
    overwrite: bool = False
    seed: int | None = None
    local_dir: str | None = None


def plan_parts(engine: str, dst: str | os.PathLike[str], format: str, *, classes: Sequence[str] | None = None,
               label_kind: str = "class", images: Sequence[str] = (), overwrite: bool = False,
               options: Mapping[str, Any] | None = None, seed: int | None = None,
               storage_options: Mapping[str, Any] | None = None, local_dir: str | None = None) -> PartPlan:
    """The plan of an ``engine`` conversion to ``dst`` (a local or shared path, or an ``s3://``
    (any fsspec) URL reached with ``storage_options``): ``options`` (packer.pack's keyword
    options: ``resize``, ``encode``, ``shard_size``, ``workers`` per task (default 1), ...)
    checked here, so a bad one fails on the driver before any task runs (TypeError/ValueError
    naming it). ``seed``: the write-time shuffle the engine applies (recorded in the manifest).
    ``local_dir``: the workers' folder parts are built in (default: in place for a local ``dst``,
    the system's temporary folder for a URL). FileExistsError when ``dst`` exists without
    ``overwrite``; ValueError for a URL destination without ``classes`` (parts must number labels
    alike to be merged in the bucket)."""
    from ..conversion.options import OPTIONS, Caller
    from ..conversion.request import convert_request

    options = dict(options or {})
    caller = f"packer.{engine} conversion"
    if "seed" in options:
        seed = options.pop("seed")
    for name, why in _REFUSED.items():
        if name in options:
            raise TypeError(f"{caller}: option {name!r} is not taken: {why}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"{caller}: seed must be an int, not {type(seed).__name__}")
    options.setdefault("workers", 1)
    options.setdefault("quiet", True)
    remote = is_url(dst)
    dst = os.fspath(dst) if remote else os.path.abspath(os.path.expanduser(os.fspath(dst)))
    convert_request(Caller(caller), "list", format, "<rows>", dst if not remote else "rows.out",
                    {**options, "no_shuffle": True}, [o for o in OPTIONS if o.pack])  # raises for a bad option or format
    if remote and classes is None and label_kind != "number":
        raise ValueError(f"{caller}: an object-storage destination ({dst}) needs classes= (every part then numbers "
                         f"labels alike, and the merge copies shards unchanged)")
    root, name = parent_and_name(dst)
    store = Store(root, dict(storage_options or {}))
    if remote:
        from ..storage.remote import check_remote_destination

        check_remote_destination(dst, dict(storage_options or {}), overwrite)
    elif os.path.lexists(dst) and not overwrite:
        raise FileExistsError(f"destination exists: {dst} (give overwrite=True to replace it)")
    staging = f".{name}.packer-{engine}-{uuid.uuid4().hex[:12]}"
    return PartPlan(engine, dst, format, store, name, staging, options,
                    tuple(classes) if classes is not None else None, label_kind, tuple(images), overwrite, seed,
                    os.path.abspath(local_dir) if local_dir is not None else None)


def write_positions(n: int, seed: int | None) -> list[int]:
    """Where each of ``n`` rows (in input order) goes in the written dataset: the inverse of the
    write order a one-process conversion with ``seed`` uses (every position its own row when
    ``seed`` is None). Engines sort the rows by it before writing."""
    from types import SimpleNamespace

    from ..pipeline.order import write_order

    order = write_order(n, SimpleNamespace(shuffle=seed is not None, seed=seed))
    positions = [0] * n
    for pos, src in enumerate(order):
        positions[src] = pos
    return positions


def write_part(plan: PartPlan, index: int, rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """In a task: pack ``rows`` (sample dicts, as packer.pack takes them) into part ``index`` of
    ``plan``, in their order, and return what the driver merges: ``index``, ``part`` (the part's
    name in the staging folder, None when it has no sample), ``samples``, ``skipped`` (``[path,
    reason]`` of a part whose every image was skipped) and ``local_peak`` (the most bytes the part
    held at once on the worker's disk, 0 when built in place). A row without ``key`` is named by
    its path, or ``part-INDEX/item-N`` (N its position in the part) for bytes and arrays."""
    items, keys = [], []
    for i, row in enumerate(rows):
        item, key = row_item(row, index, i, plan.images)
        items.append(item)
        keys.append(key)
    if not items:
        return {"index": index, "part": None, "samples": 0, "skipped": [], "local_peak": 0}
    name = f"part-{index:06d}-{uuid.uuid4().hex[:8]}"  # a new name per attempt: a retry never meets another's files
    there = f"{plan.staging}/{name}"
    in_place = plan.local_dir is None and not plan.store.remote
    local = None if in_place else tempfile.mkdtemp(prefix=".packer-part-", dir=plan.local_dir)
    try:
        path = plan.store.where(there) if in_place else os.path.join(local, name)  # type: ignore[arg-type]
        if in_place:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        moving = None if in_place else _Streaming(items, path, plan.store, there)
        try:
            report = _convert(plan, index, moving if moving is not None else items, path, keys)
        except SourceError as e:
            skipped = getattr(e, "skipped", None)
            if skipped is None:
                raise
            return {"index": index, "part": None, "samples": 0, "skipped": [[s.path, s.reason] for s in skipped],
                    "local_peak": moving.peak if moving is not None else 0}
        if moving is not None:
            moving.finish(report.manifest)
        return {"index": index, "part": name, "samples": report.manifest.num_samples, "skipped": [],
                "local_peak": moving.peak if moving is not None else 0}
    finally:
        if local is not None:
            shutil.rmtree(local, ignore_errors=True)


def _convert(plan: PartPlan, index: int, items: Sequence[Any], path: str, keys: list[str]) -> Any:
    """The part's conversion, by convert_items (one process unless ``workers`` says more)."""
    from ..conversion.options import OPTIONS, Caller
    from ..conversion.request import convert_request
    from ..pipeline.items import convert_items

    request = convert_request(Caller(f"packer.{plan.engine} conversion"), "list", plan.format, "<rows>", path,
                              {**plan.options, "no_shuffle": True}, [o for o in OPTIONS if o.pack])
    opts = request.options
    if opts.workers <= 1:  # this task is the parallelism: one OpenCV thread, as packer's own workers
        import cv2

        cv2.setNumThreads(1)
    return convert_items(items, path, plan.format, opts, plan.classes, label_kind=plan.label_kind, keys=keys,
                         source={"kind": plan.engine, "task": index}, record_files=False)


class _Streaming(Sequence[Any]):
    """The part's items, read by position by the conversion; each read first moves the shards
    the conversion finished since (its journal lists them, checkpoint by checkpoint) out of the
    worker's folder to the store. The conversion reads items only between two samples' writes,
    so a moved shard is never one being written. ``peak``: the most bytes seen in the folder."""

    def __init__(self, items: list[Any], path: str, store: Store, there: str) -> None:
        from ..files.filesystem import temp_dir_for
        from ..files.journal import JOURNAL_NAME

        self.items, self.store, self.there = items, store, there
        self.tmp = temp_dir_for(path)
        self.journal = os.path.join(self.tmp, JOURNAL_NAME)
        self.path = path
        self.moved: set[str] = set()
        self.stamp = 0
        self.peak = 0

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: Any) -> Any:
        self.drain()
        return self.items[i]

    def drain(self) -> None:
        """Move every finished file the journal lists that is still here."""
        try:
            stamp = os.stat(self.journal).st_mtime_ns
        except OSError:
            return
        if stamp == self.stamp:
            return
        from ..files.journal import read_journal

        self.stamp = stamp
        self.peak = max(self.peak, _folder_bytes(self.tmp))
        journal = read_journal(self.tmp)
        for f in journal.writer.get("files", []) if journal is not None else []:
            name = str(f["name"])
            if name not in self.moved and os.path.exists(os.path.join(self.tmp, name)):
                self.store.put(os.path.join(self.tmp, name), f"{self.there}/{name}")
                self.moved.add(name)

    def finish(self, manifest: Any) -> None:
        """After the part was published here: the files not moved yet, then its manifest."""
        from ..description.manifest import MANIFEST_NAME

        self.peak = max(self.peak, _folder_bytes(self.path))
        for f in manifest.files:
            if f.name not in self.moved:
                self.store.put(os.path.join(self.path, f.name), f"{self.there}/{f.name}")
        self.store.put(os.path.join(self.path, MANIFEST_NAME), f"{self.there}/{MANIFEST_NAME}")


def _folder_bytes(path: str) -> int:
    """The bytes of the files directly in ``path`` (0 when it is gone)."""
    try:
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    except OSError:
        return 0


def row_item(row: Mapping[str, Any], index: int, i: int, images: Sequence[str] = ()) -> tuple[tuple[Any, ...], str]:
    """A row (a sample dict as packer.pack takes it) as a ``convert_items`` item ``(source, label,
    metadata, fields)`` and its key: paths and bytes as they are, arrays as the lossless PNG
    packer.pack makes of them; NumPy scalars made Python values (metadata is JSON)."""
    sample = {k: (v.item() if hasattr(v, "item") and getattr(v, "ndim", None) == 0 else v) for k, v in row.items()}
    where = f"task {index} row {i}"
    if "image" not in sample or "label" not in sample:
        raise ValueError(f"{where}: a row needs 'image' and 'label' (it has {', '.join(map(repr, sample)) or 'nothing'})")
    image, key = _source(sample["image"], where, "image"), sample.get("key")
    if key is None:
        key = image.replace(os.sep, "/") if isinstance(image, str) else f"part-{index:06d}/item-{i:010d}"
    elif not isinstance(key, str):
        raise TypeError(f"{where}: 'key' must be a string, not {type(key).__name__}")
    fields: dict[str, Any] = {}
    if sample.get("mask") is not None:
        fields["mask"] = _source(sample["mask"], where, "mask", label_map=True)
    if images:
        fields["images"] = {n: _source(sample[n], where, n) for n in images}
    for k in ("boxes", "box_labels"):
        if sample.get(k) is not None:
            fields[k] = sample[k].tolist() if hasattr(sample[k], "tolist") else list(sample[k])
    label = sample["label"]
    label = label.tolist() if hasattr(label, "tolist") else label
    meta = {k: v for k, v in sample.items() if k not in _TAKEN and k not in images}
    return (image, label, meta or None, fields or None), key


def _source(value: Any, where: str, what: str, label_map: bool = False) -> str | bytes:
    """An image (or, ``label_map``, a mask) given as a path, bytes or a NumPy array, as a path or
    a file's bytes."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    import numpy as np

    if not isinstance(value, np.ndarray):
        raise TypeError(f"{where}: {what!r} must be a path, bytes or an array, not {type(value).__name__}")
    import cv2

    if label_map:
        from ..fields.mask import encode_mask

        return encode_mask(np.ascontiguousarray(value))
    if value.dtype != np.uint8 or value.ndim != 3 or value.shape[2] != 3 or 0 in value.shape:
        raise ValueError(f"{where}: {what!r} must be an H x W x 3 uint8 (RGB) array, not "
                         f"{'x'.join(map(str, value.shape))} {value.dtype}")
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(value[:, :, ::-1]), [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise ValueError(f"{where}: OpenCV could not encode the {what!r} array as PNG")
    return buf.tobytes()


def merge_parts(plan: PartPlan, results: Sequence[Mapping[str, Any]]) -> Any:
    """On the driver, once every task has finished: merge the parts that ``results`` (one
    :func:`write_part` return per finished task) name, in task index order, into ``plan.dst``,
    the manifest's source saying which engine made it from how many tasks (and the seed of its
    write-time shuffle); then remove the staging folder with whatever failed attempts left there.
    Returns the MergeReport. SourceError when no task packed an image; ValueError when two
    results claim one task index with different parts (an engine that reported a task twice)."""
    from ..description.manifest import Skipped
    from ..pipeline.engine import nothing_converted
    from .assemble import assemble

    by_index: dict[int, Mapping[str, Any]] = {}
    for r in results:
        seen = by_index.setdefault(int(r["index"]), r)
        if seen is not r and seen["samples"] != r["samples"]:
            raise ValueError(f"packer.{plan.engine}: task {r['index']} reported twice, with {seen['samples']} and "
                             f"{r['samples']} samples; nothing was merged")
    ordered = [by_index[k] for k in sorted(by_index)]
    skipped = [Skipped(p, why) for r in ordered for p, why in r["skipped"]]
    try:
        parts = [f"{plan.staging}/{r['part']}" for r in ordered if r["part"]]
        if not parts:
            raise nothing_converted(f"the {plan.engine} dataset's rows", skipped)
        return assemble(plan, parts, len(ordered), skipped)
    finally:
        discard_parts(plan)


def discard_parts(plan: PartPlan) -> None:
    """Remove the plan's staging folder (every part, finished or not)."""
    plan.store.remove(plan.staging)
