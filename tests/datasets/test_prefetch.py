"""Tests for packer.datasets.prefetch: device prefetching with on-device normalisation."""

from __future__ import annotations

import collections
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from packer.datasets.prefetch import DevicePrefetcher, prefetch_to_device

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
Pair = collections.namedtuple("Pair", ["image", "label"])


def image_loader(n: int = 20, batch_size: int = 4, **kwargs) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, 8, 6), dtype=torch.uint8, generator=generator)
    labels = torch.arange(n)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, **kwargs)


def formula(x: torch.Tensor, mean=MEAN, std=STD) -> torch.Tensor:
    """The torchvision convention, written out: (x / 255 - mean) / std per channel."""
    m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    scaled = x.to(torch.float32) / 255 if x.dtype == torch.uint8 else x.to(torch.float32)
    return (scaled - m) / s


def assert_same(a, b) -> None:
    """Equal structure, types and exactly equal tensors."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    else:
        assert a == b


# -- CPU -------------------------------------------------------------------------------------


def test_cpu_passthrough_equals_plain_loop() -> None:
    loader = image_loader()
    prefetched = prefetch_to_device(loader, "cpu")
    assert isinstance(prefetched, DevicePrefetcher)
    assert len(prefetched) == len(loader) == 5
    for _ in range(2):  # re-iterable, one pass per epoch
        for got, expected in zip(prefetched, loader, strict=True):
            assert_same(got, expected)
    batches = list(loader)
    assert all(got is batch for got, batch in zip(prefetch_to_device(batches, "cpu"), batches))


def test_normalisation_equals_formula() -> None:
    loader = image_loader()
    for (images, labels), (raw, raw_labels) in zip(
        prefetch_to_device(loader, "cpu", mean=MEAN, std=STD), loader, strict=True
    ):
        assert images.dtype == torch.float32
        assert torch.equal(images, formula(raw))
        assert torch.equal(labels, raw_labels), "labels are not images"


def test_dtype_and_float_inputs() -> None:
    raw = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    (scaled,) = prefetch_to_device([raw], "cpu", dtype=torch.float64)
    assert scaled.dtype == torch.float64 and torch.equal(scaled, raw.double() / 255)

    (half,) = prefetch_to_device([raw], "cpu", mean=MEAN, std=STD, dtype=torch.float16)
    assert half.dtype == torch.float16 and torch.equal(half, formula(raw).half())

    unit = raw.float() / 255
    original = unit.clone()
    (normalised,) = prefetch_to_device([unit], "cpu", mean=MEAN, std=STD)
    assert torch.equal(normalised, formula(unit)), "float images are taken as 0..1"
    assert torch.equal(unit, original), "the caller's tensor is not modified"

    (scalar,) = prefetch_to_device([raw], "cpu", mean=0.5, std=0.25)
    assert torch.equal(scalar, (raw.float() / 255 - 0.5) / 0.25)


def test_channels_last() -> None:
    raw = torch.randint(0, 256, (2, 3, 5, 7), dtype=torch.uint8)
    (out,) = prefetch_to_device([raw], "cpu", mean=MEAN, std=STD, channels_last=True)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, formula(raw))
    (kept,) = prefetch_to_device([raw], "cpu", channels_last=True)
    assert kept.dtype == torch.uint8 and torch.equal(kept, raw)
    assert kept.is_contiguous(memory_format=torch.channels_last)


def test_only_image_batches_are_converted() -> None:
    batch = {
        "image": torch.zeros(1, 3, 2, 2, dtype=torch.uint8),
        "single": torch.zeros(3, 2, 2, dtype=torch.uint8),  # 3-D: not an image batch
        "ids": torch.zeros(1, 3, 2, 2, dtype=torch.int64),  # 4-D but not uint8/float
        "name": "x",
    }
    (out,) = prefetch_to_device([batch], "cpu", mean=MEAN, std=STD)
    assert out["image"].dtype == torch.float32
    assert out["single"] is batch["single"] and out["ids"] is batch["ids"]
    assert out["name"] == "x"


def test_nested_structures_are_preserved() -> None:
    image = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    batch = {
        "pair": Pair(image, torch.tensor([1, 2])),
        "list": [image, (torch.tensor(3), "text", 7, None)],
        "meta": collections.OrderedDict(paths=["a", "b"]),
    }
    (out,) = prefetch_to_device([batch], "cpu", dtype=torch.float32)
    expected = {
        "pair": Pair(image.float() / 255, torch.tensor([1, 2])),
        "list": [image.float() / 255, (torch.tensor(3), "text", 7, None)],
        "meta": collections.OrderedDict(paths=["a", "b"]),
    }
    assert_same(out, expected)
    (same,) = prefetch_to_device([batch], "cpu")
    assert same is batch


def test_len_follows_the_loader() -> None:
    assert len(prefetch_to_device(image_loader(n=10, batch_size=3), "cpu")) == 4
    assert len(prefetch_to_device(image_loader(n=10, batch_size=3, drop_last=True), "cpu")) == 3
    unsized = prefetch_to_device(iter([torch.zeros(1)]), "cpu")
    with pytest.raises(TypeError, match="no length"):
        len(unsized)
    assert [t.item() for t in unsized] == [0.0]


def test_other_devices_get_a_plain_copy() -> None:
    raw = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    ((images, labels),) = prefetch_to_device([(raw, torch.ones(2))], "meta", mean=MEAN, std=STD)
    assert images.device.type == "meta" and labels.device.type == "meta"
    assert images.dtype == torch.float32 and images.shape == raw.shape


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the fallback without CUDA")
def test_cuda_without_cuda_falls_back_to_cpu() -> None:
    loader = image_loader()
    with pytest.warns(RuntimeWarning, match="CUDA is not available"):
        prefetched = prefetch_to_device(loader, "cuda", mean=MEAN, std=STD)
    assert prefetched.device == torch.device("cpu")
    for (images, _), (raw, _) in zip(prefetched, loader, strict=True):
        assert torch.equal(images, formula(raw))


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="together"):
        prefetch_to_device([], "cpu", mean=MEAN)
    with pytest.raises(ValueError, match="floating"):
        prefetch_to_device([], "cpu", dtype=torch.int32)
    with pytest.raises(ValueError, match="zeros"):
        prefetch_to_device([], "cpu", mean=MEAN, std=(1, 0, 1))
    with pytest.raises(ValueError, match="mean has 3 channels but std has 2"):
        prefetch_to_device([], "cpu", mean=MEAN, std=(1, 1))
    with pytest.raises(TypeError, match="number"):
        prefetch_to_device([], "cpu", mean="abc", std=STD)
    with pytest.raises(TypeError, match="iterable"):
        prefetch_to_device(3, "cpu")  # type: ignore[arg-type]
    gray = torch.zeros(1, 1, 2, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"mean has 3 values but the image batch of shape \(1, 1"):
        list(prefetch_to_device([gray], "cpu", mean=MEAN, std=STD))


# -- CUDA (skipped without a GPU) --------------------------------------------------------------


@cuda
@pytest.mark.parametrize("pin_memory", [False, True])
def test_cuda_equals_plain_loop(pin_memory: bool) -> None:
    loader = image_loader(n=64, batch_size=8, pin_memory=pin_memory)
    prefetched = prefetch_to_device(loader, "cuda")
    assert len(prefetched) == len(loader)
    for _ in range(2):
        count = 0
        for got, (images, labels) in zip(prefetched, loader, strict=True):
            expected = [images.to("cuda"), labels.to("cuda")]
            assert_same(got, expected)
            count += 1
        assert count == len(loader)


@cuda
def test_cuda_normalisation_and_structures() -> None:
    loader = image_loader(n=32, batch_size=8)
    prefetched = prefetch_to_device(loader, "cuda", mean=MEAN, std=STD, channels_last=True)
    for (images, labels), (raw, raw_labels) in zip(prefetched, loader, strict=True):
        assert images.is_cuda and labels.is_cuda
        assert images.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(images, formula(raw.cuda()), rtol=0, atol=1e-6)
        assert torch.equal(labels.cpu(), raw_labels)

    image = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    batch = {"pair": Pair(image, torch.tensor([1, 2])), "name": ["a", "b"], "n": 3}
    (out,) = prefetch_to_device([batch], torch.device("cuda", 0), dtype=torch.float16)
    assert isinstance(out["pair"], Pair) and out["name"] == ["a", "b"] and out["n"] == 3
    assert out["pair"].image.dtype == torch.float16 and out["pair"].image.is_cuda
    assert torch.equal(out["pair"].image.cpu(), (image.float() / 255).half())


def pinned_batches(count: int, nbytes: int) -> list[torch.Tensor]:
    """Batch k is filled with k; already pinned, so the loop measures copies only."""
    side = int((nbytes // 4) ** 0.5)
    return [torch.full((1, 1, side, side), float(k)).pin_memory() for k in range(count)]


def sleep_cycles_for(milliseconds: float) -> int:
    """Clock cycles of ``torch.cuda._sleep`` that take about ``milliseconds`` on this GPU."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    torch.cuda._sleep(1000)  # warm up
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return max(int(cycles * milliseconds / start.elapsed_time(end)), 1000)


