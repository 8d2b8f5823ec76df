"""What every format writer implements. The conversion engine owns processes, order, skips, the
journal and the manifest; a writer only lays processed samples into files, in the order it is given
them, and says when what it has written is a safe point to resume from.

Resume protocol (used by ``--resume``, see :mod:`packer.files.journal`): after each ``add`` the engine
asks :meth:`Writer.checkpoint_due`; when true it calls :meth:`Writer.checkpoint`, which makes every
byte written so far durable (fsync) and returns a JSON-able state whose ``"samples"`` says how many
samples, from index 0, the durable files hold; the engine then writes the journal. A later run
creates a fresh writer in the same folder and calls :meth:`Writer.resume` with that state before
any ``add``: it keeps those samples, discards whatever was written after the checkpoint, and the
next ``add`` continues at index ``state["samples"]``. Checkpoints fall where the writer makes its
data durable anyway (a finished shard, an LMDB commit, an HDF5 block), so they do not change the
bytes written, and a resumed conversion produces the same files as an uninterrupted one.
"""

from __future__ import annotations

import abc
import os
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from packer.description.manifest import FileEntry
from packer.files.filesystem import free_bytes, no_room
from packer.images.imageproc import ProcessedImage

__all__ = ["WriterOptions", "Writer", "free_bytes", "no_room"]

_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


@dataclass(frozen=True)
class WriterOptions:
    """Format options. Shard limits apply to sharded formats (tar, tfrecord); None = no limit."""

    shard_bytes: int | None = None
    shard_samples: int | None = None
    gzip: bool = False
    #: LMDB and HDF5: samples per durable commit (an LMDB transaction, an HDF5 block), each a point
    #: ``--resume`` can continue from. None: the format's default (1024 LMDB, 8192 HDF5). It decides
    #: how the file is laid out, so it is part of the options that give identical output.
    checkpoint_samples: int | None = None
    #: Sharded formats: the shard names' prefix, ``PREFIX-000000.tar`` (None: ``shard``).
    prefix: str | None = None

    def __post_init__(self) -> None:
        if self.prefix is not None and not _PREFIX.fullmatch(self.prefix):
            raise ValueError(f"shard prefix {self.prefix!r} must be letters, digits, '_' and '-', starting with a "
                             f"letter or digit")


class Writer(abc.ABC):
    """Writes samples into ``directory`` (an empty temporary folder the engine publishes later).

    Protocol: ``add`` once per sample with consecutive indices from 0, then ``close`` returns the
    payload files and format-specific layout facts for the manifest; on failure ``abort`` is
    called instead and the engine removes the folder.
    """

    format: ClassVar[str]
    #: The writer stores samples' fields besides the image (masks, extra images; version 3).
    writes_fields: ClassVar[bool] = False

    def __init__(self, directory: str, options: WriterOptions) -> None:
        self.directory = directory
        self.options = options

    def path(self, name: str) -> str:
        """Absolute path of a file inside the output directory."""
        return os.path.join(self.directory, name)

    def begin(self, info: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Called once before the first ``add`` with the manifest facts known before writing
        (``format``, ``classes``, ``processing``, ``shuffle_seed``, ``source``, ``created_by``),
        for formats that also record them inside their payload files (HDF5 attributes)."""

    @abc.abstractmethod
    def add(self, index: int, key: str, label: int, image: ProcessedImage) -> None:
        """Append one sample. ``key`` is the source path relative to the source root."""

    @abc.abstractmethod
    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Flush and fsync everything; return (payload files, layout facts for the manifest)."""

    def abort(self) -> None:  # noqa: B027 - optional hook
        """Release resources after a failure when the engine keeps the folder for ``--resume``:
        nothing written before the last checkpoint may be touched here."""

    def discard(self) -> None:
        """Release resources after a failure when the engine is about to delete the folder (a full
        disk, a bad source): nothing needs to be kept consistent. Default: :meth:`abort`."""
        self.abort()

    # -- resume ------------------------------------------------------------------------------------
    #: True for writers that implement checkpoint() and resume().
    resumable: ClassVar[bool] = False

    def checkpoint_due(self) -> bool:
        """True when the last ``add`` reached a point where a checkpoint costs nothing extra."""
        return False

    def checkpoint(self) -> dict[str, Any]:
        """Make everything written so far durable; return the state to resume from (JSON-able,
        with ``"samples"``: how many samples from index 0 the durable files hold)."""
        raise NotImplementedError(f"the {self.format} writer cannot checkpoint")

    def resume(self, state: dict[str, Any]) -> None:
        """Continue after the checkpoint ``state`` (see the module docstring); raises
        packer.errors.ResumeError when the files on disk do not match it. The run that wrote
        ``state`` may have been killed at any later moment, ``close`` included."""
        raise NotImplementedError(f"the {self.format} writer cannot resume")

    def forget_checkpoints(self) -> None:  # noqa: B027 - optional hook
        """Called after ``close`` once the engine no longer needs the last checkpoint (the final
        journal is written): delete what only a resume needed. ``close`` must not."""
