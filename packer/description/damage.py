"""Locating damage in a packed file whose SHA-256 failed: what ``packer verify`` and the format
layouts' damage locators share. A locator rebuilds the bytes the intact files imply and reports
each difference through ``report(path, sample or None, offset, what)``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["Report", "read_all", "byte_diff"]

#: ``report(path, sample, offset, what)``: one damaged place (``sample`` None: structural bytes).
Report = Callable[[str, "int | None", int, str], None]


def read_all(path: str) -> bytes:
    """The whole file at ``path``."""
    with open(path, "rb") as fh:
        return fh.read()


def byte_diff(a: bytes, b: bytes) -> np.ndarray:
    """Offsets where ``a`` and ``b`` differ (a length difference counts from the shorter end)."""
    n = min(len(a), len(b))
    d = np.flatnonzero(np.frombuffer(a, np.uint8, n) != np.frombuffer(b, np.uint8, n))
    if len(a) != len(b):
        d = np.append(d, n)
    return d
