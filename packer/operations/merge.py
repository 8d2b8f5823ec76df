"""``packer merge``: one dataset from parts of one format made separately (:func:`merge`).

Stored bytes are copied, never re-encoded: tar and TFRecord shards are copied whole where no
label changes, otherwise rewritten sample by sample; LMDB and HDF5 records are copied into a new
file by the format's writer. The rules are in docs/FORMATS.md ("Merged datasets").
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import __version__
from ..converters.base import WriterOptions
from ..converters.shards import SHARD_NAME, ShardedWriter, shard_name
from ..description.manifest import (
    FileEntry,
    Manifest,
    file_problem,
    file_sha256,
    widest_mask_dtype,
    with_mask_dtype,
    write_manifest,
)
from ..description.samples import (
    TABLE_NAME,
    build_table,
    carried_label,
    is_table_name,
    table_file_entry,
)
from ..errors import CorruptDataError, ImageError, SourceError
from ..files.filesystem import (
    check_destination,
    claim_destination,
    disk_full_error,
    fsync_dir,
    no_space,
    publish,
    recover_publish,
    space_at_failure,
    temp_dir_for,
)
from ..formats import read_manifest, writer_class
from ..layouts.tar import INDEX_SUFFIXES as TAR_INDEX_SUFFIXES
from ..layouts.tar import pack_index, read_index
from ..pipeline.engine import ConvertOptions, Item, write_packed
from .transcode import COPY, open_source, reprocess_one

__all__ = ["MergeReport", "merge", "merged_classes"]

#: Layout facts that may differ between parts (they decide where shards end, not what they hold).
_FREE_LAYOUT = ("shard_bytes", "shard_samples", "checkpoint_samples", "shards", "files", "index", "gzip_index")


@dataclass
class MergeReport:
    """What :func:`merge` did. ``labels[p][old]`` is the merged label of part ``p``'s label ``old``."""

    output: str
    manifest: Manifest
    seconds: float
    labels: list[list[int]] = field(default_factory=list)
    copied_files: int = 0
    rewritten_files: int = 0

    def mapping_lines(self, parts: Sequence[str]) -> list[str]:
        """One line per part: the labels it keeps, or each renumbered class."""
        lines = []
        for part, labels in zip(parts, self.labels):
            moved = [f"{self.manifest.classes[new]!r} {old} -> {new}" for old, new in enumerate(labels) if old != new]
            lines.append(f"{part}: " + (", ".join(moved) if moved else "unchanged"))
        return lines


def merged_classes(class_lists: Sequence[Sequence[str]]) -> tuple[list[str], list[list[int]]]:
    """Union of class lists by name in first-seen order (the first part's classes keep their labels,
    names new in a later part are appended in that part's order), and each part's old -> new labels."""
    names: list[str] = []
    index: dict[str, int] = {}
    labels: list[list[int]] = []
    for k, classes in enumerate(class_lists):
        if k and classes == class_lists[k - 1]:  # the same list: one mapping shared (1,000 parts, 1,000 classes)
            labels.append(labels[-1])
            continue
        for c in classes:
            if c not in index:
                index[c] = len(names)
                names.append(c)
        labels.append([index[c] for c in classes])
    return names, labels


def _read_parts(parts: Sequence[str]) -> list[Manifest]:
    """Each part's manifest (UnfinishedDatasetError for a part without one), checked to be mergeable."""
    if not parts:
        raise SourceError("merge needs at least one part")
    seen: dict[str, str] = {}
    manifests = []
    for p in parts:
        real = os.path.realpath(p)
        if real in seen:
            raise SourceError(f"part {p} is given twice (also as {seen[real]})")
        seen[real] = p
        if not os.path.isdir(p):
            raise SourceError(f"part {p} is not a packed dataset directory")
        m = read_manifest(p)
        if manifests and m.classes == manifests[-1].classes:
            m.classes = manifests[-1].classes  # one list for parts with the same classes, not one per part
        manifests.append(m)
    first, m0 = parts[0], manifests[0]
    for p, m in zip(parts, manifests):
        if m.format != m0.format:
            raise SourceError(f"part {p} is {m.format} but part {first} is {m0.format}; merge parts of one format "
                              f"(convert one first)")
        if m.version < 2:
            raise SourceError(f"part {p} is on-disk version {m.version}; merge needs version 2 parts (file ids): "
                              f"convert it with this packer first")
        if m.version != m0.version and (m.fields or m0.fields):
            older = p if m.version < m0.version else first
            raise SourceError(f"part {p} is on-disk version {m.version} but part {first} is {m0.version}; convert "
                              f"{older} with this packer first (its masks then declare their dtype)")
        if _fields_but_dtype(m) != _fields_but_dtype(m0):
            raise SourceError(f"part {p} has the fields {m.field_names or 'none'} but part {first} has "
                              f"{m0.field_names or 'none'}; merge parts whose samples have the same fields")
        if m.label_kind != m0.label_kind:
            raise SourceError(f"part {p} has {m.label_kind} labels but part {first} has {m0.label_kind} labels; "
                              f"merge parts of one label kind")
        _same_facts(p, m.processing, first, m0.processing, "processing")
        _same_facts(p, _fixed_layout(m), first, _fixed_layout(m0), "layout")
    return manifests


