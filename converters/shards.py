"""What the sharded writers (tar, tfrecord) share: shard limits and one shard file being written.

A shard is written under a hidden temporary name and renamed to its final name only once it is
complete and fsynced, so a crash never leaves a truncated file that looks finished (the engine also
builds the whole dataset in a temporary folder; this is the second line of defence). The SHA-256
for the manifest is computed while writing, so no file is read back.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from packer.errors import ResumeError
from packer.filesystem import fsync_dir
from packer.manifest import FileEntry, file_sha256

from .base import WriterOptions

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "SHARD_NAME",
    "ShardLimits",
    "ShardFile",
    "shard_name",
    "write_small_file",
    "shard_state",
    "keep_shards",
]

#: Byte limit per shard when neither ``shard_bytes`` nor ``shard_samples`` is given: 256 MB
#: (SI, the same as ``--shard-size 256MB``). Large enough for efficient sequential reads, small
#: enough that a few hundred shards spread evenly over ranks and workers.
DEFAULT_SHARD_BYTES = 256 * 1000**2

#: Shard file names: ``NAME-000000.EXT``, numbered from 0 in sample order.
SHARD_NAME = "shard"


def shard_name(number: int, suffix: str, name: str = SHARD_NAME) -> str:
    """``shard-000012.tar`` for ``(12, ".tar")``."""
    return f"{name}-{number:06d}{suffix}"


@dataclass(frozen=True)
class ShardLimits:
    """When a shard is full. ``max_bytes`` bounds the final file size; a single sample larger than
    the limit still gets a shard of its own (never an error, never an empty shard)."""

    max_bytes: int | None = DEFAULT_SHARD_BYTES
    max_samples: int | None = None

    @classmethod
    def from_options(cls, options: WriterOptions) -> ShardLimits:
        """Limits from writer options; ``DEFAULT_SHARD_BYTES`` when neither limit is set."""
        if options.shard_bytes is None and options.shard_samples is None:
            return cls(DEFAULT_SHARD_BYTES, None)
        if options.shard_bytes is not None and options.shard_bytes < 1:
            raise ValueError(f"shard_bytes must be at least 1, not {options.shard_bytes}")
        if options.shard_samples is not None and options.shard_samples < 1:
            raise ValueError(f"shard_samples must be at least 1, not {options.shard_samples}")
        return cls(options.shard_bytes, options.shard_samples)

    def full(self, samples: int, size_after: int) -> bool:
        """True when a shard holding ``samples`` samples may not take the next one, which would
        make the finished file ``size_after`` bytes long."""
        if samples == 0:
            return False
        if self.max_samples is not None and samples >= self.max_samples:
            return True
        return self.max_bytes is not None and size_after > self.max_bytes

    def to_json(self) -> dict[str, int | None]:
        """The manifest's record of the limits used."""
        return {"shard_bytes": self.max_bytes, "shard_samples": self.max_samples}


class ShardFile:
    """A file being written: buffered appends, byte count, running SHA-256, atomic publish."""

    def __init__(self, directory: str, name: str) -> None:
        self.name = name
        self.final = os.path.join(directory, name)
        self.temp = os.path.join(directory, f".{name}.partial")
        self.size = 0
        self._sha = hashlib.sha256()
        self._f = open(self.temp, "wb", buffering=1 << 20)  # closed by finish() or discard()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data``; return the offset it starts at."""
        offset = self.size
        self._f.write(data)
        self._sha.update(data)
        self.size += len(data)
        return offset

    def finish(self, samples: int, first: int, fid: str = "") -> FileEntry:
        """Flush, fsync, close and rename to the final name; return its manifest entry (with the
        file's identity ``fid``, packer.placement)."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self.temp, self.final)
        return FileEntry(self.name, samples, self.size, self._sha.hexdigest(), first, fid)

    def discard(self) -> None:
        """Close and delete the unfinished file."""
        self._f.close()
        try:
            os.remove(self.temp)
        except FileNotFoundError:
            pass


def write_small_file(directory: str, name: str, data: bytes, first: int) -> FileEntry:
    """Write a whole sidecar file (an index) atomically; its manifest entry holds 0 samples."""
    f = ShardFile(directory, name)
    try:
        f.write(data)
    except BaseException:
        f.discard()
        raise
    return f.finish(0, first)


def shard_state(directory: str, files: list[FileEntry]) -> dict[str, Any]:
    """A sharded writer's checkpoint: the finished files (each already fsynced and renamed by
    :meth:`ShardFile.finish`), made durable by a directory fsync."""
    fsync_dir(directory)
    return {"samples": sum(f.samples for f in files), "files": [f.to_json() for f in files]}


def keep_shards(directory: str, state: dict[str, Any], name: str = SHARD_NAME) -> list[FileEntry]:
    """Resume a sharded writer: check every finished file of ``state`` against its size and the
    SHA-256 the journal recorded (ResumeError if one differs), delete every other shard or partial
    file (written after the checkpoint), and return the kept entries."""
    try:
        files = [FileEntry(**f) for f in state["files"]]
    except (KeyError, TypeError) as e:
        raise ResumeError(f"{directory}: the journal's shard list is malformed ({e})") from None
    for f in files:
        path = os.path.join(directory, f.name)
        try:
            size = os.path.getsize(path)
        except OSError:
            raise ResumeError(f"cannot resume: {path} is missing (run without --resume to start over)") from None
        if size != f.bytes or file_sha256(path) != f.sha256:
            raise ResumeError(f"cannot resume: {path} differs from the journal's size and SHA-256 "
                              f"(run without --resume to start over)")
    keep = {f.name for f in files}
    for entry in os.listdir(directory):
        if entry.startswith((f"{name}-", f".{name}-")) and entry not in keep:
            os.remove(os.path.join(directory, entry))
    fsync_dir(directory)
    return files
