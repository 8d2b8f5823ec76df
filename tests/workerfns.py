"""Functions that tests hand to conversion worker processes, in a module that imports only NumPy.

A spawned worker imports the module a function was defined in; defining these in a test module
would make every worker import torch and the whole test module first (seconds of CPU per worker).
"""

from __future__ import annotations

import numpy as np


def make_sample(i: int) -> dict:
    """A pack function: an array, a label, metadata."""
    rng = np.random.default_rng(i)
    return {"image": rng.integers(0, 256, (6 + i % 3, 9, 3), dtype=np.uint8), "label": f"c{i % 3}",
            "score": i / 2, "tags": ["even" if i % 2 == 0 else "odd"]}


def fails_on_three(i: int) -> dict:
    """``make_sample``, except for input 3, which raises KeyError."""
    if i == 3:
        raise KeyError(f"no record {i}")
    return make_sample(i)


class TwoArgError(Exception):
    """An exception whose constructor takes two arguments (it cannot be rebuilt from its message)."""

    def __init__(self, code: int, what: str) -> None:
        super().__init__(f"code {code}: {what}")
        self.code = code


class RowError(ValueError):
    """A user's own exception type built from one message: it comes back as itself."""


def two_arg_error_on_three(i: int) -> dict:
    """``make_sample``, except for inputs 3 (TwoArgError) and 4 (RowError)."""
    if i == 3:
        raise TwoArgError(7, "bad row")
    if i == 4:
        raise RowError(f"row {i} is short")
    return make_sample(i)


def big_answers(items: list) -> list[bytes]:
    """16 MiB per item: far more than a pipe's buffer."""
    return [b"x" * (16 << 20) for _ in items]


def chunk_fails_on_three(items: list) -> list:
    """The items back, except that a chunk holding 3 raises OSError naming its first item."""
    if 3 in items:
        raise OSError(f"item {items[0]} cannot be read")
    return list(items)
