"""Ray Data writes packer datasets through ``packer.ray.Sink`` and reads them through
``packer.ray.Source``, on a real local Ray cluster (2 CPUs): the merged result equals a
one-process ``packer.pack`` of the same rows sample for sample, a failed attempt leaves nothing
in it, and reading gives every sample back split over read tasks."""

from __future__ import annotations

import os

import numpy as np
import pytest

import packer
from packer.description.manifest import read_manifest
from tests.helpers import ROOT, import_optional

ray = import_optional("ray", "the [ray] extra (Ray Data) is not installed")
import_optional("ray.data", "the [ray] extra (Ray Data) is not installed")
CLASSES = ("a", "b", "c")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs for the module, order preserved (as the docs advise)."""
    # the workers import this module (a Sink subclass below) as the driver does
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    yield ray
    ray.shutdown()


def rows(n: int) -> list[dict]:
    """Photos as arrays (sizes vary), class names, a key and metadata."""
    rng = np.random.default_rng(0)
    return [{"image": rng.integers(0, 255, (20 + i % 5, 24, 3), dtype=np.uint8), "label": CLASSES[i % 3],
             "key": f"img-{i:04d}", "step": i} for i in range(n)]


def samples(path: str) -> list[tuple]:
    """Each sample's key, label, stored bytes and metadata, in order."""
    ds = packer.open_dataset(path, fields=("key", "label", "meta"), as_dict=True)
    out = []
    for i in range(len(ds)):
        rec = ds.read_record(i)
        out.append((rec.key, rec.label, bytes(rec.payload), ds[i]["meta"]))
    return out


@pytest.mark.slow
def test_sink_equals_one_process_pack_and_source_reads_it_back(cluster, tmp_path):
    data = rows(40)
    dst = str(tmp_path / "out.tar")
    sink = packer.ray.Sink(dst, "tar", classes=CLASSES, resize="shorter:16", encode="jpeg:90", shard_samples=7)
    ray.data.from_items(data, override_num_blocks=4).write_datasink(sink)
    one = str(tmp_path / "one.tar")
    packer.pack(data, one, "tar", classes=CLASSES, resize="shorter:16", encode="jpeg:90", no_shuffle=True,
                quiet=True, workers=1)
    assert samples(dst) == samples(one)
    m = read_manifest(dst)
    assert m.source["kind"] == "ray" and m.source["tasks"] == 4 and sink.report.manifest.num_samples == 40
    assert sorted(os.listdir(tmp_path)) == ["one.tar", "out.tar"]  # no staging left
    read = ray.data.read_datasource(packer.ray.Source(dst)).take_all()
    assert [r["key"] for r in read] == [f"img-{i:04d}" for i in range(40)]
    assert [r["label"] for r in read] == [i % 3 for i in range(40)] and read[5]["step"] == 5
    assert read[0]["image"].shape == (16, 19, 3) and read[0]["image"].dtype == np.uint8


def test_source_has_a_read_task_per_shard_and_splits_one_file(tmp_path):
    from packer.engines.ray import shard_ranges

    packer.pack(rows(10), str(tmp_path / "s.tar"), "tar", classes=CLASSES, shard_samples=4, quiet=True, workers=1)
    assert [r[:2] for r in shard_ranges(read_manifest(str(tmp_path / "s.tar")), 2)] == [(0, 4), (4, 8), (8, 10)]
    packer.pack(rows(10), str(tmp_path / "s.lmdb"), "lmdb", classes=CLASSES, quiet=True, workers=1)
    assert [r[:2] for r in shard_ranges(read_manifest(str(tmp_path / "s.lmdb")), 3)] == [(0, 3), (3, 6), (6, 10)]


class DiesOnce(packer.ray.Sink if hasattr(packer, "ray") else object):
    """A Sink whose task 1 dies once right after its part was published, before reporting it."""

    def __init__(self, flag: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.flag = flag

    def write(self, blocks, ctx):
        result = super().write(blocks, ctx)
        if ctx.task_idx == 1 and not os.path.exists(self.flag):
            open(self.flag, "w").close()
            os._exit(1)  # the part is on disk, finished, and never reported: the retry makes another
        return result


@pytest.mark.slow
def test_a_task_that_dies_after_its_part_leaves_no_duplicate(cluster, tmp_path):
    flag = str(tmp_path / "died-once")
    data = rows(24)
    dst = str(tmp_path / "out.lmdb")
    ray.data.from_items(data, override_num_blocks=3).write_datasink(DiesOnce(flag, dst, "lmdb", classes=CLASSES))
    assert os.path.exists(flag)
    one = str(tmp_path / "one.lmdb")
    packer.pack(data, one, "lmdb", classes=CLASSES, no_shuffle=True, quiet=True, workers=1)
    assert samples(dst) == samples(one)
    assert sorted(os.listdir(tmp_path)) == ["died-once", "one.lmdb", "out.lmdb"]  # the orphan part went with the staging
    got = ray.data.read_datasource(packer.ray.Source(dst), override_num_blocks=3).materialize()
    assert got.count() == 24 and got.num_blocks() == 3


@pytest.mark.slow
def test_seeded_write_to_s3_equals_one_process_pack(cluster, tmp_path):
    from tests.engines.test_parts import jpeg_rows
    from tests.helpers import moto_s3

    data = jpeg_rows(50)
    with moto_s3("out") as endpoint:
        s3 = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
        ds = ray.data.from_items(data, override_num_blocks=3)
        report = packer.ray.write(ds, "s3://out/r.tar", "tar", seed=5, classes=CLASSES, storage_options=s3,
                                  resize="shorter:16", encode="jpeg:90", shard_samples=6)
        import fsspec

        fsspec.filesystem("s3", **s3).get("out/r.tar/", str(tmp_path / "r.tar"), recursive=True)
    one = str(tmp_path / "one.tar")
    packer.pack(data, one, "tar", classes=CLASSES, resize="shorter:16", encode="jpeg:90", seed=5, quiet=True, workers=1)
    assert samples(str(tmp_path / "r.tar")) == samples(one)
    m = read_manifest(str(tmp_path / "r.tar"))
    assert m.shuffle_seed == 5 and m.source["kind"] == "ray" and report.manifest.num_samples == 50
    context = ray.data.DataContext.get_current()  # write() turned reservation off for the write alone
    assert context.op_resource_reservation_enabled and context.execution_options.preserve_order
    assert [k for k, *_ in samples(one)] != sorted(k for k, *_ in samples(one))  # it was shuffled
    with pytest.raises(TypeError, match="use packer.ray.write"):
        packer.ray.Sink(str(tmp_path / "x.tar"), seed=1)
