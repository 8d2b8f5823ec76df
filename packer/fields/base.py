"""The small base class of a field kind: what a field of that kind is at each step, from the
manifest's check through conversion and storage to the readers' output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..images.imageproc import ProcessedField, ProcessOptions, Window

__all__ = ["FieldKind", "Reading", "tv_tensor_types"]


def tv_tensor_types() -> Any:
    """torchvision's ``tv_tensors`` module, or ImportError saying what needs it."""
    try:
        from torchvision import tv_tensors
    except ImportError as e:
        raise ImportError(f"output='tv_tensors' needs torchvision (pip install torchvision): {e}") from None
    return tv_tensors


@dataclass(frozen=True)
class Reading:
    """What a reader gives a kind to decode one sample's stored field: where it is (``path``,
    ``sample``), the manifest's entry for the field, the crop and its window (None without a
    crop) and the reader's own image decode, ``(payload, codec, height, width) -> pixels`` cut by
    the window."""

    path: str
    sample: int
    entry: dict[str, Any]
    crop: Any
    window: Window | None
    decode_image: Callable[..., np.ndarray]


class FieldKind:
    """A field kind (one object per kind, listed in :data:`packer.fields.KINDS`). A stored kind
    is one encoded payload per sample, kept by every format beside the image's; a kind that is
    not stored (boxes) lives in the sample table."""

    #: The kind's name in the manifest's ``fields[].kind``.
    name: str = ""
    #: The field's name where the kind fixes it (the mask is named ``mask``), or None: the source names it.
    field_name: str | None = None
    #: One payload per sample (else rows of the sample table).
    stored: bool = True
    #: The channels of a stored field whose format's own header does not say.
    channels: int = 3
    #: The codec every stored field of the kind has (the mask's PNG), or None: the encoding options decide.
    codec: str | None = None
    #: The manifest entry declares the widest stored depth as the field's ``dtype`` (version 4 on).
    dtyped: bool = False

    def outputs(self, name: str) -> tuple[str, ...]:
        """The names the readers return for a field ``name`` of this kind."""
        return (name,)

    def per_sample(self, output: str) -> bool:
        """Whether the reader's ``output`` of this kind has a count per sample (listed, not stacked)."""
        return False

    def declare(self, name: str, **facts: Any) -> dict[str, Any]:
        """The manifest's entry for a field ``name`` of this kind."""
        return {"name": name, "kind": self.name, **facts}

    def check(self, entry: dict[str, Any], dtyped: bool) -> None:
        """ValueError when a manifest entry of this kind is malformed (``dtyped``: version 4 on)."""

    def with_depth(self, entry: dict[str, Any], dtype: str) -> dict[str, Any]:
        """``entry`` with ``dtype`` declared when the kind declares one (:attr:`dtyped`)."""
        return {**entry, "dtype": dtype} if self.dtyped else entry

    def describe(self, entry: dict[str, Any]) -> str:
        """The entry as ``packer info`` shows it."""
        return self.name

    def shape(self, payload: bytes | memoryview) -> tuple[int, int, int, int] | None:
        """(height, width, channels, bits) of a stored payload read from its own header, where the
        kind reads it so (a format without these facts asks), or None."""
        return None

    def process(self, name: str, data: bytes, source: tuple[int, int], stored: tuple[int, int],
                opts: ProcessOptions) -> ProcessedField:
        """The source file ``data`` of field ``name`` processed to match an image of ``source``
        (width, height) stored at ``stored``; ImageError (a skip) naming the field."""
        raise NotImplementedError(f"a {self.name} field is not a stored payload")

    def verify(self, f: ProcessedField, size: tuple[int, int], where: dict[str, Any]) -> None:
        """CorruptDataError (``where``: path, sample) when the stored field ``f`` is not at the
        image's ``size`` (height, width) or does not decode to what its header says."""

    def load(self, f: ProcessedField, at: Reading) -> np.ndarray:
        """The stored field ``f`` decoded and cut by the reader's crop window."""
        raise NotImplementedError(f"a {self.name} field is not a stored payload")

    def output(self, name: str, value: np.ndarray, output: str, canvas: tuple[int, int]) -> Any:
        """A decoded value of output ``name`` as the reader's ``output`` mode returns it
        (``canvas``: the returned image's height, width)."""
        if output == "numpy":
            return value
        import torch

        return torch.from_numpy(value)
