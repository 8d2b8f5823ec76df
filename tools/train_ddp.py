#!/usr/bin/env python3
"""Train a small ResNet on a packed dataset with DistributedDataParallel: the reference script.

    torchrun --nproc_per_node=2 tools/train_ddp.py --data PACKED --epochs 2
    torchrun --nproc_per_node=2 tools/train_ddp.py --data PACKED --streaming --epochs 2
    python tools/train_ddp.py --data PACKED --epochs 1      # one process, no torchrun needed
    python tools/train_ddp.py --data PACKED --checkpoint ck.pt --resume   # continue a run

It applies every point of docs/guide.md's "Using packed data in your DataLoader", each marked
``# [n]`` where it is applied (the numbers are the list's there).

Every rank prints its steps, mean loss, samples, throughput and the share of time it waited for
data, per epoch; every rank runs the same number of steps.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import sys
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from packer.datasets import (
    StreamingDataset,
    collate,
    open_dataset,
    prefetch_to_device,
    seed_everything,
    seed_worker,
    worker_rng,
)

# Per-channel normalisation in 0..1 units (ImageNet's); applied on the device, see [5].
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="packed dataset directory")
    p.add_argument("--streaming", action="store_true", help="read with StreamingDataset")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--size", type=int, default=112, help="training crop, SIZE x SIZE")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--partition", choices=("pad", "drop"), default="pad",
                   help="equal samples per rank by repeating (pad) or leaving out (drop) a few")
    p.add_argument("--cache", choices=("none", "encoded", "decoded"), default="none",
                   help="keep samples in RAM shared by the workers of a rank")
    p.add_argument("--cache-bytes", default=None, help="cache bound, e.g. 2GB (default: auto)")
    p.add_argument("--amp", choices=("auto", "off", "bf16", "fp16"), default="auto",
                   help="autocast dtype; auto: bf16 (fp16 if unsupported) on CUDA, off on CPU")
    p.add_argument("--checkpoint", default=None, help="save the run here (rank 0)")
    p.add_argument("--save-every", type=int, default=0,
                   help="also save every N steps, mid-epoch (0: at the end of each epoch only)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint if it exists")
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop (and save) after N steps in this run, as a preemption would")
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume needs --checkpoint")
    return args


# -- processes and devices [1] --------------------------------------------------------------------
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


# -- data [2]-[5], [7] ----------------------------------------------------------------------------
class RandomCropFlip:
    """Random ``size`` x ``size`` crop and horizontal flip of a uint8 C x H x W tensor.

    A class, not a lambda, so it pickles to spawned workers. It holds no generator: a Generator
    made here would be copied into every worker, which would then all draw the same crops [3].
    ``worker_rng()`` is this worker's own stream (distinct per worker and rank, reproducible).
    Images already have their final scale from packing (``--resize shorter:N``), so this only
    slices; an image smaller than the crop is first enlarged (a fallback, not the fast path).
    """

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        size = self.size
        _, h, w = image.shape
        if min(h, w) < size:
            scale = size / min(h, w)
            h, w = max(size, round(h * scale)), max(size, round(w * scale))
            x = F.interpolate(image[None].float(), size=(h, w), mode="bilinear")
            image = x[0].round_().clamp_(0, 255).to(torch.uint8)
        rng = worker_rng()
        top, left = int(rng.integers(0, h - size + 1)), int(rng.integers(0, w - size + 1))
        image = image[:, top:top + size, left:left + size]
        return image.flip(-1) if rng.random() < 0.5 else image


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` whose next epoch can start part-way, to resume mid-epoch [8].

    The skipped indices are dropped from the index list: their samples are never read.
    """

    skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        super().set_epoch(epoch)
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.skip, None)

    def __len__(self) -> int:
        return self.num_samples - self.skip


def build_dataset(args: argparse.Namespace, rank: int, world: int):
    """(dataset, the object whose set_epoch(epoch) starts each epoch)."""
    reader_kwargs = {"transform": RandomCropFlip(args.size)}
    if args.cache != "none":  # [7] decoded pixels are cached; the crop still differs each epoch
        reader_kwargs.update(cache=args.cache, cache_bytes=args.cache_bytes)
    if args.streaming:
        # [2] The dataset partitions over ranks and workers itself; its batch_size must be the
        # DataLoader's, so that ds.state_dict(samples_consumed) describes what the loop consumed.
        dataset = StreamingDataset(args.data, batch_size=args.batch_size, seed=args.seed,
                                   partition=args.partition, **reader_kwargs)
        return dataset, dataset
    dataset = open_dataset(args.data, **reader_kwargs)
    # [2] Every rank gets len(dataset) / world indices (padded or dropped to be equal), in an
    # order fixed by (seed, epoch): the same on every rank, disjoint between ranks.
    sampler = ResumableSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                               seed=args.seed, drop_last=args.partition == "drop")
    return dataset, sampler


