"""Section 1 of docs/benchmarks.md (the peers): the protocol every system shares: its settings, the
result row, the one resize-encode and decode-crop, the source scan, the process-tree monitor."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# Heavy imports (cv2, torch, the peer libraries) happen inside the functions that need them, so
# the parent process stays small and a missing library only fails its own row.

SHORT_SIDE = 256
JPEG_QUALITY = 90
CROP = 224
WORKERS = 2
BATCH = 64
EPOCHS = 2
SHUFFLE_SEED = 0
SHARD_BYTES = 64 * 1000 * 1000  # target shard / chunk size for every sharded writer
SHARD_SAMPLES = 1000  # webdataset ShardWriter's sample cap (10 shards for 10k images)
RSS_INTERVAL_S = 0.02
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


# -- configuration and rows ----------------------------------------------------------------------
@dataclass(frozen=True)
class BenchConfig:
    """What every system function gets: source, scratch folder and the shared protocol."""

    src: str
    work: str
    workers: int = WORKERS
    batch_size: int = BATCH
    epochs: int = EPOCHS
    bare_images: int = 2000
    side: int = SHORT_SIDE  # the training rows' storage size (shorter side, px)
    ffcv_warm: bool = False  # the FFCV training row again after an untimed compile epoch


def make_row(system: str, **fields: Any) -> dict[str, Any]:
    """A result row; numbers left out are None (shown as '-')."""
    row: dict[str, Any] = {
        "system": system,
        "convert_img_s": None,
        "read_e1_img_s": None,
        "read_e2_img_s": None,
        "size_bytes": None,
        "peak_rss_bytes": None,
        "others_convert_cores": None,
        "others_read_cores": None,
        "read_cpu_us": None,
        "note": "",
    }
    row.update(fields)
    return row


# -- the shared image functions ------------------------------------------------------------------
_THREADS_SET = False


def one_thread_per_process() -> None:
    """Pin OpenCV and torch to one thread in this process (idempotent, cheap)."""
    global _THREADS_SET
    if _THREADS_SET:
        return
    import cv2
    import torch

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    _THREADS_SET = True


def worker_init(_worker_id: int) -> None:
    """DataLoader ``worker_init_fn`` used by every loader."""
    one_thread_per_process()


def resize_encode(path: str) -> bytes:
    """Read an image file, set its shorter side to 256 (INTER_AREA to shrink, INTER_CUBIC to
    enlarge, so every stored image can be centre-cropped to 224) and encode JPEG quality 90.

    Every peer writer stores these bytes, so conversion speed and size compare like for like.
    """
    import cv2
    import numpy as np

    one_thread_per_process()
    with open(path, "rb") as f:
        buf = np.frombuffer(f.read(), dtype=np.uint8)
    img = cv2.imdecode(buf, cv2.IMREAD_COLOR)  # BGR; honours EXIF orientation
    if img is None:
        raise ValueError(f"cannot decode {path}")
    h, w = img.shape[:2]
    scale = SHORT_SIDE / min(h, w)
    if scale != 1.0:
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        interp = cv2.INTER_AREA if scale < 1.0 else cv2.INTER_CUBIC
        img = cv2.resize(img, size, interpolation=interp)
    ok, enc = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise ValueError(f"cannot encode {path}")
    return enc.tobytes()


def decode_center_crop(jpeg_bytes: bytes | memoryview) -> Any:
    """Decode JPEG bytes to an RGB ``torch.uint8`` tensor C x H x W = 3 x 224 x 224, centre crop,
    no further resize. The one decode every loader uses (except the ImageFolder baseline)."""
    import cv2
    import numpy as np
    import torch

    img = cv2.imdecode(np.frombuffer(jpeg_bytes, dtype=np.uint8), _IMREAD_RGB or cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError("cannot decode JPEG payload")
    h, w = img.shape[:2]
    if h < CROP or w < CROP:
        raise ValueError(f"image {w}x{h} is smaller than the {CROP}px crop")
    y, x = (h - CROP) // 2, (w - CROP) // 2
    crop = img[y : y + CROP, x : x + CROP]
    if not _IMREAD_RGB:
        crop = cv2.cvtColor(crop, cv2.COLOR_BGR2RGB)
    return torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1)))


def _imread_rgb_flag() -> int:
    """``cv2.IMREAD_COLOR_RGB`` (decode straight to RGB, OpenCV >= 4.10) or 0 when missing."""
    try:
        import cv2
    except ImportError:
        return 0
    return int(getattr(cv2, "IMREAD_COLOR_RGB", 0))


_IMREAD_RGB = _imread_rgb_flag()


# -- source scan, sizes, memory -------------------------------------------------------------------
def scan_source(src: str) -> tuple[list[tuple[str, int]], list[str]]:
    """ImageFolder scan: (path, label) pairs shuffled with a fixed seed, and the class names."""
    import numpy as np

    classes = sorted(d.name for d in os.scandir(src) if d.is_dir())
    if not classes:
        raise ValueError(f"no class folders in {src}")
    items: list[tuple[str, int]] = []
    for label, cls in enumerate(classes):
        folder = os.path.join(src, cls)
        for name in sorted(os.listdir(folder)):
            if name.lower().endswith(IMAGE_EXTS):
                items.append((os.path.join(folder, name), label))
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(items))
    return [items[i] for i in order], classes


def dir_size(path: str) -> int:
    """Bytes of all regular files under ``path``."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            fp = os.path.join(root, name)
            if not os.path.islink(fp):
                total += os.path.getsize(fp)
    return total


