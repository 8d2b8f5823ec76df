"""Spark packs a DataFrame through ``packer.spark.write`` on a real local[2] session: the merged
result equals a one-process ``packer.pack`` of the same rows sample for sample, and bad input
fails on the driver before any task runs."""

from __future__ import annotations

import os
import shutil
import sys

import cv2
import numpy as np
import pytest

import packer
from packer.description.manifest import read_manifest
from tests.engines.test_ray import CLASSES, samples
from tests.helpers import import_optional, need_optional

pyspark = import_optional("pyspark", "the [spark] extra (pyspark) is not installed")


@pytest.fixture(scope="module")
def spark():
    """A local[2] Spark session whose Python workers run this interpreter."""
    need_optional(shutil.which("java") is not None, "Spark needs Java (java is not on PATH)")
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("packer-test").config("spark.ui.enabled", "false")
               .config("spark.task.maxFailures", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def photo_rows(n: int) -> list[dict]:
    """PNG file bytes (sizes vary), class names, a key and metadata."""
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        ok, buf = cv2.imencode(".png", rng.integers(0, 255, (18 + i % 4, 22, 3), dtype=np.uint8))
        out.append({"image": buf.tobytes(), "label": CLASSES[i % 3], "key": f"img-{i:04d}", "step": i})
    return out


@pytest.mark.slow
def test_spark_write_equals_one_process_pack(spark, tmp_path):
    data = photo_rows(30)
    df = spark.sparkContext.parallelize([(r["image"], r["label"], r["key"], r["step"]) for r in data], 3) \
        .toDF(["image", "label", "key", "step"])
    dst = str(tmp_path / "out.tfrecord")
    report = packer.spark.write(df, dst, "tfrecord", key="key", classes=CLASSES, resize="shorter:12",
                                encode="jpeg:90", shard_samples=4)
    one = str(tmp_path / "one.tfrecord")
    packer.pack(data, one, "tfrecord", classes=CLASSES, resize="shorter:12", encode="jpeg:90", no_shuffle=True,
                quiet=True, workers=1)
    assert samples(dst) == samples(one) and report.manifest.num_samples == 30
    m = read_manifest(dst)
    assert m.source["kind"] == "spark" and m.source["tasks"] == 3
    assert sorted(os.listdir(tmp_path)) == ["one.tfrecord", "out.tfrecord"]
    with pytest.raises(ValueError, match="no column 'picture'"):
        packer.spark.write(df, str(tmp_path / "x.tar"), image="picture")
    with pytest.raises(TypeError, match="'resume' is not taken: a retried task writes its part again"):
        packer.spark.write(df, str(tmp_path / "x.tar"), resume=True)
    with pytest.raises(FileExistsError, match="destination exists"):
        packer.spark.write(df, dst, "tfrecord")


@pytest.mark.slow
def test_spark_seeded_write_to_s3_equals_one_process_pack(spark, tmp_path):
    from tests.engines.test_parts import jpeg_rows
    from tests.helpers import moto_s3

    data = jpeg_rows(40, seed=2)
    df = spark.sparkContext.parallelize([(r["image"], r["label"], r["key"], r["step"]) for r in data], 2) \
        .toDF(["image", "label", "key", "step"])
    with moto_s3("out") as endpoint:
        s3 = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
        report = packer.spark.write(df, "s3://out/s.tfrecord", "tfrecord", key="key", seed=11, classes=CLASSES,
                                    storage_options=s3, resize="shorter:12", encode="jpeg:90", shard_samples=5)
        import fsspec

        fsspec.filesystem("s3", **s3).get("out/s.tfrecord/", str(tmp_path / "s.tfrecord"), recursive=True)
    one = str(tmp_path / "one.tfrecord")
    packer.pack(data, one, "tfrecord", classes=CLASSES, resize="shorter:12", encode="jpeg:90", seed=11, quiet=True,
                workers=1)
    assert samples(str(tmp_path / "s.tfrecord")) == samples(one) and report.manifest.num_samples == 40
    m = read_manifest(str(tmp_path / "s.tfrecord"))
    assert m.shuffle_seed == 11 and m.source["kind"] == "spark" and m.source["tasks"] == 2