def _check_part_files(paths: Sequence[str], manifests: Sequence[Manifest]) -> None:
    """Every part's files against its manifest, before anything is copied: the sample table and the
    index files (small) by size and SHA-256, payload files by size and identity (the part's reader
    opens them, and reads each one's first sample against its place). CorruptDataError names the
    part and the file."""
    for p, m in zip(paths, manifests):
        for f in m.files:
            problem = file_problem(os.path.join(p, f.name), f, sha256=not f.samples)
            if problem is not None:
                raise CorruptDataError(f"part {p}: {f.name} differs from its manifest entry ({problem}); "
                                       f"nothing was merged", path=os.path.join(p, f.name))
        ds = open_source(p, m.format)
        try:
            for f in m.files:
                if f.samples:
                    try:
                        ds.read_record(f.first)
                    except CorruptDataError as e:
                        raise CorruptDataError(f"part {p}: {f.name} differs from its manifest entry ({e}); "
                                               f"nothing was merged", path=os.path.join(p, f.name)) from None
        finally:
            ds.close()


def _check_and_drop_item_records(parts: Sequence[str], manifests: Sequence[Manifest]) -> None:
    """SourceError when two parts (or one) recorded the same source file, by its key, with another
    size or modification time (``source.converted``, written by ``convert_items``): they were
    converted from different copies of it. Parts without records (older ones, items given as
    bytes) have nothing to compare. Then the lists are left out of the parts' facts that the
    merged manifest copies: they grow with every file, and every reader reads that manifest."""
    from ..description.manifest import item_records, without_item_records
    from ..pipeline.sourcefiles import NO_STAMP, describe_stamp

    seen: dict[str, tuple[tuple[int, int], str]] = {}
    for p, m in zip(parts, manifests):
        for where, records in item_records(m.source):
            for i, r in enumerate(records if isinstance(records, list) else [None]):
                if not (isinstance(r, list) and len(r) == 3 and isinstance(r[0], str)
                        and all(isinstance(x, int) and not isinstance(x, bool) for x in r[1:])):
                    raise SourceError(f"part {p}: its manifest's {where}[{i}] is not [key, size, mtime_ns]")
                stamp = (r[1], r[2])
                if stamp == NO_STAMP:
                    continue  # could not be read: skipped, nothing converted
                first = seen.setdefault(r[0], (stamp, p))
                if first[0] != stamp:
                    raise SourceError(f"parts {first[1]} and {p} disagree about the source file {r[0]}: "
                                      f"{describe_stamp(first[0])} in {first[1]}, {describe_stamp(stamp)} in {p} "
                                      f"(converted from different copies of it, or it changed in between); "
                                      f"convert both from the same source")
    for m in manifests:
        m.source = without_item_records(m.source)


def _fixed_layout(m: Manifest) -> dict[str, Any]:
    return {k: v for k, v in m.layout.items() if k not in _FREE_LAYOUT}


def _same_facts(p: str, a: dict[str, Any], q: str, b: dict[str, Any], what: str) -> None:
    """SourceError naming the first key where the two parts' ``what`` differ."""
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            raise SourceError(f"parts were made with different {what}: {key} is {a.get(key)!r} in {p} but "
                              f"{b.get(key)!r} in {q}; convert them with the same options")


