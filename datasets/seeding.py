"""Reproducible, distinct random streams for every DataLoader worker, epoch and DDP rank.

PyTorch already seeds torch, ``random`` and NumPy's global RNG per worker (``base_seed + id``).
Three pitfalls remain, fixed here: DDP ranks repeat each other's streams (:func:`seed_worker`
folds the rank in); generators owned by the dataset are cloned identically into every worker
(:func:`seed_worker` re-seeds them, see :func:`reseed_dataset_generators`); and a fresh
``Generator`` per sample is not random (:func:`worker_rng` caches one per worker and epoch)::

    loader = DataLoader(ds, num_workers=8, worker_init_fn=seed_worker,
                        generator=torch.Generator().manual_seed(seed))

Epochs, persistent workers and reproducibility of a whole run: docs/datasets.md.
"""

from __future__ import annotations

import hashlib
import os
import random
import types
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from packer.checks import check_int

from .world import detect_rank

__all__ = [
    "reseed_dataset_generators",
    "seed_everything",
    "seed_worker",
    "worker_rng",
]

# Purposes keep the streams derived from one (seed, rank) independent of each other.
_PURPOSE_RANDOM = 1
_PURPOSE_NUMPY = 2
_PURPOSE_TORCH = 3
_PURPOSE_DATASET = 4
_PURPOSE_WORKER_RNG = 5

# Role tags: a worker's seed and the main process's torch seed are different kinds of value.
_ROLE_MAIN = 0
_ROLE_WORKER = 1

_MAX_CACHED_RNGS = 64
_MAX_SCAN_DEPTH = 4
_MAX_SCAN_CONTAINER = 64

_rng_cache: OrderedDict[tuple[int, ...], np.random.Generator] = OrderedDict()
# The rank seed_worker used in this worker process, so worker_rng folds in the same one.
_worker_rank: int | None = None


def _reset_after_fork() -> None:
    global _worker_rank
    _rng_cache.clear()
    _worker_rank = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _process_seed() -> tuple[int, int, int]:
    """(role, seed, worker id) of this process: the DataLoader worker seed, or torch's seed."""
    info = torch.utils.data.get_worker_info()
    if info is not None:
        return _ROLE_WORKER, int(info.seed), int(info.id)
    return _ROLE_MAIN, int(torch.initial_seed()), 0


def _path_key(path: str) -> int:
    """A stable 64-bit integer for an attribute path (``hash(str)`` changes per process)."""
    return int.from_bytes(hashlib.blake2b(path.encode(), digest_size=8).digest(), "little")


def _u64(seq: np.random.SeedSequence) -> int:
    return int(seq.generate_state(1, dtype=np.uint64)[0])


def seed_worker(worker_id: int, rank: int | None = None) -> None:
    """Seed ``random``, NumPy's global RNG, torch and the dataset's own generators in a worker.

    Meant as ``DataLoader(worker_init_fn=seed_worker)``. All seeds come from one
    ``np.random.SeedSequence`` over (the worker's seed, ``worker_id``, the DDP rank), so they are
    distinct per worker, per epoch (new workers get a new seed from the loader's generator), and
    per rank, and the same again for the same loader seed. NumPy's global RNG gets 128 bits of
    seed state instead of the usual ``seed % 2**32``, so different workers cannot collide.

    Args:
        worker_id: the DataLoader worker id (0 .. num_workers - 1).
        rank: the DDP rank to fold in. ``None`` detects it: ``torch.distributed`` if it is
            initialised in this process, else the environment variable ``RANK`` (set by
            torchrun), else 0. Spawned workers never have an initialised process group, so with
            a manually created one pass the rank: ``functools.partial(seed_worker, rank=rank)``.

    Outside a DataLoader worker (e.g. called by hand with ``num_workers=0``) the base seed is
    ``torch.initial_seed()`` of the calling process.
    """
    global _worker_rank
    worker_id = check_int("worker_id", worker_id, 0, 2**64)
    rank = detect_rank() if rank is None else check_int("rank", rank, 0, 2**64)
    role, base, _ = _process_seed()
    entropy = [base, worker_id, rank, role]

    random.seed(_u64(np.random.SeedSequence(entropy, spawn_key=(_PURPOSE_RANDOM,))))
    np.random.seed(np.random.SeedSequence(entropy, spawn_key=(_PURPOSE_NUMPY,)).generate_state(4))
    torch.manual_seed(_u64(np.random.SeedSequence(entropy, spawn_key=(_PURPOSE_TORCH,))))

    _rng_cache.clear()
    _worker_rank = rank

    info = torch.utils.data.get_worker_info()
    if info is not None and info.dataset is not None:
        reseed_dataset_generators(
            info.dataset, np.random.SeedSequence(entropy, spawn_key=(_PURPOSE_DATASET,))
        )


