"""``packer verify``: every payload file against the manifest's size and SHA-256, then every sample
read through its format's reader (record, key and index checksums) and decoded.

A damaged byte anywhere in a payload file fails its SHA-256, so ``verify`` never passes a changed
dataset. It also says which *sample* the damage is in wherever the format allows:

- every format: the reader's per-sample checks (payload CRC32C, LMDB record CRC over header, key
  and payload, HDF5 key CRC, TFRecord length and data CRCs) name the sample they fail on;
- tar: a shard whose SHA-256 fails is compared, sample by sample, with the bytes its (intact) index
  implies (member headers, ``.cls``, ``.json``, padding), and a damaged index with the index its
  (intact) shard implies; a byte in the end-of-archive blocks or the index header belongs to no
  sample and only the file is named;
- TFRecord: a damaged ``.idx`` is compared with the one its records imply (each line is a sample),
  a ``.zidx`` is checked record by record; the gzip header and trailer belong to no sample;
- LMDB and HDF5: bytes of a sample's record or payload are named by sample; bytes in their own
  structures (B-tree and meta pages, free space, HDF5 object headers, B-trees, heaps, the whole-
  array CRCs of ``/labels``, ``/shapes``, ``/offsets``) are reported by file, and, where the reader
  can tell, by dataset. docs/reliability.md lists what was measured.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import struct
import zlib
from dataclasses import dataclass, field

import crc32c
import numpy as np

from .errors import CorruptDataError
from .manifest import FileEntry, Manifest, file_sha256, read_manifest
from .placement import place_seed

__all__ = ["VerifyReport", "verify_dataset"]


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
    from packer.datasets import open_dataset

    root = os.fspath(path)
    m = read_manifest(root)
    rep = VerifyReport(files=len(m.files), samples=m.num_samples)
    intact: set[str] = set()
    for f in m.files:
        fp = os.path.join(root, f.name)
        try:
            st = os.lstat(fp)
        except FileNotFoundError:
            rep.problems.append(f"{fp}: missing payload file")
            rep.bad_files.append(f.name)
            continue
        size = st.st_size
        if not stat.S_ISREG(st.st_mode):
            rep.problems.append(f"{fp}: not a regular file (a symlink, FIFO, device or folder); not read")
            rep.bad_files.append(f.name)
        elif size != f.bytes:
            rep.problems.append(f"{fp}: {size} bytes, manifest says {f.bytes} (truncated or appended)")
            rep.bad_files.append(f.name)
        elif file_sha256(fp) != f.sha256:
            rep.problems.append(f"{fp}: SHA-256 differs from the manifest (file modified or corrupt)")
            rep.bad_files.append(f.name)
        else:
            rep.files_ok += 1
            intact.add(f.name)
    for f in m.files:
        if f.name not in intact and os.path.isfile(os.path.join(root, f.name)) and not os.path.islink(
                os.path.join(root, f.name)):
            try:
                _locate(root, m, f, intact, rep)
            except (OSError, ValueError, struct.error, zlib.error, EOFError) as e:
                rep.problems.append(f"{os.path.join(root, f.name)}: cannot locate the damage ({e})")
    if not decode:
        rep.samples_ok = rep.samples if rep.ok else 0
        return rep
    try:
        ds = open_dataset(root, output="numpy")
    except (CorruptDataError, OSError, ValueError) as e:
        rep.problems.append(f"{root}: cannot open: {e}")
        return rep
    seen: dict[tuple[str, int, int], int] = {}
    with ds:
        for i in range(len(ds)):
            try:
                rec = ds.read_record(i)
                ds.decode(rec, i)
            except (CorruptDataError, OSError, ValueError) as e:
                rep.problems.append(f"sample {i}: {e}")
                rep._sample(i)
                continue
            if m.format == "lmdb":  # a damaged B-tree pointer can lead to another sample's intact record
                ident = (rec.key, rec.label, crc32c.crc32c(rec.payload))
                if ident in seen:
                    rep.problems.append(f"sample {i}: reads the same record as sample {seen[ident]} ({rec.key!r}); "
                                        f"the LMDB B-tree is damaged ({os.path.join(root, 'data.mdb')})")
                    rep._sample(i)
                    continue
                seen[ident] = i
            rep.samples_ok += 1
    rep.bad_samples.sort()
    return rep


# -- locating damage in a file whose checksum failed ------------------------------------------------
def _locate(root: str, m: Manifest, f: FileEntry, intact: set[str], rep: VerifyReport) -> None:
    if m.format == "tar":
        _locate_tar(root, m, f, intact, rep)
    elif m.format == "tfrecord":
        _locate_tfrecord(root, m, f, intact, rep)


def _report(rep: VerifyReport, path: str, sample: int | None, offset: int, what: str) -> None:
    if sample is None:
        rep.problems.append(f"{path}: {what} at offset {offset} (no sample's data: structural)")
    else:
        rep.problems.append(f"{path}: sample {sample}: {what} at offset {offset}")
        rep._sample(sample)


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _diff(a: bytes, b: bytes) -> np.ndarray:
    """Offsets where ``a`` and ``b`` differ (a length difference counts from the shorter end)."""
    n = min(len(a), len(b))
    d = np.flatnonzero(np.frombuffer(a, np.uint8, n) != np.frombuffer(b, np.uint8, n))
    if len(a) != len(b):
        d = np.append(d, n)
    return d


def _locate_tar(root: str, m: Manifest, f: FileEntry, intact: set[str], rep: VerifyReport) -> None:
    from packer.converters.tar import (
        INDEX_ENTRY,
        INDEX_HEADER,
        INDEX_SUFFIX,
        TAR_SUFFIX,
        end_of_archive,
        pack_index,
        sample_members,
        unpack_index,
    )
    from packer.imageproc import CODECS
    from packer.record import CODEC_IDS

    names = {v: k for k, v in CODEC_IDS.items()}
    path = os.path.join(root, f.name)
    if f.name.endswith(TAR_SUFFIX):
        idx_name = f.name[: -len(TAR_SUFFIX)] + INDEX_SUFFIX
        if idx_name not in intact:
            return  # nothing intact to compare with; the SHA-256 problem names the file
        first, entries, keys = unpack_index(_read(os.path.join(root, idx_name)), idx_name)
        data = _read(path)
        pos, key_start = 0, 0
        for j, e in enumerate(entries):
            off, size = int(e["offset"]), int(e["size"])
            payload = data[off : off + size]
            key = keys[key_start : int(e["key_end"])].decode("utf-8")
            key_start = int(e["key_end"])
            want = sample_members(first + j, key, int(e["label"]), names[int(e["codec"])], int(e["height"]),
                                  int(e["width"]), payload)
            got = data[pos : pos + len(want)]
            bad = _diff(got, want)
            if len(bad):
                _report(rep, path, first + j, pos + int(bad[0]), "bytes differ from what the index implies")
            elif crc32c.crc32c(payload, place_seed(f.id, j)) != int(e["crc"]):
                _report(rep, path, first + j, off, "image data checksum mismatch")
            pos += len(want)
        bad = _diff(data[pos:], end_of_archive(pos))
        if len(bad):
            _report(rep, path, None, pos + int(bad[0]), "end-of-archive blocks damaged")
        return
    if not f.name.endswith(INDEX_SUFFIX):
        return
    tar_name = f.name[: -len(INDEX_SUFFIX)] + TAR_SUFFIX
    if tar_name not in intact:
        return
    rows, blob = [], []
    key_end = 0
    fid = next((e.id for e in m.files if e.name == tar_name), "")
    for j, (_stem, members) in enumerate(_tar_samples(os.path.join(root, tar_name))):
        meta = json.loads(members["json"][1])
        ext = next(x for x in members if x not in ("cls", "json"))
        off, payload = members[ext]
        k = str(meta["key"]).encode("utf-8")
        key_end += len(k)
        blob.append(k)
        codec = {v: k for k, v in CODECS.items()}.get(ext, ext)
        rows.append((off, len(payload), int(meta["label"]), int(meta["height"]), int(meta["width"]),
                     crc32c.crc32c(payload, place_seed(fid, j)), key_end, CODEC_IDS[codec], 3, b""))
    want = pack_index(f.first, np.array(rows, dtype=INDEX_ENTRY), b"".join(blob), version=2 if m.version >= 2 else 1)
    got = _read(path)
    n = len(rows)
    ends = np.array([r[6] for r in rows], np.int64)
    reported: set[int | None] = set()
    for b in _diff(got, want):
        b = int(b)
        if b < INDEX_HEADER.size:
            sample = None
        elif b < INDEX_HEADER.size + n * INDEX_ENTRY.itemsize:
            sample = f.first + (b - INDEX_HEADER.size) // INDEX_ENTRY.itemsize
        else:
            k = b - INDEX_HEADER.size - n * INDEX_ENTRY.itemsize
            sample = f.first + int(np.searchsorted(ends, k, side="right")) if k < key_end else None
        if sample not in reported:
            reported.add(sample)
            _report(rep, path, sample, b, "index bytes differ from what the shard implies")


def _tar_samples(path: str):  # noqa: ANN202 - iterator of (stem, {ext: (data offset, bytes)})
    import tarfile

    with open(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tf:
        stem, members = None, {}
        for ti in tf:
            s, _, ext = ti.name.partition(".")
            if s != stem and stem is not None:
                yield stem, members
                members = {}
            stem = s
            fh2 = tf.extractfile(ti)
            members[ext] = (ti.offset_data, fh2.read() if fh2 is not None else b"")
        if stem is not None:
            yield stem, members


def _locate_tfrecord(root: str, m: Manifest, f: FileEntry, intact: set[str], rep: VerifyReport) -> None:
    from packer.converters.tfrecord import GZIP_SUFFIX, INDEX_SUFFIX, TFRECORD_SUFFIX, ZINDEX_SUFFIX

    path = os.path.join(root, f.name)
    stem = f.name.rsplit(".", 1)[0]
    gz = m.layout.get("gzip", False)
    data_name = stem + (GZIP_SUFFIX if gz else TFRECORD_SUFFIX)
    if f.name.endswith(INDEX_SUFFIX) and data_name in intact:
        raw = _read(os.path.join(root, data_name))
        if gz:
            raw = gzip.decompress(raw)
        lines, pos = [], 0
        while pos < len(raw):
            (length,) = struct.unpack_from("<Q", raw, pos)
            lines.append(b"%d %d\n" % (pos, length + 16))
            pos += length + 16
        want = b"".join(lines)
        got = _read(path)
        starts = np.cumsum([0] + [len(x) for x in lines])
        reported: set[int | None] = set()
        for b in _diff(got, want):
            line = int(np.searchsorted(starts, int(b), side="right")) - 1
            sample = f.first + line if 0 <= line < len(lines) else None
            if sample not in reported:
                reported.add(sample)
                _report(rep, path, sample, int(b), "index line differs from what the records imply")
    elif f.name.endswith(ZINDEX_SUFFIX) and data_name in intact:
        got = _read(path)
        n = (len(got) - 20) // 8 - 1
        if n < 0 or got[:4] != b"PKGZ":
            _report(rep, path, None, 0, "gzip index header damaged")
            return
        offsets = struct.unpack_from(f"<{n + 1}Q", got, 16)
        if struct.unpack_from("<Q", got, 8)[0] != n:
            _report(rep, path, None, 8, "gzip index header damaged")
        comp = _read(os.path.join(root, data_name))
        for i in range(n):
            try:
                rec = zlib.decompressobj(-zlib.MAX_WBITS).decompress(comp[offsets[i] : offsets[i + 1]])
                (length,) = struct.unpack_from("<Q", rec, 0)
                good = len(rec) == length + 16
            except (zlib.error, struct.error):
                good = False
            if not good:
                _report(rep, path, f.first + i, 16 + 8 * i, "gzip index offset does not start a record")
    elif f.name == data_name and gz:
        got = _read(path)
        if got[:10] != b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff":
            _report(rep, path, None, int(_diff(got[:10], b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")[0]),
                    "gzip header damaged")
        try:
            stream = gzip.decompress(got)
        except (OSError, EOFError, zlib.error):
            rep.problems.append(f"{path}: the gzip stream does not decompress as a whole "
                                f"(damaged record data or trailer)")
            return
        del stream