def build_loader(args: argparse.Namespace, dataset, sampler, rank: int,
                 device: torch.device) -> DataLoader:
    workers = args.workers
    return DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=None if args.streaming else sampler,
        num_workers=workers,  # [4] measured with `python -m packer bench`, not guessed
        pin_memory=device.type == "cuda",  # [4][5] page-locked batches: async host-to-GPU copy
        persistent_workers=workers > 0,  # [4] no worker start-up (and cache loss) each epoch
        # [3] distinct streams per worker and rank; the rank is passed so spawn workers know it
        worker_init_fn=functools.partial(seed_worker, rank=rank) if workers > 0 else None,
        generator=torch.Generator().manual_seed(args.seed),  # [3] the workers' base seed
        collate_fn=collate,  # [4] batches in reused shared memory: no page faults per batch
    )


# -- model [6] ------------------------------------------------------------------------------------
class Block(nn.Module):
    """A ResNet basic block: two 3x3 convolutions and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def tiny_resnet(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, num_classes),
    )


def build_model(num_classes: int, device: torch.device) -> tuple[nn.Module, nn.Module]:
    """(the model to train, wrapped in DDP under torchrun; the bare model, for checkpoints)."""
    model = tiny_resnet(num_classes).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)  # [6] matches the prefetched input
    if not dist.is_initialized():
        return model, model
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids), model


def autocast_dtype(choice: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for full float32 [6].

    CUDA: bf16 where supported (no loss scaling needed), else fp16 with a GradScaler. CPU: off
    by default. CPU autocast pays off only on CPUs with native bf16 (AVX512-BF16, AMX), where it
    was about 1.5x faster than float32 for this model; without them bf16 is emulated and can be
    slower. A CPU run is usually a test or a debugging session, where float32 numbers are the
    reference, so it is opt-in: ``--amp bf16``.
    """
    if choice == "off" or (choice == "auto" and device.type != "cuda"):
        return None
    if choice == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if choice == "fp16" and device.type != "cuda":
        raise SystemExit("--amp fp16 needs CUDA; use --amp bf16 (or off) on a CPU")
    return torch.bfloat16 if choice == "bf16" else torch.float16


# -- checkpoints [8] ------------------------------------------------------------------------------
def data_position(args, dataset, sampler, epoch: int, consumed: int) -> dict:
    """Where the data stands after ``consumed`` samples of this rank's current pass."""
    if args.streaming:
        # Counts from this pass's start; the dataset adds what a resume skipped, and rolls over
        # to the next epoch when the epoch is complete.
        return dataset.state_dict(samples_consumed=consumed)
    done = sampler.skip + consumed
    if done >= sampler.num_samples:
        epoch, done = epoch + 1, 0
    return {"epoch": epoch, "samples_consumed": done, "world_size": sampler.num_replicas}


def save_checkpoint(path: str, model: nn.Module, optimizer, scaler, args, position: dict) -> None:
    """Rank 0 writes the run; a temporary file and a rename, so a crash never leaves half a file.

    Every rank has the same weights (DDP) and the same data position (equal per-rank counts),
    so one copy serves all ranks.
    """
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scaler": scaler.state_dict(), "data": position,
             "streaming": args.streaming, "batch_size": args.batch_size}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_checkpoint(path: str, model: nn.Module, optimizer, scaler, args, dataset, sampler,
                    device: torch.device) -> tuple[int, int]:
    """Restore the run; return (epoch, samples of it already consumed on each rank)."""
    state = torch.load(path, map_location=device)
    if (state["streaming"], state["batch_size"]) != (args.streaming, args.batch_size):
        raise SystemExit(f"{path} was saved with streaming={state['streaming']}, batch size "
                         f"{state['batch_size']}; resume with the same settings")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    data = state["data"]
    if args.streaming:
        try:
            dataset.load_state_dict(data)  # checks dataset, seed, world size; nothing is read
        except ValueError as e:
            raise SystemExit(f"{path}: {e}") from None
    elif data["samples_consumed"] and data["world_size"] != sampler.num_replicas:
        raise SystemExit(f"{path} stopped mid-epoch with {data['world_size']} ranks; resume it "
                         f"with as many")
    return data["epoch"], data["samples_consumed"]


