"""One rank of the exactly-once evaluation test in test_ddp_eval.py; run by torchrun, not pytest.

    python -m torch.distributed.run --nproc_per_node=3 tests/ddp_eval_worker.py --data D --out DIR

Evaluates twice, as docs/guide.md's "Evaluation under DDP" shows: through
``StreamingDataset(partition="exact")`` and through a map-style dataset with
``ExactDistributedSampler``. Each rank sums a per-sample "metric" (the sample's number) and
counts its samples, then ``all_gather_object`` collects every rank's pair. Writes
``DIR/rank<R>.json`` with the numbers the rank read and the gathered pairs.
"""

from __future__ import annotations

import argparse
import json
import os

import torch.distributed as dist
from torch.utils.data import DataLoader

from packer.datasets import ExactDistributedSampler, StreamingDataset, open_dataset


def evaluate(loader: DataLoader) -> tuple[list[int], list[dict[str, int]]]:
    """The numbers this rank read, and every rank's (sum, count) gathered."""
    read: list[int] = []
    for images, _ in loader:
        read += (images[:, 0, 0, 0].long() + 256 * images[:, 1, 0, 0].long()).tolist()
    mine = {"sum": sum(read), "count": len(read)}
    gathered: list[dict[str, int]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, mine)
    return read, gathered


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    dist.init_process_group("gloo")
    streaming = StreamingDataset(a.data, partition="exact", shuffle=False, batch_size=16)
    stream_read, stream_gathered = evaluate(
        DataLoader(streaming, batch_size=16, num_workers=2))
    mapped = open_dataset(a.data)
    sampler = ExactDistributedSampler(mapped)
    map_read, map_gathered = evaluate(
        DataLoader(mapped, batch_size=16, sampler=sampler, num_workers=2))
    record = {"len": len(streaming), "stream": stream_read, "stream_gathered": stream_gathered,
              "map": map_read, "map_gathered": map_gathered}
    with open(os.path.join(a.out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(record, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
