"""``collate``: DataLoader batches built in reusable shared memory instead of a fresh segment each.

Returns the same batch as torch's ``default_collate`` (same structure, dtypes, shapes and values),
but in a worker it stacks the tensors into a few shared-memory buffers ("slots") that each worker
creates once and reuses; the main process maps each slot once and rebuilds the batch as views of
it, and hands the slot back when every view of that batch is freed. This removes the per-batch
page faults of a fresh segment on both sides. The slot path leans on torch internals, so it is
decided by what this process's torch does, not by its version: :func:`slots_available` runs a
self-test at import (a real batch through a slot, the pickler and back). Where it fails, or in the
main process, ``collate`` is ``default_collate`` (one warning says why). As the ``collate_fn``::

    DataLoader(ds, batch_size=64, num_workers=4, collate_fn=packer.datasets.collate)

How slots are sent, released and dropped: docs/datasets.md.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import reduction, util
from typing import Any

import cv2
import numpy as np
import torch
from torch.multiprocessing.reductions import reduce_tensor
from torch.utils.data import default_collate, get_worker_info

from .fields import PER_SAMPLE, FieldTuple
from .shm.region import SharedRegion, SlotTable
from .shm.worker_memory import settle_worker

__all__ = ["collate", "slots_available", "MAX_SLOTS"]

#: Slots per worker process. Steady state needs about ``prefetch_factor`` + 2.
MAX_SLOTS = 8

# A slot's header: 8 int64 slots at the start of its region, then the batch's bytes. closed: the
# worker will not use it again; owner: the worker's pid; nonce: tells this slot from a later one
# that reuses its inode number; receiver: the pid of the process that holds a mapping of the slot
# (set by that process, which keeps the mapping until the slot is closed or its worker is gone).
_SLOT_FIELDS = ("state", "gen", "closed", "magic", "owner", "nonce", "receiver")
_HEADER_SLOTS = 8
_HEADER_BYTES = SlotTable.nbytes(_HEADER_SLOTS)
_MAGIC_VALUE = 0x7061636B62617463  # "packbatc"
_FREE, _BUSY = 0, 1
_ALIGN = 64
_ROUND = 1 << 20  # slot capacities are whole MiB
_STALE_AFTER = 4096  # received slot uses after which an idle mapping is dropped

def _torch_internals() -> tuple[Callable[..., Any], Callable[..., Any], dict] | None:
    """torch's recursive collate, its tensor collate and its type map (the extension point that
    ``default_collate``'s documentation names), or None where this torch lacks them."""
    try:
        from torch.utils.data._utils.collate import collate as recursive_collate
        from torch.utils.data._utils.collate import collate_tensor_fn, default_collate_fn_map
    except ImportError:
        return None
    return recursive_collate, collate_tensor_fn, default_collate_fn_map


_TORCH = _torch_internals()
_AVAILABLE = False  # set by the self-test below, at import


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


# --------------------------------------------------------------------------------------------
# Worker side: slots, allocation, pickling
# --------------------------------------------------------------------------------------------


class _Slot:
    """One reusable shared-memory buffer owned by a worker."""

    def __init__(self, capacity: int) -> None:
        self.region = SharedRegion(_HEADER_BYTES + capacity, "packer-batch")
        self.capacity = capacity
        self.header = SlotTable(_SLOT_FIELDS, self.region, slots=_HEADER_SLOTS)
        self.header["magic"] = _MAGIC_VALUE
        self.header["owner"] = os.getpid()
        self.header["nonce"] = int.from_bytes(os.urandom(8), "little") >> 2
        stat = os.fstat(self.region.fd)
        #: What the receiver keys its mapping by: (device, inode, nonce).
        self.key = (stat.st_dev, stat.st_ino, int(self.header["nonce"]))
        self.gen = 0
        self.sent_gen = -1
        self.ptr = 0
        self.use: np.ndarray | None = None

    @property
    def fd(self) -> int | None:
        """The region's descriptor, sent with each batch; None once retired."""
        return self.region.fd

    @property
    def free(self) -> bool:
        return self.header["state"] == _FREE

    def take(self) -> None:
        """Mark busy for a new batch; the views handed out hang off a fresh array ``use``."""
        self.gen += 1
        self.header["gen"] = self.gen
        self.header["state"] = _BUSY
        self.ptr = 0
        use = self.region.uint8(_HEADER_BYTES)
        finalizer = weakref.finalize(use, _worker_release, self, self.gen, os.getpid())
        finalizer.atexit = False
        self.use = use

    def retire(self) -> None:
        """Tell receivers this slot will not be used again (they drop their mapping)."""
        self.header["closed"] = 1
        self.region.close()


