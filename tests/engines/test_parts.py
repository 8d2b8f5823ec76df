"""The parts an engine's tasks make, and their merge, run in this process as a task and the driver
run them (no Ray or Spark needed): parts streamed shard by shard into moto's S3 server on
127.0.0.1 or a shared folder, the worker's own disk holding about two shards at most whatever the
part's size, the merge in the bucket equal to a one-process ``packer.pack``, sample for sample,
and the seeded write order the engines sort by equal to pack's."""

from __future__ import annotations

import os
import threading

import cv2
import numpy as np
import pytest

import packer
from packer.description.manifest import read_manifest
from packer.engines.parts import discard_parts, merge_parts, plan_parts, write_part, write_positions
from tests.helpers import moto_s3

CLASSES = ("a", "b", "c")


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on 127.0.0.1 with the bucket ``out``: the storage_options to reach it."""
    with moto_s3("out") as endpoint:
        yield {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


def jpeg_rows(n: int, seed: int = 0) -> list[dict]:
    """JPEG file bytes of noise (so each is a few KB), class names, keys and metadata."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ok, buf = cv2.imencode(".jpg", rng.integers(0, 255, (24 + i % 3, 32, 3), dtype=np.uint8))
        out.append({"image": buf.tobytes(), "label": CLASSES[i % 3], "key": f"img-{i:04d}", "step": i})
    return out


def samples(ds) -> list[tuple]:
    """Each sample's key, label, stored bytes and metadata, in order."""
    out = []
    for i in range(len(ds)):
        rec = ds.read_record(i)
        out.append((rec.key, rec.label, bytes(rec.payload), ds[i]["meta"]))
    return out


def one_process(rows, tmp_path, fmt: str, **options) -> list[tuple]:
    dst = str(tmp_path / f"one.{fmt}")
    packer.pack(rows, dst, fmt, classes=CLASSES, quiet=True, workers=1, **options)
    return samples(packer.open_dataset(dst, fields=("meta",), as_dict=True))


class Peak:
    """The most bytes seen at once in the files under a folder, sampled every 2 ms."""

    def __init__(self, folder: str) -> None:
        self.folder, self.most, self.stop = folder, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(0.002):
            total = 0
            for root, _, names in os.walk(self.folder):
                for n in names:
                    try:
                        total += os.path.getsize(os.path.join(root, n))
                    except OSError:
                        pass
            self.most = max(self.most, total)

    def __enter__(self) -> Peak:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def test_parts_stream_their_shards_to_s3_and_merge_there(s3, tmp_path):
    rows = jpeg_rows(360)
    work = str(tmp_path / "worker")
    os.makedirs(work)
    options = {"resize": "shorter:20", "encode": "jpeg:90", "shard_samples": 40}
    plan = plan_parts("ray", "s3://out/sets/train.tar", "tar", classes=CLASSES, options=options,
                      storage_options=s3, local_dir=work)
    with Peak(work) as peak:
        results = [write_part(plan, k, rows[k * 120:(k + 1) * 120]) for k in (2, 0, 1)]  # any order of finishing
    report = merge_parts(plan, results)
    assert report.manifest.num_samples == 360 and report.manifest.source["kind"] == "ray"
    import fsspec

    fs = fsspec.filesystem("s3", **s3)
    fs.get("out/sets/train.tar/", str(tmp_path / "got.tar"), recursive=True)
    ds = packer.open_dataset(str(tmp_path / "got.tar"), fields=("meta",), as_dict=True)
    assert samples(ds) == one_process(rows, tmp_path, "tar", **options, no_shuffle=True)
    shard = max(f.bytes for f in report.manifest.files if f.samples)
    assert 0 < peak.most <= 2 * shard + 64 * 1024, (peak.most, shard)  # each part held 3 shards' worth
    assert max(r["local_peak"] for r in results) <= 2 * shard + 64 * 1024
    assert os.listdir(work) == []  # nothing left on the worker
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls("out/sets", refresh=True)) == ["train.tar"]  # staging gone
    with pytest.raises(FileExistsError, match="already holds a packed dataset"):
        plan_parts("ray", "s3://out/sets/train.tar", "tar", classes=CLASSES, storage_options=s3)
    again = plan_parts("ray", "s3://out/sets/train.tar", "tar", classes=CLASSES, options=options, storage_options=s3,
                       overwrite=True)
    assert merge_parts(again, [write_part(again, 0, rows[:50])]).manifest.num_samples == 50
    left = sorted(p.rsplit("/", 1)[1] for p in fs.ls("out/sets/train.tar", refresh=True))
    assert left == ["manifest.json", "samples.table", "shard-000000.pkidx", "shard-000000.tar", "shard-000001.pkidx",
                    "shard-000001.tar"]  # the old dataset's nine shards are gone
    with pytest.raises(ValueError, match="needs classes="):
        plan_parts("ray", "s3://out/sets/other.tar", "tar", storage_options=s3)


