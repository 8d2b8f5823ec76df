"""Operations on packed datasets, above the pipeline: merge, transcode (format -> format and ->
image folder), verify, preview, the loader benchmark, doctor and the demo."""

from __future__ import annotations

__all__: list[str] = []
