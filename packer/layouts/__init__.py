"""One module per format holding all of its on-disk knowledge: file names, structs, index
pack/unpack, member scans and damage locators. The writer (packer.converters), the reader
(packer.datasets), ``verify`` and the tests import these; readers never import writers.
docs/FORMATS.md is the user's reference for the same layouts."""

from __future__ import annotations

import os
import zlib

__all__ = ["describe_directory", "explain_missing_manifest", "compressed_tar_note", "zlib_tfrecord",
           "ZLIB_ADVICE", "read_head"]

_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: Compressed tar files and the command that decompresses each (packer reads samples at their
#: offsets inside uncompressed tar files).
_COMPRESSED_TARS = {".tar.gz": "gunzip", ".tgz": "gunzip", ".tar.bz2": "bunzip2", ".tar.xz": "unxz",
                    ".tar.zst": "unzstd"}


#: What to do with a ZLIB-compressed TFRecord file of another tool.
ZLIB_ADVICE = ("packer reads other tools' TFRecord files uncompressed (GZIP only in packer's own datasets, "
               "which carry an index); decompress each file first (zlib.decompress of the whole file) or write "
               "them without compression")


def compressed_tar_note(names: list[str]) -> str | None:
    """What to say about compressed tar shards among ``names`` (None when there are none)."""
    found = sorted(n for n in names if n.lower().endswith(tuple(_COMPRESSED_TARS)))
    if not found:
        return None
    tool = next(t for suffix, t in _COMPRESSED_TARS.items() if found[0].lower().endswith(suffix))
    return (f"compressed tar shards ({len(found)} file(s) such as {found[0]}), which packer does not read: it reads "
            f"samples at their offsets in uncompressed .tar files; decompress them first ({tool} {found[0]})")


def zlib_tfrecord(head: bytes) -> bool:
    """Whether a TFRecord file whose first bytes are ``head`` is ZLIB-compressed: no valid record
    header (its length CRC fails) but a zlib stream (RFC 1950 header) that inflates."""
    from .tfrecord import HEAD, masked_crc32c

    if len(head) < 2:
        return False
    if len(head) >= HEAD.size and masked_crc32c(head[:8]) == HEAD.unpack_from(head)[1]:
        return False
    try:
        zlib.decompressobj().decompress(head, 16)
    except zlib.error:
        return False
    return True


def read_head(path: str, n: int = 1 << 16) -> bytes:
    """The first ``n`` bytes of ``path`` (empty when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def describe_directory(directory: str) -> str | None:
    """What a directory without ``manifest.json`` holds, when it is not packer output whose
    conversion did not finish (None then): an image folder, another tool's files of a format
    (each format's layout module says, through the registry's ``identify``), or nothing packed;
    the text says what to do with it."""
    from packer.description.registry import FORMATS

    try:
        names = [n for n in os.listdir(directory) if not n.startswith(".")]
    except OSError:
        return None
    if any(n.endswith(".packer-journal.json") for n in os.listdir(directory)):
        return None
    files = {n for n in names if os.path.isfile(os.path.join(directory, n))}
    for fmt in FORMATS.values():
        what = fmt.identify(directory, files) if fmt.identify is not None else None
        if what is not None:
            return what or None  # "": the format's own files, an unfinished conversion
    for n in names:
        sub = os.path.join(directory, n)
        if os.path.isdir(sub) and any(f.lower().endswith(_IMAGE_SUFFIXES) for f in os.listdir(sub)[:1000]):
            return (f"an image folder, not a packed dataset: convert it first with "
                    f"'packer convert imagefolder lmdb {directory} DST'")
    return "not a packed dataset (no manifest.json and no packed files)"


def explain_missing_manifest(error: Exception, directory: str) -> Exception:
    """``error`` (an UnfinishedDatasetError for ``directory``) with a message that says what the
    directory holds instead, when it is not unfinished packer output; else ``error`` itself."""
    from packer.errors import UnfinishedDatasetError

    what = describe_directory(directory)
    if what is None:
        return error
    return UnfinishedDatasetError(f"{directory} has no manifest.json: it is {what}")
