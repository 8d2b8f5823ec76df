"""What the sharded writers (tar, tfrecord) share: shard limits and one shard file being written.

A shard is written under a hidden temporary name and renamed to its final name only once it is
complete and fsynced, so a crash never leaves a truncated file that looks finished (the engine also
builds the whole dataset in a temporary folder; this is the second line of defence). The SHA-256
for the manifest is computed while writing, so no file is read back.
"""

from __future__ import annotations

import abc
import hashlib
import os
from dataclasses import dataclass
from typing import Any, ClassVar

from packer.description.manifest import FileEntry, file_sha256
from packer.description.placement import file_id
from packer.errors import ResumeError
from packer.files.filesystem import fsync_dir

from .base import Writer, WriterOptions

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "SHARD_NAME",
    "ShardLimits",
    "ShardFile",
    "ShardedWriter",
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
        try:
            self._f.write(data)
        except OSError as e:
            raise _named(e, self.temp) from None
        self._sha.update(data)
        self.size += len(data)
        return offset

    def finish(self, samples: int, first: int, fid: str = "") -> FileEntry:
        """Flush, fsync, close and rename to the final name; return its manifest entry (with the
        file's identity ``fid``, packer.description.placement)."""
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as e:
            raise _named(e, self.temp) from None
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


def _named(e: OSError, path: str) -> OSError:
    """``e`` naming the file it happened to (a buffered write's ENOSPC names none)."""
    if e.filename is not None:
        return e
    return type(e)(e.errno, e.strerror, path) if e.errno is not None else e


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


class ShardedWriter(Writer):
    """The shard loop the sharded formats share: a new shard when the open one is full, a
    checkpoint at every finished shard, resume from the finished shards, abort of the open one.

    A format subclass sets ``suffix`` (its data files' extension) and implements ``add`` (which
    gets its shard from :meth:`shard_for`), :meth:`seal` (a shard's trailer),
    :meth:`write_indexes` (the files written beside a finished shard) and :meth:`layout`.
    """

    resumable = True
    #: The data files' extension, e.g. ``".tar"``: shards are ``PREFIX-NNNNNN<suffix>`` (``shard`` by default).
    suffix: ClassVar[str] = ""

    def __init__(self, directory: str, options: WriterOptions) -> None:
        super().__init__(directory, options)
        self.limits = ShardLimits.from_options(options)
        self.files: list[FileEntry] = []  # finished shards and index files, in order
        self.shard: ShardFile | None = None  # the open shard
        self.number = 0  # of the open (or next) shard
        self.first = 0  # sample index of the open shard's first sample
        self.count = 0  # samples in the open shard
        self.fid = ""  # the open shard's identity (packer.description.placement)
        self.prefix = options.prefix or SHARD_NAME
        self._due = False

    def shard_for(self, index: int, key: str, payload: bytes, size_after: int) -> ShardFile:
        """The shard sample ``index`` goes into, counted in it: the open one, or a new one when
        the open one is full (``size_after``: the open shard's final size with this sample in it).
        A new shard's identity comes from its number, ``key`` and ``payload``."""
        if self.shard is not None and self.limits.full(self.count, size_after):
            self._finish_shard()
        if self.shard is None:
            self.shard = ShardFile(self.directory, shard_name(self.number, self.suffix, self.prefix))
            self.first = index
            self.fid = file_id(self.number, key, payload)
            self.opened(self.shard)
        self.count += 1
        return self.shard

    def opened(self, shard: ShardFile) -> None:  # noqa: B027 - optional hook
        """Called when a shard is created, before its first sample (e.g. to write a header)."""

    @abc.abstractmethod
    def seal(self, shard: ShardFile) -> None:
        """Write what ends a full shard (its trailer) before it is finished."""

    @abc.abstractmethod
    def write_indexes(self, stem: str) -> list[FileEntry]:
        """Write the files that go beside the shard just finished (``stem`` + their suffix, with
        :func:`write_small_file`), reset the per-shard state, return their entries."""

    @abc.abstractmethod
    def layout(self) -> dict[str, Any]:
        """The manifest's ``layout`` facts, the shard limits (``limits.to_json()``) among them."""

    def _finish_shard(self) -> None:
        shard: ShardFile = self.shard  # type: ignore[assignment]  # called with a shard open
        self.seal(shard)
        self.files.append(shard.finish(self.count, self.first, self.fid))
        self.shard = None
        self.files.extend(self.write_indexes(shard_name(self.number, "", self.prefix)))
        self.number += 1
        self.count = 0
        self._due = True

    def checkpoint_due(self) -> bool:
        """True right after a shard and its index files were finished."""
        return self._due

    def checkpoint(self) -> dict[str, Any]:
        """The finished shards and index files (already fsynced and renamed); the open shard is
        not part of the checkpoint."""
        self._due = False
        return shard_state(self.directory, self.files)

    def resume(self, state: dict[str, Any]) -> None:
        """Keep the checkpoint's files (size and SHA-256 checked), delete the rest; the next
        ``add`` starts the next shard number."""
        self.files = keep_shards(self.directory, state, self.prefix)
        self.number = sum(1 for f in self.files if f.name.endswith(self.suffix))

    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Finish the last shard; return shards and index files (index entries hold 0 samples)."""
        if self.shard is not None:
            self._finish_shard()
        return self.files, self.layout()

    def abort(self) -> None:
        """Delete the unfinished shard."""
        if self.shard is not None:
            self.shard.discard()
            self.shard = None
