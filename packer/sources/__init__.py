"""Every kind of input a conversion reads, and the source table (:mod:`packer.sources.table`,
the only place that lists them): lists (listsource), COCO files (coco), other tools' datasets
(importers); the image folder and packed datasets are rows of the table over the pipeline and
transcode."""

from __future__ import annotations

__all__: list[str] = []
