"""The conversion journal: what an interrupted conversion had made durable, so ``--resume`` can go on.

The engine (:mod:`packer.pipeline.engine`) writes ``.packer-journal.json`` into the hidden folder
``.NAME.packer-tmp`` at every checkpoint and deletes it before publishing. JSON only, no pickle.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from .filesystem import atomic_write_bytes, fsync_dir

__all__ = ["JOURNAL_NAME", "JOURNAL_VERSION", "Journal", "read_journal", "write_journal", "remove_journal",
           "digest"]

JOURNAL_NAME = ".packer-journal.json"
JOURNAL_VERSION = 1


def digest(value: Any) -> str:
    """SHA-256 of a JSON-able value in canonical form (sorted keys, no whitespace)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class Journal:
    """One checkpoint of a conversion, as JSON::

        {"version": 1, "fingerprint": {"source": SHA-256, "options": SHA-256},
         "phase": "writing" | "closed", "consumed": C, "written": S,
         "skipped": [{"pos": P, "path": ..., "reason": ...}], "writer": {...}, "manifest": {...} | null,
         "left_small": L}

    ``consumed`` counts items of the ordered source list whose result is durable (written or
    skipped), ``written`` the samples the writer holds, ``writer`` the writer's own state (its
    :meth:`~packer.converters.base.Writer.checkpoint`). ``phase`` is ``closed`` once every payload
    file is final; ``manifest`` then holds the manifest, so a run killed between the journal and
    the publish only has to write it and rename. ``left_small`` counts the ``written`` samples
    stored below the resize target (a resumed run reports the whole conversion's count; journals
    without it count 0).

    The fingerprint binds a journal to its source (every file's path, label, size and mtime, or a
    packed source's manifest) and to every option that changes the output; ``--resume`` refuses a
    journal whose fingerprint differs.
    """

    fingerprint: dict[str, str]
    phase: str = "writing"
    consumed: int = 0
    written: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    writer: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] | None = None
    version: int = JOURNAL_VERSION
    left_small: int = 0

    def dumps(self) -> bytes:
        """The journal's JSON bytes."""
        return (json.dumps(asdict(self), ensure_ascii=False) + "\n").encode("utf-8")  # key order kept: the manifest is rebuilt from it


def read_journal(directory: str) -> Journal | None:
    """The journal in ``directory``, or None when there is none or it cannot be used (unreadable,
    another version): a conversion without a usable journal starts over."""
    try:
        with open(os.path.join(directory, JOURNAL_NAME), "rb") as f:
            d = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("version") != JOURNAL_VERSION:
        return None
    try:
        j = Journal(
            fingerprint={str(k): str(v) for k, v in d["fingerprint"].items()},
            phase=str(d["phase"]),
            consumed=int(d["consumed"]),
            written=int(d["written"]),
            skipped=[dict(s) for s in d["skipped"]],
            writer=dict(d["writer"]),
            manifest=dict(d["manifest"]) if d.get("manifest") is not None else None,
            left_small=int(d.get("left_small", 0)),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if j.phase not in ("writing", "closed") or j.consumed < 0 or j.written < 0 or j.left_small < 0:
        return None
    return j


def write_journal(directory: str, journal: Journal) -> None:
    """Write the journal atomically and durably (temp file, fsync, rename, directory fsync).

    Call it at a checkpoint (a finished shard, an LMDB commit, an HDF5 block: the writer says
    when), *after* the writer has made everything it reports durable.
    """
    atomic_write_bytes(os.path.join(directory, JOURNAL_NAME), journal.dumps())


def remove_journal(directory: str) -> None:
    """Delete the journal and make the deletion durable; done before the folder is published, so
    a finished dataset never holds a journal."""
    try:
        os.remove(os.path.join(directory, JOURNAL_NAME))
    except FileNotFoundError:
        return
    fsync_dir(directory)
