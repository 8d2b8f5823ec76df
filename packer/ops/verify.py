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

import functools
import os
import stat
import struct
import zlib
from dataclasses import dataclass, field

import crc32c

from ..errors import CorruptDataError
from ..manifest import FileEntry, Manifest, file_sha256, read_manifest
from ..registry import get_format

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
    spec = get_format(m.format)
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
            if spec.check_unique_records:  # a damaged pointer can lead to another sample's intact record
                ident = (rec.key, rec.label, crc32c.crc32c(rec.payload))
                if ident in seen:
                    rep.problems.append(f"sample {i}: reads the same record as sample {seen[ident]} ({rec.key!r}); "
                                        f"the file's index is damaged ({os.path.join(root, m.files[0].name)})")
                    rep._sample(i)
                    continue
                seen[ident] = i
            rep.samples_ok += 1
    rep.bad_samples.sort()
    return rep


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
