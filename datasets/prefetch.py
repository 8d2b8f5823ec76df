"""Copy the next batch to the GPU while the current one is used, and normalise it there.

``prefetch_to_device(loader, "cuda")`` wraps any iterable of batches (a DataLoader, usually) and
yields the same batches with every tensor on the device; on a machine without CUDA the same script
runs on the CPU. With ``decode=True`` the batches are :class:`~packer.datasets.encoded.EncodedBatch`
es (stored bytes) and are decoded on the device (nvJPEG on CUDA, the CPU readers' decode on the CPU).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from .encoded import EncodedBatch, decode_batch

__all__ = ["DevicePrefetcher", "prefetch_to_device"]


def _map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor in a nest of tuples, lists and dicts; keep the rest."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple):
        items = [_map_tensors(item, fn) for item in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    if isinstance(batch, list):
        return [_map_tensors(item, fn) for item in batch]
    if isinstance(batch, Mapping):
        mapped = {key: _map_tensors(value, fn) for key, value in batch.items()}
        try:
            return type(batch)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    return batch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (tuple, list)):
        for item in batch:
            yield from _tensors(item)
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from _tensors(value)


def _is_image(tensor: torch.Tensor) -> bool:
    return tensor.ndim == 4 and (tensor.dtype == torch.uint8 or tensor.is_floating_point())


def _per_channel(name: str, value: float | Sequence[float] | torch.Tensor) -> torch.Tensor:
    try:
        values = torch.as_tensor(value, dtype=torch.float64).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"{name} must be a number or a sequence of numbers, got {value!r}"
        ) from error
    if values.numel() == 0:
        raise ValueError(f"{name} must not be empty")
    if name == "std" and bool((values == 0).any()):
        raise ValueError(f"std must not contain zeros, got {values.tolist()}")
    return values


class _Converter:
    """The per-tensor conversion (normalise, dtype, memory format) of a prefetcher."""

    def __init__(
        self,
        mean: float | Sequence[float] | torch.Tensor | None,
        std: float | Sequence[float] | torch.Tensor | None,
        dtype: torch.dtype | None,
        channels_last: bool,
    ) -> None:
        if (mean is None) != (std is None):
            raise ValueError("give mean and std together, or neither")
        if dtype is not None and (
            not isinstance(dtype, torch.dtype) or not dtype.is_floating_point
        ):
            raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        # (mean, std) per channel, float64 on the CPU; None without normalisation.
        self.norm: tuple[torch.Tensor, torch.Tensor] | None = None
        if mean is not None and std is not None:
            mean_values, std_values = _per_channel("mean", mean), _per_channel("std", std)
            sizes = (mean_values.numel(), std_values.numel())
            if sizes[0] != sizes[1] and 1 not in sizes:
                raise ValueError(f"mean has {sizes[0]} channels but std has {sizes[1]}")
            self.norm = (mean_values, std_values)
        self.convert = dtype is not None or self.norm is not None
        self.dtype = dtype or torch.float32
        self.compute_dtype = torch.promote_types(self.dtype, torch.float32)
        self.channels_last = bool(channels_last)
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def active(self) -> bool:
        return self.convert or self.channels_last

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """mean and std as (1, C, 1, 1) tensors on ``device``, made once per device."""
        if self.norm is None:
            raise RuntimeError("no mean/std were given to this prefetcher")
        if device not in self._constants:
            self._constants[device] = tuple(  # type: ignore[assignment]
                values.to(self.compute_dtype).reshape(1, -1, 1, 1).to(device)
                for values in self.norm
            )
        return self._constants[device]

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if not _is_image(tensor):
            return tensor
        out = tensor
        if self.convert:
            out = tensor.to(self.compute_dtype)
            if tensor.dtype == torch.uint8:
                out = out.div_(255)  # a new tensor already: safe in place
            if self.norm is not None:
                channels = out.shape[1]
                for name, values in zip(("mean", "std"), self.norm):
                    if values.numel() not in (1, channels):
                        raise ValueError(
                            f"{name} has {values.numel()} values but the image batch of shape "
                            f"{tuple(out.shape)} has {channels} channels (dim 1)"
                        )
                mean, std = self.constants(out.device)
                # Never modify the caller's tensor: the first step is out of place if it aliases.
                out = out.sub(mean) if out is tensor else out.sub_(mean)
                out = out.div_(std)
            if out.dtype != self.dtype:
                out = out.to(self.dtype)
        if self.channels_last:
            out = out.contiguous(memory_format=torch.channels_last)
        return out


def _pin(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.device.type != "cpu" or tensor.is_pinned() else tensor.pin_memory()


class DevicePrefetcher:
    """An iterable over ``loader``'s batches, delivered on ``device``; see :func:`prefetch_to_device`.

    ``len()`` is the loader's length and raises ``TypeError`` when the loader has none. Each
    ``iter()`` starts a new pass over the loader (a new epoch for a DataLoader).
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: torch.device | str | int,
        mean: float | Sequence[float] | torch.Tensor | None = None,
        std: float | Sequence[float] | torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
        channels_last: bool = False,
        decode: bool = False,
        crop: int | Sequence[int] | None = None,
    ) -> None:
        if not isinstance(loader, Iterable):
            raise TypeError(f"loader must be iterable, got {type(loader).__name__}")
        self.loader = loader
        requested = (
            torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        )
        if requested.type == "cuda" and not torch.cuda.is_available():
            warnings.warn(
                f"prefetch_to_device: {requested} asked for but CUDA is not available; batches "
                "stay on the CPU (conversions still apply)",
                RuntimeWarning,
                stacklevel=3,
            )
            requested = torch.device("cpu")
        if requested.type == "cuda" and requested.index is None:
            requested = torch.device("cuda", torch.cuda.current_device())
        self.device = requested
        self._convert = _Converter(mean, std, dtype, channels_last)
        if crop is not None and not decode:
            raise ValueError("crop applies to decoded batches: pass decode=True (and output='encoded' batches)")
        self.decode = bool(decode)
        self.crop = crop

    def _decoded(self, batch: Any) -> tuple[torch.Tensor, Any]:
        """An :class:`EncodedBatch` decoded, cropped and converted on the device: (images, labels)."""
        if not isinstance(batch, EncodedBatch):
            raise TypeError(f"prefetch_to_device(decode=True) takes EncodedBatch batches (a reader with "
                            f"output='encoded' and collate_fn=collate_encoded), not {type(batch).__name__}")
        images = self._convert(decode_batch(batch, self.device, crop=self.crop))
        if self.device.type == "cpu":
            return images, batch.labels
        return images, _map_tensors(batch.labels, lambda t: t.to(self.device, non_blocking=True))

    def __len__(self) -> int:
        try:
            return len(self.loader)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"the wrapped {type(self.loader).__name__} has no length, so neither has its "
                "prefetcher"
            ) from None

    def __iter__(self) -> Iterator[Any]:
        if self.device.type == "cuda":
            return self._iter_cuda()
        if self.device.type == "cpu":
            return self._iter_cpu()
        return self._iter_other()

    def _iter_cpu(self) -> Iterator[Any]:
        convert = self._convert
        for batch in self.loader:
            if self.decode:
                yield self._decoded(batch)
                continue
            yield _map_tensors(batch, lambda t: convert(t.cpu())) if convert.active else batch

    def _iter_other(self) -> Iterator[Any]:
        device, convert = self.device, self._convert
        for batch in self.loader:
            yield self._decoded(batch) if self.decode else _map_tensors(batch, lambda t: convert(t.to(device)))

    def _iter_cuda(self) -> Iterator[Any]:
        """Batch ``k + 1`` is pinned (unless the loader already pinned it, ``pin_memory=True``,
        which is cheaper: it happens in the loader's thread), copied with ``non_blocking=True`` on
        a side ``torch.cuda.Stream`` and converted there, while the caller's kernels for batch
        ``k`` run on the current stream. Before a batch is handed out the current stream waits for
        its copy, and each of its tensors is ``record_stream``-ed on the current stream so the
        caching allocator does not give its memory to a later copy while the caller's kernels may
        still read it."""
        device, convert = self.device, self._convert
        copy_stream = torch.cuda.Stream(device=device)

        def to_device(tensor: torch.Tensor) -> torch.Tensor:
            return convert(_pin(tensor).to(device, non_blocking=True))

        def start_copy(iterator: Iterator[Any]) -> tuple[bool, Any]:
            """Fetch the next batch and queue its copy and conversion on the side stream."""
            try:
                batch = next(iterator)
            except StopIteration:
                return False, None
            with torch.cuda.device(device), torch.cuda.stream(copy_stream):
                return True, self._decoded(batch) if self.decode else _map_tensors(batch, to_device)

        if convert.norm is not None:
            convert.constants(device)  # made on the current stream, before any copy
        # The side stream starts after whatever the caller queued before iterating.
        copy_stream.wait_stream(torch.cuda.current_stream(device))
        iterator = iter(self.loader)
        pending, batch = start_copy(iterator)
        while pending:
            current = torch.cuda.current_stream(device)
            # Wait for this batch's copy only: the next one is queued after the wait.
            current.wait_stream(copy_stream)
            for tensor in _tensors(batch):
                if tensor.device.type == "cuda":
                    tensor.record_stream(current)
            ready = batch
            pending, batch = start_copy(iterator)
            yield ready


