"""The Dask example of docs/distributed.md runs as written: its code block is taken from the doc."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, import_optional, make_folder

DOC = os.path.join(ROOT, "docs", "distributed.md")


def example_code() -> str:
    """The one ```python block of the doc's "Example: Dask's local cluster" section."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    section = text.split("### Example: Dask's local cluster", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the Dask section should hold exactly one Python block"
    return blocks[0]


@pytest.mark.slow
def test_dask_example_runs_as_written(tmp_path):
    import_optional("dask.distributed", "the [dask] extra is not installed")
    from packer.datasets import open_dataset

    src = str(tmp_path / "src")
    make_folder(src, {"cat": [(f"c{i}.jpg", 24, 32) for i in range(5)], "dog": [(f"d{i}.png", 20, 20) for i in range(4)],
                      "eel": [("e0.jpg", 16, 16)]})
    script = tmp_path / "dask_convert.py"
    script.write_text(example_code())
    dst = str(tmp_path / "out.tar")
    out = subprocess.run([sys.executable, str(script), src, dst, "3"], capture_output=True, text=True, timeout=600,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "samples per part: [3, 3, 4]" in out.stdout and f"{dst}: 10 samples" in out.stdout
    ds = open_dataset(dst)
    keys = [ds.read_record(i).key for i in range(len(ds))]
    assert ds.classes == ["cat", "dog", "eel"]
    assert keys == [f"cat/c{i}.jpg" for i in range(5)] + [f"dog/d{i}.png" for i in range(4)] + ["eel/e0.jpg"]
    assert [ds[i][1] for i in range(len(ds))] == [0] * 5 + [1] * 4 + [2]
    assert sorted(os.listdir(tmp_path)) == ["dask_convert.py", "out.tar", "src"]  # the parts are removed
