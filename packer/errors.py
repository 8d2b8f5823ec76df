"""The exceptions packer raises.

Each refines the builtin it most resembles, so existing ``except FileNotFoundError`` or
``except ValueError`` code keeps working, and each message names the file, and where it applies
the sample and byte offset, so a failure deep in a DataLoader worker still says where it happened.
"""

from __future__ import annotations

import re

__all__ = [
    "PackerError",
    "SourceError",
    "UnfinishedDatasetError",
    "ManifestError",
    "CorruptDataError",
    "ImageError",
    "DiskFullError",
    "ResumeError",
    "DestinationBusyError",
    "DatasetChangedError",
    "WorkerError",
]


class PackerError(Exception):
    """Base class of every error packer raises on purpose."""


class _PathError(PackerError):
    """An error about one file or folder, named by ``path``; pickles with it (DataLoader workers)."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), self.args, {"path": self.path})


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
        if path is None and sample is None and offset is None:
            path, sample, offset = _fields_from_text(message)  # rebuilt from a DataLoader worker's text
            super().__init__(message)
            self.path, self.sample, self.offset = path, sample, offset
            return
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

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), self.args, {"path": self.path, "sample": self.sample, "offset": self.offset})


class DiskFullError(_PathError, OSError):
    """The file system ran out of space (or hit a file size limit) while a conversion was writing.

    The partial output has been removed and the destination left as it was; ``path`` names the
    file being written when the space ran out, where known.
    """


class ResumeError(PackerError, ValueError):
    """``--resume`` cannot continue: the source or the options changed since the interrupted run,
    or the partial output does not match its journal. Run again without ``--resume`` to start over."""


class DestinationBusyError(_PathError, RuntimeError):
    """Another conversion is writing the same destination (its pid and host are in the message).

    A conversion owns its destination until it has published; the claim ends with the process that
    holds it, so one left by a killed run never blocks a new run or ``--resume``.
    """


class DatasetChangedError(_PathError, RuntimeError):
    """The dataset directory a reader was opened on now holds another dataset (it was replaced, e.g.
    by a conversion with ``--overwrite``, or deleted). A reader only ever reads the dataset it
    opened: open the new one with a new reader."""


class WorkerError(PackerError):
    """An exception raised in a worker process (a conversion's, or ``packer.pack``'s ``fn``) whose
    type could not be rebuilt in the caller: its constructor takes other arguments, or its class
    is not loaded here. The message keeps the original's type name, its message and the input's
    position; ``type_name`` is the original type (``module.Name``) and ``worker_traceback`` the
    worker's traceback text (also shown as this error's cause)."""

    def __init__(self, message: str, *, type_name: str | None = None, worker_traceback: str | None = None) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.worker_traceback = worker_traceback

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), self.args, {"type_name": self.type_name,
                                                  "worker_traceback": self.worker_traceback})


_WHERE = re.compile(r"CorruptDataError: .*\((?:file (?P<path>.+?))?(?:, )?(?:sample (?P<sample>[^,()]+?))?"
                    r"(?:, )?(?:offset (?P<offset>\d+))?\)\s*$", re.M)


def _fields_from_text(message: str) -> tuple[str | None, int | str | None, int | None]:
    """(path, sample, offset) from the text of a CorruptDataError raised elsewhere: DataLoader
    re-raises a worker's exception by calling its class with the formatted traceback alone."""
    matches = list(_WHERE.finditer(message))
    if not matches:
        return None, None, None
    m = matches[-1]  # the innermost error, last in a traceback
    sample: int | str | None = m["sample"]
    if sample is not None and sample.lstrip("-").isdigit():
        sample = int(sample)
    return m["path"], sample, int(m["offset"]) if m["offset"] else None


def _rebuild(cls: type, args: tuple[object, ...], fields: dict[str, object]) -> BaseException:
    """Unpickle an error with its keyword-only fields (they cross DataLoader workers intact)."""
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(fields)
    return err
