"""``packer bench``: measures a grid, recommends a setting, speaks JSON."""

from __future__ import annotations

import json

import torch

from packer.ops.cli import main
from packer.ops.engine import ConvertOptions, convert_imagefolder
from packer.ops.loaderbench import BenchRow, CenterCropPad, recommend


def test_bench_json_covers_the_grid(tiny_folder, tmp_path, capsys):
    src, pixels = tiny_folder
    convert_imagefolder(src, tmp_path / "out", "lmdb", ConvertOptions())
    rc = main(["bench", str(tmp_path / "out"), "--workers", "0,2", "--batch-sizes", "4,8",
               "--cache", "none,decoded", "--samples", "10", "--crop", "32", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    grid = {(r["cache"], r["num_workers"], r["batch_size"], r["collate"]) for r in out["rows"]}
    assert grid == {(c, w, b, k) for c in ("none", "decoded") for w in (0, 2) for b in (4, 8)
                    for k in (("packer", "default") if w else ("default",))}
    assert all(r["images_per_s"] > 0 and r["mb_per_s"] > 0 for r in out["rows"])
    assert out["recommended"] in out["rows"]


def test_bench_refuses_bad_arguments(tmp_path, capsys):
    assert main(["bench", str(tmp_path), "--cache", "all"]) in (1, 2)
    assert main(["bench", str(tmp_path / "nope")]) == 1
    assert main(["bench", str(tmp_path), "--collate", "fast"]) in (1, 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert "--collate" in err[2]
    assert len(err) == 3 and all("Traceback" not in e for e in err)


def test_recommend_prefers_fewer_workers_within_five_percent():
    rows = [BenchRow(8, False, 64, "none", 1000, 1, 0), BenchRow(2, False, 64, "none", 960, 1, 0),
            BenchRow(0, False, 64, "none", 500, 1, 0)]
    assert recommend(rows).num_workers == 2


def test_recommend_prefers_torchs_collate_unless_packers_is_faster():
    rows = [BenchRow(2, False, 64, "none", 1000, 1, 0, "packer"), BenchRow(2, False, 64, "none", 980, 1, 0, "default")]
    assert recommend(rows).collate == "default"
    rows[1].images_per_s = 700
    assert recommend(rows).collate == "packer"


def test_center_crop_pad():
    x = torch.arange(2 * 5 * 7, dtype=torch.uint8).reshape(2, 5, 7)
    assert torch.equal(CenterCropPad(3)(x), x[:, 1:4, 2:5])
    y = CenterCropPad(6)(x)
    assert y.shape == (2, 6, 6) and torch.equal(y[:, :5, :6], x[:, :5, :6]) and y[:, 5].sum() == 0


def test_bench_compares_the_crop_in_the_transform_and_in_the_reader(tiny_folder, tmp_path, capsys):
    src, _ = tiny_folder
    convert_imagefolder(src, tmp_path / "out", "lmdb", ConvertOptions())
    rc = main(["bench", str(tmp_path / "out"), "--workers", "0", "--batch-sizes", "4", "--cache", "none",
               "--samples", "8", "--crop", "24", "--crop-in", "transform,reader"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| crop in |" in out and "| none | reader | 0 |" in out and "| none | transform | 0 |" in out
    assert "recommended: DataLoader(num_workers=0" in out
    assert main(["bench", str(tmp_path / "out"), "--crop-in", "model"]) in (1, 2)
    assert "--crop-in takes transform, reader" in capsys.readouterr().err
