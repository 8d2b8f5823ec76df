"""output="encoded", collate_encoded and prefetch_to_device(decode=True): the GPU-decode-ready path,
checked on the CPU against the ordinary readers pixel for pixel."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from packer.datasets import collate, open_dataset, prefetch_to_device
from packer.datasets.encoded import EncodedBatch, center_crop, collate_encoded, decode_batch
from packer.errors import CorruptDataError
from tests.helpers import pack

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def crop24(image: torch.Tensor) -> torch.Tensor:
    return center_crop(image, 24)


@pytest.mark.parametrize("fmt", ["lmdb", "tar"])
@pytest.mark.parametrize("encode", ["jpeg:90", "png", "raw"])
def test_decoded_batches_equal_the_cpu_readers(tiny_folder, tmp_path, fmt, encode):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", fmt, encode=encode)
    plain = open_dataset(tmp_path / "out", transform=crop24)
    encoded = open_dataset(tmp_path / "out", output="encoded")
    expected = list(prefetch_to_device(DataLoader(plain, batch_size=4, collate_fn=collate), "cpu",
                                       mean=MEAN, std=STD, channels_last=True))
    got = list(prefetch_to_device(DataLoader(encoded, batch_size=4, num_workers=2, collate_fn=collate_encoded),
                                  "cpu", mean=MEAN, std=STD, channels_last=True, decode=True, crop=24))
    assert len(got) == len(expected) == 4
    for (images, labels), (want_images, want_labels) in zip(got, expected):
        assert images.dtype == torch.float32 and images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
    raw = list(prefetch_to_device(DataLoader(encoded, batch_size=5, collate_fn=collate_encoded), "cpu",
                                  decode=True, crop=(20, 30)))
    for b, (images, labels) in enumerate(raw):
        for k in range(len(labels)):
            want, label = plain.load(5 * b + k)
            assert torch.equal(images[k], center_crop(torch.from_numpy(want).permute(2, 0, 1), (20, 30)))
            assert int(labels[k]) == label


def test_encoded_sample_and_batch_layout(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "lmdb", encode="png")
    ds = open_dataset(tmp_path / "out", output="encoded", target_transform=lambda y: y + 100)
    payload, target, (h, w, codec, index) = ds[-1]
    rec = ds.read_record(len(ds) - 1)
    assert payload.dtype == torch.uint8 and payload.ndim == 1 and bytes(payload.numpy()) == bytes(rec.payload)
    assert (target, h, w, codec, index) == (rec.label + 100, rec.height, rec.width, "png", len(ds) - 1)
    batch = collate_encoded([ds[i] for i in (3, 0, 7)])
    assert isinstance(batch, EncodedBatch)
    assert batch.data.dtype == torch.uint8 and batch.data.ndim == 1
    assert batch.offsets.tolist() == [0, batch.lengths[0], batch.lengths[0] + batch.lengths[1]]
    assert int(batch.lengths.sum()) == batch.data.numel()
    assert batch.codecs == ("png", "png", "png") and batch.samples.tolist() == [3, 0, 7]
    for k, i in enumerate((3, 0, 7)):
        rec = ds.read_record(i)
        assert bytes(batch.payload(k).numpy()) == bytes(rec.payload)
        assert batch.shapes[k].tolist() == [rec.height, rec.width] and int(batch.labels[k]) == rec.label + 100


def test_encoded_output_refuses_transforms_and_decoded_cache(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "lmdb")
    with pytest.raises(ValueError, match="no transform"):
        open_dataset(tmp_path / "out", output="encoded", transform=crop24)
    with pytest.raises(ValueError, match="cache='decoded'"):
        open_dataset(tmp_path / "out", output="encoded", cache="decoded")
    cached = open_dataset(tmp_path / "out", output="encoded", cache="encoded")
    assert [bytes(cached[i][0].numpy()) for i in range(3)] * 2 == [bytes(cached[i][0].numpy()) for i in range(3)] * 2


def test_damaged_payload_names_the_sample(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "tar")
    ds = open_dataset(tmp_path / "out", output="encoded")
    good = ds[0]
    bad = (good[0][: good[0].numel() // 3].clone(), good[1], (good[2][0], good[2][1], "jpeg", 41))
    garbage = (torch.arange(200, dtype=torch.uint8), 0, (8, 8, "jpeg", 42))
    for sample, number in ((garbage, 42), (bad, 41)):
        with pytest.raises(CorruptDataError, match=f"sample {number}") as info:
            decode_batch(collate_encoded([good, sample]), "cpu", crop=16)
        assert info.value.sample == number
    short_raw = (torch.zeros(10, dtype=torch.uint8), 0, (4, 4, "raw", 43))
    with pytest.raises(CorruptDataError, match="sample 43"):
        decode_batch(collate_encoded([short_raw]), "cpu")


def test_sizes_must_agree_without_crop(tiny_folder, tmp_path):
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "lmdb")
    ds = open_dataset(tmp_path / "out", output="encoded")
    sizes = {i: ds[i][2][:2] for i in range(len(ds))}
    a, b = next((i, j) for i in sizes for j in sizes if sizes[i] != sizes[j])
    with pytest.raises(ValueError, match="pass crop="):
        decode_batch(collate_encoded([ds[a], ds[b]]), "cpu")
    with pytest.raises(ValueError, match="smaller than"):
        decode_batch(collate_encoded([ds[a]]), "cpu", crop=1000)
    with pytest.raises(TypeError, match="EncodedBatch"):
        list(prefetch_to_device([torch.zeros(2, 3, 4, 4)], "cpu", decode=True))
    with pytest.raises(ValueError, match="decode=True"):
        prefetch_to_device([], "cpu", crop=4)


def test_cuda_request_without_cuda_decodes_on_the_cpu(tiny_folder, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the fallback is for machines without CUDA")
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "lmdb")
    ds = open_dataset(tmp_path / "out", output="encoded")
    loader = DataLoader(ds, batch_size=7, collate_fn=collate_encoded)
    with pytest.warns(RuntimeWarning, match="CUDA is not available"):
        prefetched = prefetch_to_device(loader, "cuda", decode=True, crop=24)
    images, labels = next(iter(prefetched))
    assert images.shape == (7, 3, 24, 24) and images.dtype == torch.uint8 and labels.shape == (7,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_decode_matches_cpu_decode_closely(tiny_folder, tmp_path):
    pytest.importorskip("torchvision")
    src, _ = tiny_folder
    pack(src, tmp_path / "out", "lmdb")
    ds = open_dataset(tmp_path / "out", output="encoded")
    batch = collate_encoded([ds[i] for i in range(len(ds))])
    on_gpu = decode_batch(batch, "cuda", crop=24)
    on_cpu = decode_batch(batch, "cpu", crop=24)
    assert on_gpu.device.type == "cuda" and on_gpu.shape == on_cpu.shape
    assert (on_gpu.cpu().int() - on_cpu.int()).abs().float().mean() < 2.0
    images, labels = next(iter(prefetch_to_device(DataLoader(ds, batch_size=4, collate_fn=collate_encoded), "cuda",
                                                  decode=True, crop=24, mean=MEAN, std=STD)))
    assert images.device.type == "cuda" and images.dtype == torch.float32 and labels.device.type == "cuda"
