"""Section 1 of docs/benchmarks.md (the peers): each peer system's row (torchvision ImageFolder,
webdataset, NVIDIA DALI's CPU pipeline, litdata, mosaicml-streaming, a bare decode loop)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

from tools.bench.peers_protocol import (
    CROP,
    SHARD_BYTES,
    SHARD_SAMPLES,
    SHORT_SIDE,
    BenchConfig,
    Monitor,
    converted_row,
    decode_center_crop,
    dir_size,
    fresh_dir,
    join_notes,
    loader_kwargs,
    make_row,
    one_thread_per_process,
    resize_encode,
    scan_source,
    time_epochs,
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
        lambda: torch.utils.data.DataLoader(ds, shuffle=False, **loader_kwargs(cfg)),
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
        return torch.utils.data.DataLoader(ds, **loader_kwargs(cfg))

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
        return litdata.StreamingDataLoader(ds, **loader_kwargs(cfg))

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
        return torch.utils.data.DataLoader(ds, **loader_kwargs(cfg))

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
