"""The top-level Python API: ``import packer`` stays light, ``packer.convert`` is the command line's
conversion, ``packer.pack`` makes a dataset from any inputs and a function, and samples come as
dicts through a DataLoader, ``collate`` and ``prefetch_to_device``."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import packer
from packer.cli import main
from packer.conversion.options import Caller
from packer.conversion.request import convert_request

from .helpers import tree
from .workerfns import RowError, fails_on_three, make_sample, two_arg_error_on_three

FORMATS = ["lmdb", "hdf5", "tar", "tfrecord"]


def test_import_packer_is_light():
    code = ("import sys, packer; heavy = [m for m in ('torch', 'cv2', 'h5py', 'lmdb', 'numpy') if m in sys.modules]; "
            "print(','.join(heavy)); print(sorted(n for n in ('convert', 'pack', 'open_dataset', 'StreamingDataset', "
            "'collate') if n in dir(packer)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == ""
    assert out[1] == str(sorted(["convert", "pack", "open_dataset", "StreamingDataset", "collate"]))


def test_lazy_names_are_the_real_ones():
    from packer.api import convert, pack
    from packer.datasets import StreamingDataset, collate, open_dataset

    assert (packer.convert, packer.pack, packer.open_dataset, packer.StreamingDataset, packer.collate) == (
        convert, pack, open_dataset, StreamingDataset, collate)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        packer.nothing  # noqa: B018


def test_the_distributed_building_blocks_are_public_and_their_old_paths_forward():
    """``packer.ConvertOptions``, ``packer.convert_items`` and ``packer.merge`` are the pipeline's
    and the merge operation's own, and the old paths under ``packer.ops`` still give the same ones."""
    import packer.ops.engine
    import packer.ops.items
    import packer.ops.merge
    from packer.operations.merge import merge
    from packer.pipeline.engine import ConvertOptions
    from packer.pipeline.items import convert_items

    assert (packer.ConvertOptions, packer.convert_items, packer.merge) == (ConvertOptions, convert_items, merge)
    assert (packer.ops.engine.ConvertOptions, packer.ops.items.convert_items, packer.ops.merge.merge) == (
        ConvertOptions, convert_items, merge)
    assert {"ConvertOptions", "convert_items", "merge"} <= set(packer.__all__)


@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_writes_what_the_command_line_writes(tiny_folder, tmp_path, fmt):
    src, _ = tiny_folder
    shards = ["--shard-samples", "5"] if fmt in ("tar", "tfrecord") else []
    assert main(["convert", "imagefolder", fmt, src, str(tmp_path / "cli"), "--resize", "shorter:32",
                 "--encode", "jpeg:80", "--workers", "2", "--seed", "7", "-q", *shards]) == 0
    extra = {"shard_samples": 5} if shards else {}
    report = packer.convert("imagefolder", fmt, src, tmp_path / "api", resize="shorter:32", encode="jpeg:80",
                            workers=2, seed=7, quiet=True, **extra)
    assert report.manifest.num_samples == 14 and report.skipped == []
    assert report.output == str(tmp_path / "api")
    cli, api = tree(tmp_path / "cli"), tree(tmp_path / "api")
    assert sorted(cli) == sorted(api) and len(cli) >= 2
    assert all(cli[name] == api[name] for name in cli)


def test_convert_options_are_checked_as_the_command_line_checks_them(tiny_folder, tmp_path):
    src, _ = tiny_folder
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'resise'; it takes .*resize.*shard_size"):
        packer.convert("imagefolder", "lmdb", src, tmp_path / "a", resise="shorter:32")
    with pytest.raises(ValueError, match="bad resize policy 'big'"):
        packer.convert("imagefolder", "lmdb", src, tmp_path / "a", resize="big")
    with pytest.raises(ValueError, match=r"^packer\.convert\(\): shard_size applies to tar and tfrecord output only$"):
        packer.convert("imagefolder", "lmdb", src, tmp_path / "a", shard_size="1MB", quiet=True)
    with pytest.raises(TypeError, match="no_shuffle takes True or False"):
        packer.convert("imagefolder", "lmdb", src, tmp_path / "a", no_shuffle="yes")
    with pytest.raises(ValueError, match="dst_format: invalid choice: 'zip'"):
        packer.convert("imagefolder", "zip", src, tmp_path / "a")
    assert not os.path.exists(tmp_path / "a")
    request = convert_request(Caller("packer.convert()"), "lmdb", "tar", "s3://bucket/data", "~/out", {
        "storage_option": {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}, "anon": True}})
    assert request.storage.options == {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}, "anon": True}
    assert request.dst == os.path.expanduser("~/out")
    report = packer.convert("imagefolder", "tar", src, tmp_path / "a", workers="1", shard_size="1MB", quiet=True,
                            no_shuffle=True)
    assert report.manifest.num_samples == 14 and report.manifest.shuffle_seed is None


