"""``packer doctor``: what this machine gives packer, on one screen (or as one JSON object).

Paste its output into a bug report. Every value is found out in this process (the shared-memory
batches by their self-test, the decoders by what imported), never inferred from a version number.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import sys
from typing import Any

from ..wording import plural

__all__ = ["collect", "extras_report", "format_report", "run_doctor"]

_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?[^;]*(?:;\s*(.*))?$")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")


def _requirements(dist: str) -> list[tuple[str, tuple[str, ...], str | None]]:
    """(name, its extras, the extra that asks for it or None) for each requirement of ``dist``
    as installed; ``[]`` where it is not installed or lists none."""
    try:
        lines = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    out = []
    for line in lines:
        m = _REQUIREMENT.match(line)
        if not m:
            continue
        name, extras, marker = m.group(1), m.group(2), m.group(3) or ""
        extra = _EXTRA_MARKER.search(marker)
        out.append((name, tuple(e.strip() for e in (extras or "").split(",") if e.strip()),
                    extra.group(1) if extra else None))
    return out


def _missing(dist: str, extra: str, seen: set[tuple[str, str]] | None = None) -> list[str]:
    """The distributions that ``pip install 'DIST[EXTRA]'`` would bring and that are not installed
    (nested extras such as ``dask[distributed]`` followed), in the order the metadata lists them."""
    seen = set() if seen is None else seen
    if (dist, extra) in seen:
        return []
    seen.add((dist, extra))
    out: list[str] = []
    for name, nested, wanted_by in _requirements(dist):
        if wanted_by != extra:
            continue
        if _version(name) is None:
            out.append(name)
            continue
        for sub in nested:
            out += [m for m in _missing(name, sub, seen) if m not in out]
    return out


def extras_report() -> dict[str, list[str]]:
    """Every extra that packer's installed metadata declares (``pip install 'packer[NAME]'``),
    each with the distributions it needs that are not installed (``[]``: all there). Empty where
    packer runs without being installed (no metadata to read)."""
    try:
        names = importlib.metadata.metadata("packer").get_all("Provides-Extra") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    return {name: _missing("packer", name) for name in names}


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
            "window_libjpeg_turbo": version_of() if imageproc.window_decoding() else None,
            "area_resize": getattr(imageproc, "_AREA", None) is not None}


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
    extras = extras_report()
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
        "extras": {name: not missing for name, missing in extras.items()},
        "extras_missing": {name: missing for name, missing in extras.items() if missing},
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


def _wrapped(head: str, items: list[str], width: int = 100) -> list[str]:
    """``items`` joined by "; " after ``head``, as lines of at most about ``width`` characters,
    the later ones indented under the first item; no line when there are no items."""
    lines: list[str] = []
    line = head
    for i, item in enumerate(items):
        piece = item + (";" if i < len(items) - 1 else "")
        if line.strip() and len(line) + len(piece) + 1 > width and line != head:
            lines.append(line.rstrip())
            line = " " * len(head)
        line += piece + " "
    if items:
        lines.append(line.rstrip())
    return lines


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
    area = ("packer's C module (OpenCV's INTER_AREA bytes, fewer passes)" if info.get("area_resize")
            else "OpenCV's INTER_AREA (the C module is not built)")
    have = " ".join(f"[{k}]" for k, v in info["extras"].items() if v) or "none"
    lacking = [f"[{k}] needs {', '.join(v)}" for k, v in info.get("extras_missing", {}).items()]
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
        f"shrinking     {area}",
        f"extras        installed: {have}" if info["extras"] else
        "extras        unknown (packer is not installed: pip install -e .)",
        *_wrapped("              missing:  ", lacking),
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
