#!/usr/bin/env python3
"""Train a tiny CNN on a packed dataset with DistributedDataParallel: the reference script.

    torchrun --nproc_per_node=2 tools/train_ddp.py --data PACKED_DIR --epochs 2
    torchrun --nproc_per_node=2 tools/train_ddp.py --data PACKED_DIR --streaming --epochs 2
    python tools/train_ddp.py --data PACKED_DIR          # one process, no torchrun needed

Two ways to read, the same training loop:

* map-style (default): ``open_dataset`` + ``DistributedSampler``, ``sampler.set_epoch(e)``;
* ``--streaming``: ``StreamingDataset`` (partitions by itself over ranks and workers; pass the
  DataLoader's batch size to it), ``ds.set_epoch(e)``.

GPU with NCCL when CUDA is available (one GPU per process, ``LOCAL_RANK``), else CPU with gloo.
Every rank prints its steps and mean loss per epoch; every rank runs the same number of steps.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from packer.datasets import StreamingDataset, open_dataset

try:
    from packer.datasets.seeding import seed_worker
except ImportError:  # older packer without the seeding helpers
    seed_worker = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="packed dataset directory")
    p.add_argument("--streaming", action="store_true", help="use StreamingDataset")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--size", type=int, default=64, help="images are resized to SIZE x SIZE")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


# -- processes and devices ----------------------------------------------------------------------
def setup_distributed() -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes (if any); return (rank, world size, device)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    if "RANK" not in os.environ:  # plain `python train_ddp.py`: one process
        return 0, 1, device
    dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def cleanup_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# -- data -----------------------------------------------------------------------------------------
def resize_uint8(image: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 C x H x W -> uint8 C x size x size (runs in the DataLoader workers)."""
    x = F.interpolate(image[None].float(), size=(size, size), mode="bilinear", antialias=True)
    return x[0].round_().clamp_(0, 255).to(torch.uint8)


def build_loader(args: argparse.Namespace, device: torch.device):
    """(loader, object whose set_epoch(e) must be called each epoch, number of classes)."""
    transform = functools.partial(resize_uint8, size=args.size)
    sampler = None
    if args.streaming:
        dataset = StreamingDataset(args.data, batch_size=args.batch_size, seed=args.seed,
                                   transform=transform)
        epoch_setter = dataset
    else:
        dataset = open_dataset(args.data, transform=transform)
        # DistributedSampler reads rank and world size from the process group (one rank: 0, 1).
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                     seed=args.seed)
        epoch_setter = sampler
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=args.workers > 0,
        worker_init_fn=seed_worker if args.workers > 0 else None,
        generator=torch.Generator().manual_seed(args.seed),
    )
    return loader, epoch_setter, len(dataset.classes)


# -- model and training ---------------------------------------------------------------------------
def build_model(num_classes: int, device: torch.device) -> nn.Module:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    ).to(device)
    if dist.is_initialized():
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def to_device(images: torch.Tensor, labels: torch.Tensor, device: torch.device):
    """uint8 images -> float in [0, 1] on the device (non_blocking with pinned memory)."""
    images = images.to(device, non_blocking=True).float().div_(255)
    return images, labels.to(device, non_blocking=True)


def train_one_epoch(model, loader, optimizer, device) -> tuple[int, float, int]:
    """One pass over this rank's data; returns (steps, mean loss, samples)."""
    model.train()
    steps, loss_sum, samples = 0, 0.0, 0
    for images, labels in loader:
        images, labels = to_device(images, labels, device)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
        loss_sum += loss.item()
        samples += len(labels)
    return steps, loss_sum / max(steps, 1), samples


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = setup_distributed()
    try:
        torch.manual_seed(args.seed)
        loader, epoch_setter, num_classes = build_loader(args, device)
        model = build_model(num_classes, device)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        for epoch in range(args.epochs):
            epoch_setter.set_epoch(epoch)  # a new order every epoch, the same on every rank
            start = time.perf_counter()
            steps, loss, samples = train_one_epoch(model, loader, optimizer, device)
            rate = samples / (time.perf_counter() - start)
            print(f"rank {rank}/{world} epoch {epoch}: {steps} steps, loss {loss:.4f}, "
                  f"{samples} samples, {rate:.0f} img/s", flush=True)
    finally:
        cleanup_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