def _template(manifests: Sequence[Manifest], classes: list[str]) -> Manifest:
    """The merged manifest before any file is written: summed counts, concatenated skips."""
    ignored: dict[str, int] = {}
    for m in manifests:
        for k, n in m.ignored.items():
            ignored[k] = ignored.get(k, 0) + n
    seeds = {m.shuffle_seed for m in manifests}
    source = {"kind": "merge", "parts": [{"samples": m.num_samples, "classes": len(m.classes), "source": m.source}
                                         for m in manifests]}
    return Manifest(format=manifests[0].format, num_samples=0, classes=classes, processing=dict(manifests[0].processing),
                    files=[], shuffle_seed=seeds.pop() if len(seeds) == 1 else None,
                    skipped=[s for m in manifests for s in m.skipped], ignored=ignored, source=source,
                    created_by=f"packer {__version__}", label_kind=manifests[0].label_kind,
                    fields=with_mask_dtype(list(manifests[0].fields), widest_mask_dtype([m.mask_dtype for m in manifests]),
                                           manifests[0].version), version=manifests[0].version)


def _fields_but_dtype(m: Manifest) -> list[dict[str, Any]]:
    """A manifest's fields without the mask's dtype: parts whose masks differ in width merge (to the widest)."""
    return [{k: v for k, v in f.items() if k != "dtype"} for f in m.fields]


def _stored(ds: Any, part: str, start: int, stop: int, labels: list[int]) -> Iterator[Item]:
    """Samples ``start`` .. ``stop - 1`` of a part as engine items holding their stored bytes, labels
    renumbered; a sample that cannot be read raises (a part is a finished dataset)."""
    for i in range(start, stop):
        key, label, image, reason = reprocess_one(ds, i, COPY, copy=True)
        if image is None:
            raise ImageError(f"part {part}: sample {i} ({key}): {reason}")
        if image.box_labels is not None:
            image = replace(image, box_labels=tuple(_renumbered(image.box_labels, labels)))
        yield key, carried_label(ds, i, label, labels), image, None


def _renumbered(box_labels: Sequence[int], labels: list[int]) -> list[int]:
    """Box labels (class indices; -1: none) renumbered to the merged class list."""
    return [labels[int(v)] if 0 <= int(v) < len(labels) else int(v) for v in box_labels]


def merge(
    parts: Sequence[str | os.PathLike[str]],
    dst: str | os.PathLike[str],
    overwrite: bool = False,
    *,
    describe: Callable[[Manifest], Manifest] | None = None,
    link: bool = False,
) -> MergeReport:
    """Merge packed datasets of one format (``parts``, in order) into one at ``dst``.

    Samples keep their order (all of the first part, then the second, ...) and their stored bytes.
    Classes are united by name in first-seen order (:func:`merged_classes`) and labels renumbered;
    the report's ``labels`` says how. Counts are summed and skip lists concatenated. Refused
    (SourceError): parts of different formats or on-disk versions, or made with different
    processing or format options; UnfinishedDatasetError for a part without a manifest;
    FileExistsError when ``dst`` exists without ``overwrite``. ``describe`` may change the merged
    manifest's facts (source, skips, seed) before it is written; the files are its own.
    ``link``: a tar or TFRecord shard taken unchanged is hard-linked into ``dst`` instead of
    copied, when the file system allows (it is still read once and checked against its SHA-256);
    for parts that are deleted afterwards, as a torchrun conversion's are, since the merged
    dataset and the part then share the file.
    """
    t0 = time.perf_counter()
    paths, dst = [os.fspath(p) for p in parts], os.fspath(dst)
    for p in paths:
        check_destination(p, dst)
    with claim_destination(dst):
        recover_publish(dst)
        if os.path.lexists(dst) and not overwrite:
            raise FileExistsError(f"destination exists: {dst} (use --overwrite to replace it)")
        manifests = _read_parts(paths)
        _check_part_files(paths, manifests)
        _check_and_drop_item_records(paths, manifests)
        classes, labels = merged_classes([m.classes for m in manifests])
        template = _template(manifests, classes)
        template = describe(template) if describe is not None else template
        report = MergeReport(dst, template, 0.0, labels)
        if issubclass(writer_class(template.format), ShardedWriter):
            report.manifest = _merge_shards(paths, manifests, dst, template, overwrite, report, link)
        else:
            report.manifest = _merge_records(paths, manifests, dst, template, overwrite, labels)
    report.seconds = time.perf_counter() - t0
    return report


def _merge_records(paths: Sequence[str], manifests: Sequence[Manifest], dst: str, template: Manifest,
                   overwrite: bool, labels: list[list[int]]) -> Manifest:
    """LMDB and HDF5: every part's records copied into one new file through the engine and the writer."""
    checkpoint = manifests[0].layout.get("checkpoint_samples")
    options = ConvertOptions(processing=COPY, overwrite=overwrite,
                             writer=WriterOptions(checkpoint_samples=checkpoint if isinstance(checkpoint, int) else None))

    def items() -> Iterator[Item]:
        for p, m, lab in zip(paths, manifests, labels):
            ds = open_source(p, m.format)
            try:
                yield from _stored(ds, p, 0, len(ds), lab)
            finally:
                ds.close()

    return write_packed(dst, template.format, items(), template, options,
                        total=sum(m.num_samples for m in manifests), source=", ".join(paths))