@cuda
def test_cuda_record_stream_keeps_memory_until_the_consumer_is_done() -> None:
    """A slow consumer must read each batch's own data, not a later copy reusing its memory."""
    batches = pinned_batches(12, 16 * 2**20)
    cycles = sleep_cycles_for(5.0)
    means = []
    for batch in prefetch_to_device(batches, "cuda"):
        torch.cuda._sleep(cycles)  # the consumer is busy while later copies are queued
        means.append(batch.mean())
        del batch  # only the queued kernels still use it
    assert [m.item() for m in means] == [float(k) for k in range(12)]


@cuda
def test_cuda_copies_overlap_with_compute() -> None:
    count = 8
    batches = pinned_batches(count, 64 * 2**20)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for batch in batches:
        batch.to("cuda", non_blocking=True)
    end.record()
    end.synchronize()
    copy_ms = start.elapsed_time(end) / count
    cycles = sleep_cycles_for(copy_ms)

    def run(iterable) -> float:
        torch.cuda.synchronize()
        began = time.perf_counter()
        for batch in iterable:
            torch.cuda._sleep(cycles)  # "compute" as long as one copy
            batch.add_(1)  # depends on the batch
        torch.cuda.synchronize()
        return (time.perf_counter() - began) * 1000

    run(prefetch_to_device(batches[:2], "cuda"))  # warm up streams and the allocator
    serial = run(batch.to("cuda") for batch in batches)
    overlapped = run(prefetch_to_device(batches, "cuda"))
    # Serial is about count * (copy + compute); overlapped about (count + 1) * compute.
    assert overlapped < 0.8 * serial, f"prefetch {overlapped:.1f} ms vs serial {serial:.1f} ms"