def test_pack_arrays_with_a_function_in_two_workers(tmp_path):
    report = packer.pack(range(20), tmp_path / "out", format="lmdb", fn=make_sample, workers=2, encode="png",
                         quiet=True)
    assert report.manifest.num_samples == 20 and report.manifest.classes == ["c0", "c1", "c2"]
    ds = packer.open_dataset(tmp_path / "out", output="numpy", fields=("image", "label", "key", "meta"), as_dict=True)
    seen = set()
    for i in range(len(ds)):
        s = ds[i]
        n = int(s["key"].removeprefix("item-"))
        want = make_sample(n)
        assert np.array_equal(s["image"], want["image"])
        assert ds.classes[s["label"]] == want["label"]
        assert s["meta"] == {"score": want["score"], "tags": want["tags"]}
        seen.add(n)
    assert seen == set(range(20))
    assert [ds.keys[i] for i in range(20)] != sorted(ds.keys)  # shuffled at write time, as convert does


def test_a_finished_pack_is_kept_by_resume(tmp_path):
    first = packer.pack(range(8), tmp_path / "out", "tar", fn=make_sample, workers=1, quiet=True)
    again = packer.pack(range(8), tmp_path / "out", "tar", fn=make_sample, workers=1, quiet=True, resume=True)
    assert again.already_complete and again.manifest.to_json() == first.manifest.to_json()
    with pytest.raises(FileExistsError):  # other samples are not the finished dataset
        packer.pack(range(1, 9), tmp_path / "out", "tar", fn=make_sample, workers=1, quiet=True, resume=True)


def _with_mask(i: int) -> dict:
    return {"image": np.zeros((4, 4, 3), np.uint8), "label": 0, "mask": np.zeros((4, 4, 3), np.uint8)}


def _bad_array(i: int) -> dict:
    return {"image": np.zeros((4, 4), np.float32), "label": 0}


def test_an_error_in_fn_names_the_input(tmp_path):
    with pytest.raises(KeyError, match="input 3: fn raised KeyError: 'no record 3'"):
        packer.pack(range(6), tmp_path / "out", "lmdb", fn=fails_on_three, workers=2, quiet=True)
    assert not os.path.exists(tmp_path / "out")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_any_exception_in_fn_comes_back_with_its_type_message_and_input(tmp_path, workers):
    with pytest.raises(packer.WorkerError, match=r"^input 3: fn raised tests\.workerfns\.TwoArgError: code 7: bad row$") as e:
        packer.pack(range(4), tmp_path / "out", "lmdb", fn=two_arg_error_on_three, workers=workers, quiet=True)
    assert e.value.type_name == "tests.workerfns.TwoArgError"
    cause = "".join(__import__("traceback").format_exception(e.value))
    assert 'raise TwoArgError(7, "bad row")' in cause  # the worker's traceback, shown with the error
    if workers > 1:
        assert 'raise TwoArgError(7, "bad row")' in e.value.worker_traceback
    with pytest.raises(RowError, match=r"^input 0: fn raised tests\.workerfns\.RowError: row 4 is short$"):
        packer.pack(range(4, 6), tmp_path / "out", "lmdb", fn=two_arg_error_on_three, workers=workers, quiet=True)
    assert os.listdir(tmp_path) == []


def test_a_worker_error_is_rebuilt_from_plain_data_only():
    from packer.pipeline.pool import error_report, rebuilt_error

    err = rebuilt_error(error_report(FileNotFoundError(2, "No such file", "a.jpg")))
    assert type(err) is FileNotFoundError and (err.errno, err.filename) == (2, "a.jpg")
    corrupt = rebuilt_error(error_report(packer.CorruptDataError("bad crc", path="x.tar", sample=3, offset=9)))
    assert (type(corrupt), corrupt.path, corrupt.sample, corrupt.offset) == (packer.CorruptDataError, "x.tar", 3, 9)
    # A type whose module is not loaded here is not imported on a worker's say-so.
    report = ("packer_not_a_module", "Boom", ("x",), "x", {}, "Traceback ...\n")
    err = rebuilt_error(report)
    assert type(err) is packer.WorkerError and str(err) == "packer_not_a_module.Boom: x"
    assert "packer_not_a_module" not in sys.modules and err.worker_traceback == "Traceback ...\n"


