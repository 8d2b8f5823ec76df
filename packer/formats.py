"""The format registry: one typed record per format, the only place that lists formats.

It sits above the parts it lists (layouts, writers, readers) and below what uses them (the
readers' front door, the operations). Each record names the format's layout module, its writer
and reader (imported on first use, so ``import packer`` stays light and a format whose optional
dependency is missing fails only when used; the imports are written out, so go-to-definition
works), the writer options it accepts, and its hooks for ``verify``. The CLI, ``verify``, the
engine and the tests ask the registry; nothing else compares format names. Below it, the manifest
is given the format names by its reader here (:func:`read_manifest`) instead of asking for them.
Adding a format: a layout module in packer/layouts, a writer in converters/, a reader in
datasets/, and one record here (docs/FORMATS.md, "Adding a format").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packer.description.manifest import FileEntry, Manifest
from packer.description.manifest import read_manifest as _read_manifest
from packer.errors import UnfinishedDatasetError

if TYPE_CHECKING:
    from packer.converters.base import Writer
    from packer.datasets.base import PackedDataset
    from packer.description.damage import Report

__all__ = ["Format", "FORMATS", "format_names", "get_format", "writer_class", "reader_class", "formats_taking",
           "shard_suffixes", "shard_format", "read_manifest", "describe_directory", "explain_missing_manifest"]

#: Writer options every format takes (see packer.converters.base.WriterOptions).
SHARD_OPTIONS = frozenset({"shard_bytes", "shard_samples", "prefix"})

#: ``locate_damage(root, manifest, file, intact names, report)``: name the samples a file whose
#: SHA-256 failed holds wrong bytes for (``packer verify``).
Locator = Callable[[str, "Manifest", "FileEntry", "set[str]", "Report"], None]


@dataclass(frozen=True)
class Format:
    """One packed format."""

    name: str
    #: Import and return the writer and the reader class (see :attr:`writer` and :attr:`reader`).
    load_writer: Callable[[], type[Writer]]
    load_reader: Callable[[], type[PackedDataset]]
    #: WriterOptions fields this format uses; giving any other is a usage error.
    options: frozenset[str]
    #: Readable without a packer manifest (shards written by other tools).
    foreign: bool = False
    #: Names the damaged samples of a file that failed its SHA-256 (None: the SHA-256 names the file).
    locate_damage: Locator | None = None
    #: For a folder without a manifest: ``identify(directory, file_names)`` is None when it holds
    #: none of this format's files, "" when they are packer's own (an unfinished conversion), else
    #: a sentence saying what they are and what to do (:func:`describe_directory`).
    identify: Callable[[str, set[str]], str | None] | None = None
    #: One B-tree over the whole file: a damaged pointer can lead to another intact record, which
    #: ``verify`` looks for in version 1 datasets (version 2 binds each record to its place).
    check_unique_records: bool = False
    #: The endings of this format's shard files, by which a list of files or a brace pattern is
    #: known to be of this format (``packer.datasets.open_dataset``); empty for one-file formats.
    load_shard_suffixes: Callable[[], tuple[str, ...]] | None = None

    @property
    def shard_suffixes(self) -> tuple[str, ...]:
        """The endings of this format's shard files (lower case), or ``()``."""
        return self.load_shard_suffixes() if self.load_shard_suffixes is not None else ()

    def refused_options(self, options: Any) -> list[str]:
        """The WriterOptions fields set in ``options`` (not None, not False) that this format does not take."""
        from dataclasses import fields

        return [f.name for f in fields(options) if getattr(options, f.name) not in (None, False)
                and f.name not in self.options]

    @property
    def writer(self) -> type[Writer]:
        """The writer class."""
        return self.load_writer()

    @property
    def reader(self) -> type[PackedDataset]:
        """The map-style dataset class."""
        return self.load_reader()


# Writers and readers are imported on first use: a conversion never imports torch (the readers
# do), and importing packer.datasets does not import h5py or lmdb. One small function per class,
# not one loader over "module:Class" strings: the imports stay real, so tools and readers of the
# code can follow them, and a renamed class fails ruff, not a user's first conversion.
def _lmdb_writer() -> type[Writer]:
    from packer.converters.lmdb import LMDBWriter

    return LMDBWriter


def _lmdb_reader() -> type[PackedDataset]:
    from packer.datasets.formats.lmdb import LMDBDataset

    return LMDBDataset


def _tar_writer() -> type[Writer]:
    from packer.converters.tar import TarWriter

    return TarWriter


def _tar_reader() -> type[PackedDataset]:
    from packer.datasets.formats.tar import TarDataset

    return TarDataset


