"""Section 1 of docs/benchmarks.md (the peers), the training pipeline: ``RandomResizedCrop(224)``
(scale 0.08-1, ratio 3/4-4/3) and a random horizontal flip, uint8 CHW, batch 64, 2 workers or 2
threads, 2 epochs, for packer (``crop=`` on lmdb and tar, and a torchvision v2 ``transform``),
webdataset + OpenCV, NVIDIA DALI's CPU ``decoders.image_random_crop``, FFCV's
``RandomResizedCropRGBImageDecoder`` and a bare one-core loop.

Every system reads the same JPEG bytes: packer converts the ImageFolder once per storage size
(``--store-side``, shorter side, JPEG q90) and the webdataset, DALI and FFCV stores are written
from that lmdb's payloads (FFCV's writer re-encodes the decoded pixels at q90: it takes arrays)."""

from __future__ import annotations

import math
import os
import random
import time
from typing import Any

from tools.bench.peers_protocol import (
    CROP,
    JPEG_QUALITY,
    SHUFFLE_SEED,
    BenchConfig,
    Monitor,
    dir_size,
    fresh_dir,
    join_notes,
    loader_kwargs,
    make_row,
    one_thread_per_process,
    time_epochs,
)

SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def window(height: int, width: int, rng: Any = random) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a RandomResizedCrop window, the rule torchvision documents: ten tries
    of a random area (``SCALE`` of the image) and log-uniform aspect ratio (``RATIO``), then the
    centre crop clamped to the ratio range."""
    area = height * width
    lo, hi = math.log(RATIO[0]), math.log(RATIO[1])
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(lo, hi))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    ratio = width / height
    if ratio < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif ratio > RATIO[1]:
        h, w = height, round(height * RATIO[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def crop_flip(rgb: Any) -> Any:
    """The peers' crop on a decoded H x W x 3 RGB array: a RandomResizedCrop window, OpenCV
    ``INTER_AREA`` to 224 x 224 (packer's default interpolation), a random flip, CHW uint8 tensor."""
    import cv2
    import numpy as np
    import torch

    top, left, h, w = window(*rgb.shape[:2])
    out = cv2.resize(rgb[top:top + h, left:left + w], (CROP, CROP), interpolation=cv2.INTER_AREA)
    if random.random() < 0.5:
        out = out[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(out.transpose(2, 0, 1)))


def _decode_rgb(data: bytes) -> Any:
    import cv2
    import numpy as np

    img = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR_RGB)
    if img is None:
        raise ValueError("cannot decode JPEG payload")
    return img


# -- the stores ----------------------------------------------------------------------------------
def packed(cfg: BenchConfig, fmt: str) -> str:
    """packer's ``fmt`` conversion of the source at ``cfg.side`` (shorter side, JPEG q90), made
    once per work folder and reused by every row of every run."""
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.pipeline.engine import ConvertOptions, convert_imagefolder

    out = os.path.join(cfg.work, f"train{cfg.side}", f"packer_{fmt}")
    done = out + ".done"
    if not os.path.exists(done):
        fresh_dir(out)
        opts = ConvertOptions(
            processing=ProcessOptions(resize=parse_resize(f"shorter:{cfg.side}"),
                                      encoding=parse_encoding(f"jpeg:{JPEG_QUALITY}")),
            workers=cfg.workers, seed=SHUFFLE_SEED, overwrite=True)
        convert_imagefolder(cfg.src, out, fmt, opts)
        open(done, "w").close()
    return out


def payloads(cfg: BenchConfig) -> list[tuple[bytes, int]]:
    """(JPEG bytes, label) of every sample of packer's lmdb conversion, in its order."""
    from packer.datasets import open_dataset

    with open_dataset(packed(cfg, "lmdb")) as ds:
        return [(bytes(rec.payload), int(rec.label)) for rec in map(ds.read_record, range(len(ds)))]


