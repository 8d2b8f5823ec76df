"""Batches of still-encoded images, decoded where the batch is used (the GPU, or else the CPU).

A reader with ``output="encoded"`` yields ``(payload, target, (height, width, codec, index))``;
:func:`collate_encoded` packs a batch of them into one :class:`EncodedBatch`; :func:`decode_batch`
(used by ``prefetch_to_device(..., decode=True)``) turns it into a uint8 N x 3 x H x W batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import default_collate

from packer.images.imageproc import decode_payload

__all__ = ["EncodedBatch", "collate_encoded", "decode_batch", "center_crop"]


class EncodedBatch(NamedTuple):
    """A batch of stored payloads, back to back in one buffer.

    Sample ``k``'s bytes are ``data[offsets[k] : offsets[k] + lengths[k]]``; ``shapes[k]`` is its
    stored (height, width), ``codecs[k]`` its codec name ("jpeg", "png", "raw", ...), ``labels``
    the collated targets and ``samples[k]`` its index in the dataset (for error messages).
    """

    data: torch.Tensor  # uint8, 1-D
    offsets: torch.Tensor  # int64, (N,)
    lengths: torch.Tensor  # int64, (N,)
    shapes: torch.Tensor  # int64, (N, 2)
    codecs: tuple[str, ...]
    labels: Any
    samples: torch.Tensor  # int64, (N,)

    def payload(self, k: int) -> torch.Tensor:
        """Sample ``k``'s stored bytes (a view of :attr:`data`)."""
        start = int(self.offsets[k])
        return self.data[start : start + int(self.lengths[k])]


def collate_encoded(batch: list[tuple[torch.Tensor, Any, tuple[int, int, str, int]]]) -> EncodedBatch:
    """The DataLoader ``collate_fn`` for ``output="encoded"`` samples: one :class:`EncodedBatch`.

    Args:
        batch: samples ``(payload, target, (height, width, codec, index))`` as the readers give.
    """
    if not batch:
        raise ValueError("collate_encoded: an empty batch")
    for item in batch:
        if not (isinstance(item, tuple) and len(item) == 3 and isinstance(item[0], torch.Tensor)):
            raise TypeError("collate_encoded takes samples of a reader with output='encoded' and its default "
                            "fields ((payload, target, (height, width, codec, index))), not "
                            f"{type(item).__name__} of {len(item) if isinstance(item, tuple) else 1}; batch "
                            f"other fields (masks, extra images, boxes) with your own collate_fn")
    payloads = [item[0].reshape(-1) for item in batch]
    lengths = torch.tensor([p.numel() for p in payloads], dtype=torch.int64)
    offsets = torch.zeros(len(batch), dtype=torch.int64)
    if len(batch) > 1:
        offsets[1:] = torch.cumsum(lengths[:-1], 0)
    return EncodedBatch(
        data=torch.cat(payloads),
        offsets=offsets,
        lengths=lengths,
        shapes=torch.tensor([[int(item[2][0]), int(item[2][1])] for item in batch], dtype=torch.int64),
        codecs=tuple(str(item[2][2]) for item in batch),
        labels=default_collate([item[1] for item in batch]),
        samples=torch.tensor([int(item[2][3]) for item in batch], dtype=torch.int64),
    )


def _crop_box(height: int, width: int, size: tuple[int, int]) -> tuple[int, int]:
    """(top, left) of a centred ``size`` crop, rounded as torchvision's CenterCrop rounds."""
    return int(round((height - size[0]) / 2.0)), int(round((width - size[1]) / 2.0))


def center_crop(image: torch.Tensor, size: int | Sequence[int]) -> torch.Tensor:
    """The centred ``size`` (an int for a square, or (height, width)) crop of a ... x H x W tensor,
    as a view; the CPU-side transform that ``decode_batch(..., crop=size)`` matches pixel for pixel.
    An image smaller than ``size`` raises ValueError."""
    th, tw = _pair(size)
    h, w = image.shape[-2:]
    if h < th or w < tw:
        raise ValueError(f"center_crop: a {h}x{w} image is smaller than the {th}x{tw} crop")
    top, left = _crop_box(h, w, (th, tw))
    return image[..., top : top + th, left : left + tw]


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    th, tw = (int(v) for v in size)
    return th, tw


