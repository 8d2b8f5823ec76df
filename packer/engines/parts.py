"""Parts made by a cluster engine's tasks (Ray Data, Spark) and their merge into one dataset.

The driver plans the conversion (:func:`plan_parts`: options checked before any task runs) and
stages it in a hidden folder beside the destination (``.DST.packer-ENGINE-ID``). Each task packs
its rows, in the order it was given them, with :func:`packer.pack` into a part named by its task
index and a new attempt id (:func:`write_part`); pack publishes the part atomically (manifest
last) and the task returns its name. The driver merges exactly the parts the engine reports as
finished, one per task index, in index order (:func:`merge_parts`), and removes the staging
folder: a failed, retried or speculative attempt's part is never taken, so nothing is duplicated
or half-written in the result. The merged dataset equals a one-process ``packer.pack`` of the
same rows in the same order, with ``no_shuffle=True``, sample for sample.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..description.manifest import Skipped
from ..errors import SourceError
from ..files.filesystem import is_url, sibling_path

__all__ = ["PartPlan", "plan_parts", "write_part", "merge_parts", "discard_parts"]

#: pack's options a part takes from the driver (the rest would make parts differ or shuffle them).
_REFUSED = {"seed": "shuffle with the engine before writing (Ray: ds.random_shuffle(seed=...), Spark: orderBy)",
            "no_shuffle": "parts keep the rows' order; shuffle with the engine before writing",
            "resume": "a retried task writes its part again", "overwrite": "give overwrite= to the engine's call"}


@dataclass(frozen=True)
class PartPlan:
    """What every task needs to make its part (sent to the tasks, so plain data)."""

    engine: str
    dst: str
    format: str
    staging: str
    options: Mapping[str, Any] = field(default_factory=dict)
    classes: tuple[str, ...] | None = None
    label_kind: str = "class"
    images: tuple[str, ...] = ()
    overwrite: bool = False


def plan_parts(engine: str, dst: str | os.PathLike[str], format: str, *, classes: Sequence[str] | None = None,
               label_kind: str = "class", images: Sequence[str] = (), overwrite: bool = False,
               options: Mapping[str, Any] | None = None) -> PartPlan:
    """The plan of an ``engine`` conversion to ``dst``: ``options`` (packer.pack's keyword options:
    ``resize``, ``encode``, ``shard_size``, ``workers`` per task (default 1), ...) checked here, so
    a bad one fails on the driver before any task runs (TypeError/ValueError naming it).
    FileExistsError when ``dst`` exists without ``overwrite``; ValueError for a URL destination."""
    from ..conversion.options import OPTIONS, Caller
    from ..conversion.request import convert_request

    options = dict(options or {})
    caller = f"packer.{engine} conversion"
    for name, why in _REFUSED.items():
        if name in options:
            raise TypeError(f"{caller}: option {name!r} is not taken: {why}")
    if is_url(dst):
        raise ValueError(f"{caller}: the destination must be a local or shared-file-system path, not {os.fspath(dst)} "
                         f"(write it there, then copy it to object storage)")
    options.setdefault("workers", 1)
    options.setdefault("quiet", True)
    convert_request(Caller(caller), "list", format, "<rows>", dst, {**options, "no_shuffle": True},
                    [o for o in OPTIONS if o.pack])  # raises for a bad option or format
    dst = os.path.abspath(os.path.expanduser(os.fspath(dst)))
    if os.path.lexists(dst) and not overwrite:
        raise FileExistsError(f"destination exists: {dst} (give overwrite=True to replace it)")
    staging = sibling_path(dst, f"{engine}-{uuid.uuid4().hex[:12]}")
    return PartPlan(engine, dst, format, staging, options, tuple(classes) if classes is not None else None,
                    label_kind, tuple(images), overwrite)


def write_part(plan: PartPlan, index: int, rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """In a task: pack ``rows`` (sample dicts, as packer.pack takes them) into part ``index`` of
    ``plan``, in their order, and return what the driver merges: ``index``, ``part`` (the part's
    name in the staging folder, None when it has no sample), ``samples`` and ``skipped``
    (``[path, reason]`` of a part whose every image was skipped). A row without ``key`` is named
    ``part-INDEX/item-N`` (N its position in the part)."""
    from ..api import pack

    samples = [_keyed(row, index, i) for i, row in enumerate(rows)]
    if not samples:
        return {"index": index, "part": None, "samples": 0, "skipped": []}
    os.makedirs(plan.staging, exist_ok=True)
    name = f"part-{index:06d}-{uuid.uuid4().hex[:8]}"  # a new name per attempt: a retry never meets another's files
    try:
        report = pack(samples, os.path.join(plan.staging, name), plan.format, classes=plan.classes,
                      label_kind=plan.label_kind, images=plan.images, no_shuffle=True, **plan.options)
    except SourceError as e:
        skipped = getattr(e, "skipped", None)
        if skipped is None:
            raise
        return {"index": index, "part": None, "samples": 0, "skipped": [[s.path, s.reason] for s in skipped]}
    return {"index": index, "part": name, "samples": report.manifest.num_samples, "skipped": []}


def _keyed(row: Mapping[str, Any], index: int, i: int) -> dict[str, Any]:
    """A row as a sample dict with a key, NumPy scalars made Python values (metadata is JSON)."""
    sample = {k: (v.item() if hasattr(v, "item") and getattr(v, "ndim", None) == 0 else v) for k, v in row.items()}
    if sample.get("key") is None:
        sample["key"] = f"part-{index:06d}/item-{i:010d}"
    return sample


def merge_parts(plan: PartPlan, results: Sequence[Mapping[str, Any]]) -> Any:
    """On the driver, once every task has finished: merge the parts that ``results`` (one
    :func:`write_part` return per finished task) name, in task index order, into ``plan.dst``,
    the manifest's source saying which engine made it from how many tasks; then remove the
    staging folder with whatever failed attempts left there. Returns the MergeReport. SourceError
    when no task packed an image; ValueError when two results claim one task index with
    different parts (an engine that reported a task twice)."""
    from ..operations.merge import merge
    from ..pipeline.engine import nothing_converted

    by_index: dict[int, Mapping[str, Any]] = {}
    for r in results:
        seen = by_index.setdefault(int(r["index"]), r)
        if seen is not r and seen["samples"] != r["samples"]:
            raise ValueError(f"packer.{plan.engine}: task {r['index']} reported twice, with {seen['samples']} and "
                             f"{r['samples']} samples; nothing was merged")
    ordered = [by_index[k] for k in sorted(by_index)]
    skipped = [Skipped(p, why) for r in ordered for p, why in r["skipped"]]
    parts = [os.path.join(plan.staging, r["part"]) for r in ordered if r["part"]]
    try:
        if not parts:
            raise nothing_converted(f"the {plan.engine} dataset's rows", skipped)

        def describe(m: Any) -> Any:
            source = {"kind": plan.engine, "tasks": len(ordered), "parts": m.source["parts"]}
            return replace(m, source=source, shuffle_seed=None, skipped=skipped + list(m.skipped))

        return merge(parts, plan.dst, plan.overwrite, describe=describe, link=True)
    finally:
        discard_parts(plan)


def discard_parts(plan: PartPlan) -> None:
    """Remove the plan's staging folder (every part, finished or not)."""
    shutil.rmtree(plan.staging, ignore_errors=True)
