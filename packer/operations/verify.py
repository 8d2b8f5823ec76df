"""``packer verify``: every payload file against the manifest's size and SHA-256, then every sample
read through its format's reader (record, key and index checksums) and decoded.

In a dataset with fields, every mask and extra image is read (its checksum, bound to the sample's
place, checked by the reader) and decoded, and every sample's boxes are checked against its image.
A damaged byte anywhere fails its file's SHA-256, so ``verify`` never passes a changed dataset;
the format's damage locator (packer.description.registry) names the samples wherever the format allows.
docs/reliability.md ("Damage: detected and named") says, format by format, what gets named.
"""

from __future__ import annotations

import functools
import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import crc32c
import numpy as np

from ..description.manifest import FileEntry, Manifest, file_problem
from ..description.record import Record
from ..description.samples import SampleTable
from ..errors import CorruptDataError
from ..fields import KINDS
from ..fields.boxes import BOXES
from ..formats import get_format, read_manifest

__all__ = ["VerifyReport", "verify_dataset", "file_problem"]


@dataclass
class VerifyReport:
    """Counts and one line per problem (file, sample, offset, reason)."""

    files: int = 0
    files_ok: int = 0
    samples: int = 0
    samples_ok: int = 0
    problems: list[str] = field(default_factory=list)
    bad_samples: list[int] = field(default_factory=list)
    bad_files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every file and every sample is intact."""
        return not self.problems

    def _sample(self, i: int) -> None:
        if i not in self.bad_samples:
            self.bad_samples.append(i)


def verify_dataset(path: str | os.PathLike[str], decode: bool = True) -> VerifyReport:
    """Check a packed dataset; never raises for corrupt data, it reports it."""
    root = os.fspath(path)
    m = read_manifest(root)
    spec = get_format(m.format)
    rep = VerifyReport(files=len(m.files), samples=m.num_samples)
    intact = _check_files(root, m, rep)
    _locate_all(root, m, intact, rep)
    if not decode:
        rep.samples_ok = rep.samples if rep.ok else 0
        return rep
    _read_samples(root, m, spec.check_unique_records, rep)
    return rep


def _check_files(root: str, m: Manifest, rep: VerifyReport) -> set[str]:
    """Check every payload file's size and SHA-256; return the names of the intact ones."""
    intact: set[str] = set()
    for f in m.files:
        fp = os.path.join(root, f.name)
        problem = file_problem(fp, f)
        if problem is None:
            rep.files_ok += 1
            intact.add(f.name)
        else:
            rep.problems.append(f"{fp}: {problem}")
            rep.bad_files.append(f.name)
    return intact


def _locate_all(root: str, m: Manifest, intact: set[str], rep: VerifyReport) -> None:
    """Name the damaged samples of each regular payload file that failed its check."""
    for f in m.files:
        fp = os.path.join(root, f.name)
        if f.name not in intact and os.path.isfile(fp) and not os.path.islink(fp):
            try:
                _locate(root, m, f, intact, rep)
            except (OSError, ValueError, struct.error, zlib.error, EOFError) as e:
                rep.problems.append(f"{fp}: cannot locate the damage ({e})")


def _read_samples(root: str, m: Manifest, check_unique: bool, rep: VerifyReport) -> None:
    """Read every sample through the format's reader and decode it. With ``check_unique`` a
    sample that reads another sample's record counts as bad: a damaged pointer in a file with one
    index over all samples can lead to another sample's intact record."""
    from packer.datasets import open_dataset

    try:
        ds = open_dataset(root, output="numpy")
        ds._ensure_open()  # a file that fails the checks at open is one problem, not one per sample
        ds.audit = True  # no shortcut around a stored structure (HDF5: keys from /keys, not the table)
    except (CorruptDataError, OSError, ValueError) as e:
        rep.problems.append(f"{root}: cannot open: {e}")
        return
    try:  # the sample table the readers take labels and keys from: this dataset's own, every section intact
        table = ds.sample_table()
        if table is not None:
            table.check_all()
    except (CorruptDataError, OSError, ValueError) as e:
        rep.problems.append(str(e))
    seen: dict[tuple[str, int, int], int] = {}
    with ds:
        for i in range(len(ds)):
            try:
                rec = ds.read_record(i)
                ds.decode(rec, i)
                if m.fields:
                    _check_fields(ds, m, rec, i)
            except (CorruptDataError, OSError, ValueError) as e:
                rep.problems.append(f"sample {i}: {e}")
                rep._sample(i)
                continue
            if check_unique:
                ident = (rec.key, rec.label, crc32c.crc32c(rec.payload))
                if ident in seen:
                    rep.problems.append(f"sample {i}: reads the same record as sample {seen[ident]} ({rec.key!r}); "
                                        f"the file's index is damaged ({os.path.join(root, m.files[0].name)})")
                    rep._sample(i)
                    continue
                seen[ident] = i
            rep.samples_ok += 1
    rep.bad_samples.sort()


