"""``packer verify``: every payload file against the manifest's size and SHA-256, then every sample
read through its format's reader (record checksums) and decoded."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import CorruptDataError
from .manifest import file_sha256, read_manifest

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

    @property
    def ok(self) -> bool:
        """True when every file and every sample is intact."""
        return not self.problems


def verify_dataset(path: str | os.PathLike[str], decode: bool = True) -> VerifyReport:
    """Check a packed dataset; never raises for corrupt data, it reports it."""
    from packer.datasets import open_dataset

    root = os.fspath(path)
    m = read_manifest(root)
    rep = VerifyReport(files=len(m.files), samples=m.num_samples)
    for f in m.files:
        fp = os.path.join(root, f.name)
        if not os.path.exists(fp):
            rep.problems.append(f"{fp}: missing payload file")
            continue
        size = os.path.getsize(fp)
        if size != f.bytes:
            rep.problems.append(f"{fp}: {size} bytes, manifest says {f.bytes} (truncated or appended)")
            continue
        if file_sha256(fp) != f.sha256:
            rep.problems.append(f"{fp}: SHA-256 differs from the manifest (file modified or corrupt)")
            continue
        rep.files_ok += 1
    if not decode:
        rep.samples_ok = rep.samples if rep.ok else 0
        return rep
    try:
        ds = open_dataset(root, output="numpy")
    except (CorruptDataError, OSError) as e:
        rep.problems.append(f"{root}: cannot open: {e}")
        return rep
    with ds:
        for i in range(len(ds)):
            try:
                ds.load(i)
            except (CorruptDataError, OSError) as e:
                rep.problems.append(f"sample {i}: {e}")
                rep.bad_samples.append(i)
            else:
                rep.samples_ok += 1
    return rep