def worker_rng(epoch: int | None = None) -> np.random.Generator:
    """The NumPy ``Generator`` of this worker (and ``epoch``, if given).

    The generator is created once per key and cached in the process, so successive calls return
    the same object and draw successive values; never seed a new generator per sample.

    The key, and the seed, is (the DataLoader worker's seed ``get_worker_info().seed``, which is
    distinct per worker and per non-persistent epoch; the DDP rank; ``epoch``). In the main
    process (``num_workers=0``) the worker seed is replaced by ``torch.initial_seed()``, and
    :func:`seed_everything` restarts the streams.

    Args:
        epoch: ``None`` gives one stream per worker process, which continues across the epochs of
            persistent workers (different values each epoch, reproducible run to run). An int
            gives a separate stream for that epoch, which depends only on (worker seed, rank,
            epoch), not on how much earlier epochs drew: use it when the dataset knows its epoch.

    The rank is the one :func:`seed_worker` used in this worker, or is detected as it does.
    """
    if epoch is not None:
        epoch = check_int("epoch", epoch, 0, 2**64)
    role, base, worker_id = _process_seed()
    rank = _worker_rank if _worker_rank is not None else detect_rank()
    key = (role, base, worker_id, rank, -1 if epoch is None else epoch)
    rng = _rng_cache.get(key)
    if rng is None:
        spawn_key = (
            (_PURPOSE_WORKER_RNG, 0, 0) if epoch is None else (_PURPOSE_WORKER_RNG, 1, epoch)
        )
        seq = np.random.SeedSequence([base, worker_id, rank, role], spawn_key=spawn_key)
        rng = np.random.Generator(np.random.PCG64(seq))
        _rng_cache[key] = rng
        while len(_rng_cache) > _MAX_CACHED_RNGS:
            _rng_cache.popitem(last=False)
    return rng


def _reseed_one(obj: object, seq: np.random.SeedSequence) -> bool:
    """Re-seed ``obj`` in place if it is a generator we know; return whether it was one."""
    if isinstance(obj, np.random.Generator):
        bit_generator = obj.bit_generator
        bit_generator.state = type(bit_generator)(seq).state
        return True
    if isinstance(obj, np.random.RandomState):
        obj.seed(seq.generate_state(4))
        return True
    if isinstance(obj, random.Random):
        obj.seed(_u64(seq))
        return True
    if isinstance(obj, torch.Generator):
        obj.manual_seed(_u64(seq))
        return True
    return False


_SKIP_TYPES = (str, bytes, bytearray, int, float, complex, type(None), torch.Tensor, np.ndarray)
# Reached but never looked into: their attributes are code, not dataset state.
_OPAQUE_TYPES = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
)