def _merge_shards(paths: Sequence[str], manifests: Sequence[Manifest], dst: str, template: Manifest,
                  overwrite: bool, report: MergeReport, link: bool = False) -> Manifest:
    """tar and TFRecord: every part's shards, renumbered in order, into a temporary folder; then the
    manifest and the publish. A shard is copied unchanged (with its id) when its part keeps its
    labels, else rewritten by the format's writer with the stored payloads (a new id)."""
    tmp = temp_dir_for(dst)
    if os.path.lexists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    try:
        files: list[FileEntry] = []
        first = number = 0
        prefix = _prefix(manifests[0])
        for p, m, labels in zip(paths, manifests, report.labels):
            keep = labels == list(range(len(labels)))
            ds = None if keep else open_source(p, m.format)
            try:
                for data, indexes in _shard_groups(p, m):
                    if ds is None:
                        files += _copy_shard(p, data, indexes, tmp, number, first, prefix, link)
                        report.copied_files += 1
                    else:
                        files += _rewrite_shard(ds, p, m, data, tmp, number, first, labels, prefix)
                        report.rewritten_files += 1
                    first += data.samples
                    number += 1
            finally:
                if ds is not None:
                    ds.close()
        files.append(_merged_table(paths, manifests, tmp, template.label_kind, report.labels,
                                   template.field_kind("boxes") is not None))
        fsync_dir(tmp)
        manifest = replace(template, num_samples=first, files=files, layout=_merged_layout(manifests))
        write_manifest(tmp, manifest)
        publish(tmp, dst, overwrite)
        return manifest
    except BaseException as e:
        full = no_space(e, tmp)
        space = space_at_failure(tmp, e) if full is not None else None  # before the cleanup frees it
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise disk_full_error(full[0], full[1], tmp, dst, space) from e
        raise


def _merged_table(paths: Sequence[str], manifests: Sequence[Manifest], tmp: str, kind: str,
                  labels: list[list[int]], boxes: bool = False) -> FileEntry:
    """The merged dataset's sample table: every part's rows in order, class indices (of labels
    and boxes) renumbered."""
    def rows() -> Iterator[tuple[Any, ...]]:
        for p, m, lab in zip(paths, manifests, labels):
            ds = open_source(p, m.format)
            try:
                keys, targets, table = ds.keys, ds.targets, ds.sample_table() if boxes else None
                for i in range(len(ds)):
                    label = int(targets[i]) if kind == "class" else -1
                    if table is None:
                        yield keys[i], carried_label(ds, i, label, lab)
                        continue
                    b, bl = table.boxes_of(i)
                    yield keys[i], carried_label(ds, i, label, lab), b, _renumbered(bl, lab)
            finally:
                ds.close()

    path = os.path.join(tmp, TABLE_NAME)
    return table_file_entry(path, build_table(path, kind, rows(), boxes))


def _shard_groups(part: str, m: Manifest) -> Iterator[tuple[FileEntry, list[FileEntry]]]:
    """Each data file of a sharded part with the index files listed after it (the sample table,
    which belongs to no shard, is merged on its own)."""
    group: tuple[FileEntry, list[FileEntry]] | None = None
    for f in m.files:
        if is_table_name(f.name):
            continue
        if f.samples:
            if group is not None:
                yield group
            group = (f, [])
        elif group is None:
            raise SourceError(f"part {part}: its manifest lists {f.name} before any data file")
        else:
            group[1].append(f)
    if group is not None:
        yield group


def _merged_layout(manifests: Sequence[Manifest]) -> dict[str, Any]:
    """The first part's layout; shard limits that differ between parts become null."""
    layout = dict(manifests[0].layout)
    for key in _FREE_LAYOUT:
        if any(m.layout.get(key) != layout.get(key) for m in manifests):
            layout[key] = None
    return layout


def _suffix(name: str, stem: str) -> str:
    return name[len(stem):] if name.startswith(stem) else os.path.splitext(name)[1]


def _prefix(m: Manifest) -> str:
    """The shard names' prefix of a part (``train`` for ``train-000000.tar``): the merged dataset
    keeps the first part's."""
    first = next((f.name for f in m.files if f.samples), "")
    return first.split(".", 1)[0].rsplit("-", 1)[0] if "-" in first else SHARD_NAME


