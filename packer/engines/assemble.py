"""The merge of an engine conversion's parts where they are (:func:`assemble`).

Parts of one plan hold shards (tar, TFRecord) made with the same options and, given
``classes=``, the same class list: their shards are taken unchanged under their new numbers,
as hard links on a local disk and server-side copies in a bucket (no shard passes through the
driver; each is checked against its part's manifest by size, its SHA-256 was computed while it
was written). Only the small files are read and written here: each tar shard's index gets its new
first sample, the parts' sample tables become one, and the manifest is written last. A local
result is built in a hidden folder and published by rename (as every packer conversion); in a
bucket, where nothing renames, the files go straight under the destination and the manifest
last, so a reader never finds a manifest whose files are missing (with ``overwrite``, the old
dataset is removed first: readers opening it meanwhile find no manifest, never a mix).

Other parts (LMDB and HDF5, one file each, whose records are copied into one new file; parts
whose class lists differ) go through :func:`packer.merge`, locally, parts downloaded first for a
bucket and the result uploaded.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from ..converters.shards import SHARD_NAME, shard_name
from ..description.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    Skipped,
    widest_mask_dtype,
    with_mask_dtype,
)

__all__ = ["assemble", "table_rows"]

#: Layout facts that may differ between parts: they decide where shards end, not what they hold.
_FREE = ("shard_bytes", "shard_samples", "checkpoint_samples", "shards", "files", "index", "gzip_index")


def assemble(plan: Any, parts: Sequence[str], tasks: int, skipped: list[Skipped]) -> Any:
    """Merge ``parts`` (folders in ``plan.store``, in order) into ``plan.dst``; the MergeReport.
    ``tasks``: how many tasks reported; ``skipped``: the images of parts that packed none."""
    from ..converters.shards import ShardedWriter
    from ..formats import writer_class
    from ..operations.merge import MergeReport

    t0 = time.perf_counter()
    store = plan.store
    manifests = [Manifest.from_json(json.loads(store.read(f"{p}/{MANIFEST_NAME}")), store.where(p)) for p in parts]

    def describe(m: Manifest) -> Manifest:
        source = {"kind": plan.engine, "tasks": tasks, "parts": m.source["parts"]}
        return replace(m, source=source, shuffle_seed=plan.seed, skipped=skipped + list(m.skipped))

    if issubclass(writer_class(plan.format), ShardedWriter) and _uniform(manifests):
        manifest = _assembled(plan, parts, manifests, describe)
        labels = [list(range(len(m.classes))) for m in manifests]
        return MergeReport(plan.dst, manifest, time.perf_counter() - t0, labels, copied_files=len(
            [f for m in manifests for f in m.files if f.samples]))
    return _merged_by_packer(plan, parts, describe)


def _uniform(manifests: Sequence[Manifest]) -> bool:
    """Whether the parts' shards can be taken unchanged: the same class list, fields and format facts."""
    m0 = manifests[0]

    def fixed(m: Manifest) -> dict[str, Any]:
        return {k: v for k, v in m.layout.items() if k not in _FREE}

    return all(m.format == m0.format and m.classes == m0.classes and m.fields == m0.fields
               and m.processing == m0.processing and m.label_kind == m0.label_kind and m.version == m0.version
               and fixed(m) == fixed(m0) for m in manifests)