def fresh_dir(path: str) -> str:
    """Remove ``path`` if present and return it (the writer creates it)."""
    if os.path.lexists(path):
        shutil.rmtree(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return path


class Monitor:
    """Watches this process tree while a phase runs (conversion or reading).

    ``peak``: the largest summed RSS of this process and all its descendants, sampled on a
    background thread. ``own_cpu``: CPU seconds the tree used (exited, reaped children too). ``other_cores``: CPU used meanwhile by processes outside the tree, in
    cores (system busy time minus the tree's own CPU time, over wall time). On a shared machine
    a value well above 0 means the row was measured under contention.
    """

    def __init__(self, interval: float = RSS_INTERVAL_S) -> None:
        import psutil

        self._proc = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.peak = 0
        self.seconds = 0.0
        self.other_cores = 0.0
        self.own_cpu = 0.0
        self._start: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def _tree(self) -> list[Any]:
        import psutil

        try:
            return [self._proc, *self._proc.children(recursive=True)]
        except psutil.Error:
            return [self._proc]

    def sample(self) -> int:
        import psutil

        total = 0
        for p in self._tree():
            try:
                total += p.memory_info().rss
            except psutil.Error:  # a worker that just exited
                pass
        self.peak = max(self.peak, total)
        return total

    def _cpu(self) -> tuple[float, float, float]:
        """(wall, system busy CPU seconds, this tree's CPU seconds incl. reaped children)."""
        import psutil

        t = psutil.cpu_times()
        busy = (
            sum(t)
            - t.idle
            - getattr(t, "iowait", 0.0)
            - getattr(t, "guest", 0.0)
            - getattr(t, "guest_nice", 0.0)
        )
        own = 0.0
        for p in self._tree():
            try:
                c = p.cpu_times()
            except psutil.Error:
                continue
            own += c.user + c.system + c.children_user + c.children_system
        return time.perf_counter(), busy, own

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._interval)

    def __enter__(self) -> Monitor:
        self._start = self._cpu()
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
        wall, busy, own = (b - a for a, b in zip(self._start, self._cpu()))
        self.seconds = wall
        self.own_cpu = own
        self.other_cores = max(0.0, (busy - own) / wall) if wall > 0 else 0.0


#: Rows measured while other processes used at least this many cores say so in their note.
BUSY_CORES = 0.2


def join_notes(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def time_epochs(
    make_loader: Callable[[], Iterable[Any]], epochs: int, expected: int
) -> dict[str, Any]:
    """Iterate ``epochs`` epochs; return per-epoch img/s, peak tree RSS and notes (short epochs,
    contention). ``make_loader`` is called once; each epoch is a fresh ``iter()`` of the loader.
    """
    rates: list[float] = []
    notes: list[str] = []
    total = 0
    with Monitor() as mon:
        loader = make_loader()
        for epoch in range(epochs):
            seen = 0
            t0 = time.perf_counter()
            for images, _labels in loader:
                seen += len(images)
            dt = time.perf_counter() - t0
            rates.append(seen / dt if dt > 0 else 0.0)
            total += seen
            if seen != expected:
                notes.append(f"epoch {epoch + 1} read {seen} of {expected} images")
    out: dict[str, Any] = {
        "peak_rss_bytes": mon.peak,
        "others_read_cores": mon.other_cores,
        "read_cpu_us": 1e6 * mon.own_cpu / total if total else None,
        "note": join_notes(*notes),
    }
    out["read_e1_img_s"] = rates[0] if rates else None
    out["read_e2_img_s"] = rates[1] if len(rates) > 1 else None
    return out


def loader_kwargs(cfg: BenchConfig, packer_collate: bool = False) -> dict[str, Any]:
    """The DataLoader arguments every system gets; packer's rows add ``packer.datasets.collate``."""
    kwargs = {"batch_size": cfg.batch_size, "num_workers": cfg.workers, "worker_init_fn": worker_init}
    if packer_collate:
        from packer.datasets import collate

        kwargs["collate_fn"] = collate
    return kwargs


def converted_row(
    system: str, n: int, conv: Monitor, size: int, read: dict[str, Any]
) -> dict[str, Any]:
    """A row for a system that converted ``n`` images under ``conv`` and was then read."""
    fields = dict(read)
    fields["others_convert_cores"] = conv.other_cores
    return make_row(
        system,
        convert_img_s=n / conv.seconds if conv.seconds > 0 else None,
        size_bytes=size,
        **fields,
    )


def one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def is_error(row: dict[str, Any]) -> bool:
    return str(row.get("note", "")).startswith("error:")
