"""What every format writer implements. The conversion engine owns processes, order, skips and the
manifest; a writer only lays processed samples into files, in the order it is given them."""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from typing import Any, ClassVar

from packer.imageproc import ProcessedImage
from packer.manifest import FileEntry

__all__ = ["WriterOptions", "Writer"]


@dataclass(frozen=True)
class WriterOptions:
    """Format options. Shard limits apply to sharded formats (tar, tfrecord); None = no limit."""

    shard_bytes: int | None = None
    shard_samples: int | None = None
    gzip: bool = False


class Writer(abc.ABC):
    """Writes samples into ``directory`` (an empty temporary folder the engine publishes later).

    Protocol: ``add`` once per sample with consecutive indices from 0, then ``close`` returns the
    payload files and format-specific layout facts for the manifest; on failure ``abort`` is
    called instead and the engine removes the folder.
    """

    format: ClassVar[str]

    def __init__(self, directory: str, options: WriterOptions) -> None:
        self.directory = directory
        self.options = options

    def path(self, name: str) -> str:
        """Absolute path of a file inside the output directory."""
        return os.path.join(self.directory, name)

    def begin(self, info: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Called once before the first ``add`` with the manifest facts known before writing
        (``format``, ``classes``, ``processing``, ``shuffle_seed``, ``source``, ``created_by``),
        for formats that also record them inside their payload files (HDF5 attributes)."""

    @abc.abstractmethod
    def add(self, index: int, key: str, label: int, image: ProcessedImage) -> None:
        """Append one sample. ``key`` is the source path relative to the source root."""

    @abc.abstractmethod
    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Flush and fsync everything; return (payload files, layout facts for the manifest)."""

    def abort(self) -> None:  # noqa: B027 - optional hook
        """Release resources after a failure (files are removed by the engine)."""
