#!/usr/bin/env python3
"""The checks that need a GPU, in one run of at most 6 minutes: ``python tools/gpu_check.py``.

1. builds a tiny dataset (synthetic JPEGs -> LMDB as jpeg:90 and as raw, shorter side 256);
2. runs the CUDA tests of ``prefetch_to_device`` and of the decode path (pytest, ``-k cuda``);
3. measures images/s of (a) CPU decode in 2 DataLoader workers, (b) GPU decode
   (``output="encoded"`` + ``prefetch_to_device(decode=True)``), (c) raw pixels; each for the
   loader alone and feeding a ResNet-18 forward+backward (AMP, channels_last; torchvision.models).

Results go to ``$OUT/gpu_check.json`` (or ``--out``), rewritten after every step. Without CUDA it
says so, writes that, and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import cv2
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET_S = 330  # everything but the last measurement's tail must start before this
CROP, BATCH, CLASSES = 224, 64, 20


class Report:
    """The JSON results file, rewritten whole after every step."""

    def __init__(self, path: str) -> None:
        self.path, self.data = path, {"started": time.strftime("%Y-%m-%d %H:%M:%S")}

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path + ".tmp", "w") as f:
            json.dump(self.data, f, indent=2)
        os.replace(self.path + ".tmp", self.path)
        print(f"{key}: {json.dumps(value)[:300]}", flush=True)


def make_importable() -> None:
    """Make ``packer`` (with ``packer.datasets`` from ``datasets/``, as setup.cfg maps it) importable
    here and in subprocesses when it is not installed: a temporary tree of links, on PYTHONPATH
    (the script starts again with it)."""
    try:
        import packer.datasets  # noqa: F401
        return
    except ImportError:
        pass
    tree = os.path.join(tempfile.mkdtemp(prefix="gpu_check_pkg."), "packer")
    os.makedirs(tree)
    for name in os.listdir(os.path.join(ROOT, "packer")):
        os.symlink(os.path.join(ROOT, "packer", name), os.path.join(tree, name))
    for name in ("datasets", "converters"):
        os.symlink(os.path.join(ROOT, name), os.path.join(tree, name))
    parent = os.path.dirname(tree)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [parent, os.environ.get("PYTHONPATH")]))}
    # Start again with the tree on PYTHONPATH, so this process and every subprocess import it alike.
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def make_folder(root: str, per_class: int, seed: int = 0) -> str:
    """``per_class`` smooth random 320 x 400 JPEGs (quality 95) in each of CLASSES class folders."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:320, 0:400].astype(np.float32)
    for c in range(CLASSES):
        os.makedirs(os.path.join(root, f"c{c:02d}"), exist_ok=True)
        for i in range(per_class):
            a, b, d = rng.uniform(0.01, 0.1, 3)
            img = np.stack([127 + 120 * np.sin(a * x + b * y), 127 + 120 * np.cos(b * x - d * y),
                            127 + 120 * np.sin(d * (x + y))], axis=-1)
            img = np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)
            ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])
            assert ok
            with open(os.path.join(root, f"c{c:02d}", f"{i:05d}.jpg"), "wb") as f:
                f.write(buf.tobytes())
    return root


def convert(src: str, dst: str, encode: str) -> str:
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.pipeline.engine import ConvertOptions, convert_imagefolder

    opts = ConvertOptions(processing=ProcessOptions(resize=parse_resize("shorter:256"),
                                                    encoding=parse_encoding(encode)),
                          workers=min(8, os.cpu_count() or 1), overwrite=True)
    convert_imagefolder(src, dst, "lmdb", opts)
    return dst


