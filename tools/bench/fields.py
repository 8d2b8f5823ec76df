"""Section 11 of docs/benchmarks.md, ``fields``: what reading a mask with the image costs."""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import tempfile
from typing import Any

import cv2
import numpy as np
import torch

from tools.bench.common import FORMATS, Subcommand, cpu_seconds, header, row, turns


def _region_mask(bgr: np.ndarray) -> np.ndarray:
    """A segmentation-like label map of a photo: large regions (blurred gray, 8 levels), 255 at the border."""
    gray = cv2.GaussianBlur(cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY), (0, 0), 6)
    mask = (gray // 32).astype(np.uint8)
    mask[:4], mask[-4:], mask[:, :4], mask[:, -4:] = 255, 255, 255, 255
    return mask


def fields_dataset(src: str, dst: str, count: int, fmt: str) -> None:
    """``count`` images of the image folder ``src`` with region masks, packed to ``dst`` (shorter:256, jpeg:90)."""
    from packer.description.manifest import FIELDS_VERSION, Manifest
    from packer.images.fields import FieldSources, process_sample
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.pipeline.engine import ConvertOptions, write_packed

    opts = ProcessOptions(resize=parse_resize("shorter:256"), encoding=parse_encoding("jpeg:90"))
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs)[:count]

    def items() -> Any:
        for k, path in enumerate(paths):
            with open(path, "rb") as f:
                data = f.read()
            mask = _region_mask(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR))
            png = cv2.imencode(".png", mask)[1].tobytes()
            yield os.path.relpath(path, src), k % 2, process_sample(data, opts, FieldSources(mask=png)), None

    template = Manifest(format=fmt, num_samples=0, classes=["a", "b"], processing=opts.to_json(), files=[],
                        version=FIELDS_VERSION, fields=[{"name": "mask", "kind": "mask"}])
    write_packed(dst, fmt, items(), template, ConvertOptions(processing=opts))


def _read_all(path: str, fields: tuple[str, ...]) -> float:
    """CPU seconds of this process to read every sample of ``path`` with ``fields``."""
    from packer.datasets import open_dataset

    with open_dataset(path, fields=fields) as ds:
        c0 = cpu_seconds()
        for i in range(len(ds)):
            ds[i]
        return cpu_seconds() - c0


def _stored_payloads(path: str) -> list[tuple[bytes, str, int, int, bytes]]:
    """Every sample's stored image (bytes, codec, height, width) and mask PNG."""
    from packer.datasets import open_dataset

    with open_dataset(path) as ds:
        recs = (ds.read_record(i) for i in range(len(ds)))
        return [(bytes(r.payload), r.codec, r.height, r.width, bytes(r.fields[0].payload)) for r in recs]


def _bare_decodes(payloads: list[tuple[bytes, str, int, int, bytes]], what: str) -> float:
    """CPU seconds of a bare loop over stored payloads already in memory: decode the ``mask``
    PNGs alone, the ``image`` alone (packer's decoder), or ``both``, image then mask, sample by
    sample (the work a reader of both cannot avoid, caches included)."""
    from packer.images.imageproc import decode_payload

    c0 = cpu_seconds()
    for data, codec, h, w, mask in payloads:
        if what != "mask":
            torch.from_numpy(decode_payload(data, codec, h, w)).permute(2, 0, 1)
        if what != "image":
            torch.from_numpy(cv2.imdecode(np.frombuffer(mask, np.uint8), cv2.IMREAD_UNCHANGED))
    return cpu_seconds() - c0


def fields(a: argparse.Namespace) -> int:
    """What reading a mask with the image costs: image alone, image + mask, and the mask's PNG decode alone.

    Packs ``--count`` images of ``--src`` (shorter:256, jpeg:90) with a region mask each (a
    label map of large regions, like a segmentation dataset's) into each ``--formats``, then, in
    ``--rounds`` interleaved rounds, reads every sample in this process with
    ``fields=("image", "label")`` and ``fields=("image", "mask", "label")``, and, from payloads
    already in memory, decodes the mask PNGs alone, the images alone and both, image then mask
    per sample. The target: image + mask costs at most image + mask decode (the ratio column at
    most 1). Decoding a JPEG and a PNG in turn costs more than the two apart (caches), which the
    bare loops measure; the last column is what packer adds per mask beyond that.
    """
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="bench-fields-")
    try:
        paths = {}
        for fmt in a.formats:
            paths[fmt] = os.path.join(work, f"f.{fmt}")
            fields_dataset(a.src, paths[fmt], a.count, fmt)
        header("format", "image (us/sample)", "image + mask", "mask PNG decode alone",
               "(image + mask) / (image + decode)", "bare: image, image + mask decodes", "packer's extra per mask")
        for fmt, path in paths.items():
            payloads = _stored_payloads(path)
            runs: dict[str, list[float]] = {k: [] for k in ("image", "both", "mask", "bare_image", "bare_both")}
            for turn in range(a.rounds):
                jobs = {"image": functools.partial(_read_all, path, ("image", "label")),
                        "both": functools.partial(_read_all, path, ("image", "mask", "label")),
                        "mask": functools.partial(_bare_decodes, payloads, "mask"),
                        "bare_image": functools.partial(_bare_decodes, payloads, "image"),
                        "bare_both": functools.partial(_bare_decodes, payloads, "both")}
                for name in turns(list(jobs), turn):
                    runs[name].append(jobs[name]() / a.count * 1e6)
            med = {k: statistics.median(v) for k, v in runs.items()}
            extra = (med["both"] - med["image"]) - (med["bare_both"] - med["bare_image"])
            row(fmt, f"{med['image']:.0f}", f"{med['both']:.0f}", f"{med['mask']:.0f}",
                f"{med['both'] / (med['image'] + med['mask']):.2f}", f"{med['bare_image']:.0f}, {med['bare_both']:.0f}",
                f"{extra:+.0f} us")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _fields_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src", required=True, help="an image folder of photos")
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)


#: subcommand of ``python -m tools.bench_parts`` -> (what it runs, what adds its arguments).
SUBCOMMANDS: dict[str, Subcommand] = {"fields": (fields, _fields_args)}