# -- fields (version 3) ---------------------------------------------------------------------------
def _check_fields(ds: Any, m: Manifest, rec: Record, i: int) -> None:
    """Sample ``i``'s record ``rec`` (read through ``ds``, its fields' checksums checked there)
    has the manifest's fields, each at the image's size and decodable, and boxes inside the image;
    CorruptDataError naming the field otherwise."""
    holder = next((f.name for f in m.files if f.samples and f.first <= i < f.first + f.samples), "")
    where = {"path": os.path.join(ds.root, holder), "sample": i}
    names = [f.name for f in rec.fields]
    if names != m.stored_fields:
        raise CorruptDataError(f"has the fields {names}, the manifest lists {m.stored_fields}", **where)
    declared = {e["name"]: e.get("dtype") for e in m.fields}
    for f in rec.fields:
        KINDS[str(m.field_kind(f.name))].verify(f, (rec.height, rec.width), where)
        dtype = declared.get(f.name)
        if dtype is not None and f.depth > 8 * np.dtype(dtype).itemsize:
            raise CorruptDataError(f"field {f.name!r} is stored with {f.depth} bits per value, wider than the "
                                   f"manifest's {dtype}", **where)
    spec = next((f for f in m.fields if KINDS[f["kind"]] is BOXES), None)
    if spec is not None:
        _check_boxes(ds.sample_table(), rec, bool(spec.get("labels")), i)


def _check_boxes(table: SampleTable | None, rec: Record, labelled: bool, i: int) -> None:
    """Sample ``i``'s boxes in the sample table ``table``: inside the stored image, ordered, with
    labels exactly when the manifest says so, and equal to those the sample itself carries."""
    if table is None or not table.has_boxes:
        raise CorruptDataError("the manifest lists boxes, but the dataset has no sample table boxes section", sample=i)
    boxes, labels = table.boxes_of(i)
    w, h = rec.width * (1 + 1e-6), rec.height * (1 + 1e-6)
    x0, y0, x1, y1 = boxes.T.astype(np.float64)
    bad = ~np.isfinite(boxes).all(axis=1) | (x0 < 0) | (y0 < 0) | (x0 > x1) | (y0 > y1) | (x1 > w) | (y1 > h)
    where = {"path": table.path, "sample": i}
    if bad.any():
        k = int(np.argmax(bad))
        raise CorruptDataError(f"field 'boxes': box {k} {boxes[k].tolist()} is not an ordered box inside the "
                               f"stored {rec.width}x{rec.height} image", **where)
    if bool((labels >= 0).all() if labelled else (labels == -1).all()) is False:
        raise CorruptDataError(f"field 'boxes': labels {labels.tolist()} where the manifest says the boxes "
                               f"{'have' if labelled else 'have no'} labels", **where)
    if rec.boxes is not None:  # the sample's own copy (for other tools; HDF5's /boxes under audit)
        own = np.asarray(rec.boxes, np.float64).reshape(-1, 4)
        own_labels = rec.box_labels
        if own.shape != boxes.shape or not np.allclose(own, boxes, rtol=1e-5, atol=1e-3) or (
                labelled and own_labels is not None and list(own_labels) != labels.tolist()):
            raise CorruptDataError(f"field 'boxes': the sample holds {len(own)} boxes {own.tolist()[:4]}, the "
                                   f"sample table {len(boxes)} {boxes.tolist()[:4]}", **where)


# -- locating damage in a file whose checksum failed ------------------------------------------------
def _locate(root: str, m: Manifest, f: FileEntry, intact: set[str], rep: VerifyReport) -> None:
    locate = get_format(m.format).locate_damage
    if locate is not None:
        locate(root, m, f, intact, functools.partial(_report, rep))


def _report(rep: VerifyReport, path: str, sample: int | None, offset: int, what: str) -> None:
    if sample is None:
        rep.problems.append(f"{path}: {what} at offset {offset} (no sample's data: structural)")
    else:
        rep.problems.append(f"{path}: sample {sample}: {what} at offset {offset}")
        rep._sample(sample)
