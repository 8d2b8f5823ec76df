"""The source table: every kind of SRC a conversion reads, one row each (its name, how it converts,
the options it takes, whether it converts in parts under torchrun, whether it reads a URL itself).
It is the only place that lists sources; the command line and :func:`packer.convert` ask it."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..formats import format_names

if TYPE_CHECKING:
    from ..conversion.options import ConvertRequest

__all__ = ["Source", "SOURCES", "source_names", "get_source", "sources_taking", "add_source"]


@dataclass(frozen=True)
class Source:
    """One kind of SRC.

    ``convert``: runs the conversion of a :class:`~packer.conversion.options.ConvertRequest` (its SRC
    local unless ``reads_urls``) and returns the ConvertReport. ``takes``: the source options
    (:class:`~packer.conversion.options.SourceOptions` fields but ``classes_from``) it takes; ``needs``: those it cannot do
    without, each with what it is. ``splits``: converts in parts, one per rank, under torchrun.
    ``reads_urls``: reads a URL SRC itself (else a URL SRC must be ``packed``, and is downloaded).
    ``packed``: a packed dataset (it converts to an image folder too). ``pins_classes``: takes
    ``classes_from``. ``one_image_column``: ``image_column`` names its one image column.
    ``split_hint``: how to convert it in parts by hand, said when it does not split under torchrun."""

    name: str
    convert: Callable[[ConvertRequest], Any]
    takes: tuple[str, ...] = ()
    needs: tuple[tuple[str, str], ...] = ()
    splits: bool = False
    reads_urls: bool = False
    packed: bool = False
    pins_classes: bool = False
    one_image_column: bool = False
    split_hint: str = ""


def _imagefolder(r: ConvertRequest) -> Any:
    from ..pipeline.engine import convert_imagefolder

    return convert_imagefolder(r.src, r.dst, r.dst_format, r.options)


def _list(r: ConvertRequest) -> Any:
    from ..errors import SourceError
    from .listsource import convert_list

    s = r.source
    try:
        return convert_list(r.src, r.dst, r.dst_format, r.options, root=s.root, path_column=s.path_column,
                            label_column=s.label_column, label_kind=s.label_kind, label_sep=s.label_sep,
                            allow_outside_root=bool(s.allow_outside_root), mask_column=s.mask_column,
                            image_columns=s.image_column or (), boxes_column=s.boxes_column,
                            box_labels_column=s.box_labels_column, metadata_types=s.metadata_types or "auto")
    except ValueError as e:  # metadata that cannot be stored, named by its item
        if isinstance(e, SourceError):  # names the list already
            raise
        raise SourceError(f"{r.src}: {e}") from None


def _coco(r: ConvertRequest) -> Any:
    from .coco import convert_coco

    return convert_coco(r.src, r.dst, r.dst_format, r.options, images=r.source.images, masks=r.source.masks)


def _imported(open_table: Callable[[ConvertRequest], Any], r: ConvertRequest) -> Any:
    """Convert an MDS, LitData or Parquet dataset (packer.sources.importers), read by ``open_table``."""
    from .importers.common import convert_import

    s = r.source
    return convert_import(open_table(r), r.dst, r.dst_format, r.options,
                          image_column=s.image_column[0] if s.image_column else None, label_column=s.label_column,
                          drop_columns=s.drop_column or (), label_kind=s.label_kind, classes=r.options.classes,
                          source_kind=r.src_format)


def _mds(r: ConvertRequest) -> Any:
    from .importers.mdsreader import MDSTable

    return MDSTable(r.src, dict(r.storage.options))


def _litdata(r: ConvertRequest) -> Any:
    from .importers.litreader import LitDataTable

    return LitDataTable(r.src, dict(r.storage.options))


def _parquet(r: ConvertRequest) -> Any:
    from ..errors import SourceError
    from ..storage.remote import is_url
    from .importers.parquetreader import ParquetTable

    if is_url(r.src):
        raise SourceError(f"{r.src}: Parquet is read from a local file or folder; download it first")
    return ParquetTable(r.src, r.source.root, bool(r.source.allow_outside_root))


def _packed(r: ConvertRequest) -> Any:
    """Packed -> packed or imagefolder: copy the stored bytes unless resize/encode ask otherwise."""
    from dataclasses import replace

    from ..description.manifest import MANIFEST_NAME
    from ..formats import read_manifest
    from ..operations.transcode import convert_dataset, processing_for

    src_manifest = read_manifest(r.src) if os.path.exists(os.path.join(r.src, MANIFEST_NAME)) else None
    processing = processing_for(src_manifest, r.resize, r.encode, r.options.processing)
    report = convert_dataset(r.src, r.dst, r.src_format, r.dst_format, replace(r.options, processing=processing))
    renamed = getattr(report, "renamed", [])
    for key, path, why in renamed[:20]:
        _say(f"renamed {key} -> {path}: {why}")
    if len(renamed) > 20:
        _say(f"... and {len(renamed) - 20} more renamed")
    return report


def _say(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr)


_LIST_TAKES = ("root", "allow_outside_root", "path_column", "label_column", "label_kind", "label_sep", "mask_column",
               "image_column", "boxes_column", "box_labels_column", "metadata_types")
_IMPORT_TAKES = ("label_column", "drop_column", "label_kind", "image_column")


def _importer(name: str, open_table: Callable[[ConvertRequest], Any], *also: str) -> Source:
    return Source(name, functools.partial(_imported, open_table), takes=_IMPORT_TAKES + also, reads_urls=True,
                  pins_classes=True, one_image_column=True)


#: Every source, by name, in the order ``packer convert --help`` lists them; the packed formats
#: (one row each, from the format registry) after the sources that are not packed.
SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("imagefolder", _imagefolder, splits=True, pins_classes=True),
    Source("list", _list, takes=_LIST_TAKES, pins_classes=True,
           split_hint="split the list and merge the parts: packer merge"),
    Source("coco", _coco, takes=("images", "masks"), needs=(("images", "the folder of its images"),)),
    *(Source(fmt, _packed, packed=True) for fmt in format_names()),
    _importer("mds", _mds),
    _importer("litdata", _litdata),
    _importer("parquet", _parquet, "root", "allow_outside_root"),
)}


def _rows() -> dict[str, Source]:
    """SOURCES, with a packed row for each format added to the registry after this module was
    imported (a plugin's format, a test's toy one): the registry is the one list of formats."""
    late = [fmt for fmt in format_names() if fmt not in SOURCES]
    return {**SOURCES, **{fmt: Source(fmt, _packed, packed=True) for fmt in late}} if late else SOURCES


def source_names() -> list[str]:
    """The names a conversion takes as its source format."""
    return list(_rows())


def get_source(name: str) -> Source:
    """The source named ``name``; KeyError naming those there are."""
    rows = _rows()
    try:
        return rows[name]
    except KeyError:
        raise KeyError(f"no source {name!r}; there are {', '.join(rows)}") from None


def sources_taking() -> dict[str, list[Source]]:
    """Each source option that some source takes -> the sources that take it, in table order."""
    out: dict[str, list[Source]] = {}
    for s in _rows().values():
        for k in s.takes:
            out.setdefault(k, []).append(s)
    return out


def add_source(source: Source) -> None:
    """Add a row to the table (a plugin's source, a test's toy one); ValueError if the name is taken."""
    if source.name in SOURCES:
        raise ValueError(f"a source named {source.name!r} exists")
    SOURCES[source.name] = source