def _tfrecord_writer() -> type[Writer]:
    from packer.converters.tfrecord import TFRecordWriter

    return TFRecordWriter


def _tfrecord_reader() -> type[PackedDataset]:
    from packer.datasets.formats.tfrecord import TFRecordDataset

    return TFRecordDataset


def _hdf5_writer() -> type[Writer]:
    from packer.converters.hdf5 import HDF5Writer

    return HDF5Writer


def _hdf5_reader() -> type[PackedDataset]:
    from packer.datasets.formats.hdf5 import HDF5Dataset

    return HDF5Dataset


def _locate_tar(*args: Any) -> None:
    from packer.layouts.tar import locate_damage

    locate_damage(*args)


def _locate_tfrecord(*args: Any) -> None:
    from packer.layouts.tfrecord import locate_damage

    locate_damage(*args)


def _identify_lmdb(directory: str, files: set[str]) -> str | None:
    from packer.layouts.lmdb import identify

    return identify(directory, files)


def _identify_hdf5(directory: str, files: set[str]) -> str | None:
    from packer.layouts.hdf5 import identify

    return identify(directory, files)


def _identify_tar(directory: str, files: set[str]) -> str | None:
    from packer.layouts.tar import identify

    return identify(directory, files)


def _identify_tfrecord(directory: str, files: set[str]) -> str | None:
    from packer.layouts.tfrecord import identify

    return identify(directory, files)


def _tar_suffixes() -> tuple[str, ...]:
    from packer.layouts.tar import TAR_SUFFIX

    return (TAR_SUFFIX,)


def _tfrecord_suffixes() -> tuple[str, ...]:
    from packer.layouts.tfrecord import FOREIGN_SUFFIXES

    return FOREIGN_SUFFIXES


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("lmdb", _lmdb_writer, _lmdb_reader, frozenset({"checkpoint_samples"}), check_unique_records=True,
           identify=_identify_lmdb),
    Format("tar", _tar_writer, _tar_reader, SHARD_OPTIONS, foreign=True, locate_damage=_locate_tar,
           identify=_identify_tar, load_shard_suffixes=_tar_suffixes),
    Format("tfrecord", _tfrecord_writer, _tfrecord_reader, SHARD_OPTIONS | {"gzip"}, foreign=True,
           locate_damage=_locate_tfrecord, identify=_identify_tfrecord, load_shard_suffixes=_tfrecord_suffixes),
    Format("hdf5", _hdf5_writer, _hdf5_reader, frozenset({"checkpoint_samples"}), identify=_identify_hdf5),
)}


def format_names() -> list[str]:
    """The registered format names, in registry order."""
    return list(FORMATS)


def get_format(fmt: str) -> Format:
    """The record of ``fmt`` (ValueError naming the known formats for an unknown one)."""
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}; known formats: {', '.join(FORMATS)}") from None


def formats_taking(option: str) -> list[str]:
    """The formats whose writer takes the WriterOptions field ``option``."""
    return [f.name for f in FORMATS.values() if option in f.options]


def shard_suffixes() -> tuple[str, ...]:
    """Every format's shard file endings, together."""
    return tuple(s for f in FORMATS.values() for s in f.shard_suffixes)


def shard_format(name: str) -> str | None:
    """The format whose shard files end as ``name`` does (case-insensitive), or None."""
    low = name.lower()
    return next((f.name for f in FORMATS.values() if f.shard_suffixes and low.endswith(f.shard_suffixes)), None)


def writer_class(fmt: str) -> type[Writer]:
    """The writer class for ``fmt`` (ValueError for an unknown format)."""
    return get_format(fmt).writer


def reader_class(fmt: str) -> type[PackedDataset]:
    """The map-style dataset class for ``fmt`` (ValueError for an unknown format)."""
    return get_format(fmt).reader


def read_manifest(directory: str | os.PathLike[str]) -> Manifest:
    """A dataset's manifest, read and validated as :func:`packer.description.manifest.read_manifest`
    does, its ``format`` one of the registry's (ManifestError naming the file otherwise)."""
    return _read_manifest(directory, format_names())


_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def describe_directory(directory: str) -> str | None:
    """What a directory without ``manifest.json`` holds, when it is not packer output whose
    conversion did not finish (None then): an image folder, another tool's files of a format
    (each format's layout module says, through its record's ``identify``), or nothing packed;
    the text says what to do with it."""
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
    what = describe_directory(directory)
    if what is None:
        return error
    return UnfinishedDatasetError(f"{directory} has no manifest.json: it is {what}")
