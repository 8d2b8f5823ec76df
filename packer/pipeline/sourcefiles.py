"""One source image file read and processed, shared by both conversion pipelines: its stamp (size
and modification time) that a resumed or distributed conversion checks, and any decoder failure
as a skip with its reason."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ..errors import ImageError, SourceError
from ..files.fileio import NotReadableError, read_source_file
from ..images.imageproc import ProcessedImage, ProcessOptions, process_image

__all__ = ["Result", "Stamp", "NO_STAMP", "file_stamp", "describe_stamp", "stamp_mismatch", "process_file",
           "process_data"]

Result = tuple[ProcessedImage | None, str | None]  # (image, None) or (None, reason)


#: What a conversion knows of a source file before reading it: ``(size, mtime_ns)``, or
#: :data:`NO_STAMP` when it could not be looked up (a missing or unreadable file).
Stamp = tuple[int, int]
NO_STAMP: Stamp = (-1, -1)


def file_stamp(path: str) -> Stamp:
    """The size and modification time (ns) of the file at ``path``, or :data:`NO_STAMP`."""
    try:
        st = os.stat(path)
    except OSError:
        return NO_STAMP
    return st.st_size, st.st_mtime_ns


def describe_stamp(stamp: Stamp) -> str:
    """A stamp for the user: ``1,234 bytes, modified 2026-12-01 15:51:03.123456789 UTC``."""
    if tuple(stamp) == NO_STAMP:
        return "missing or unreadable"
    size, ns = stamp
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns // 10**9))
    return f"{size:,} bytes, modified {when}.{ns % 10**9:09d} UTC"


def stamp_mismatch(path: str, found: Stamp, expected: Stamp) -> SourceError:
    """The error for a source file that is not the one the conversion was planned with."""
    return SourceError(f"{path} is not the file this conversion was planned with: it is {describe_stamp(found)}, "
                       f"it was {describe_stamp(expected)} when listed (it changed, or this process sees "
                       f"another copy of the source)")


def process_file(path: str, opts: ProcessOptions, stamp: Stamp | None = None,
                  process: Callable[[bytes, ProcessOptions], Result] | None = None) -> Result:
    """One image file processed (by ``process``, default :func:`process_data`). With ``stamp``, the
    bytes read must come from a file of that size and modification time, else SourceError (never a
    skip: the file is not the planned one)."""
    try:
        data, seen = read_source_file(path, opts.max_source_bytes)
    except OSError as e:
        return None, f"cannot read: {e.strerror or e}"
    except NotReadableError as e:
        return None, str(e)
    if stamp is not None and (seen.st_size, seen.st_mtime_ns) != tuple(stamp):
        raise stamp_mismatch(path, (seen.st_size, seen.st_mtime_ns), stamp)
    return (process or process_data)(data, opts)


def process_data(data: bytes, opts: ProcessOptions) -> Result:
    """One image file's bytes processed, or (None, the reason) for a skip: any decoder failure."""
    try:
        return process_image(data, opts), None
    except ImageError as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - any decoder failure is a skip with the reason
        return None, f"{type(e).__name__}: {e}"