def _decode_cpu(batch: EncodedBatch, k: int) -> torch.Tensor:
    """Sample ``k`` decoded as the CPU readers decode it (``decode_payload``), as a 3 x H x W
    uint8 tensor."""
    h, w = (int(v) for v in batch.shapes[k])
    payload = batch.payload(k).cpu().numpy()
    rgb = decode_payload(payload, batch.codecs[k], h, w, sample=int(batch.samples[k]))
    return torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)


def _decode_jpegs_cuda(batch: EncodedBatch, ks: list[int], device: torch.device) -> list[torch.Tensor]:
    """The JPEG samples ``ks`` decoded on ``device`` by nvJPEG in one call (torchvision); when the
    batch call fails, each sample is decoded alone, on the CPU if nvJPEG refuses it, and a payload
    neither decoder takes raises CorruptDataError naming its sample."""
    from torchvision.io import ImageReadMode, decode_jpeg

    datas = [batch.payload(k).cpu() for k in ks]
    try:
        return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=device))
    except (RuntimeError, ValueError):
        pass
    out = []
    for k, data in zip(ks, datas):
        try:
            out.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
        except (RuntimeError, ValueError):
            out.append(_decode_cpu(batch, k).to(device))  # raises CorruptDataError for a damaged one
    return out


def _decode_all(batch: EncodedBatch, device: torch.device) -> list[torch.Tensor]:
    """Every sample of ``batch`` as a 3 x H x W uint8 tensor on ``device``."""
    n = len(batch.codecs)
    images: list[torch.Tensor | None] = [None] * n
    if device.type == "cuda":
        jpegs = [k for k in range(n) if batch.codecs[k] == "jpeg"]
        if jpegs:
            for k, image in zip(jpegs, _decode_jpegs_cuda(batch, jpegs, device)):
                images[k] = image
    for k in range(n):
        if images[k] is None:
            image = _decode_cpu(batch, k)
            images[k] = image if device.type == "cpu" else image.to(device, non_blocking=False)
    return images  # type: ignore[return-value]


def decode_batch(batch: EncodedBatch, device: torch.device | str, crop: int | Sequence[int] | None = None
                 ) -> torch.Tensor:
    """Decode ``batch`` on ``device`` to a uint8 N x 3 x H x W tensor (RGB).

    On CUDA, JPEGs are decoded in one nvJPEG call (``torchvision.io.decode_jpeg``; torchvision must
    be importable) and other codecs on the CPU, then copied; on the CPU every sample is decoded
    pixel for pixel as the CPU readers decode (TurboJPEG or OpenCV, ``decode_payload``). ``raw`` payloads are only
    reshaped. ``crop`` takes the centred crop of each image (as :func:`center_crop`); without it
    every image of the batch must have the same size. nvJPEG's pixels may differ from libjpeg's
    by a level or two, and it ignores EXIF orientation (packer stores images upright; JPEGs of
    other tools' shards that carry a rotation come out unrotated on CUDA).

    Raises:
        CorruptDataError: a payload that does not decode, naming its sample.
        ValueError: images of different sizes without ``crop``, or one smaller than ``crop``.
    """
    device = torch.device(device)
    images = _decode_all(batch, device)
    if crop is not None:
        size = _pair(crop)
        for k, image in enumerate(images):
            try:
                images[k] = center_crop(image, size)
            except ValueError as e:
                raise ValueError(f"sample {int(batch.samples[k])}: {e}") from None
    first = images[0].shape
    for k, image in enumerate(images):
        if image.shape != first:
            raise ValueError(f"sample {int(batch.samples[k])} decodes to {tuple(image.shape[1:])}, sample "
                             f"{int(batch.samples[0])} to {tuple(first[1:])}: pass crop= for a batch of one size")
    return torch.stack(images)
