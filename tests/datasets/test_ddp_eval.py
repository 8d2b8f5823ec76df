"""Exactly-once evaluation on three real torchrun ranks (gloo) over 1,001 samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.datasets.test_ddp import free_port
from tests.datasets.test_streaming_modes import numbered
from tests.helpers import TESTS

HERE = TESTS  # the folder of ddp_eval_worker.py


@pytest.mark.slow
def test_three_ranks_evaluate_every_sample_once(tmp_path_factory, tmp_path):
    data = numbered(tmp_path_factory, 1001, "eval")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3",
           f"--master_port={free_port()}", os.path.join(HERE, "ddp_eval_worker.py"),
           "--data", data, "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    want = {"sum": sum(range(1001)), "count": 1001}
    for kind in ("stream", "map"):
        reads = [rec[kind] for rec in ranks]
        assert [len(r) for r in reads] == [334, 334, 333]
        assert sorted(sum(reads, [])) == list(range(1001))  # each once, nothing padded
        for rec in ranks:  # every rank gathered the same pairs, which add up to the dataset
            gathered = rec[f"{kind}_gathered"]
            assert gathered == ranks[0][f"{kind}_gathered"]
            total = {k: sum(g[k] for g in gathered) for k in want}
            assert total == want
    assert [rec["len"] for rec in ranks] == [334, 334, 333]
