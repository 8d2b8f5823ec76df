"""Section 7 of docs/benchmarks.md, ``v2-fusion``: a torchvision v2 ``RandomResizedCrop`` + flip
pipeline in ``transform``, fused into the decode, against packer's ``crop=`` and the same
pipeline unfused (``fuse_crop=False``), through a DataLoader."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from tools.bench.common import Subcommand, header, row


def _systems(size: int) -> dict[str, Callable[[str], Any]]:
    """name -> how it opens the dataset: the three ways to get RandomResizedCrop(size) + a flip."""
    from torchvision.transforms import v2

    from packer.datasets import open_dataset
    from packer.datasets.crops import RandomResizedCrop

    def pipeline() -> Any:
        return v2.Compose([v2.RandomResizedCrop(size), v2.RandomHorizontalFlip()])

    return {
        "crop=": lambda p: open_dataset(p, crop=RandomResizedCrop(size), transform=v2.RandomHorizontalFlip()),
        "v2 fused": lambda p: open_dataset(p, transform=pipeline()),
        "v2 fused, fuse_crop=\"opencv\"": lambda p: open_dataset(p, transform=pipeline(), fuse_crop="opencv"),
        "v2 unfused": lambda p: open_dataset(p, transform=pipeline(), fuse_crop=False),
    }


def epoch_rate(ds: Any, batch: int, workers: int) -> float:
    """Images per second of one epoch through a DataLoader of ``workers`` (packer's collate),
    timed from the first batch (worker start-up left out)."""
    import torch
    from torch.utils.data import DataLoader

    from packer.datasets import collate

    loader = DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=collate, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    first = next(it)
    start, seen = time.perf_counter(), 0
    for images, _ in it:
        seen += len(images)
    del first
    return seen / (time.perf_counter() - start)


def v2_fusion(a: argparse.Namespace) -> int:
    """A v2 RandomResizedCrop + flip pipeline, fused into the decode, against crop= and unfused.

    Each round times one epoch of each system in turn (the order rotating from round to round),
    DataLoader with ``--workers`` workers and packer's ``collate``, uint8 batches of
    ``--batch``; the table gives the median img/s and the ratios to ``crop=``, per round and
    median. Make the data with ``make_imagefolder.py OUT --classes 4 --per-class 500`` and
    ``python -m packer convert imagefolder lmdb OUT DST --resize shorter:256``.
    """
    systems = _systems(a.size)
    rates: dict[str, list[float]] = {name: [] for name in systems}
    for path in a.datasets:
        names = list(systems)
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                with systems[name](path) as ds:
                    rates[name].append(epoch_rate(ds, a.batch, a.workers))
        print(f"\n{os.path.basename(path.rstrip('/'))}: {a.rounds} rounds, {a.workers} workers, batch {a.batch}, "
              f"load {os.getloadavg()[0]:.1f}\n")
        header("system", "img/s (median)", "/ crop= (median of rounds)", "/ crop= per round")
        base = rates["crop="]
        for name, got in rates.items():
            per_round = [g / b for g, b in zip(got, base)]
            row(name, f"{statistics.median(got):.0f}", f"{statistics.median(per_round):.2f}",
                " ".join(f"{x:.2f}" for x in per_round))
        rates = {name: [] for name in systems}
    return 0


def _v2_fusion_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("datasets", nargs="+", help="packed datasets (JPEG, shorter side 256)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)


SUBCOMMANDS: dict[str, Subcommand] = {"v2-fusion": (v2_fusion, _v2_fusion_args)}
