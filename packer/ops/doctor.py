"""``packer doctor``: what this machine gives packer, on one screen (or as one JSON object).

Paste its output into a bug report. Every value is found out in this process (the shared-memory
batches by their self-test, the decoders by what imported), never inferred from a version number.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from typing import Any

from ..wording import plural

__all__ = ["collect", "format_report", "run_doctor"]

_EXTRAS = {"s3": ("fsspec", "s3fs"), "gcs": ("fsspec", "gcsfs"), "http": ("fsspec", "aiohttp")}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch() -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "torch_path": os.path.dirname(torch.__file__),
            "torch_cuda_build": torch.version.cuda, "cuda_available": cuda,
            "gpus": torch.cuda.device_count() if cuda else 0}


def _decoders() -> dict[str, Any]:
    import cv2

    from packer.images import imageproc

    turbo = imageproc._simplejpeg is not None
    version_of = getattr(imageproc, "window_decoder_version", lambda: None)
    return {"jpeg_decoder": "turbojpeg" if turbo else "opencv",
            "simplejpeg": _version("simplejpeg") if turbo else None,
            "opencv": cv2.__version__,
            "window_decode": imageproc.window_decoding(),
            "window_libjpeg_turbo": version_of() if imageproc.window_decoding() else None}


def _space(path: str) -> dict[str, Any] | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return {"path": path, "size": st.f_frsize * st.f_blocks, "free": st.f_frsize * st.f_bavail}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _cgroup_memory_limit() -> int | None:
    """The memory limit of this process's cgroup (v2, else v1) in bytes; None when unlimited."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        value = _read(path)
        if value is not None:
            if value == "max" or not value.isdigit() or int(value) >= 1 << 60:
                return None
            return int(value)
    return None


def _usable_cpus() -> float:
    """CPUs this process may run on, lowered by a cgroup v2 CPU quota where one is set."""
    cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    quota = (_read("/sys/fs/cgroup/cpu.max") or "max").split()
    if len(quota) == 2 and quota[0] != "max":
        cpus = min(cpus, int(quota[0]) / int(quota[1]))
    return cpus


def _node_cache() -> dict[str, Any]:
    from packer.storage.nodecache import default_cache_dir

    root = default_cache_dir()
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                pass
    return {"path": root, "exists": os.path.isdir(root), "bytes": total}


def collect() -> dict[str, Any]:
    """Everything ``packer doctor`` reports, as one JSON-ready dict (keys ``packer``, ``torch``,
    ``collate_slots``, ``window_decode`` and ``jpeg_decoder`` among them)."""
    import packer
    from packer.datasets.collation import slots_available

    slots, why = slots_available()
    decoders = _decoders()
    return {
        "packer": packer.__version__,
        "packer_path": os.path.dirname(packer.__file__),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        **_torch(),
        "collate_slots": slots,
        "collate_slots_off_because": why or None,
        **decoders,
        "extras": {name: all(importlib.util.find_spec(m) is not None for m in mods)
                   for name, mods in _EXTRAS.items()},
        "dev_shm": _space("/dev/shm"),
        "cgroup_memory_limit": _cgroup_memory_limit(),
        "usable_cpus": _usable_cpus(),
        "node_cache": _node_cache(),
    }


def _bytes(n: int | None) -> str:
    if n is None:
        return "none"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def format_report(info: dict[str, Any]) -> str:
    """The one-screen text form of :func:`collect`'s result."""
    build = info["torch_cuda_build"]
    cuda = f"CUDA {build}, {plural(info['gpus'], 'GPU')} visible" if info["cuda_available"] else (
        f"CUDA build {build}, no GPU visible" if build else "CPU build")
    slots = "on" if info["collate_slots"] else f"OFF ({info['collate_slots_off_because']}): collate is default_collate"
    jpeg = (f"TurboJPEG through simplejpeg {info['simplejpeg']}, OpenCV {info['opencv']} for the rest"
            if info["jpeg_decoder"] == "turbojpeg" else f"OpenCV {info['opencv']} (simplejpeg is not importable)")
    window = (f"built, libjpeg-turbo {info['window_libjpeg_turbo'] or 'version unknown'}" if info["window_decode"]
              else "not built: readers with crop= decode whole images and cut them (same pixels)")
    extras = ", ".join(f"[{k}] {'yes' if v else 'no'}" for k, v in info["extras"].items())
    shm = info["dev_shm"]
    shm_text = f"{_bytes(shm['size'])}, {_bytes(shm['free'])} free" if shm else "missing"
    cache = info["node_cache"]
    lines = [
        f"packer        {info['packer']}  ({info['packer_path']})",
        f"python        {info['python']}  ({info['python_executable']})",
        f"platform      {info['platform']}",
        f"torch         {info['torch']}  ({info['torch_path']}); {cuda}",
        f"collate       shared-memory batches {slots}",
        f"JPEG decode   {jpeg}",
        f"crop windows  {window}",
        f"extras        {extras}",
        f"/dev/shm      {shm_text}",
        f"memory limit  {_bytes(info['cgroup_memory_limit']) if info['cgroup_memory_limit'] else 'no cgroup limit'}",
        f"usable CPUs   {info['usable_cpus']:g}",
        f"node cache    {cache['path']} ({_bytes(cache['bytes']) if cache['exists'] else 'not created yet'})",
    ]
    return "\n".join(lines)


def run_doctor(as_json: bool = False) -> int:
    """Print the report (``as_json``: one JSON object); returns 0."""
    info = collect()
    print(json.dumps(info, indent=2, sort_keys=True) if as_json else format_report(info))
    return 0