def wds_shards(cfg: BenchConfig) -> list[str]:
    """webdataset tar shards (``ShardWriter``) of :func:`payloads`, two per worker at least,
    written once per work folder; DALI reads the same shards."""
    import webdataset as wds

    out = os.path.join(cfg.work, f"train{cfg.side}", "wds")
    if not os.path.exists(out + ".done"):
        items = payloads(cfg)
        fresh_dir(out)
        os.makedirs(out)
        per_shard = max(1, -(-len(items) // (2 * cfg.workers)))
        with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
            for i, (data, label) in enumerate(items):
                sink.write({"__key__": f"{i:08d}", "jpg": data, "cls": label})
        open(out + ".done", "w").close()
    return sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar"))


# -- the rows ------------------------------------------------------------------------------------
def _flip() -> Any:
    from torchvision.transforms import v2

    return v2.RandomHorizontalFlip()


def train_packer(cfg: BenchConfig) -> list[dict[str, Any]]:
    """packer, ``crop=RandomResizedCrop(224)`` + a v2 flip in ``transform`` (lmdb and tar,
    map-style), and the same with ``interpolation="linear"`` and as a v2 ``Compose`` (fused)."""
    import torch
    from torchvision.transforms import v2

    from packer.datasets import open_dataset
    from packer.datasets.crops import RandomResizedCrop

    one_thread_per_process()
    rows = []
    ways = [
        ("lmdb", "crop=RandomResizedCrop(224)", lambda p: open_dataset(p, crop=RandomResizedCrop(CROP), transform=_flip())),
        ("tar", "crop=RandomResizedCrop(224)", lambda p: open_dataset(p, crop=RandomResizedCrop(CROP), transform=_flip())),
        ("lmdb", "crop=, interpolation=\"linear\"",
         lambda p: open_dataset(p, crop=RandomResizedCrop(CROP, interpolation="linear"), transform=_flip())),
        ("lmdb", "v2 Compose([RandomResizedCrop(224), RandomHorizontalFlip()]) (fused)",
         lambda p: open_dataset(p, transform=v2.Compose([v2.RandomResizedCrop(CROP), v2.RandomHorizontalFlip()]))),
    ]
    for fmt, what, opener in ways:
        path = packed(cfg, fmt)
        ds = opener(path)
        n = len(ds)
        read = time_epochs(lambda ds=ds: torch.utils.data.DataLoader(ds, shuffle=False, **loader_kwargs(cfg, True)),
                           cfg.epochs, n)
        rows.append(make_row(f"train: packer {fmt}, {what}", size_bytes=dir_size(path), **read))
    return rows


def _wds_train(sample: dict[str, Any]) -> tuple[Any, int]:
    return crop_flip(_decode_rgb(sample["jpg"])), int(sample["cls"])


def train_webdataset(cfg: BenchConfig) -> dict[str, Any]:
    """webdataset over the same JPEG bytes: OpenCV decode, the window, INTER_AREA, flip."""
    import torch
    import webdataset as wds

    urls = wds_shards(cfg)
    n = len(payloads(cfg))

    def make_loader() -> Any:
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_wds_train)
        return torch.utils.data.DataLoader(ds, **loader_kwargs(cfg))

    return make_row("train: webdataset + OpenCV", size_bytes=dir_size(os.path.dirname(urls[0])),
                    **time_epochs(make_loader, cfg.epochs, n))


def train_bare(cfg: BenchConfig) -> dict[str, Any]:
    """One process: simplejpeg whole decode, the window, OpenCV INTER_AREA to 224, over the
    JPEG bytes in memory (``--bare-images`` of them): img/s per core."""
    import cv2
    import simplejpeg

    one_thread_per_process()
    items = [d for d, _ in payloads(cfg)]
    items = items[: cfg.bare_images] if cfg.bare_images > 0 else items
    rates = []
    with Monitor() as mon:
        for _ in range(cfg.epochs):
            t0 = time.perf_counter()
            for data in items:
                rgb = simplejpeg.decode_jpeg(data, colorspace="rgb")
                top, left, h, w = window(*rgb.shape[:2])
                cv2.resize(rgb[top:top + h, left:left + w], (CROP, CROP), interpolation=cv2.INTER_AREA)
            rates.append(len(items) / (time.perf_counter() - t0))
    return make_row("train: bare loop (simplejpeg + window + INTER_AREA, 1 process)",
                    read_e1_img_s=rates[0], read_e2_img_s=rates[-1], peak_rss_bytes=mon.peak,
                    others_read_cores=mon.other_cores,
                    read_cpu_us=1e6 * mon.own_cpu / (len(items) * cfg.epochs),
                    note=f"{len(items)} images in memory; img/s per core")


class _DaliBatches:
    """DALI's PyTorch iterator as (images, labels) batches, one epoch per ``iter()``."""

    def __init__(self, iterator: Any) -> None:
        self.it = iterator

    def __iter__(self) -> Any:
        for out in self.it:
            yield out[0]["images"], out[0]["labels"]


def train_dali(cfg: BenchConfig) -> dict[str, Any]:
    """NVIDIA DALI's CPU pipeline over the webdataset row's shards: ``decoders.image_random_crop``
    (the window decoded alone; area 0.08-1, ratio 3/4-4/3), ``resize`` to 224 x 224 (DALI's
    default: linear, antialiased), ``crop_mirror_normalize`` with a coin-flip mirror to CHW
    uint8; ``cfg.workers`` threads, batch ``cfg.batch_size``."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    from tools.bench.peers_systems import dali_index

    urls = wds_shards(cfg)
    indexes = [u + ".idx" if os.path.exists(u + ".idx") else dali_index(u) for u in urls]
    n = len(payloads(cfg))

    @pipeline_def(batch_size=cfg.batch_size, num_threads=cfg.workers, device_id=None)
    def pipe() -> Any:
        jpegs, labels = fn.readers.webdataset(paths=urls, index_paths=indexes, ext=["jpg", "cls"],
                                              random_shuffle=False, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=list(SCALE), random_aspect_ratio=list(RATIO))
        images = fn.resize(images, resize_x=CROP, resize_y=CROP)
        images = fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(), dtype=types.UINT8,
                                          output_layout="CHW")
        return images, fn.pad(labels, axes=(0,), shape=(8,), fill_value=0)

    def make_loader() -> Any:
        p = pipe()
        p.build()
        return _DaliBatches(DALIGenericIterator(p, ["images", "labels"], reader_name="Reader",
                                                last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True,
                                                prepare_first_batch=False))

    read = time_epochs(make_loader, cfg.epochs, n)
    read["note"] = join_notes(f"CPU only, {cfg.workers} threads; threads live across epochs", read["note"])
    return make_row("train: NVIDIA DALI CPU, image_random_crop + resize", size_bytes=dir_size(os.path.dirname(urls[0])),
                    **read)


def train_ffcv(cfg: BenchConfig) -> list[dict[str, Any]]:
    """FFCV: a .beton of the same images (``RGBImageField(write_mode="jpg", jpeg_quality=90)``,
    FFCV re-encoding the decoded pixels), read with ``RandomResizedCropRGBImageDecoder((224,
    224))`` (scale 0.08-1, ratio 3/4-4/3: its defaults), ``RandomHorizontalFlip``, ``ToTensor``,
    ``ToTorchImage``; ``cfg.workers`` workers, sequential order, batch ``cfg.batch_size``. With
    ``cfg.ffcv_warm``, a second row times the same after one untimed epoch (numba's compile)."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter

    items = payloads(cfg)
    path = os.path.join(cfg.work, f"train{cfg.side}", "ffcv.beton")
    if not os.path.exists(path + ".done"):

        class Source:
            def __len__(self) -> int:
                return len(items)

            def __getitem__(self, i: int) -> tuple[Any, int]:
                return _decode_rgb(items[i][0]), items[i][1]

        writer = DatasetWriter(path, {"image": RGBImageField(write_mode="jpg", jpeg_quality=JPEG_QUALITY),
                                      "label": IntField()}, num_workers=cfg.workers)
        writer.from_indexed_dataset(Source())
        open(path + ".done", "w").close()

    def make_loader() -> Any:
        return Loader(path, batch_size=cfg.batch_size, num_workers=cfg.workers, order=OrderOption.SEQUENTIAL,
                      drop_last=False, os_cache=True,
                      pipelines={"image": [RandomResizedCropRGBImageDecoder((CROP, CROP)), RandomHorizontalFlip(),
                                           ToTensor(), ToTorchImage()],
                                 "label": [IntDecoder(), ToTensor()]})

    read = time_epochs(make_loader, cfg.epochs, len(items))
    rows = [make_row("train: FFCV, RandomResizedCropRGBImageDecoder", size_bytes=os.path.getsize(path), **read)]
    if not cfg.ffcv_warm:
        return rows
    # numba compiles FFCV's pipeline in its first epoch: one untimed epoch first, so that the CPU
    # per image of the timed ones compares with the other rows'.
    loader = make_loader()
    for _ in loader:
        pass
    warm = time_epochs(lambda: loader, cfg.epochs, len(items))
    warm["note"] = join_notes("after one untimed epoch (numba's compile)", warm["note"])
    rows.append(make_row("train: FFCV, after a compile epoch", size_bytes=os.path.getsize(path), **warm))
    return rows


#: name -> function(cfg) -> rows, each run in its own child process by tools.bench_peers.
TRAIN_SYSTEMS = {
    "train-packer": train_packer,
    "train-webdataset": train_webdataset,
    "train-dali": train_dali,
    "train-ffcv": train_ffcv,  # a list of rows
    "train-bare": train_bare,
}