def _copy_shard(part: str, data: FileEntry, indexes: list[FileEntry], tmp: str, number: int,
                first: int, prefix: str = SHARD_NAME, link: bool = False) -> list[FileEntry]:
    """Copy one shard unchanged under its new number (its id and every sample's checksum stay valid:
    they depend on the file, not on its name or place in the dataset), and its index files, the
    tar index re-written with the shard's new first sample."""
    stem = data.name.split(".", 1)[0]
    new = shard_name(number, _suffix(data.name, stem), prefix)
    out = [replace(_copy_checked(part, data, os.path.join(tmp, new), link=link), first=first, id=data.id)]
    for f in indexes:
        name = shard_name(number, _suffix(f.name, stem), prefix)
        if name.endswith(TAR_INDEX_SUFFIXES) and data.name.endswith(".tar"):
            old_first, entries, keys, names, rows = read_index(_read_checked(part, f), os.path.join(part, f.name))
            if old_first != data.first or len(entries) != data.samples:
                raise CorruptDataError(f"part {part}: index {f.name} disagrees with the manifest",
                                       path=os.path.join(part, f.name))
            fields = (names, rows) if names else None  # a version 3 index keeps its field section
            out.append(_write_new(tmp, name, pack_index(first, entries, keys, fields=fields), first))
        else:
            out.append(replace(_copy_checked(part, f, os.path.join(tmp, name)), first=first))
    return out


def _read_checked(part: str, f: FileEntry) -> bytes:
    """A small file of a part, checked against its manifest entry."""
    path = os.path.join(part, f.name)
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) != f.bytes or hashlib.sha256(data).hexdigest() != f.sha256:
        raise CorruptDataError(f"part {part}: {f.name} differs from its manifest entry (size or SHA-256)", path=path)
    return data


def _write_new(tmp: str, name: str, data: bytes, first: int) -> FileEntry:
    path = os.path.join(tmp, name)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return FileEntry(name, 0, len(data), hashlib.sha256(data).hexdigest(), first)


def _copy_checked(part: str, f: FileEntry, dest: str, chunk: int = 1 << 22, link: bool = False) -> FileEntry:
    """Copy a part's file to ``dest`` (fsynced), checking the bytes against its manifest entry;
    with ``link``, check it, then hard-link it (a copy where the file system refuses links)."""
    src = os.path.join(part, f.name)
    if link:
        if file_sha256(src, chunk) != f.sha256 or os.path.getsize(src) != f.bytes:
            raise CorruptDataError(f"part {part}: {f.name} differs from its manifest entry (size or SHA-256); "
                                   f"verify the part", path=src)
        try:
            os.link(src, dest)
            return FileEntry(os.path.basename(dest), f.samples, f.bytes, f.sha256, f.first, f.id)
        except OSError:
            pass  # another file system, or links not allowed: copy
    h, size = hashlib.sha256(), 0
    with open(src, "rb") as fi, open(dest, "wb") as fo:
        while block := fi.read(chunk):
            h.update(block)
            size += len(block)
            fo.write(block)
        fo.flush()
        os.fsync(fo.fileno())
    if size != f.bytes or h.hexdigest() != f.sha256:
        raise CorruptDataError(f"part {part}: {f.name} differs from its manifest entry (size or SHA-256); "
                               f"verify the part", path=src)
    return FileEntry(os.path.basename(dest), f.samples, size, f.sha256, f.first, f.id)


def _rewrite_shard(ds: Any, part: str, m: Manifest, data: FileEntry, tmp: str, number: int, first: int,
                   labels: list[int], prefix: str = SHARD_NAME) -> list[FileEntry]:
    """Write one shard again with its labels renumbered: the stored payloads through the format's
    writer, as shard ``number`` holding samples from ``first`` on (a new id, checksums seeded anew)."""
    options = WriterOptions(shard_samples=data.samples, gzip=bool(m.layout.get("gzip", False)), prefix=prefix)
    writer = writer_class(m.format)(tmp, options)
    writer.number = number
    writer.begin({"format": m.format, "classes": m.classes, "fields": m.fields, "version": m.version})
    try:
        for j, (key, label, image, _) in enumerate(_stored(ds, part, data.first, data.first + data.samples, labels)):
            writer.add(first + j, key, label, image)
        files, _layout = writer.close()
    except BaseException:
        writer.abort()
        raise
    return files
