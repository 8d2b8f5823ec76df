"""One module per format holding all of its on-disk knowledge: file names, structs, index
pack/unpack, member scans and damage locators. The writer (packer.converters), the reader
(packer.datasets), ``verify`` and the tests import these; readers never import writers.
docs/FORMATS.md is the user's reference for the same layouts."""

from __future__ import annotations

import os

__all__ = ["describe_directory", "explain_missing_manifest"]

_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr")


def _head(path: str, n: int = 1 << 16) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def describe_directory(directory: str) -> str | None:
    """What a directory without ``manifest.json`` holds, when it is not packer output whose
    conversion did not finish (None then): an image folder, an LMDB or HDF5 file of another
    tool, or shards of another tool; the text says what to do with it."""
    try:
        names = [n for n in os.listdir(directory) if not n.startswith(".")]
    except OSError:
        return None
    if any(n.endswith(".packer-journal.json") for n in os.listdir(directory)):
        return None
    files = {n for n in names if os.path.isfile(os.path.join(directory, n))}
    if "data.mdb" in files:
        head = _head(os.path.join(directory, "data.mdb"), 1 << 20)
        if b"PKS1" in head or b"PKS2" in head:
            return None
        return "an LMDB environment not written by packer (no packer records in data.mdb)"
    if "data.h5" in files:
        try:
            import h5py

            with h5py.File(os.path.join(directory, "data.h5"), "r") as f:
                if "packer_layout" in f.attrs:
                    return None
        except Exception:  # noqa: BLE001 - unreadable: not ours to describe further
            pass
        return "an HDF5 file not written by packer"
    tars = [n for n in files if n.endswith(".tar")]
    if tars:
        if any(_head(os.path.join(directory, n), 4) == b"PKTI" for n in files if n.endswith(".idx")):
            return None
        return (f"tar shards written by another tool ({len(tars)} .tar files): open them with "
                f"open_dataset(path, format='tar') or convert them with 'packer convert tar FMT {directory} DST'")
    records = [n for n in files if n.endswith(_TFRECORD_SUFFIXES)]
    if records:
        if b"packer/place" in _head(os.path.join(directory, records[0])):
            return None
        return (f"TFRecord files written by another tool ({len(records)} files): open them with "
                f"open_dataset(path, format='tfrecord') or convert them with 'packer convert tfrecord FMT "
                f"{directory} DST'")
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
