"""One rank of the real multi-process test in test_ddp.py; run by torchrun, not by pytest.

    python -m torch.distributed.run --nproc_per_node=2 tests/ddp_worker.py \
        --data PACKED --out DIR --epochs auto,auto,5 --batch-size 3 --workers 2

Reads the packed dataset through StreamingDataset (rank and world size detected from the gloo
process group) and a DataLoader with persistent workers. ``--epochs`` lists the epochs to run:
``auto`` lets the dataset advance on its own, a number is passed to ``set_epoch``. Every step
all-reduces a tensor, as DDP's gradient sync does, so a rank with more steps than another hangs
(and the test's timeout catches it). Writes ``DIR/rank<R>.json`` with what the rank saw.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from packer.datasets import StreamingDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", default="auto,auto")
    p.add_argument("--batch-size", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-samples", type=int, default=0, help="0: partition by whole files")
    p.add_argument("--storage-options", default=None, help="JSON: fsspec options when --data is a URL")
    p.add_argument("--cache-dir", default=None, help="node cache when --data is a URL")
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = StreamingDataset(a.data, batch_size=a.batch_size, seed=a.seed, shuffle_buffer=8,
                          block_samples=a.block_samples or None,
                          **({"storage_options": json.loads(a.storage_options), "cache_dir": a.cache_dir}
                             if a.storage_options else {}))
    loader = DataLoader(ds, batch_size=a.batch_size, num_workers=a.workers,
                        persistent_workers=a.workers > 0)
    record = {"rank": rank, "world_size": dist.get_world_size(), "len": len(ds),
              "padded": ds.padded, "epochs": []}
    for spec in a.epochs.split(","):
        if spec != "auto":
            ds.set_epoch(int(spec))
        pixels: list[int] = []
        labels: list[int] = []
        steps = 0
        for images, targets in loader:
            pixels += images[:, 0, 0, 0].tolist()
            labels += targets.tolist()
            steps += 1
            dist.all_reduce(torch.ones(1))
        record["epochs"].append({"epoch": ds.epoch, "steps": steps, "pixels": pixels,
                                 "labels": labels})
    dist.barrier()
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