# -- training [6] ---------------------------------------------------------------------------------
def train_one_epoch(model, batches, optimizer, scaler, amp: torch.dtype | None,
                    device: torch.device, on_step) -> tuple[int, float, int, float]:
    """One pass over this rank's data; returns (steps, mean loss, samples, seconds waiting).

    ``on_step(steps, samples)`` runs after each step and returns True to stop the pass early.
    """
    model.train()
    steps, samples, waited = 0, 0, 0.0
    loss_sum = torch.zeros((), device=device)
    ready = time.perf_counter()
    for images, labels in batches:  # already on the device, normalised, channels_last [5]
        waited += time.perf_counter() - ready
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)  # frees the gradients instead of writing zeros
        scaler.scale(loss).backward()  # the scaler is a no-op unless fp16
        scaler.step(optimizer)
        scaler.update()
        loss_sum += loss.detach()  # stays on the device: .item() here would wait for the GPU
        steps += 1
        samples += len(labels)
        if on_step(steps, samples):
            break
        ready = time.perf_counter()
    return steps, loss_sum.item() / max(steps, 1), samples, waited


def say(line: str) -> None:
    """Print one line with one write() call, so the lines of several ranks sharing a terminal or
    a pipe never interleave within a line (print() may write the text and the newline apart)."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def resume_point(args, bare: nn.Module, optimizer, scaler, dataset, sampler, device: torch.device,
                 rank: int, world: int) -> tuple[int, int]:
    """(epoch, samples of it already trained) to start from: the checkpoint's with ``--resume``
    where it exists [8], else (0, 0)."""
    if not (args.resume and os.path.exists(args.checkpoint)):
        return 0, 0
    start_epoch, skip = load_checkpoint(args.checkpoint, bare, optimizer, scaler, args,
                                        dataset, sampler, device)
    per_rank = len(dataset) if args.streaming else sampler.num_samples
    say(f"rank {rank}/{world}: resumed from {args.checkpoint} at epoch {start_epoch}, "
        f"sample {skip} of {per_rank}")
    return start_epoch, skip


def main(argv: list[str] | None = None) -> int:
    """Train ``--epochs`` epochs on this rank; 0."""
    args = parse_args(argv)
    rank, world, device = setup_distributed()
    try:
        # [3] Before anything random; the same seed on every rank (DDP also broadcasts rank 0's
        # initial weights), the ranks' data streams differ through the sampler and seed_worker.
        seed_everything(args.seed)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # [6] fixed input shape: pick fast kernels once
        dataset, epoch_setter = build_dataset(args, rank, world)
        sampler = None if args.streaming else epoch_setter
        loader = build_loader(args, dataset, sampler, rank, device)
        # [5] uint8 batches are copied ahead on a side stream and normalised on the device; on a
        # CPU this is a passthrough that normalises on the CPU, so the script runs anywhere.
        batches = prefetch_to_device(loader, device, mean=MEAN, std=STD,
                                     channels_last=device.type == "cuda")
        model, bare = build_model(len(dataset.classes), device)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        amp = autocast_dtype(args.amp, device)
        scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)

        start_epoch, skip = resume_point(args, bare, optimizer, scaler, dataset, sampler, device, rank, world)
        total_steps = 0
        for epoch in range(start_epoch, args.epochs):
            # [2] A new order every epoch, the same on every rank. The streaming dataset keeps a
            # loaded position for this epoch; the sampler is told what to skip.
            if args.streaming:
                dataset.set_epoch(epoch)
            else:
                sampler.set_epoch(epoch, skip if epoch == start_epoch else 0)

            def on_step(steps: int, samples: int, epoch: int = epoch) -> bool:
                nonlocal total_steps
                total_steps += 1
                stop = args.max_steps > 0 and total_steps >= args.max_steps
                if args.checkpoint and (stop or (args.save_every and steps % args.save_every == 0)):
                    position = data_position(args, dataset, sampler, epoch, samples)
                    save_checkpoint(args.checkpoint, bare, optimizer, scaler, args, position)
                return stop

            start = time.perf_counter()
            steps, loss, samples, waited = train_one_epoch(model, batches, optimizer, scaler,
                                                           amp, device, on_step)
            seconds = time.perf_counter() - start
            say(f"rank {rank}/{world} epoch {epoch}: {steps} steps, loss {loss:.4f}, "
                f"{samples} samples, {samples / seconds:.0f} img/s, "
                f"waiting for data {waited / seconds:.0%}")
            if args.max_steps > 0 and total_steps >= args.max_steps:
                say(f"rank {rank}/{world}: stopped after {total_steps} steps (--max-steps)")
                break
            if args.checkpoint:
                position = data_position(args, dataset, sampler, epoch, samples)
                save_checkpoint(args.checkpoint, bare, optimizer, scaler, args, position)
    finally:
        cleanup_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
