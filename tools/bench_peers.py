#!/usr/bin/env python3
"""Side-by-side benchmark of packer against the tools users would pick instead (torchvision's
ImageFolder, webdataset, NVIDIA DALI's CPU pipeline, litdata, mosaicml-streaming, a bare decode
loop): each converts the same ImageFolder and is read through the same decode and crop. Its rows,
method and the commands that reproduce it: docs/benchmarks.md, section 1."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
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

__all__ = [
    "BenchConfig",
    "decode_center_crop",
    "resize_encode",
    "SYSTEMS",
    "packer_rows",
    "run_system",
    "format_table",
    "main",
]


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


def _loader_kwargs(cfg: BenchConfig, packer_collate: bool = False) -> dict[str, Any]:
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


# -- (a) torchvision ImageFolder ----------------------------------------------------------------
def bench_imagefolder(cfg: BenchConfig) -> dict[str, Any]:
    """The original folder through torchvision's usual pipeline (PIL decode + resize per epoch)."""
    import torch
    from torchvision import datasets, transforms

    tf = transforms.Compose(
        [transforms.Resize(SHORT_SIDE), transforms.CenterCrop(CROP), transforms.PILToTensor()]
    )
    ds = datasets.ImageFolder(cfg.src, transform=tf)
    read = time_epochs(
        lambda: torch.utils.data.DataLoader(ds, shuffle=False, **_loader_kwargs(cfg)),
        cfg.epochs,
        len(ds),
    )
    return make_row("torchvision ImageFolder (PIL)", size_bytes=dir_size(cfg.src), **read)


# -- (b) webdataset ----------------------------------------------------------------------------
def _wds_sample(sample: dict[str, Any]) -> tuple[Any, int]:
    return decode_center_crop(sample["jpg"]), int(sample["cls"])


