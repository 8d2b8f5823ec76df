"""The one conversion pipeline, below every source: the engine (an item source's items, processed
in worker processes, written in the write-time order, with checkpoints and resume), items and
their fields, the write-time shuffle (order), the worker pool, the image folder's scan and the
processing of one source file. It imports no source, operation or front end."""

from __future__ import annotations

__all__: list[str] = []
