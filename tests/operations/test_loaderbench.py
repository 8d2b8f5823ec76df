"""``packer bench``: measures a grid in interleaved rounds, tells a winner from noise, speaks JSON."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from packer.cli import main
from packer.datasets import collation
from packer.operations.loaderbench import (
    SAME_COLLATE,
    BenchRow,
    CenterCropPad,
    collate_slots,
    decide,
    format_table,
    round_order,
    run_bench,
)
from tests.helpers import pack


def row(workers: int, rounds: list[float], *, collate: str = "default", cache: str = "none", pin: bool = False,
        batch: int = 64) -> BenchRow:
    """A measured setting from synthetic rounds of images/s."""
    return BenchRow(workers, pin, batch, cache, statistics.median(rounds), 1, 0, collate, "transform", rounds)


def test_bench_json_carries_every_round_and_the_decision(tiny_folder, tmp_path, capsys):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "lmdb")
    rc = main(["bench", str(tmp_path / "out"), "--workers", "0,2", "--batch-sizes", "4,8",
               "--cache", "none,decoded", "--samples", "10", "--crop", "32", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    on, reason = collate_slots()
    assert out["collate_slots"] == {"on": on, "reason": reason}
    with_workers = ("packer", "default") if on else (SAME_COLLATE,)
    grid = [(r["cache"], r["num_workers"], r["batch_size"], r["collate"]) for r in out["rows"]]
    assert sorted(grid) == sorted((c, w, b, k) for c in ("none", "decoded") for w in (0, 2) for b in (4, 8)
                                  for k in (with_workers if w else ("default",)))
    assert out["rounds"] == 3 and out["spread"] == "interquartile range of the rounds (inclusive quartiles)"
    for r in out["rows"]:  # the default is three rounds; the row's figure is their median
        lo, mid, hi = sorted(r["images_per_s_rounds"])
        assert lo > 0 and r["images_per_s"] == mid and r["mb_per_s"] > 0
        assert (r["images_per_s_min"], r["images_per_s_max"]) == (lo, hi)
        assert (r["images_per_s_q1"], r["images_per_s_q3"]) == pytest.approx(((lo + mid) / 2, (mid + hi) / 2))
        assert r["spread"] == pytest.approx((hi - lo) / 2)
    d = out["decision"]
    assert out["recommended"] == out["rows"][d["recommended"]] and d["recommended"] in d["tied"]
    assert out["rows"][d["fastest"]]["images_per_s"] == max(r["images_per_s"] for r in out["rows"])
    assert d["clear"] == (d["tied"] == [d["fastest"]]) and d["reason"]


def test_bench_table_shows_median_and_spread_and_says_why(tiny_folder, tmp_path, capsys):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "lmdb")
    rc = main(["bench", str(tmp_path / "out"), "--workers", "0,1", "--batch-sizes", "4", "--cache", "none",
               "--collate", "default", "--samples", "6", "--crop", "24", "--repeats", "4"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "4 rounds per setting, interleaved" in out
    assert "| images/s (median) | spread (IQR) |" in out
    table = [line for line in out.splitlines() if line.startswith("| none |")]
    assert len(table) == 2 and all(line.count("|") == 12 for line in table)
    assert ("recommended: DataLoader(num_workers=" in out or "the cheapest of the tied: DataLoader(num_workers=" in out)
    assert "\nwhy: " in out


def test_bench_with_packers_collate_off_shows_the_two_collates_as_one(tiny_folder, tmp_path, capsys, monkeypatch):
    # a process where packer's collate is torch's default_collate (no memfd_create, or torch internals it
    # cannot use): what bench then measures and says
    monkeypatch.setattr(collation, "_AVAILABLE", False)
    monkeypatch.setattr(collation, "slots_available", lambda: (False, "no memfd_create here"))
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "lmdb")
    args = ["bench", str(tmp_path / "out"), "--workers", "0,1", "--batch-sizes", "4", "--cache", "none",
            "--samples", "6", "--crop", "24"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "shared-memory batches are off in this process (no memfd_create here)" in out
    assert "| 1 | False | 4 | default=packer |" in out and "| packer |" not in out
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["collate_slots"] == {"on": False, "reason": "no memfd_create here"}
    assert [(r["num_workers"], r["collate"]) for r in out["rows"]] == [(0, "default"), (1, SAME_COLLATE)]


def test_bench_refuses_bad_arguments(tmp_path, capsys):
    assert main(["bench", str(tmp_path), "--cache", "all"]) in (1, 2)
    assert main(["bench", str(tmp_path / "nope")]) == 1
    assert main(["bench", str(tmp_path), "--collate", "fast"]) in (1, 2)
    assert main(["bench", str(tmp_path), "--repeats", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--collate" in err[2] and "--repeats takes a whole number of at least 1, got 0" in err[3]
    assert len(err) == 4 and all("Traceback" not in e for e in err)


def test_rounds_are_interleaved_and_alternate_direction():
    assert round_order(3, 3) == [0, 1, 2, 2, 1, 0, 0, 1, 2]
    assert round_order(2, 1) == [0, 1]


def test_overlapping_spreads_name_no_winner_and_pick_the_cheapest():
    rows = [row(8, [900, 1000, 1010]), row(2, [940, 960, 1005]), row(0, [400, 500, 510])]
    d = decide(rows)
    assert not d.clear and d.fastest is rows[0] and d.runner_up is rows[1]
    assert d.tied == rows[:2] and d.recommended is rows[1]  # fewer workers, though its median is lower
    assert "indistinguishable on this machine" in d.reason and "cheapest" in d.reason


def test_separated_spreads_name_the_winner_even_with_more_workers():
    rows = [row(8, [1180, 1200, 1210]), row(2, [940, 960, 1005]), row(0, [400, 500, 510])]
    d = decide(rows)
    assert d.clear and d.recommended is rows[0] and d.tied == [rows[0]] and d.runner_up is rows[1]
    assert "1.25x the next (workers=2)" in d.reason and "more than their two spreads added (15 + 32 img/s" in d.reason


def test_a_lead_within_one_settings_spread_is_no_lead():
    # the runner-up's rounds are steady, the fastest's are not: a lead of 50 inside its spread of 100
    d = decide([row(4, [900, 1000, 1100]), row(2, [948, 950, 952])])
    assert not d.clear and d.recommended.num_workers == 2
    # the runner-up is clearly behind, but a setting further back with a wide spread is tied with the fastest
    rows = [row(4, [1000, 1000, 1001]), row(2, [980, 985, 990]), row(1, [500, 900, 1500])]
    d = decide(rows)
    assert not d.clear and d.tied == [rows[0], rows[2]] and d.recommended is rows[2]


def test_one_stray_round_does_not_hide_a_clear_difference():
    # each setting had one stray round (the machine went busy, then idle): their ranges overlap, but the
    # lead of the medians is larger than the two interquartile ranges added
    rows = [row(2, [2100, 6500, 7000]), row(0, [500, 560, 2500])]
    d = decide(rows)
    assert d.clear and d.recommended is rows[0]


def test_tied_settings_prefer_no_cache_pin_off_and_torchs_collate():
    tie = [900, 1000, 1100]
    rows = [row(2, tie, cache="decoded"), row(2, tie, pin=True), row(2, tie, collate="packer"), row(2, tie)]
    assert decide(rows).recommended is rows[3]
    assert decide(rows[:3]).recommended is rows[2]  # the cache and pinned memory cost more than packer's collate


def test_fewer_than_three_rounds_name_no_winner():
    rows = [row(8, [1000]), row(2, [960]), row(0, [500])]
    d = decide(rows)
    assert not d.clear and d.recommended is rows[1] and "spread is unknown" in d.reason
    assert not decide([row(8, [1000, 1001]), row(0, [500, 501])]).clear
    d = decide([row(2, [1000, 1001, 1002])])
    assert not d.clear and d.recommended.num_workers == 2 and d.runner_up is None


def test_format_table_shows_the_median_the_spread_and_the_decision():
    rows = [row(2, [90, 100, 130]), row(0, [95, 96, 97])]
    text = format_table(rows, decide(rows))
    assert "| 2 | False | 64 | default | 100 | 95-115 (20%) |" in text
    assert text.splitlines()[2].endswith("| tied |") and text.splitlines()[3].endswith("| cheapest of the tied |")


def test_center_crop_pad():
    x = torch.arange(2 * 5 * 7, dtype=torch.uint8).reshape(2, 5, 7)
    assert torch.equal(CenterCropPad(3)(x), x[:, 1:4, 2:5])
    y = CenterCropPad(6)(x)
    assert y.shape == (2, 6, 6) and torch.equal(y[:, :5, :6], x[:, :5, :6]) and y[:, 5].sum() == 0


def test_bench_compares_the_crop_in_the_transform_and_in_the_reader(tiny_folder, tmp_path, capsys):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "lmdb")
    rc = main(["bench", str(tmp_path / "out"), "--workers", "0", "--batch-sizes", "4", "--cache", "none",
               "--samples", "8", "--crop", "24", "--crop-in", "transform,reader"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| crop in |" in out and "| none | reader | 0 |" in out and "| none | transform | 0 |" in out
    assert "DataLoader(num_workers=0" in out
    assert main(["bench", str(tmp_path / "out"), "--crop-in", "model"]) in (1, 2)
    assert "--crop-in takes transform, reader" in capsys.readouterr().err


def test_run_bench_refuses_no_rounds(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "lmdb")
    with pytest.raises(ValueError, match="repeats must be at least 1, got 0"):
        run_bench(str(tmp_path / "out"), repeats=0, progress=False)
