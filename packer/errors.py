"""The exceptions packer raises.

Each refines the builtin it most resembles, so existing ``except FileNotFoundError`` or
``except ValueError`` code keeps working, and each message names the file, and where it applies
the sample and byte offset, so a failure deep in a DataLoader worker still says where it happened.
"""

from __future__ import annotations

__all__ = [
    "PackerError",
    "SourceError",
    "UnfinishedDatasetError",
    "ManifestError",
    "CorruptDataError",
    "ImageError",
    "DiskFullError",
    "ResumeError",
]


class PackerError(Exception):
    """Base class of every error packer raises on purpose."""


class SourceError(PackerError, ValueError):
    """The source to convert is missing, empty or not laid out as expected."""


class UnfinishedDatasetError(PackerError, FileNotFoundError):
    """A packed-dataset directory has no manifest: its conversion never finished."""


class ManifestError(PackerError, ValueError):
    """A manifest is unreadable, of an unknown version, or inconsistent with the files."""


class ImageError(PackerError, ValueError):
    """One image could not be decoded or processed (the converter skips it and reports why)."""


class CorruptDataError(PackerError, ValueError):
    """Packed data does not match what was written: bad checksum, truncated file, bad layout.

    ``path``, ``sample`` and ``offset`` are attributes as well as part of the message, so a
    training loop with ``on_error="skip"`` can count and log them.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        sample: int | str | None = None,
        offset: int | None = None,
    ) -> None:
        where = []
        if path is not None:
            where.append(f"file {path}")
        if sample is not None:
            where.append(f"sample {sample}")
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.path = path
        self.sample = sample
        self.offset = offset


class DiskFullError(PackerError, OSError):
    """The file system ran out of space (or hit a file size limit) while a conversion was writing.

    The partial output has been removed and the destination left as it was; ``path`` names the
    file being written when the space ran out, where known.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class ResumeError(PackerError, ValueError):
    """``--resume`` cannot continue: the source or the options changed since the interrupted run,
    or the partial output does not match its journal. Run again without ``--resume`` to start over."""