def run_cuda_tests(timeout: int) -> dict[str, Any]:
    """pytest ``-k cuda`` over the prefetch and decode tests: exit status and the output's tail."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-k", "cuda",
           "tests/datasets/test_prefetch.py", "tests/datasets/test_encoded.py"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return {"rc": None, "timed_out": True, "tail": str(e.stdout or "")[-3000:]}
    return {"rc": done.returncode, "tail": (done.stdout + done.stderr)[-3000:]}


def crop_transform(image):  # noqa: ANN001, ANN201 - a DataLoader transform must pickle: module level
    from packer.datasets.encoded import center_crop

    return center_crop(image, CROP)


def loader_for(path: str, mode: str):  # noqa: ANN201
    """(a prefetching iterable of (images, labels) on CUDA, normalised, channels_last)."""
    from torch.utils.data import DataLoader

    from packer.datasets import collate, collate_encoded, open_dataset, prefetch_to_device

    norm = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225), "channels_last": True}
    if mode == "gpu_decode":
        ds = open_dataset(path, output="encoded")
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2, collate_fn=collate_encoded,
                            pin_memory=True, persistent_workers=True, drop_last=True)
        return prefetch_to_device(loader, "cuda", decode=True, crop=CROP, **norm)
    ds = open_dataset(path, transform=crop_transform)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2, collate_fn=collate,
                        pin_memory=True, persistent_workers=True, drop_last=True)
    return prefetch_to_device(loader, "cuda", **norm)


def measure(batches, step, seconds: float) -> dict[str, Any]:  # noqa: ANN001
    """images/s over whole epochs of ``batches`` for about ``seconds`` (first batch not timed)."""
    import torch

    images = 0
    start = None
    epochs = 0
    while start is None or time.perf_counter() - start < seconds:
        for x, y in batches:
            step(x, y)
            if start is None:
                torch.cuda.synchronize()
                start = time.perf_counter()
                continue
            images += x.shape[0]
        epochs += 1
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {"images_per_s": round(images / elapsed, 1), "images": images, "seconds": round(elapsed, 2),
            "epochs": epochs}


def resnet_step():  # noqa: ANN201
    """ResNet-18 forward + backward + SGD step under autocast (bf16), channels_last."""
    import torch
    import torchvision

    model = torchvision.models.resnet18(num_classes=CLASSES).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y) -> None:  # noqa: ANN001
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def benchmarks(report: Report, paths: dict[str, str], deadline: float, have_tv: bool) -> None:
    modes = [("cpu_decode_2_workers", "jpeg"), ("raw_pixels", "raw")]
    if have_tv:
        modes.insert(1, ("gpu_decode", "jpeg"))
    step_model = resnet_step() if have_tv else None
    for name, data in modes:
        for with_model in (False, True):
            if with_model and step_model is None:
                continue
            key = f"{name}{'_resnet18_amp' if with_model else '_loader'}"
            if time.monotonic() > deadline:
                report.put(key, {"skipped": "out of time"})
                continue
            try:
                batches = loader_for(paths[data], "gpu_decode" if name == "gpu_decode" else "cpu")
                report.put(key, measure(batches, step_model if with_model else (lambda x, y: None), 20.0))
            except Exception as e:  # a failure is a result here; the next measurement still runs
                report.put(key, {"error": f"{type(e).__name__}: {e}"[:500]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_check.json"))
    parser.add_argument("--per-class", type=int, default=100, help="images per class (20 classes)")
    a = parser.parse_args(argv)
    deadline = time.monotonic() + BUDGET_S
    report = Report(a.out)
    make_importable()
    import torch

    report.put("torch", torch.__version__)
    if not torch.cuda.is_available():
        report.put("error", "CUDA is not available: nothing to check on this machine")
        print("gpu_check: CUDA is not available; run this on a machine with a GPU", file=sys.stderr)
        return 2
    report.put("device", torch.cuda.get_device_name(0))
    try:
        import torchvision

        report.put("torchvision", torchvision.__version__)
        have_tv = True
    except Exception as e:  # an import that fails for any reason: the GPU decode cannot run
        report.put("torchvision", f"not importable: {type(e).__name__}: {e}"[:300])
        have_tv = False
    work = tempfile.mkdtemp(prefix="gpu_check.")
    t = time.perf_counter()
    src = make_folder(os.path.join(work, "src"), a.per_class)
    paths = {"jpeg": convert(src, os.path.join(work, "jpeg"), "jpeg:90"),
             "raw": convert(src, os.path.join(work, "raw"), "raw")}
    report.put("dataset", {"images": CLASSES * a.per_class, "seconds": round(time.perf_counter() - t, 1),
                           "crop": CROP, "batch": BATCH})
    report.put("cuda_tests", run_cuda_tests(timeout=120))
    benchmarks(report, paths, deadline, have_tv)
    report.put("finished", time.strftime("%Y-%m-%d %H:%M:%S"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