def test_pack_takes_paths_and_bytes_and_refuses_bad_samples(tiny_folder, tmp_path):
    src, _ = tiny_folder
    paths = sorted(os.path.join(d, n) for d, _, names in os.walk(src) for n in names)
    with open(paths[0], "rb") as f:
        first = f.read()
    samples = [{"image": p, "label": os.path.basename(os.path.dirname(p))} for p in paths[1:]]
    samples.append({"image": first, "label": "cat", "key": "from-bytes", "note": "given as bytes"})
    report = packer.pack(samples, tmp_path / "out", "tar", workers=1, no_shuffle=True, resize="16x16", quiet=True)
    assert report.manifest.num_samples == 14 and report.manifest.classes == ["cat", "dog", "ému bird"]
    ds = packer.open_dataset(tmp_path / "out", fields=("key", "meta"))
    assert ds[13] == ("from-bytes", {"note": "given as bytes"})
    assert ds[0][0] == paths[1].replace(os.sep, "/")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".out.pack-")]  # the spool is gone
    with pytest.raises(ValueError, match=r"input 0: a mask array must be H x W uint8 or uint16 \(a label map\), not 4x4x3"):
        packer.pack([0], tmp_path / "m", "lmdb", fn=_with_mask, workers=1)
    with pytest.raises(ValueError, match=r"input 0: an image array must be H x W x 3 uint8 \(RGB\), not 4x4 float32"):
        packer.pack([0], tmp_path / "m", "lmdb", fn=_bad_array, workers=1)
    with pytest.raises(ValueError, match="input 1: the sample has no 'label'"):
        packer.pack([{"image": first, "label": 0}, {"image": first}], tmp_path / "m", "lmdb", workers=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'classes_from'"):
        packer.pack([], tmp_path / "m", "lmdb", classes_from="x")
    assert not os.path.exists(tmp_path / "m")


@pytest.fixture(scope="module")
def packed_all(tmp_path_factory):
    """The tiny folder in every format, images 16x16 so that batches stack."""
    from .helpers import make_folder

    root = tmp_path_factory.mktemp("dicts")
    make_folder(str(root / "src"), {"a": [(f"a{i}.png", 20, 24) for i in range(5)],
                                    "b": [(f"b{i}.jpg", 30, 18) for i in range(5)]})
    for fmt in FORMATS:
        packer.convert("imagefolder", fmt, root / "src", root / fmt, resize="16x16", encode="png", workers=1,
                       quiet=True)
    return root


def _double(image: torch.Tensor) -> torch.Tensor:
    return image.to(torch.int16) * 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_dict_samples_through_a_dataloader_and_collate(packed_all, fmt):
    path = packed_all / fmt
    fields = ("image", "label", "key")
    tuples = packer.open_dataset(path, fields=fields, transform=_double)
    dicts = packer.open_dataset(path, fields=fields, transform=_double, as_dict=True)
    assert isinstance(dicts[0], dict) and list(dicts[0]) == list(fields)
    loader = DataLoader(dicts, batch_size=4, num_workers=2, collate_fn=packer.collate)
    want = [default_collate([dict(zip(fields, tuples[i])) for i in range(s, min(s + 4, 10))]) for s in range(0, 10, 4)]
    got = list(packer.datasets.prefetch_to_device(loader, "cpu"))
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert list(g) == list(fields) and g["key"] == w["key"]
        assert g["image"].dtype == torch.int16 and torch.equal(g["image"], w["image"])
        assert torch.equal(g["label"], w["label"])
    stream = packer.StreamingDataset(path, fields=fields, as_dict=True, shuffle=False)
    batches = list(DataLoader(stream, batch_size=5, num_workers=2, collate_fn=packer.collate))
    keys = sorted(k for b in batches for k in b["key"])
    assert keys == sorted(tuples.keys) and all(b["image"].shape[1:] == (3, 16, 16) for b in batches)


def test_a_mixture_yields_dicts_with_the_source(packed_all):
    stream = packer.StreamingDataset([packed_all / "lmdb", packed_all / "tar"], return_source=True, as_dict=True,
                                     shuffle=False)
    samples = list(stream)
    assert len(samples) == 20 and all(list(s) == ["image", "label", "source"] for s in samples)
    assert sorted(s["source"] for s in samples) == [0] * 10 + [1] * 10
    picked = packer.StreamingDataset([packed_all / "hdf5"], fields=("source", "key"), as_dict=True, shuffle=False)
    assert all(list(s) == ["source", "key"] and s["source"] == 0 for s in picked)


def test_prefetch_converts_the_image_of_dict_batches(packed_all):
    tuples = DataLoader(packer.open_dataset(packed_all / "lmdb"), batch_size=4)
    dicts = DataLoader(packer.open_dataset(packed_all / "lmdb", as_dict=True), batch_size=4, collate_fn=packer.collate)
    norm = dict(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3))
    got = list(packer.datasets.prefetch_to_device(dicts, "cpu", **norm))
    want = list(packer.datasets.prefetch_to_device(tuples, "cpu", **norm))
    assert len(got) == len(want) == 3
    for g, (images, labels) in zip(got, want):
        assert g["image"].dtype == torch.float32 and torch.equal(g["image"], images)
        assert torch.equal(g["label"], labels)
