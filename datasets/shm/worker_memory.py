"""Memory settings for DataLoader worker processes, applied by packer's readers and collate at a
worker's first read or batch (:func:`settle_worker`): glibc malloc thresholds, and the garbage
collector's view of what the worker inherited. Why and how: docs/datasets.md ("Worker memory").
"""

from __future__ import annotations

import ctypes
import gc
import os

from torch.utils.data import get_worker_info

__all__ = ["settle_worker", "tune_worker_malloc", "freeze_inherited", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers

_tuned: tuple[int, bool] | None = None  # (pid, whether the settings took) of the process that tried


_frozen_pid: int | None = None  # the process that froze what it inherited


def settle_worker() -> None:
    """In a DataLoader worker: :func:`freeze_inherited` and :func:`tune_worker_malloc` (each once
    per process; a few microseconds after the first call). Nothing elsewhere."""
    freeze_inherited()
    tune_worker_malloc()


def freeze_inherited() -> bool:
    """In a DataLoader worker, once per process: ``gc.freeze()`` (see above). Returns whether
    this process is a worker that froze what it inherited."""
    global _frozen_pid
    pid = os.getpid()
    if get_worker_info() is None:
        return False
    if _frozen_pid == pid:
        return True
    gc.freeze()
    _frozen_pid = pid
    return True


def _freeze_in_forked_child() -> None:
    global _frozen_pid
    gc.freeze()
    _frozen_pid = os.getpid()


os.register_at_fork(after_in_child=_freeze_in_forked_child)


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return False


def tune_worker_malloc() -> bool:
    """Apply the settings above once per process; return whether they are in effect here.

    Does nothing outside DataLoader workers, off glibc, with ``PACKER_MALLOC_TUNING=0`` or when
    the process was started with glibc's malloc environment variables.
    """
    global _tuned
    pid = os.getpid()
    if _tuned is not None and _tuned[0] == pid:
        return _tuned[1]  # once per process: the first outcome, success or not
    if get_worker_info() is None or os.environ.get("PACKER_MALLOC_TUNING", "1") == "0":
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ or not _glibc():
        return False
    _tuned = (pid, _apply())
    return _tuned[1]


def _apply() -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