def _assembled(plan: Any, parts: Sequence[str], manifests: Sequence[Manifest], describe: Any) -> Manifest:
    """The sharded merge: files under a hidden folder published by rename (local), or straight
    under the destination with the manifest last (bucket)."""
    from ..files.filesystem import claim_destination, publish, recover_publish, temp_dir_for

    store = plan.store
    if store.remote:
        if plan.overwrite and store.exists(plan.name):
            store.remove(f"{plan.name}/{MANIFEST_NAME}")  # first: no reader takes the old files for the new
            store.remove(plan.name)
        return _write(store, plan.name, parts, manifests, describe)
    with claim_destination(plan.dst):
        recover_publish(plan.dst)
        if os.path.lexists(plan.dst) and not plan.overwrite:
            raise FileExistsError(f"destination exists: {plan.dst} (give overwrite=True to replace it)")
        tmp = temp_dir_for(plan.dst)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        try:
            manifest = _write(store, os.path.basename(tmp), parts, manifests, describe)
            publish(tmp, plan.dst, plan.overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return manifest


def _write(store: Any, out: str, parts: Sequence[str], manifests: Sequence[Manifest], describe: Any) -> Manifest:
    """Every part's shards and index files under ``out`` (renumbered), the merged sample table,
    then the manifest."""
    from ..description.samples import is_table_name
    from ..layouts.tar import INDEX_SUFFIXES, pack_index, read_index

    files: list[FileEntry] = []
    first = number = 0
    prefix = _prefix(manifests[0])
    for p, m in zip(parts, manifests):
        for data, indexes in _groups(p, m, is_table_name):
            stem = data.name.split(".", 1)[0]
            new = shard_name(number, _suffix(data.name, stem), prefix)
            store.copy(f"{p}/{data.name}", f"{out}/{new}", data.bytes)
            files.append(FileEntry(new, data.samples, data.bytes, data.sha256, first, data.id))
            for f in indexes:
                name = shard_name(number, _suffix(f.name, stem), prefix)
                if name.endswith(INDEX_SUFFIXES) and data.name.endswith(".tar"):
                    raw = _checked(store, p, f)
                    _first, entries, keys, names, rows = read_index(raw, store.where(f"{p}/{f.name}"))
                    blob = pack_index(first, entries, keys, fields=(names, rows) if names else None)
                    store.write(f"{out}/{name}", blob)
                    files.append(FileEntry(name, 0, len(blob), _sha(blob), first))
                else:
                    store.copy(f"{p}/{f.name}", f"{out}/{name}", f.bytes)
                    files.append(FileEntry(name, 0, f.bytes, f.sha256, first))
            first += data.samples
            number += 1
    files.append(_table(store, out, parts, manifests))
    m0 = manifests[0]
    template = replace(m0, num_samples=first, files=files, layout=_layout(manifests),
                       skipped=[s for m in manifests for s in m.skipped], ignored=_summed(manifests),
                       source={"kind": "merge", "parts": [{"samples": m.num_samples, "classes": len(m.classes),
                                                           "source": m.source} for m in manifests]},
                       fields=with_mask_dtype(list(m0.fields), widest_mask_dtype([m.mask_dtype for m in manifests]),
                                              m0.version))
    manifest = describe(template)
    store.write(f"{out}/{MANIFEST_NAME}", manifest.dumps())
    return manifest


def _table(store: Any, out: str, parts: Sequence[str], manifests: Sequence[Manifest]) -> FileEntry:
    """The merged sample table from the parts' tables (each fetched once, read in order)."""
    from ..description.samples import SampleTable, build_table, table_entry, table_file_entry

    boxes = manifests[0].field_kind("boxes") is not None
    with tempfile.TemporaryDirectory(prefix=".packer-table-") as work:
        tables = []
        try:
            for k, (p, m) in enumerate(zip(parts, manifests)):
                entry = table_entry(m)
                local = os.path.join(work, f"part-{k}.table")
                store.get(f"{p}/{entry.name}", local)
                fd = os.open(local, os.O_RDONLY)
                try:
                    tables.append(SampleTable(fd, local, m.num_samples, entry))
                finally:
                    os.close(fd)
            path = os.path.join(work, "samples.table")

            def rows() -> Iterator[tuple[Any, ...]]:
                for t in tables:
                    yield from table_rows(t, boxes)

            entry = table_file_entry(path, build_table(path, manifests[0].label_kind, rows(), boxes))
            store.put(path, f"{out}/{entry.name}")
        finally:
            for t in tables:
                t.close()
    return entry


def table_rows(table: Any, boxes: bool = False) -> Iterator[tuple[Any, ...]]:
    """A sample table's rows as :func:`packer.description.samples.build_table` takes them: ``(key,
    label)`` with the label carrying its kind's values and the metadata (and the boxes)."""
    from ..description.samples import Label

    kind = table.kind
    for i in range(table.num_samples):
        meta = table.meta(i) or None
        if kind == "number":
            label: Any = Label(-1, target=float(table.target_of(i)), meta=meta)
        elif kind == "multi":
            label = Label(-1, labels=table.labels_of(i), meta=meta)
        else:
            value = int(table.target_of(i))
            label = Label(value, meta=meta) if meta else value
        if boxes:
            b, bl = table.boxes_of(i)
            yield table.keys[i], label, b, [int(x) for x in bl]
        else:
            yield table.keys[i], label


def _groups(part: str, m: Manifest, is_table: Any) -> Iterator[tuple[FileEntry, list[FileEntry]]]:
    """Each data file of a part with the index files listed after it (not the sample table)."""
    group: tuple[FileEntry, list[FileEntry]] | None = None
    for f in m.files:
        if is_table(f.name):
            continue
        if f.samples:
            if group is not None:
                yield group
            group = (f, [])
        elif group is not None:
            group[1].append(f)
    if group is not None:
        yield group


def _checked(store: Any, part: str, f: FileEntry) -> bytes:
    """A part's small file, checked against its manifest entry (CorruptDataError naming it)."""
    from ..errors import CorruptDataError

    data = store.read(f"{part}/{f.name}")
    if len(data) != f.bytes or _sha(data) != f.sha256:
        raise CorruptDataError(f"{store.where(part)}: {f.name} differs from its manifest entry (size or SHA-256); "
                               f"nothing was merged", path=store.where(f"{part}/{f.name}"))
    return data


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _suffix(name: str, stem: str) -> str:
    return name[len(stem):] if name.startswith(stem) else os.path.splitext(name)[1]


def _prefix(m: Manifest) -> str:
    first = next((f.name for f in m.files if f.samples), "")
    return first.split(".", 1)[0].rsplit("-", 1)[0] if "-" in first else SHARD_NAME


def _layout(manifests: Sequence[Manifest]) -> dict[str, Any]:
    """The first part's layout; shard limits that differ between parts become null."""
    layout = dict(manifests[0].layout)
    for key in _FREE:
        if any(m.layout.get(key) != layout.get(key) for m in manifests):
            layout[key] = None
    return layout


def _summed(manifests: Sequence[Manifest]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in manifests:
        for k, n in m.ignored.items():
            out[k] = out.get(k, 0) + n
    return out


def _merged_by_packer(plan: Any, parts: Sequence[str], describe: Any) -> Any:
    """LMDB, HDF5 and parts that renumber labels: :func:`packer.merge` (parts hard-linked where
    they are on a local disk); from a bucket, the parts are downloaded to the driver's temporary
    folder, merged there and the result uploaded (files first, manifest last)."""
    from ..operations.merge import merge

    store = plan.store
    if not store.remote:
        return merge([store.where(p) for p in parts], plan.dst, plan.overwrite, describe=describe, link=True)
    from ..storage.remote import upload_converted

    with tempfile.TemporaryDirectory(prefix=".packer-merge-") as work:
        local = []
        for k, p in enumerate(parts):
            folder = os.path.join(work, f"part-{k}")
            os.makedirs(folder)
            m = Manifest.from_json(json.loads(store.read(f"{p}/{MANIFEST_NAME}")), store.where(p))
            for f in m.files:
                store.get(f"{p}/{f.name}", os.path.join(folder, f.name))
            store.get(f"{p}/{MANIFEST_NAME}", os.path.join(folder, MANIFEST_NAME))
            local.append(folder)
        out = os.path.join(work, "merged")
        report = merge(local, out, describe=describe, link=True)
        upload_converted(out, plan.dst, dict(store.storage_options), plan.overwrite)
        report.output = plan.dst
        return report
