"""Importing datasets of other tools (MosaicML Streaming's MDS, LitData's optimized chunks, Parquet):
each reader yields rows that :func:`packer.ops.importers.common.convert_import` converts."""

from __future__ import annotations

__all__ = ["IMPORT_FORMATS", "open_table"]

#: ``packer convert`` source formats read by an importer, and the pip extra each one needs.
IMPORT_FORMATS = {"mds": "mds", "litdata": "mds", "parquet": "parquet"}


def open_table(kind: str, src: str, storage_options: dict | None = None, root: str | None = None,  # noqa: ANN201 - a common.Table
               allow_outside_root: bool = False):
    """The reader of the ``kind`` dataset at ``src`` (mds and litdata: a folder or URL; parquet: a
    local file or folder of files, its images by path relative to ``root`` and inside it unless
    ``allow_outside_root``); SourceError when it cannot be read."""
    from ...errors import SourceError
    from ...storage.remote import is_url

    if kind == "mds":
        from .mdsreader import MDSTable

        return MDSTable(src, storage_options)
    if kind == "litdata":
        from .litreader import LitDataTable

        return LitDataTable(src, storage_options)
    if is_url(src):
        raise SourceError(f"{src}: Parquet is read from a local file or folder; download it first")
    from .parquetreader import ParquetTable

    return ParquetTable(src, root, allow_outside_root)
