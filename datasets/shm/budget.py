"""How many bytes a shared cache may take: free RAM, the container's memory limit (cgroup v2 or
v1) and free ``/dev/shm``, less headroom for the DataLoader's own batches (docs/datasets.md)."""

from __future__ import annotations

import os
import warnings

__all__ = ["SHM_DIR", "ALIGN", "cgroup_free_bytes", "clamp_capacity"]

#: Where node-shared segments live (a tmpfs).
SHM_DIR = "/dev/shm"
#: A cache's capacity is a multiple of this many bytes.
ALIGN = 64
_MIN_HEADROOM = 256 * 2**20
_CGROUP_ENV = "PACKER_CGROUP_DIR"
_NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as 2**63 rounded down to a page


def _shm_free_bytes(path: str = SHM_DIR) -> int | None:
    """Bytes an unprivileged process may still allocate in ``path``; None if not a directory."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _available_memory_bytes() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo``; None where that is missing (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_value(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _stat_field(directory: str, name: str) -> int:
    """Field ``name`` of ``directory``'s memory.stat, 0 where missing."""
    for line in (_read_value(os.path.join(directory, "memory.stat")) or "").splitlines():
        field, _, value = line.partition(" ")
        if field == name and value.strip().isdigit():
            return int(value)
    return 0


def _cgroup_dir_free(directory: str) -> int | None:
    """Limit less usage in one cgroup directory (v2 or v1 files); None without a limit there.

    Usage counts the page cache; its inactive part (``inactive_file``) is reclaimed before the
    limit bites, so it counts as free.
    """
    for limit_name, usage_name, inactive in (("memory.max", "memory.current", "inactive_file"),
                                             ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                              "total_inactive_file")):
        limit = _read_value(os.path.join(directory, limit_name))
        if limit is None:
            continue
        if not limit.isdigit() or int(limit) >= _NO_LIMIT:  # "max"
            return None
        usage = _read_value(os.path.join(directory, usage_name)) or "0"
        used = int(usage) if usage.isdigit() else 0
        return max(int(limit) - max(used - _stat_field(directory, inactive), 0), 0)
    return None


def _cgroup_dirs(root: str = "/sys/fs/cgroup") -> list[str]:
    """This process's memory cgroup directories and their ancestors, v2 and v1 alike."""
    found: list[str] = []
    for line in (_read_value("/proc/self/cgroup") or "").splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            mount = root  # the v2 unified hierarchy
        elif "memory" in controllers.split(","):
            mount = os.path.join(root, "memory")
        else:
            continue
        here = os.path.normpath(os.path.join(mount, path.lstrip("/")))
        if not os.path.isdir(here):  # a namespace that shows the host's path: its root is ours
            here = mount
        while True:
            found.append(here)
            if here == mount or len(here) <= len(mount):
                break
            here = os.path.dirname(here)
    return found


def cgroup_free_bytes(cgroup_dir: str | None = None) -> int | None:
    """Memory this container may still use: the tightest ``memory.max`` less usage over the
    process's cgroup and its ancestors (cgroup v2), or ``memory.limit_in_bytes`` less usage (v1).

    Args:
        cgroup_dir: read only this directory (its ``memory.max`` and ``memory.current``, or the v1
            files); default: the ``PACKER_CGROUP_DIR`` environment variable, else the cgroups of
            ``/proc/self/cgroup``.

    Returns:
        Bytes, or None where no limit is set (or no cgroup is visible).
    """
    chosen = cgroup_dir if cgroup_dir is not None else os.environ.get(_CGROUP_ENV) or None
    free = [_cgroup_dir_free(d) for d in ([chosen] if chosen is not None else _cgroup_dirs())]
    known = [f for f in free if f is not None]
    return min(known) if known else None


def _usable_bytes(free: int) -> int:
    """Free space less headroom for the DataLoader's own batches: 10%, 256 MiB at least."""
    headroom = min(free // 2, max(free // 10, _MIN_HEADROOM))
    return free - headroom


def clamp_capacity(requested: int, overhead: int, node: bool) -> int:
    """``requested`` bytes, or less (with a warning) where memory cannot hold them and
    ``overhead`` bytes of table: RAM, the cgroup's limit, and for a named segment ``/dev/shm``."""
    limits = {
        "RAM available": _available_memory_bytes(),
        "left under the container's memory limit (cgroup)": cgroup_free_bytes(),
    }
    if node:
        limits["free in " + SHM_DIR] = _shm_free_bytes()
    known = {name: value for name, value in limits.items() if value is not None}
    if not known:
        return requested
    tightest = min(known, key=known.__getitem__)
    usable = max(_usable_bytes(known[tightest]) - overhead, 0)
    if requested <= usable:
        return requested
    capacity = usable - usable % ALIGN
    warnings.warn(
        f"SharedCache: capacity_bytes={requested} is more than shared memory can hold "
        f"({known[tightest]} bytes {tightest}, less headroom for DataLoader batches); using "
        f"{capacity} bytes. For more, free memory, raise the limit or enlarge {SHM_DIR} "
        f"(docker run --shm-size=...).",
        RuntimeWarning,
        stacklevel=4,
    )
    return capacity
