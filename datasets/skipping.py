"""The readers' ``on_error`` policy, mixed into :class:`~packer.datasets.base.PackedDataset`:
``"raise"``, or ``"skip"`` to the next readable sample, warning and counting each skip in a
count shared with the DataLoader workers (:class:`~packer.datasets.shm.skips.SkipCounter`)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

from packer.errors import CorruptDataError

from .shm.skips import SkipCounter

__all__ = ["SkipPolicy"]


class SkipPolicy:
    """The error policy's part of :class:`~packer.datasets.base.PackedDataset` (its attributes
    are set by the dataset's constructor)."""

    root: str
    _skips: SkipCounter | None
    _open_failure: tuple[int, CorruptDataError] | None
    _unreadable: tuple[int, CorruptDataError] | None

    @property
    def errors(self) -> int:
        """Samples skipped by ``on_error="skip"`` so far, in this process and its DataLoader workers."""
        return self._skips.value if self._skips is not None else 0

    def _load_or_skip(self, index: int, load: Callable[[int], Any] | None = None) -> Any:
        """``load(index)`` (default :meth:`load`); with ``on_error="skip"``, the next sample that
        loads, counting each skip. Raises the last CorruptDataError only when every sample fails in
        a row, or at once when the dataset itself failed its open check (no sample can be read:
        nothing is counted). Once the dataset is known to be unreadable, each read raises that error
        again without retrying or counting its samples."""
        n = len(self)
        load = self.load if load is None else load
        pid = os.getpid()
        if self._skips is not None and self._unreadable is not None and self._unreadable[0] == pid:
            raise copy.copy(self._unreadable[1])
        for step in range(n):
            try:
                return load((index + step) % n)
            except CorruptDataError as e:
                if self._skips is None:
                    raise
                whole = self._open_failure is not None and self._open_failure[0] == pid
                if whole:
                    message = f"every sample of {self.root} is unreadable: the dataset failed its open check: {e}"
                elif step < n - 1:
                    self._skips.warn(str(e))
                    continue
                else:
                    self._skips.warn(str(e))
                    message = f"every sample of {self.root} failed to read; the last: {e}"
                err = CorruptDataError(message, path=e.path, sample=e.sample, offset=e.offset)
                self._unreadable = (pid, err)
                raise copy.copy(err) from e
        raise AssertionError("unreachable")  # pragma: no cover
