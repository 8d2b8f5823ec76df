"""Importing datasets of other tools (MosaicML Streaming's MDS, LitData's optimized chunks, Parquet):
each reader yields rows that :func:`packer.sources.importers.common.convert_import` converts; the
source table (:mod:`packer.sources.table`) names them and opens each one's reader."""

from __future__ import annotations

__all__: list[str] = []
