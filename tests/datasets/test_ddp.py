"""A real two-rank run: torchrun, gloo, DataLoader workers (persistent), a sharded dataset.

Each rank records what it read (tests/ddp_worker.py); the union over the ranks must be the
dataset plus the reported padding, every epoch, with the same number of steps on both ranks, in
exactly the order the partition plan gives, and a new order each epoch.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from packer.datasets import open_dataset
from packer.description.registry import format_names
from tests.datasets.test_streaming import SHARD, N, convert, expected
from tests.helpers import TESTS, slow_except

HERE = TESTS  # the folder of ddp_worker.py
# Formats with several payload files; LMDB (one file) partitioned by blocks when none exists.
SHARDED = [f for f in ("tar", "tfrecord") if f in format_names()]
# (format, block_samples; 0: whole files); the second sharded format reads through the same
# partition code, so it is in the slow suite
CASES = [pytest.param(f, 0, marks=[pytest.mark.slow] if k else []) for k, f in enumerate(SHARDED)] or [("lmdb", 4)]
EPOCHS = ["auto", "auto", "5"]  # two epochs counted by the workers, then set_epoch(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("fmt,block", CASES)
def test_two_ranks_read_every_sample_once_per_epoch(tmp_path_factory, tmp_path, fmt, block):
    data = convert(tmp_path_factory, fmt)
    if not block:
        shards = open_dataset(data).shard_sizes
        assert len(shards) % 2 == 1 and max(shards) == SHARD > min(shards)  # odd count, uneven
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={free_port()}", os.path.join(HERE, "ddp_worker.py"),
           "--data", data, "--out", str(tmp_path), "--epochs", ",".join(EPOCHS),
           "--batch-size", "3", "--workers", "2", "--block-samples", str(block)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    blocks = {"block": block or None}
    for i, spec in enumerate(EPOCHS):
        epoch = i if spec == "auto" else int(spec)
        seen = collections.Counter()
        for r, rec in enumerate(ranks):
            got = rec["epochs"][i]
            ids = [p // 10 for p in got["pixels"]]
            assert got["epoch"] == epoch
            assert ids == expected(data, rank=r, world_size=2, epoch=epoch, **blocks)
            assert len(ids) == rec["len"] == 12 and got["steps"] == 4
            assert got["labels"] == [i % 2 for i in ids]  # the class folders alternate
            seen.update(ids)
        assert set(seen) == set(range(N)) and sum(seen.values()) == N + ranks[0]["padded"] == 24
    for r in range(2):
        orders = [[p // 10 for p in e["pixels"]] for e in ranks[r]["epochs"]]
        assert orders[0] != orders[1] != orders[2]


SCRIPT = os.path.join(os.path.dirname(HERE), "tools", "train_ddp.py")
MODES = {"map-style": [], "streaming": ["--streaming"]}


def run_script(launcher: list[str], data: str, *args: str) -> str:
    """Run tools/train_ddp.py on the 6 x 6 test images (crop 8: enlarged first); its stdout."""
    cmd = [*launcher, SCRIPT, "--data", data, "--batch-size", "3", "--workers", "2",
           "--size", "8", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("mode", slow_except(MODES, "map-style"))
def test_reference_training_script_runs_on_two_ranks(tmp_path_factory, tmp_path, mode):
    data = convert(tmp_path_factory, "lmdb")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                f"--master_port={free_port()}"]
    checkpoint = str(tmp_path / "ck.pt")
    out = run_script(torchrun, data, "--epochs", "2", "--checkpoint", checkpoint, *MODES[mode])
    for rank in range(2):
        for epoch in range(2):  # 12 samples per rank (23 padded to 24), batches of 3
            assert f"rank {rank}/2 epoch {epoch}: 4 steps, loss " in out
    assert out.count(" img/s, waiting for data ") == 4
    assert all(line.count("rank ") <= 1 for line in out.splitlines())  # ranks' lines never share a line
    state = torch.load(checkpoint)
    assert state["data"]["epoch"] == 2 and state["data"]["samples_consumed"] == 0


@pytest.mark.parametrize("mode", slow_except(MODES, "streaming"))
def test_reference_training_script_resumes_mid_epoch(tmp_path_factory, tmp_path, mode):
    """One process: stop 2 steps into epoch 1 (of 8 steps: 23 samples, batches of 3), resume."""
    data = convert(tmp_path_factory, "lmdb")
    args = ["--epochs", "2", "--checkpoint", str(tmp_path / "ck.pt"), *MODES[mode]]
    first = run_script([sys.executable], data, *args, "--max-steps", "10")
    assert "rank 0/1 epoch 0: 8 steps, loss " in first and ", 23 samples, " in first
    assert "rank 0/1 epoch 1: 2 steps, loss " in first and ", 6 samples, " in first
    second = run_script([sys.executable], data, *args, "--resume")
    assert "rank 0/1: resumed from " in second and " at epoch 1, sample 6 of 23" in second
    assert "rank 0/1 epoch 1: 6 steps, loss " in second and ", 17 samples, " in second
    assert "epoch 0" not in second