def prefetch_to_device(
    loader: Iterable[Any],
    device: torch.device | str | int,
    mean: float | Sequence[float] | torch.Tensor | None = None,
    std: float | Sequence[float] | torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    channels_last: bool = False,
    decode: bool = False,
    crop: int | Sequence[int] | None = None,
) -> DevicePrefetcher:
    """Wrap ``loader`` so its batches arrive on ``device``, copied ahead of use.

    * **CUDA**: batch ``k + 1`` is copied on a side stream, and converted there, while the
      caller's kernels for batch ``k`` run.
    * **CPU** (``device="cpu"``, or a CUDA device asked for on a machine without CUDA, with a
      warning): the batches pass through unchanged, the same objects, unless a conversion is
      asked; the conversion then runs on the CPU with the same results, so one script runs
      anywhere.
    * any other device: a plain synchronous ``.to(device)`` plus the conversion.

    Conversion applies to *image batches*: tensors with ``ndim == 4`` (N, C, H, W) whose dtype is
    ``uint8`` (values 0..255) or floating (values 0..1, as torchvision's ``ToTensor`` gives),
    wherever they are in the batch. Everything else (labels, 1-3-D tensors, 4-D integer tensors of
    other dtypes) is only moved, and non-tensors pass through as they are. Batches may be tensors,
    tuples (named ones keep their type), lists, dicts or any nesting of them. If a batch holds
    other 4-D float tensors that are not images, normalise yourself instead.

    For an image batch, with ``dtype`` (default ``float32``) used when any conversion is asked:

    * ``mean``/``std`` given: ``(x / 255 - mean) / std`` for ``uint8``, ``(x - mean) / std`` for
      floats, computed in float32 (or ``dtype`` if wider) and returned as ``dtype``; ``mean`` and
      ``std`` are per channel (dim 1), in 0..1 units, like ``torchvision.transforms.Normalize``;
    * only ``dtype`` given: ``uint8`` becomes ``x / 255``, floats are cast;
    * ``channels_last=True``: the result (or the unconverted image batch) is made contiguous in
      ``torch.channels_last`` memory format.

    Args:
        loader: a DataLoader or any iterable of batches (tensors, tuples, lists, dicts, nested).
        device: ``"cuda"``, ``"cuda:1"``, a ``torch.device``, a CUDA index, or ``"cpu"``. A CUDA
            device without CUDA available falls back to the CPU with a warning.
        mean, std: per-channel normalisation of image batches in 0..1 units (both or neither).
        dtype: floating dtype of converted image batches (default float32 when converting).
        channels_last: give image batches the ``torch.channels_last`` memory format.
        decode: the loader yields :class:`~packer.datasets.encoded.EncodedBatch` es (a reader with
            ``output="encoded"``, ``collate_fn=collate_encoded``); each is decoded on the device
            (:func:`~packer.datasets.encoded.decode_batch`: nvJPEG for JPEG on CUDA, the CPU
            readers' decode otherwise, pixel-equal to them on the CPU; ``raw`` only reshaped) and
            delivered as ``(images, labels)``, images converted as above. On CUDA the decode is
            queued on the side stream, so it overlaps the caller's work on the previous batch.
        crop: with ``decode``, the centred crop (int or (height, width)) taken of each decoded
            image; without it all images of a batch must have one size.

    Returns:
        A :class:`DevicePrefetcher`: iterable, re-iterable, with ``len()`` when the loader has one.

    Example::

        loader = DataLoader(ds, batch_size=256, num_workers=8, pin_memory=True)
        for images, labels in prefetch_to_device(loader, "cuda", mean=(0.485, 0.456, 0.406),
                                                 std=(0.229, 0.224, 0.225), channels_last=True):
            loss = criterion(model(images), labels)
    """
    return DevicePrefetcher(
        loader, device, mean=mean, std=std, dtype=dtype, channels_last=channels_last, decode=decode, crop=crop
    )