def test_a_shared_folder_gets_the_shards_as_they_fill_and_lmdb_stays_whole(tmp_path):
    rows = jpeg_rows(240, seed=1)
    work, shared = str(tmp_path / "worker"), tmp_path / "shared"
    os.makedirs(work)
    options = {"resize": "shorter:20", "encode": "jpeg:90", "shard_samples": 40}
    plan = plan_parts("spark", str(shared / "t.tfrecord"), "tfrecord", classes=CLASSES, options=options,
                      local_dir=work)
    with Peak(work) as peak:
        results = [write_part(plan, k, rows[k * 120:(k + 1) * 120]) for k in (0, 1)]
    report = merge_parts(plan, results)
    got = samples(packer.open_dataset(str(shared / "t.tfrecord"), fields=("meta",), as_dict=True))
    assert got == one_process(rows, tmp_path, "tfrecord", **options, no_shuffle=True)
    shard = max(f.bytes for f in report.manifest.files if f.samples)
    assert peak.most <= 2 * shard + 64 * 1024
    assert sorted(os.listdir(shared)) == ["t.tfrecord"]
    # LMDB writes one file: the part stays on the worker until it is finished, then moves whole
    plan = plan_parts("spark", str(shared / "t.lmdb"), "lmdb", classes=CLASSES, options={"resize": "shorter:20"},
                      local_dir=work)
    results = [write_part(plan, k, rows[k * 120:(k + 1) * 120]) for k in (0, 1)]
    assert min(r["local_peak"] for r in results) > 100 * 1000  # the whole part's records
    merge_parts(plan, results)
    got = samples(packer.open_dataset(str(shared / "t.lmdb"), fields=("meta",), as_dict=True))
    assert got == one_process(rows, tmp_path, "lmdb", resize="shorter:20", no_shuffle=True)


def test_a_failed_attempt_and_an_empty_task_leave_nothing(tmp_path):
    rows = jpeg_rows(20)
    plan = plan_parts("ray", str(tmp_path / "o.tar"), "tar", classes=CLASSES)
    orphan = write_part(plan, 0, rows[:10])  # an attempt whose result never reached the driver
    results = [write_part(plan, 0, rows[:10]), write_part(plan, 1, rows[10:]), write_part(plan, 2, [])]
    assert orphan["part"] != results[0]["part"] and results[2]["part"] is None
    merge_parts(plan, results)
    assert len(packer.open_dataset(str(tmp_path / "o.tar"))) == 20
    assert sorted(os.listdir(tmp_path)) == ["o.tar"]
    with pytest.raises(TypeError, match="'resume' is not taken"):
        plan_parts("ray", str(tmp_path / "x.tar"), "tar", options={"resume": True})
    bad = plan_parts("ray", str(tmp_path / "x.tar"), "tar", classes=CLASSES)
    with pytest.raises(ValueError, match="task 0 row 1: a row needs 'image' and 'label'"):
        write_part(bad, 0, [rows[0], {"image": rows[1]["image"]}])
    discard_parts(bad)
    assert sorted(os.listdir(tmp_path)) == ["o.tar"]


def test_seeded_positions_are_packs_write_order(tmp_path):
    rows = jpeg_rows(30)
    positions = write_positions(30, 7)
    assert sorted(positions) == list(range(30)) and positions != list(range(30))
    placed = [row for _, row in sorted(zip(positions, rows), key=lambda pr: pr[0])]
    plan = plan_parts("ray", str(tmp_path / "s.tar"), "tar", classes=CLASSES, seed=7)
    report = merge_parts(plan, [write_part(plan, 0, placed[:13]), write_part(plan, 1, placed[13:])])
    assert read_manifest(str(tmp_path / "s.tar")).shuffle_seed == 7 == report.manifest.shuffle_seed
    got = samples(packer.open_dataset(str(tmp_path / "s.tar"), fields=("meta",), as_dict=True))
    assert got == one_process(rows, tmp_path, "tar", seed=7)


def test_seeded_parts_equal_packer_convert_of_the_folder(tmp_path):
    src = tmp_path / "src"
    rows = []
    for i, r in enumerate(jpeg_rows(24, seed=3)):
        folder = src / r["label"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:03d}.jpg").write_bytes(r["image"])
    for c in CLASSES:  # the order an image folder is listed in: classes, then files, sorted
        rows += [{"image": str(src / c / f), "label": c, "key": f"{c}/{f}"} for f in sorted(os.listdir(src / c))]
    packer.convert("imagefolder", "tar", str(src), str(tmp_path / "one.tar"), seed=4, resize="shorter:16", quiet=True,
                   workers=1, no_torchrun=True)
    placed = [row for _, row in sorted(zip(write_positions(len(rows), 4), rows), key=lambda pr: pr[0])]
    plan = plan_parts("spark", str(tmp_path / "parts.tar"), "tar", classes=CLASSES, seed=4,
                      options={"resize": "shorter:16"})
    merge_parts(plan, [write_part(plan, k, placed[k * 8:(k + 1) * 8]) for k in range(3)])
    one = packer.open_dataset(str(tmp_path / "one.tar"), fields=("meta",), as_dict=True)
    assert samples(packer.open_dataset(str(tmp_path / "parts.tar"), fields=("meta",), as_dict=True)) == samples(one)


def test_lmdb_parts_in_a_bucket_are_merged_on_the_driver_and_uploaded(s3, tmp_path):
    rows = jpeg_rows(30, seed=4)
    plan = plan_parts("spark", "s3://out/l.lmdb", "lmdb", classes=CLASSES, storage_options=s3,
                      options={"resize": "shorter:16"}, local_dir=str(tmp_path))
    report = merge_parts(plan, [write_part(plan, k, rows[k * 10:(k + 1) * 10]) for k in range(3)])
    assert report.output == "s3://out/l.lmdb" and report.manifest.source["kind"] == "spark"
    import fsspec

    fs = fsspec.filesystem("s3", **s3)
    fs.get("out/l.lmdb/", str(tmp_path / "got.lmdb"), recursive=True)
    got = samples(packer.open_dataset(str(tmp_path / "got.lmdb"), fields=("meta",), as_dict=True))
    assert got == one_process(rows, tmp_path, "lmdb", resize="shorter:16", no_shuffle=True)
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls("out", refresh=True) if "l.lmdb" in p) == ["l.lmdb"]