def _worker_release(slot: _Slot, gen: int, pid: int) -> None:
    # Every worker-side view of this use is gone. If it was never sent (the batch was dropped or
    # its collation failed), nobody else will free the slot.
    if os.getpid() == pid and slot.sent_gen != gen and slot.header["gen"] == gen:
        slot.header["state"] = _FREE


class _Pool:
    """The slots of one worker process and the allocation state of the batch being built."""

    def __init__(self, register: bool = True) -> None:
        self.slots: list[_Slot] = []
        self.taken: list[_Slot] = []
        self.expect = 0  # bytes the previous batch needed: new slots are sized for a whole batch
        self.used = 0
        if register:
            # At worker exit, after multiprocessing has flushed the result queue (its feeder thread
            # is joined at exitpriority -5), so no batch is still being pickled from a closed slot.
            util.Finalize(self, _retire_all, args=(self.slots,), exitpriority=-10)

    def begin(self) -> None:
        self.taken = []
        self.used = 0

    def end(self, ok: bool) -> None:
        if ok:
            self.expect = self.used
        for slot in self.taken:
            # From now on only the batch's views keep ``use`` alive; when they are gone its
            # finalizer frees the slot, unless the batch was sent (then the receiver frees it).
            slot.use = None
        self.taken = []

    def alloc(self, nbytes: int) -> tuple[_Slot, int] | None:
        """Reserve ``nbytes`` in a slot of this batch; None when every slot is busy."""
        need = _align(nbytes)
        for slot in self.taken:
            if slot.ptr + need <= slot.capacity:
                return self._carve(slot, need)
        want = max(need, self.expect - self.used)
        free = [s for s in self.slots if s not in self.taken and s.free]
        fits = [s for s in free if s.capacity >= want] or [s for s in free if s.capacity >= need]
        if fits:
            slot = min(fits, key=lambda s: s.capacity)
        elif len(self.slots) < MAX_SLOTS or free:
            if len(self.slots) >= MAX_SLOTS:  # a free slot that is too small: replace it
                small = min(free, key=lambda s: s.capacity)
                self.slots.remove(small)
                small.retire()
            slot = _Slot(-(-max(want, need) // _ROUND) * _ROUND)
            self.slots.append(slot)
        else:
            return None
        slot.take()
        self.taken.append(slot)
        return self._carve(slot, need)

    def _carve(self, slot: _Slot, need: int) -> tuple[_Slot, int]:
        offset = slot.ptr
        slot.ptr += need
        self.used += need
        return slot, offset


def _retire_all(slots: list[_Slot]) -> None:
    for slot in slots:
        slot.retire()


_pool: _Pool | None = None


def _worker_pool() -> _Pool:
    global _pool
    if _pool is None:
        # What the worker inherited goes to the collector's permanent generation, and malloc
        # keeps freed buffers (see worker_memory); the reader's first read did it already.
        settle_worker()
        _pool = _Pool()
    return _pool


class _SlotTensor(torch.Tensor):
    """A batch tensor living in a slot, until it is pickled; operations return plain tensors."""

    __torch_function__ = getattr(torch._C, "_disabled_torch_function_impl", torch.Tensor.__torch_function__)


def _slot_tensor(slot: _Slot, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    assert slot.use is not None
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = itemsize * int(np.prod(shape, dtype=np.int64))
    flat = torch.from_numpy(slot.use[offset : offset + nbytes])
    tensor = (flat.view(dtype) if dtype != torch.uint8 else flat).view(shape).as_subclass(_SlotTensor)
    tensor._packer_slot = (slot, slot.gen, offset, tensor.data_ptr())  # type: ignore[attr-defined]
    return tensor


def _reduce_slot_tensor(tensor: _SlotTensor) -> tuple:
    """Send a slot tensor as (slot key, slot fd or None, generation, offset, shape, dtype).

    The descriptor goes only while the parent process has not mapped the slot yet: passing one
    is a connection to this worker's descriptor-sharing thread with an authentication handshake,
    twice per batch (images and labels), which costs the main process more than the rest of
    receiving the batch. Once the parent has set itself as the slot's ``receiver`` it keeps the
    mapping for as long as this worker may use the slot, and the key alone finds it."""
    plain = tensor.as_subclass(torch.Tensor)
    info = getattr(tensor, "_packer_slot", None)
    if info is not None:
        slot, gen, offset, ptr = info
        if slot.fd is not None and slot.gen == gen and plain.data_ptr() == ptr and plain.is_contiguous():
            slot.sent_gen = gen
            fd = None if slot.header["receiver"] == os.getppid() else reduction.DupFd(slot.fd)
            return _rebuild_slot_tensor, (slot.key, fd, gen, offset, tuple(plain.shape), plain.dtype)
    return reduce_tensor(plain)  # changed in place after collation: torch's own path


reduction.ForkingPickler.register(_SlotTensor, _reduce_slot_tensor)


def _stack_into_slot(batch: list[torch.Tensor], *, collate_fn_map: dict | None = None) -> torch.Tensor:
    if any(type(x) not in (torch.Tensor, _SlotTensor) for x in batch):  # tv_tensors stack to plain tensors too
        batch = [x.as_subclass(torch.Tensor) if type(x) is not _SlotTensor else x for x in batch]
    elem = batch[0]
    pool = _pool
    plain = (
        pool is not None
        and elem.layout == torch.strided
        and not elem.is_nested
        and elem.device.type == "cpu"
        and all(
            type(x) in (torch.Tensor, _SlotTensor) and x.shape == elem.shape and x.dtype == elem.dtype
            and x.device == elem.device and not x.requires_grad
            for x in batch
        )
    )
    if plain:
        shape = (len(batch), *elem.shape)
        place = pool.alloc(elem.element_size() * int(np.prod(shape, dtype=np.int64)))
        if place is not None:
            out = _slot_tensor(place[0], place[1], shape, elem.dtype)
            target = out.as_subclass(torch.Tensor)
            if _is_chw_view_of_hwc(elem):
                _deinterleave_into(batch, target)
            else:
                torch.stack(batch, 0, out=target)
            return out
    assert _TORCH is not None
    return _TORCH[1](batch, collate_fn_map=collate_fn_map)


def _is_chw_view_of_hwc(x: torch.Tensor) -> bool:
    """A uint8 3 x H x W tensor whose pixels are interleaved in memory: ``hwc.permute(2, 0, 1)``,
    possibly cropped, which is what the readers (and most decoders) return."""
    return x.dtype == torch.uint8 and x.dim() == 3 and x.shape[0] == 3 and x.stride(0) == 1 and x.stride(2) == 3


def _deinterleave_into(batch: list[torch.Tensor], out: torch.Tensor) -> None:
    """``torch.stack(batch, out=out)`` for CHW views of HWC images, 4-5x faster.

    torch copies a permuted view element by element; OpenCV's vectorised ``split`` reads the
    crop's rows and writes the channels straight into the batch's planes.
    """
    planes = out.numpy()
    for i, x in enumerate(batch):
        if not _is_chw_view_of_hwc(x):
            out[i].copy_(x)
            continue
        dst = [planes[i, 0], planes[i, 1], planes[i, 2]]
        # The H x W x 3 view as it is (a crop has a row stride wider than its rows): OpenCV reads
        # strided rows itself, and a contiguous copy first would double the memory traffic.
        got = cv2.split(x.permute(1, 2, 0).numpy(), dst)
        if not (got[0] is dst[0] and got[1] is dst[1] and got[2] is dst[2]):  # pragma: no cover - OpenCV reallocated
            out[i].copy_(x)


def _collate_ints(batch: list[int], *, collate_fn_map: dict | None = None) -> torch.Tensor:
    values = torch.tensor(batch)  # int64, or the same OverflowError default_collate raises
    place = _pool.alloc(values.numel() * 8) if _pool is not None else None
    if place is None:
        return values
    out = _slot_tensor(place[0], place[1], tuple(values.shape), values.dtype)
    out.as_subclass(torch.Tensor).copy_(values)
    return out


def _stack_in_process(batch: list[torch.Tensor], *, collate_fn_map: dict | None = None) -> torch.Tensor:
    # The main process (no slots): torch's stack, except that CHW views of HWC images, which
    # torch copies element by element (~300 us for a 224 x 224 image), are split into the planes
    # of a fresh batch by OpenCV (~20 us). The same values as torch's stack, a new tensor alike.
    elem = batch[0]
    if all(type(x) is torch.Tensor and x.shape == elem.shape and not x.requires_grad
           and x.device.type == "cpu" and x.layout == torch.strided and _is_chw_view_of_hwc(x) for x in batch):
        out = torch.empty((len(batch), *elem.shape), dtype=torch.uint8)
        _deinterleave_into(batch, out)
        return out
    assert _TORCH is not None
    return _TORCH[1](batch, collate_fn_map=collate_fn_map)


_COLLATE_MAP = {} if _TORCH is None else {**_TORCH[2], torch.Tensor: _stack_into_slot,
                                            int: _collate_ints}
_MAIN_MAP = {} if _TORCH is None else {**_TORCH[2], torch.Tensor: _stack_in_process}

def _per_sample(value: Any) -> bool:
    """Whether ``value`` is a field with a count per sample: torchvision's ``BoundingBoxes``."""
    tv = sys.modules.get("torchvision.tv_tensors")
    return tv is not None and isinstance(value, tv.BoundingBoxes)


#: Unsigned dtypes that torch cannot promote when it stacks them (uint8 with uint16 raises), by width.
_UNSIGNED = (torch.uint8, *(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)))


def _widened(column: Sequence[Any]) -> list[Any] | None:
    """``column`` (one position of every sample) with tensors of mixed unsigned dtypes cast to the
    widest, values unchanged, or None when it has none: the masks of a dataset written before
    masks had one declared dtype hold 8-bit and 16-bit PNGs side by side."""
    first = column[0]
    if not isinstance(first, torch.Tensor) or first.dtype not in _UNSIGNED:
        return None
    dtype = first.dtype
    if all(isinstance(x, torch.Tensor) and x.dtype is dtype for x in column):
        return None
    if not all(isinstance(x, torch.Tensor) and x.dtype in _UNSIGNED for x in column):
        return None  # torch's own error says what is mixed
    widest = max((x.dtype for x in column), key=_UNSIGNED.index)
    return [x.to(widest) for x in column]


def _rebuilt(sample: Any, values: list[Any]) -> Any:
    """A tuple ``sample`` of the same type (a reader's marks kept) holding ``values``."""
    if hasattr(sample, "_fields"):
        return type(sample)(*values)
    out = type(sample)(values)
    if isinstance(sample, FieldTuple):
        out.per_sample = sample.per_sample
    return out


def _widen(batch: list[Any]) -> list[Any]:
    """``batch`` with each position (a dict key, a tuple place, or the samples themselves) that
    holds tensors of mixed unsigned dtypes widened (:func:`_widened`); the same list when none does."""
    elem = batch[0] if batch else None
    if isinstance(elem, torch.Tensor):
        return _widened(batch) or batch
    if isinstance(elem, Mapping) and all(isinstance(d, Mapping) and d.keys() == elem.keys() for d in batch):
        wide = {k: w for k in elem if (w := _widened([d[k] for d in batch])) is not None}
        return [{**d, **{k: w[i] for k, w in wide.items()}} for i, d in enumerate(batch)] if wide else batch
    if isinstance(elem, tuple) and all(isinstance(s, tuple) and len(s) == len(elem) for s in batch):
        wide = {k: w for k, column in enumerate(zip(*batch)) if (w := _widened(column)) is not None}
        if not wide:
            return batch
        return [_rebuilt(s, [wide[k][i] if k in wide else v for k, v in enumerate(s)]) for i, s in enumerate(batch)]
    return batch


def _collate_fields(batch: list[Any], inner: Callable[[list[Any]], Any]) -> Any:
    """``inner(batch)``, except that boxes (dict keys in :data:`~packer.datasets.fields.PER_SAMPLE`,
    the positions a reader's tuple marks, and ``BoundingBoxes`` anywhere in a dict or tuple
    sample) come as a list with one entry per sample, left as the samples hold them. Tensors of
    one position whose unsigned dtypes differ are stacked as the widest (:func:`_widen`)."""
    batch = _widen(batch)
    elem = batch[0] if batch else None
    if isinstance(elem, Mapping):
        listed = {k for k, v in elem.items() if k in PER_SAMPLE or _per_sample(v)}
        if listed:
            out = {k: [d[k] for d in batch] if k in listed else inner([d[k] for d in batch]) for k in elem}
            try:
                return type(elem)(out)  # type: ignore[call-arg]
            except TypeError:
                return out
    elif isinstance(elem, tuple) and not hasattr(elem, "_fields"):
        listed = {k for k, v in enumerate(elem) if _per_sample(v)} | set(getattr(elem, "per_sample", ()))
        if listed:
            if any(len(item) != len(elem) for item in batch):
                raise RuntimeError("each element in list of batch should be of equal size")
            return [list(column) if k in listed else inner(list(column)) for k, column in enumerate(zip(*batch))]
    return inner(batch)


def collate(batch: list[Any]) -> Any:
    """Drop-in for ``torch.utils.data.default_collate`` that reuses shared memory across batches.

    Returns exactly what ``default_collate`` returns (tuples, lists, dicts and namedtuples of
    stacked tensors; ints as int64, floats as float64, strings as lists). Inside a DataLoader
    worker the tensors are stacked into slots of shared memory that the worker reuses once the
    main process has freed the previous batch in that slot (see the module documentation),
    which removes the per-batch page faults of a fresh segment on both sides. In the main
    process it stacks into fresh tensors as ``default_collate`` does (images that are CHW views
    of HWC pixels, what the readers return, are split into the batch's planes by OpenCV, several
    times faster than torch's copy); where the import-time self-test failed
    (:func:`slots_available` says why) it is ``default_collate`` itself.

    Images and masks of one size are stacked (in slots), masks of 8 and 16 bits in one batch (a
    dataset written before the manifest declared the masks' dtype) as 16-bit; boxes, whose count differs from sample
    to sample, come as a list of the samples' tensors: a dict's ``"boxes"`` and ``"box_labels"``
    (``as_dict=True``), and torchvision ``BoundingBoxes`` (``output="tv_tensors"``) in dicts and
    tuples alike, and the readers' ``"boxes"`` and ``"box_labels"`` in tuples too (a reader's
    tuple marks their places).

    Args:
        batch: the list of samples the DataLoader's sampler selected.
    """
    if get_worker_info() is None:
        if _TORCH is None or not _AVAILABLE:
            return _collate_fields(batch, default_collate)
        return _collate_fields(batch, lambda part: _TORCH[0](part, collate_fn_map=_MAIN_MAP))  # type: ignore[index]
    if not _AVAILABLE:
        settle_worker()
        return _collate_fields(batch, default_collate)
    pool = _worker_pool()
    pool.begin()
    ok = False
    try:
        result = _collate_fields(batch, lambda part: _TORCH[0](part, collate_fn_map=_COLLATE_MAP))  # type: ignore[index]
        ok = True
        return result
    finally:
        pool.end(ok)


# --------------------------------------------------------------------------------------------
# Receiving side: one mapping per slot, views per batch
# --------------------------------------------------------------------------------------------


class _Mapping:
    def __init__(self, fd: int, size: int, key: tuple[int, int, int]) -> None:
        # A mapping of its own; the caller keeps (and closes) ``fd``.
        self.region = SharedRegion(size, "packer-batch", fd=os.dup(fd))
        self.region.close()
        self.size = size
        self.header = SlotTable(_SLOT_FIELDS, self.region, slots=_HEADER_SLOTS)
        if self.header["magic"] != _MAGIC_VALUE or self.header["nonce"] != key[2]:
            raise RuntimeError("packer.datasets.collate: received a descriptor that is not a batch slot")
        self.uses: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
        self.last = 0
        self.header["receiver"] = os.getpid()  # from now on the worker sends the key alone


_rx: dict[tuple[int, int, int], _Mapping] = {}
_rx_lock = threading.RLock()
_rx_tick = itertools.count(1)
_rx_now = 0


def _rx_release(header: SlotTable, gen: int, pid: int) -> None:
    # Every main-process view of this batch is gone: the worker may reuse the slot.
    if os.getpid() == pid and header["gen"] == gen:
        header["state"] = _FREE


def _gone(pid: int) -> bool:
    """Whether process ``pid`` no longer exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _sweep() -> None:
    """Drop mappings of slots that hold no live batch and that their worker will not use again:
    closed, or long idle with the worker gone (a killed worker cannot close its slots). An idle
    slot of a live worker stays mapped: the worker sends its batches by key alone, and the
    mapping costs no memory of its own (the pages are the worker's)."""
    for key, mapping in list(_rx.items()):
        if len(mapping.uses):
            continue
        if mapping.header["closed"] or (_rx_now - mapping.last > _STALE_AFTER and _gone(int(mapping.header["owner"]))):
            mapping.header["receiver"] = 0
            del _rx[key]


def _gc_sweep(phase: str, info: dict) -> None:
    if phase == "stop" and _rx and _rx_lock.acquire(blocking=False):
        try:
            _sweep()
        finally:
            _rx_lock.release()


def _map_slot(key: tuple[int, int, int], dup_fd: Any) -> _Mapping:
    """This process's mapping of the slot ``key``, made from ``dup_fd`` if there is none yet."""
    mapping = _rx.get(key)
    if dup_fd is None:
        if mapping is None:
            raise RuntimeError(f"packer.datasets.collate: a batch names a slot this process has not mapped "
                               f"(device, inode, nonce {key}); was it sent on by another process?")
        return mapping
    fd = dup_fd.detach()
    try:
        if mapping is None or mapping.header["closed"]:
            mapping = _Mapping(fd, os.fstat(fd).st_size, key)
            _rx[key] = mapping
    finally:
        os.close(fd)
    return mapping


def _rebuild_slot_tensor(key: tuple[int, int, int], dup_fd: Any, gen: int, offset: int, shape: tuple[int, ...],
                         dtype: torch.dtype) -> torch.Tensor:
    global _rx_now
    with _rx_lock:
        mapping = _map_slot(key, dup_fd)
        use = mapping.uses.get(gen)
        if use is None:
            _rx_now = next(_rx_tick)
            mapping.last = _rx_now
            use = mapping.region.uint8(_HEADER_BYTES)
            mapping.uses[gen] = use
            finalizer = weakref.finalize(use, _rx_release, mapping.header, gen, os.getpid())
            finalizer.atexit = False
            if _rx_now % 32 == 0:
                _sweep()
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = itemsize * int(np.prod(shape, dtype=np.int64))
    if offset < 0 or offset + nbytes > use.size:
        raise RuntimeError(
            f"packer.datasets.collate: batch tensor at offset {offset} ({nbytes} bytes) lies outside "
            f"its {use.size}-byte slot"
        )
    flat = torch.from_numpy(use[offset : offset + nbytes])
    return (flat.view(dtype) if dtype != torch.uint8 else flat).view(shape)


def _after_fork_in_child() -> None:
    # A forked child must neither reuse its parent's slots nor keep its parent's mappings alive.
    global _pool, _rx, _rx_lock
    _pool = None
    _rx = {}
    _rx_lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
gc.callbacks.append(_gc_sweep)


# --------------------------------------------------------------------------------------------
# The self-test: whether the slot path works with this process's torch
# --------------------------------------------------------------------------------------------

_WHY_OFF = "not tested yet"


def _probe_batch() -> list[tuple[torch.Tensor, int, dict[str, torch.Tensor]]]:
    images = torch.arange(2 * 5 * 7 * 3, dtype=torch.uint8).reshape(2, 5, 7, 3)
    return [(images[i].permute(2, 0, 1), 40 + i, {"f": torch.full((2,), i / 4)}) for i in range(2)]


def _probe() -> str:
    """Send one batch the way a worker does and receive it the way the main process does, all in
    this process: collate into a slot (torch's recursive collate with packer's type map), pickle
    with multiprocessing's pickler, rebuild from the slot's mapping, compare with
    ``default_collate``, and check that freeing the batch hands the slot back. Returns "" when every
    step behaves, else what failed."""
    global _pool
    if not hasattr(os, "memfd_create"):
        return "this platform has no memfd_create"
    if _TORCH is None:
        return "torch.utils.data._utils.collate (collate, collate_tensor_fn, default_collate_fn_map) is missing"
    batch = _probe_batch()
    saved, _pool = _pool, _Pool(register=False)
    key = None
    try:
        _pool.begin()
        sent = _TORCH[0](batch, collate_fn_map=_COLLATE_MAP)
        _pool.end(True)
        if not _pool.slots or type(sent[0]) is not _SlotTensor:
            return "torch's recursive collate did not call packer's tensor collate for a Tensor"
        slot = _pool.slots[0]
        key = slot.key
        with _rx_lock:
            _rx[key] = _Mapping(slot.fd, os.fstat(slot.fd).st_size, key)
        slot.header["receiver"] = os.getppid()  # as a worker whose parent holds the mapping: key alone
        data = bytes(reduction.ForkingPickler.dumps(sent))
        if b"_rebuild_slot_tensor" not in data:
            return "multiprocessing's pickler did not use packer's reduction for a slot tensor"
        del sent
        got = reduction.ForkingPickler.loads(data)
        want = default_collate(_probe_batch())
        if not _same(got, want):
            return "a batch sent through a slot differs from default_collate's"
        del got  # its views are freed here (no cycles): the finalizer hands the slot back
        if slot.header["state"] != _FREE:
            return "freeing a received batch did not hand its slot back"
        return ""
    except Exception as exc:  # noqa: BLE001 - any failure of torch's internals turns the path off
        return f"{type(exc).__name__}: {exc}"
    finally:
        with _rx_lock:
            if key is not None:
                _rx.pop(key, None)
        _retire_all(_pool.slots)
        _pool = saved


def _same(a: Any, b: Any) -> bool:
    """Same structure, types, dtypes, shapes and values (tensors must be plain ``torch.Tensor``)."""
    if isinstance(b, torch.Tensor):
        return type(a) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in b)
    if isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def slots_available() -> tuple[bool, str]:
    """Whether ``collate`` builds batches in shared-memory slots in this process's workers, and if
    not, why: the result of the self-test run at import (:func:`_probe`), never of a version check."""
    return _AVAILABLE, _WHY_OFF


def _self_test() -> None:
    global _AVAILABLE, _WHY_OFF
    _WHY_OFF = _probe()
    _AVAILABLE = not _WHY_OFF
    if _WHY_OFF and multiprocessing.parent_process() is None:  # once, in the main process
        warnings.warn(f"packer.datasets.collate: shared-memory batches are off ({_WHY_OFF}); it uses "
                      f"torch's default_collate", RuntimeWarning, stacklevel=2)


_self_test()