def write_wds_shards(cfg: BenchConfig, out: str) -> tuple[int, Monitor, list[str]]:
    """ShardWriter (single process) writes the source as tar shards into ``out`` (rewritten).

    Returns (images written, the Monitor of the writing, the shard paths in order). The
    webdataset and DALI rows both read shards written by this function.
    """
    import webdataset as wds

    items, _classes = scan_source(cfg.src)
    fresh_dir(out)
    os.makedirs(out)
    # At least two shards per worker, or a small source leaves a worker idle.
    per_shard = max(1, min(SHARD_SAMPLES, -(-len(items) // (2 * cfg.workers))))
    with (
        Monitor() as conv,
        wds.ShardWriter(
            os.path.join(out, "shard-%06d.tar"),
            maxcount=per_shard,
            maxsize=SHARD_BYTES,
            verbose=0,
        ) as sink,
    ):
        for i, (path, label) in enumerate(items):
            sink.write({"__key__": f"{i:08d}", "jpg": resize_encode(path), "cls": label})
    urls = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar"))
    return len(items), conv, urls


def bench_webdataset(cfg: BenchConfig) -> dict[str, Any]:
    """ShardWriter (single process) to tar shards; wds.WebDataset + map to the shared decode."""
    import torch
    import webdataset as wds

    n, conv, urls = write_wds_shards(cfg, os.path.join(cfg.work, "webdataset"))

    def make_loader() -> Any:
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_wds_sample)
        return torch.utils.data.DataLoader(ds, **_loader_kwargs(cfg))

    return converted_row(
        "webdataset",
        n,
        conv,
        dir_size(os.path.dirname(urls[0])),
        time_epochs(make_loader, cfg.epochs, n),
    )


# -- (b2) NVIDIA DALI, CPU only ------------------------------------------------------------------
#: ``KEY.cls`` holds an ASCII integer; DALI reads it as bytes, padded to this many.
_DALI_LABEL_BYTES = 8
#: Relative crop position that DALI rounds to the shared crop's anchor ((size - 224) // 2).
_DALI_CENTRE = 0.4999


def dali_index(shard: str) -> str:
    """Write DALI's index for one tar shard with DALI's own ``wds2idx`` (installed beside the
    interpreter by the nvidia-dali wheel); returns the index path (``shard`` + ``.idx``)."""
    tool = os.path.join(os.path.dirname(sys.executable), "wds2idx")
    if not os.path.exists(tool):
        raise FileNotFoundError(f"DALI's wds2idx not found next to {sys.executable}")
    index = shard + ".idx"
    subprocess.run([sys.executable, tool, shard, index], check=True, capture_output=True)
    return index


class _DaliEpochs:
    """DALI's PyTorch iterator as an iterable of (images, labels) batches, one epoch per
    ``iter()``: images uint8 N x 3 x 224 x 224, labels int64 parsed from the ASCII ``.cls``."""

    def __init__(self, iterator: Any) -> None:
        self.it = iterator

    def __iter__(self) -> Iterable[tuple[Any, Any]]:
        import torch

        for out in self.it:  # auto_reset: the iterator rewinds itself at the end of an epoch
            images, raw = out[0]["images"], out[0]["labels"].to(torch.int64)
            digit = raw != 0  # zero padding after the ASCII digits
            place = torch.cumsum(digit.flip(1), 1).flip(1) - 1  # decimal place of each digit
            labels = ((raw - 48) * 10 ** place.clamp(min=0) * digit).sum(1)
            yield images, labels


def bench_dali(cfg: BenchConfig) -> dict[str, Any]:
    """NVIDIA DALI's CPU pipeline (no GPU) over tar shards written as the webdataset row's.

    readers.webdataset with DALI's index, decoders.image(device="cpu"), 224 centre crop to CHW
    uint8, ``cfg.workers`` threads, batch ``cfg.batch_size``, read through DALI's PyTorch iterator.
    """
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    n, conv, urls = write_wds_shards(cfg, os.path.join(cfg.work, "dali"))
    t0 = time.perf_counter()
    indexes = [dali_index(u) for u in urls]
    index_s = time.perf_counter() - t0

    @pipeline_def(batch_size=cfg.batch_size, num_threads=cfg.workers, device_id=None)
    def cpu_pipeline() -> Any:
        jpegs, labels = fn.readers.webdataset(
            paths=urls,
            index_paths=indexes,
            ext=["jpg", "cls"],
            missing_component_behavior="error",
            random_shuffle=False,
            name="Reader",
        )
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        # DALI rounds an odd margin's half up, the shared crop down: a position a hair below
        # the centre gives the shared crop's anchor, so the tensors are the same as the others'.
        images = fn.crop_mirror_normalize(
            images,
            crop=(CROP, CROP),
            crop_pos_x=_DALI_CENTRE,
            crop_pos_y=_DALI_CENTRE,
            dtype=types.UINT8,
            output_layout="CHW",
        )
        labels = fn.pad(labels, axes=(0,), shape=(_DALI_LABEL_BYTES,), fill_value=0)
        return images, labels

    def make_loader() -> Any:
        pipe = cpu_pipeline()
        pipe.build()
        return _DaliEpochs(
            DALIGenericIterator(
                pipe,
                ["images", "labels"],
                reader_name="Reader",
                last_batch_policy=LastBatchPolicy.PARTIAL,
                auto_reset=True,
                prepare_first_batch=False,  # the first batch is read inside epoch 1's timing
            )
        )

    read = time_epochs(make_loader, cfg.epochs, n)
    read["note"] = join_notes(
        f"CPU only, {cfg.workers} threads; DALI index (wds2idx) {index_s:.1f} s, not in convert",
        read["note"],
    )
    return converted_row("NVIDIA DALI (CPU pipeline)", n, conv, dir_size(os.path.dirname(urls[0])), read)


# -- (c) litdata ---------------------------------------------------------------------------------
def _litdata_fn(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    return {"image": resize_encode(path), "label": int(label)}


def _litdata_decode(sample: dict[str, Any]) -> tuple[Any, int]:
    return decode_center_crop(sample["image"]), int(sample["label"])


def bench_litdata(cfg: BenchConfig) -> dict[str, Any]:
    """litdata.optimize (2 workers) to chunks; StreamingDataset + StreamingDataLoader."""
    import litdata

    items, _classes = scan_source(cfg.src)
    out = fresh_dir(os.path.join(cfg.work, "litdata"))
    with Monitor() as conv:
        litdata.optimize(
            fn=_litdata_fn,
            inputs=items,
            output_dir=out,
            chunk_bytes=SHARD_BYTES,
            num_workers=cfg.workers,
            reorder_files=False,
            verbose=False,
        )
    size = dir_size(out)
    cache = fresh_dir(os.path.join(cfg.work, "litdata_cache"))

    def make_loader() -> Any:
        ds = litdata.StreamingDataset(
            out, cache_dir=cache, shuffle=False, transform=_litdata_decode
        )
        return litdata.StreamingDataLoader(ds, **_loader_kwargs(cfg))

    return converted_row(
        "litdata", len(items), conv, size, time_epochs(make_loader, cfg.epochs, len(items))
    )


# -- (d) mosaicml-streaming ----------------------------------------------------------------------
def _mds_dataset_class() -> type:
    from streaming import StreamingDataset

    class SharedDecodeMDS(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: int) -> tuple[Any, int]:
            sample = super().__getitem__(index)
            return decode_center_crop(sample["image"]), int(sample["label"])

    return SharedDecodeMDS


def bench_mosaicml(cfg: BenchConfig) -> dict[str, Any]:
    """MDSWriter (single process; image bytes + int label) to MDS shards; local StreamingDataset."""
    import torch
    from streaming import MDSWriter
    from streaming.base.util import clean_stale_shared_memory

    items, _classes = scan_source(cfg.src)
    out = fresh_dir(os.path.join(cfg.work, "mosaicml"))
    columns = {"image": "bytes", "label": "int"}
    with Monitor() as conv, MDSWriter(out=out, columns=columns, size_limit=SHARD_BYTES) as sink:
        for path, label in items:
            sink.write({"image": resize_encode(path), "label": int(label)})
    size = dir_size(out)
    clean_stale_shared_memory()
    cls = _mds_dataset_class()

    def make_loader() -> Any:
        ds = cls(local=out, shuffle=False, batch_size=cfg.batch_size)
        return torch.utils.data.DataLoader(ds, **_loader_kwargs(cfg))

    read = time_epochs(make_loader, cfg.epochs, len(items))
    return converted_row("mosaicml-streaming", len(items), conv, size, read)


# -- (e) bare decode loop ------------------------------------------------------------------------
def bench_bare_decode(cfg: BenchConfig) -> dict[str, Any]:
    """One process, the shared decode over pre-resized JPEG bytes in memory: img/s per core."""
    one_thread_per_process()
    items, _classes = scan_source(cfg.src)
    items = items[: cfg.bare_images] if cfg.bare_images > 0 else items
    payloads = [resize_encode(path) for path, _label in items]
    rates: list[float] = []
    with Monitor() as mon:
        for _epoch in range(cfg.epochs):
            t0 = time.perf_counter()
            for data in payloads:
                decode_center_crop(data)
            rates.append(len(payloads) / (time.perf_counter() - t0))
    return make_row(
        "bare decode (1 process)",
        read_e1_img_s=rates[0],
        read_e2_img_s=rates[1] if len(rates) > 1 else None,
        size_bytes=sum(len(p) for p in payloads),
        peak_rss_bytes=mon.peak,
        others_read_cores=mon.other_cores,
        read_cpu_us=1e6 * mon.own_cpu / (len(payloads) * cfg.epochs),
        note=join_notes(f"{len(payloads)} images in memory; img/s per core"),
    )


# -- packer's own formats, measured in the same run ---------------------------------------------
class _PackerSharedDecode:
    """Map-style view of a packer dataset that decodes stored payloads with the shared decode."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        rec = self.ds.read_record(index)
        return decode_center_crop(rec.payload), int(rec.label)


def packer_rows(cfg: BenchConfig) -> list[dict[str, Any]]:
    """One row per format in packer's registry, same protocol as the peers.

    Converts with packer's engine (``workers=cfg.workers``, shorter:256, jpeg:90) and reads the
    packed dataset map-style (no shuffle) and streaming with packer's reader (see
    _packer_format_rows).
    Returns [] when packer is not importable here or registers no format yet; a format that fails
    gives an error row. New formats appear here by being registered, with no change to this file.
    """
    try:
        from packer.description.registry import format_names
    except ImportError:
        return []
    names = format_names()
    if not names:
        return []
    rows = []
    for fmt in names:
        try:
            rows.extend(_packer_format_rows(cfg, fmt))
        except Exception as exc:  # noqa: BLE001 - one format failing must not stop the others
            rows.append(make_row(f"packer {fmt}", note=f"error: {_one_line(exc)}"))
    try:
        rows.append(_packer_raw_row(cfg))
    except Exception as exc:  # noqa: BLE001
        rows.append(make_row("packer lmdb raw", note=f"error: {_one_line(exc)}"))
    return label_packer_rows(rows)


def collate_slots() -> tuple[bool, str]:
    """Whether ``packer.datasets.collate`` builds batches in shared-memory slots in this process
    (its import-time self-test passed) and, if not, why."""
    from packer.datasets import collation

    state = collation.slots_available()
    if isinstance(state, tuple):
        return bool(state[0]), str(state[1])
    return bool(state), "" if state else "slots_available() is False"


def label_packer_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Name the torch that measured each packer row (packer's rows can run under two torch
    versions in one table) and record whether ``collate``'s shared-memory batches were on."""
    import torch

    on, why = collate_slots()
    for row in rows:
        row["system"] = f"{row['system']} (torch {torch.__version__})"
        row["torch"] = torch.__version__
        if row.get("collate") == "default" or _is_error(row):
            continue
        row["collate_slots"] = on
        state = "collate slots on" if on else f"collate slots OFF: {why}"
        row["note"] = join_notes(state, row.get("note", ""))
    return rows


class _Crop224:
    """Center crop of packer's C x H x W uint8 output to 224 (the shared decode's crop), picklable."""

    def __call__(self, x: Any) -> Any:
        h, w = x.shape[-2:]
        y, left = (h - CROP) // 2, (w - CROP) // 2
        return x[:, y : y + CROP, left : left + CROP]


def _packer_raw_row(cfg: BenchConfig) -> dict[str, Any]:
    """packer's ``raw`` encoding (decoded pixels stored): no decode at read time, same crop."""
    import torch

    from packer.datasets import open_dataset
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.ops.engine import ConvertOptions, convert_imagefolder

    one_thread_per_process()
    out = fresh_dir(os.path.join(cfg.work, "packer_lmdb_raw"))
    opts = ConvertOptions(
        processing=ProcessOptions(resize=parse_resize(f"shorter:{SHORT_SIDE}"), encoding=parse_encoding("raw")),
        workers=cfg.workers, seed=SHUFFLE_SEED, overwrite=True,
    )
    with Monitor() as conv:
        report = convert_imagefolder(cfg.src, out, "lmdb", opts)
    n = report.manifest.num_samples
    ds = open_dataset(out, transform=_Crop224())
    read = time_epochs(
        lambda: torch.utils.data.DataLoader(ds, shuffle=False, **_loader_kwargs(cfg, True)), cfg.epochs, n
    )
    read["note"] = join_notes("raw pixels, packer's own reader (no decode)", read["note"])
    return converted_row("packer lmdb raw", n, conv, dir_size(out), read)


def _packer_format_rows(cfg: BenchConfig, fmt: str) -> list[dict[str, Any]]:
    """Map-style and streaming (``StreamingDataset``) through packer's own reader: the same
    ``cv2.imdecode`` to RGB and the same 224 center crop as the shared decode, giving the same
    uint8 CHW tensors, but without its extra HWC -> CHW copy (``packer.datasets.collate`` writes
    the channels straight into the batch). For lmdb, two more rows isolate the parts: the
    shared decode function itself, and torch's default_collate."""
    import torch

    from packer.datasets import StreamingDataset
    from packer.description.registry import reader_class
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.ops.engine import ConvertOptions, convert_imagefolder

    one_thread_per_process()
    out = fresh_dir(os.path.join(cfg.work, f"packer_{fmt}"))
    opts = ConvertOptions(
        processing=ProcessOptions(
            resize=parse_resize(f"shorter:{SHORT_SIDE}"),
            encoding=parse_encoding(f"jpeg:{JPEG_QUALITY}"),
        ),
        workers=cfg.workers,
        seed=SHUFFLE_SEED,
        overwrite=True,
    )
    with Monitor() as conv:
        report = convert_imagefolder(cfg.src, out, fmt, opts)
    n = report.manifest.num_samples
    ds = reader_class(fmt)(out, transform=_Crop224())
    read = time_epochs(
        lambda: torch.utils.data.DataLoader(ds, shuffle=False, **_loader_kwargs(cfg, True)), cfg.epochs, n
    )
    if report.skipped:
        read["note"] = join_notes(f"{len(report.skipped)} images skipped", read["note"])
    rows = [converted_row(f"packer {fmt}", n, conv, dir_size(out), read)]
    if fmt == "lmdb":
        # Transparency rows: the shared decode function over packer's stored payloads (the exact
        # code the peers run), and packer's reader with torch's default_collate.
        shared = _PackerSharedDecode(reader_class(fmt)(out))
        same = time_epochs(
            lambda: torch.utils.data.DataLoader(shared, shuffle=False, **_loader_kwargs(cfg, True)), cfg.epochs, n
        )
        same["note"] = join_notes("the peers' decode_center_crop over packer's payloads", same["note"])
        rows.append(converted_row(f"packer {fmt}, shared decode", n, conv, dir_size(out), same))
        plain = time_epochs(
            lambda: torch.utils.data.DataLoader(ds, shuffle=False, **_loader_kwargs(cfg)), cfg.epochs, n
        )
        plain["note"] = join_notes("torch's default_collate instead of packer.datasets.collate", plain["note"])
        plain["collate"] = "default"
        rows.append(converted_row(f"packer {fmt}, default_collate", n, conv, dir_size(out), plain))
    stream = StreamingDataset(out, shuffle=False, batch_size=64, transform=_Crop224())
    sread = time_epochs(
        lambda: torch.utils.data.DataLoader(stream, **_loader_kwargs(cfg, True)), cfg.epochs, n
    )
    sread["note"] = join_notes("streaming, no shuffle", sread["note"])
    rows.append(converted_row(f"packer {fmt} streaming", n, conv, dir_size(out), sread))
    return rows


# -- the table of systems ------------------------------------------------------------------------
def _single(
    fn: Callable[[BenchConfig], dict[str, Any]],
) -> Callable[[BenchConfig], list[dict[str, Any]]]:
    def rows(cfg: BenchConfig) -> list[dict[str, Any]]:
        return [fn(cfg)]

    rows.__doc__ = fn.__doc__
    return rows


#: name -> function(cfg) -> rows. Each entry runs in its own child process.
SYSTEMS: dict[str, Callable[[BenchConfig], list[dict[str, Any]]]] = {
    "imagefolder": _single(bench_imagefolder),
    "webdataset": _single(bench_webdataset),
    "dali": _single(bench_dali),
    "litdata": _single(bench_litdata),
    "mosaicml": _single(bench_mosaicml),
    "bare": _single(bench_bare_decode),
    "packer": packer_rows,
}


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def _child(name: str, cfg: BenchConfig, result_path: str) -> int:
    """Run one system in this process and write its rows as JSON."""
    one_thread_per_process()
    try:
        rows = SYSTEMS[name](cfg)
    except Exception as exc:  # noqa: BLE001 - reported in the row
        import traceback

        traceback.print_exc()
        rows = [make_row(name, note=f"error: {_one_line(exc)}")]
    with open(result_path, "w") as f:
        json.dump(rows, f)
    return 0


def wait_for_quiet(max_wait: float, threshold: float = 0.3) -> float:
    """Wait (at most ``max_wait`` s) until other processes use under ``threshold`` cores, measured
    over one second. Returns the load last seen, in cores. The benchmark shares its machine with
    whatever else runs there; rows measured under load say so in their note anyway."""
    import psutil

    deadline = time.monotonic() + max_wait
    while True:
        busy = psutil.cpu_percent(interval=1.0) * (os.cpu_count() or 1) / 100.0
        if busy < threshold or time.monotonic() >= deadline:
            return busy
        time.sleep(2.0)


def run_system(
    name: str, cfg: BenchConfig, timeout: float, python: str | None = None
) -> list[dict[str, Any]]:
    """Run ``SYSTEMS[name]`` in a child process of ``python`` (default: this interpreter);
    failures become a one-line error row."""
    python = python or sys.executable
    logs = os.path.join(cfg.work, "logs")
    os.makedirs(logs, exist_ok=True)
    stem = name if python == sys.executable else f"{name}-{_slug(python)}"
    result = os.path.join(logs, f"{stem}.json")
    log = os.path.join(logs, f"{stem}.log")
    if os.path.exists(result):
        os.remove(result)
    cmd = [
        python,
        os.path.abspath(__file__),
        "--_child",
        name,
        "--_result",
        result,
        "--src",
        cfg.src,
        "--work",
        cfg.work,
        "--bare-images",
        str(cfg.bare_images),
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "w") as logf:
        # A session of its own, so a timeout can stop the child's workers too.
        proc = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return [make_row(name, note=f"error: timed out after {timeout:.0f}s (log: {log})")]
    if proc.returncode == 0 and os.path.exists(result):
        with open(result) as f:
            return list(json.load(f))
    return [
        make_row(
            name, note=f"error: child exited {proc.returncode}: {_last_line(log)} (log: {log})"
        )
    ]


def _slug(path: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in path).strip("_")


def interpreter_torch(python: str) -> str:
    """The torch version ``python`` imports (its metadata; nothing is imported), or a one-line
    reason it cannot run packer's rows. Raises ValueError when ``python`` does not run."""
    code = (
        "import importlib.metadata as m, importlib.util as u\n"
        "print(m.version('torch') if u.find_spec('packer') else 'no packer')"
    )
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"cannot run {python}: {_one_line(exc)}") from None
    if done.returncode != 0:
        raise ValueError(f"{python} has no torch: {_last_text(done.stderr)}")
    version = done.stdout.strip()
    if version == "no packer":
        raise ValueError(f"{python} cannot import packer")
    return version


def _last_text(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no output"


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1][:200] if lines else "no output"


# -- output ---------------------------------------------------------------------------------------
def _num(v: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _mb(v: int | None) -> str:
    return "-" if v is None else f"{v / 1e6:,.1f}"


def row_note(row: dict[str, Any]) -> str:
    """The row's note plus, when the machine was shared, how busy other processes kept it."""
    busy = []
    for key, phase in (("others_convert_cores", "converting"), ("others_read_cores", "reading")):
        v = row.get(key)
        if v is not None and v >= BUSY_CORES:
            busy.append(f"{v:.1f} cores while {phase}")
    extra = f"other processes used {' and '.join(busy)}" if busy else ""
    return join_notes(str(row.get("note", "")), extra)


def merge_runs(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Best of several runs, per system: the highest rate of each column, the lowest outside
    load seen, the highest peak RSS; the read CPU per image is the median, and each run's best
    epoch and CPU per image are kept (``read_runs``, ``cpu_runs``) to show the spread. A system
    that failed in every run keeps its error row."""
    order: list[str] = []
    by_system: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for row in run:
            if row["system"] not in by_system:
                order.append(row["system"])
            by_system.setdefault(row["system"], []).append(row)
    merged = []
    for system in order:
        rows = by_system[system]
        good = [r for r in rows if not _is_error(r)]
        if not good:
            merged.append(rows[-1])
            continue
        out = dict(good[-1])
        for key in ("convert_img_s", "read_e1_img_s", "read_e2_img_s"):
            out[key] = _pick(good, key, max)
        for key in ("others_convert_cores", "others_read_cores"):
            out[key] = _pick(good, key, min)
        out["peak_rss_bytes"] = _pick(good, "peak_rss_bytes", max)
        out["read_runs"] = [_best_epoch(r) for r in good if _best_epoch(r) is not None]
        out["cpu_runs"] = [r["read_cpu_us"] for r in good if r.get("read_cpu_us") is not None]
        out["read_cpu_us"] = _median(out["cpu_runs"]) if out["cpu_runs"] else None
        if len(good) < len(rows):
            failed = f"{len(rows) - len(good)} of {len(rows)} runs failed"
            out["note"] = join_notes(out.get("note", ""), failed)
        merged.append(out)
    return merged


def _best_epoch(row: dict[str, Any]) -> float | None:
    rates = [row[k] for k in ("read_e1_img_s", "read_e2_img_s") if row.get(k) is not None]
    return max(rates) if rates else None


def run_spread(row: dict[str, Any]) -> str:
    """The row's read rate over runs (each run's best epoch) as 'min-max (spread %)', the
    spread relative to the median run; '-' with fewer than two runs."""
    runs = sorted(row.get("read_runs") or [])
    if len(runs) < 2:
        return "-"
    return f"{runs[0]:,.0f}-{runs[-1]:,.0f} ({100 * (runs[-1] - runs[0]) / _median(runs):.0f}%)"


def cpu_cell(row: dict[str, Any]) -> str:
    """Read CPU us/img: one run's value, or the median over runs with their min-max."""
    runs = sorted(row.get("cpu_runs") or [])
    if len(runs) < 2:
        return _num(row.get("read_cpu_us"))
    return f"{_median(runs):,.0f} ({runs[0]:,.0f}-{runs[-1]:,.0f})"


def _median(values: Sequence[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def _is_error(row: dict[str, Any]) -> bool:
    return str(row.get("note", "")).startswith("error:")


def _pick(rows: Sequence[dict[str, Any]], key: str, fn: Callable[[list[Any]], Any]) -> Any:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return fn(vals) if vals else None


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as a markdown table (sizes in MB = 10^6 bytes). With several runs, a column gives
    each row's read rate over the runs (best epoch of each run): min-max and spread."""
    runs = any(len(r.get("read_runs") or []) > 1 for r in rows)
    spread_head, spread_rule = (" read img/s over runs |", "---:|") if runs else ("", "")
    head = [
        "| system | convert img/s | read epoch 1 img/s | read epoch 2 img/s |"
        f"{spread_head} read CPU us/img | size MB | peak RSS MB | note |",
        f"|---|---:|---:|---:|{spread_rule}---:|---:|---:|---|",
    ]
    body = [
        f"| {r['system']} | {_num(r['convert_img_s'])} | {_num(r['read_e1_img_s'])} | "
        f"{_num(r['read_e2_img_s'])} |{f' {run_spread(r)} |' if runs else ''} "
        f"{cpu_cell(r)} | {_mb(r['size_bytes'])} | {_mb(r['peak_rss_bytes'])} | "
        f"{row_note(r).replace('|', '/')} |"
        for r in rows
    ]
    return "\n".join(head + body)


def _versions() -> str:
    out = []
    for mod, label in (
        ("torch", "torch"),
        ("torchvision", "torchvision"),
        ("cv2", "opencv"),
        ("PIL", "pillow"),
        ("webdataset", "webdataset"),
        ("litdata", "litdata"),
        ("streaming", "mosaicml-streaming"),
        ("nvidia.dali", "nvidia-dali"),
    ):
        try:
            import importlib

            m = importlib.import_module(mod)
            out.append(f"{label} {getattr(m, '__version__', '?')}")
        except Exception:  # noqa: BLE001 - a missing library is reported in its row
            out.append(f"{label} missing")
    return ", ".join(out)


def report_markdown(
    rows: Sequence[dict[str, Any]],
    cfg: BenchConfig,
    n_images: int,
    argv: Sequence[str],
    seconds: float,
    repeat: int = 1,
    also: str = "",
) -> str:
    """The report written to ``--out``: command, protocol, machine, table. ``also`` says which
    second interpreter (and torch) ran packer's rows too."""
    best = f" Best of {repeat} runs per column." if repeat > 1 else ""
    best += f" packer's rows also ran under {also}, right after the main interpreter's." if also else ""
    return "\n".join(
        [
            "# Peer benchmark",
            "",
            f"Command: `{' '.join(argv)}`",
            "",
            f"{n_images} images from `{cfg.src}`; shorter side {SHORT_SIDE}, JPEG q{JPEG_QUALITY} (OpenCV) in every "
            f"writer; DataLoader(num_workers={cfg.workers}, batch_size={cfg.batch_size}), {cfg.epochs} epochs, "
            f"decode = cv2 imdecode -> RGB -> centre crop {CROP} -> uint8 CHW tensor (ImageFolder: PIL + "
            f"Resize({SHORT_SIDE}) + CenterCrop({CROP})). Peak RSS summed over the process tree.",
            "",
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; {_versions()}.",
            f"Total wall time: {seconds:.0f} s.{best}",
            "",
            format_table(rows),
            "",
        ]
    )


# -- command line ---------------------------------------------------------------------------------
def _parse_systems(text: str) -> list[str]:
    names = [s for s in text.replace(",", " ").split() if s]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system(s) {', '.join(unknown)}; known: {', '.join(SYSTEMS)}")
    return names


def _schedule(
    systems: Sequence[str], also_python: str | None, run: int
) -> list[tuple[str, str | None]]:
    """(system, interpreter) in the order one run measures them: with a second interpreter,
    packer runs twice in a row, the two interpreters taking turns at going first, so neither
    torch always gets the warmer or the quieter slot."""
    order: list[tuple[str, str | None]] = []
    for name in systems:
        if name == "packer" and also_python:
            pair = [(name, None), (name, also_python)]
            order.extend(pair if run % 2 == 0 else pair[::-1])
        else:
            order.append((name, None))
    return order


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Peer benchmark: convert + read with each peer system "
                                             "(method and rows: docs/benchmarks.md, section 1).")
    ap.add_argument("--src", help="ImageFolder source (root/<class>/<image>)")
    ap.add_argument("--work", help="scratch folder for converted data and logs (rewritten)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of: {', '.join(SYSTEMS)}")
    ap.add_argument("--out", help="write the markdown report here")
    ap.add_argument("--bare-images", type=int, default=2000, help="images held in memory for the bare decode loop")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per system")
    ap.add_argument("--quiet-wait", type=float, default=60.0,
                    help="before each system, wait up to this many seconds for other processes to go idle")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every system this many times and keep the best of each column")
    ap.add_argument("--also-python", metavar="PYTHON",
                    help="run packer's rows a second time with this interpreter (another torch version), "
                         "interleaved with the others; each packer row names its torch")
    ap.add_argument("--list", action="store_true", help="print the system names and exit")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    ap.add_argument("--_result", help=argparse.SUPPRESS)
    return ap


def _checked(args: argparse.Namespace) -> tuple[list[str], str]:
    """The systems to run and the description of ``--also-python``; ValueError saying what is wrong."""
    if not args.src or not args.work:
        raise ValueError("--src and --work are required")
    systems = _parse_systems(args.systems)
    if not os.path.isdir(args.src):
        raise ValueError(f"source folder not found: {args.src}")
    also = ""
    if args.also_python:
        try:
            also = f"{args.also_python} (torch {interpreter_torch(args.also_python)})"
        except ValueError as exc:
            raise ValueError(f"--also-python: {exc}") from None
        if "packer" not in systems:
            raise ValueError("--also-python needs the packer system")
    return systems, also


def _run_all(args: argparse.Namespace, cfg: BenchConfig, systems: list[str]) -> list[dict[str, Any]]:
    """Every system, ``--repeat`` times (packer's rows also under ``--also-python``): the rows."""
    runs: list[list[dict[str, Any]]] = []
    for run in range(args.repeat):
        if args.repeat > 1:
            print(f"run {run + 1} of {args.repeat}", flush=True)
        rows: list[dict[str, Any]] = []
        for name, python in _schedule(systems, args.also_python, run):
            if args.quiet_wait > 0:
                busy = wait_for_quiet(args.quiet_wait)
                if busy >= 0.3:
                    print(f"  (machine busy: others use {busy:.1f} cores; running {name} anyway)")
            t0 = time.perf_counter()
            new = run_system(name, cfg, args.timeout, python)
            for r in new:
                print(f"  {r['system']:30s} convert {_num(r['convert_img_s']):>6s}  "
                      f"read e1 {_num(r['read_e1_img_s']):>6s}  e2 {_num(r['read_e2_img_s']):>6s} img/s  "
                      f"{row_note(r)}", flush=True)
            print(f"  [{name}: {time.perf_counter() - t0:.0f} s]", flush=True)
            rows.extend(new)
        runs.append(rows)
    return merge_runs(runs) if len(runs) > 1 else runs[0]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (``--help``); returns a process exit status."""
    args = _parser().parse_args(argv)
    if args.list:
        for name, fn in SYSTEMS.items():
            print(f"{name:12s} {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    try:
        systems, also = _checked(args)
    except ValueError as exc:
        print(f"bench_peers: error: {exc}", file=sys.stderr)
        return 2
    cfg = BenchConfig(src=os.path.abspath(args.src), work=os.path.abspath(args.work), bare_images=args.bare_images)
    if args._child:
        return _child(args._child, cfg, args._result)
    os.makedirs(cfg.work, exist_ok=True)
    n_images = len(scan_source(cfg.src)[0])
    print(f"{n_images} images, systems: {', '.join(systems)}; work folder {cfg.work}", flush=True)
    if also:
        print(f"packer's rows also run under {also}", flush=True)
    t_all = time.perf_counter()
    rows = _run_all(args, cfg, systems)
    seconds = time.perf_counter() - t_all
    shown_argv = [sys.executable, "tools/bench_peers.py", *(argv if argv is not None else sys.argv[1:])]
    text = report_markdown(rows, cfg, n_images, shown_argv, seconds, args.repeat, also)
    print()
    print(format_table(rows))
    print(f"\ntotal {seconds:.0f} s")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