def reseed_dataset_generators(obj: Any, seed: int | np.random.SeedSequence) -> list[str]:
    """Re-seed, in place, the random generators an object holds; return their attribute paths.

    Found: ``np.random.Generator``, ``np.random.RandomState``, ``random.Random`` and
    ``torch.Generator`` objects that are ``obj`` itself, its attributes (``vars()``), or
    elements of lists, tuples and dicts among them, recursively to depth 4 (so
    ``Subset.dataset.rng``, ``ConcatDataset.datasets[1].rng`` and ``self.transform.rng`` are
    reached). Containers longer than 64 elements are not scanned (a dataset's sample list), nor
    are tensors, arrays, strings, modules, classes and functions. A generator reached twice is
    re-seeded once, so objects that share one generator keep sharing it.

    Each generator gets its own seed, derived from ``seed`` and its attribute path (e.g.
    ``"dataset.rng"``), so it is stable run to run and independent of attribute order. Re-seeding
    keeps the generator's type (a ``Generator`` keeps its bit generator class).

    :func:`seed_worker` calls this on ``get_worker_info().dataset``; call it yourself for objects
    it does not reach.

    Args:
        obj: the dataset (or any object) to scan.
        seed: a non-negative int or a ``np.random.SeedSequence``.
    """
    if not isinstance(seed, np.random.SeedSequence):
        seed = np.random.SeedSequence(check_int("seed", seed, 0, 2**128))
    found: list[str] = []
    seen: set[int] = set()

    def child(path: str) -> np.random.SeedSequence:
        return np.random.SeedSequence(
            seed.entropy, spawn_key=(*seed.spawn_key, _path_key(path)), pool_size=seed.pool_size
        )

    def visit(node: object, path: str, depth: int) -> None:
        if id(node) in seen or isinstance(node, _SKIP_TYPES):
            return
        seen.add(id(node))
        if _reseed_one(node, child(path)):
            found.append(path)
            return
        if depth >= _MAX_SCAN_DEPTH or isinstance(node, _OPAQUE_TYPES):
            return
        if isinstance(node, dict):
            if len(node) <= _MAX_SCAN_CONTAINER:
                for key, value in list(node.items()):
                    visit(value, f"{path}[{key!r}]", depth + 1)
            return
        if isinstance(node, (list, tuple)):
            if len(node) <= _MAX_SCAN_CONTAINER:
                for index, value in enumerate(node):
                    visit(value, f"{path}[{index}]", depth + 1)
            return
        attributes = getattr(node, "__dict__", None)
        if isinstance(attributes, dict) and len(attributes) <= 4 * _MAX_SCAN_CONTAINER:
            for name, value in list(attributes.items()):
                visit(value, f"{path}.{name}", depth + 1)

    visit(obj, "dataset", 0)
    return found


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed ``random``, NumPy's global RNG, torch (CPU and every CUDA device) in this process.

    Also sets ``os.environ["PYTHONHASHSEED"]``, which only affects processes started later
    (spawned DataLoader workers, subprocesses): the running interpreter's ``hash()`` of strings
    was fixed at start-up. Restarts the streams of :func:`worker_rng` in this process. A
    DataLoader without a ``generator`` draws its workers' seeds from torch's global RNG, so
    seeding here also makes the workers reproducible.

    NumPy is seeded with ``seed`` itself when it fits 32 bits, else with 128 bits derived from it.

    Args:
        seed: an int in [0, 2**64).
        deterministic: also ask for deterministic kernels: ``cudnn.deterministic = True``,
            ``cudnn.benchmark = False``, ``torch.use_deterministic_algorithms(True)`` (ops without
            a deterministic implementation then raise), and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` if
            unset (cuBLAS reads it when CUDA starts, so call this before any CUDA work).
            ``False`` leaves these settings as they are.
    """
    seed = check_int("seed", seed, 0, 2**64)
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    if seed < 2**32:
        np.random.seed(seed)
    else:
        np.random.seed(np.random.SeedSequence(seed).generate_state(4))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    _rng_cache.clear()

    if deterministic:
        if "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                warnings.warn(
                    "seed_everything(deterministic=True) set CUBLAS_WORKSPACE_CONFIG after CUDA "
                    "was initialised; cuBLAS may ignore it. Call seed_everything before any CUDA "
                    "work, or export CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting Python.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
