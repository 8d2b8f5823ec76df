"""Converting an image folder with the processes torchrun starts: :func:`convert_imagefolder_torchrun`.

Rank 0 scans and shuffles once and sends the ordered list to every rank (JSON bytes in a tensor,
gloo): SRC as given, and each file's path, label, size and modification time. Every rank checks
that it was given the same SRC and that the files of its share are the ones rank 0 listed, and
any difference fails every rank before an image is converted; each file is checked again as it
is read. Each rank converts one contiguous part into a hidden folder beside the destination with its
own worker processes; rank 0 merges the parts (:mod:`packer.operations.merge`; shards taken whole are
hard-linked, not copied) and publishes. The result
holds the samples of a one-process conversion with the same seed, in the same order, with the same
stored bytes. Any rank failing fails every rank, with nothing at the destination; the finished
parts stay beside it, and ``--resume`` keeps them (and continues interrupted ones).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from ..description.manifest import Manifest, Skipped
from ..errors import PackerError, SourceError
from ..files.filesystem import check_destination, claim_destination, drop_stale_claim, sibling_path
from ..formats import read_manifest
from ..operations.merge import merge
from ..pipeline.engine import (
    ConvertOptions,
    ConvertReport,
    describe_stamp,
    file_stamp,
    nothing_converted,
    scan_ordered,
)
from ..pipeline.items import convert_items
from ..sizes import seconds_from_env
from ..wording import noun, plural

__all__ = ["DistributedError", "Launch", "torchrun_launch", "part_range", "part_path", "rank_timeout",
           "convert_imagefolder_torchrun"]

#: How long a rank may stay silent (stopped, hung) before the others give up on it; a slow rank
#: that is alive is waited for however long its part takes. ``PACKER_TORCHRUN_TIMEOUT`` (seconds)
#: or ``packer convert --rank-timeout`` change it.
DEFAULT_TIMEOUT = timedelta(minutes=30)


class DistributedError(PackerError, RuntimeError):
    """Another rank failed, or the ranks could not talk to each other."""


@dataclass(frozen=True)
class Launch:
    """This process's place in a torchrun job, from the environment torchrun sets."""

    rank: int
    world_size: int
    local_rank: int
    master: str

    def describe(self) -> str:
        """One line for the user."""
        return f"rank {self.rank} of {self.world_size} (local rank {self.local_rank}, master {self.master})"


def torchrun_launch(environ: Mapping[str, str] = os.environ) -> Launch | None:
    """The torchrun job this process belongs to (RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR all
    set), else None. ValueError for values that are not a rank within the world size."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
    if not all(environ.get(n, "").strip() for n in names):
        return None
    try:
        rank, size, local = (int(environ[n]) for n in names[:3])
    except ValueError:
        raise ValueError(f"torchrun environment RANK={environ['RANK']!r} WORLD_SIZE={environ['WORLD_SIZE']!r} "
                         f"LOCAL_RANK={environ['LOCAL_RANK']!r} is not integers") from None
    if not 0 <= rank < size or local < 0:
        raise ValueError(f"torchrun environment: rank {rank} is not within world size {size}")
    return Launch(rank, size, local, f"{environ['MASTER_ADDR']}:{environ.get('MASTER_PORT', '')}")


def part_range(n: int, world_size: int, rank: int) -> tuple[int, int]:
    """The contiguous share [start, stop) of ``n`` ordered items that ``rank`` converts; the shares
    of ranks 0 .. world_size - 1 follow each other and differ in size by at most one."""
    return n * rank // world_size, n * (rank + 1) // world_size


def part_path(dst: str, rank: int, world_size: int) -> str:
    """The hidden folder beside ``dst`` that ``rank`` writes its part into."""
    return sibling_path(dst, f"part-{rank}-of-{world_size}")


def rank_timeout(environ: Mapping[str, str] = os.environ) -> timedelta:
    """How long a rank may stay silent: ``PACKER_TORCHRUN_TIMEOUT`` (seconds) or :data:`DEFAULT_TIMEOUT`."""
    return timedelta(seconds=seconds_from_env("PACKER_TORCHRUN_TIMEOUT", DEFAULT_TIMEOUT.total_seconds(), environ))


# -- talking between ranks: JSON bytes in tensors (gloo) ------------------------------------------
class _Peers:
    """Liveness of the other ranks, through the process group's store: each rank beats (a counter
    in the store, from a thread) while it works, and before each collective every rank waits in the
    store until all have arrived, failing if another rank's beat has not moved for ``timeout``.
    The collective itself then runs with every rank present, so a long part on a live rank is
    waited for and a stopped or hung one is named after ``timeout``."""

    def __init__(self, store: Any, launch: Launch, timeout: timedelta) -> None:
        call = (int(store.add("packer/calls", 1)) - 1) // launch.world_size  # the same on every rank
        self.store, self.prefix, self.launch = store, f"packer/{call}/", launch
        self.timeout = timeout.total_seconds()
        self.interval = min(5.0, max(0.05, self.timeout / 20))
        self.step = 0
        self.silent: str | None = None  # the error once a rank is known to be silent
        self.dead: int | None = None  # the rank found dead, whose claim files are left to remove
        self.who: dict[int, tuple[int, str]] = {}  # rank -> (pid, host), read at the first meeting
        self._stop = threading.Event()
        store.set(f"{self.prefix}who/{launch.rank}", json.dumps([os.getpid(), socket.gethostname()]))
        self._beat()
        self._thread = threading.Thread(target=self._beats, name="packer-rank-beat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        self.store.add(f"{self.prefix}beat/{self.launch.rank}", 1)

    def _beats(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending; the waits say why
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.interval + 1)  # a beat blocked on a stopped store host is left to die

    def leave(self, why: str) -> None:
        """Tell the other ranks why this one stops without reaching its next collective (an
        interrupt, a signal): they name it at once instead of waiting for its beat to stop."""
        try:
            self.store.set(f"{self.prefix}gone/{self.launch.rank}", why)
        except Exception:  # noqa: BLE001 - the store is gone too; the others see this rank die
            pass

    def _learn_who(self) -> None:
        """Every rank's pid and host that the store holds (each sets its own as it starts), kept
        for when the store is gone."""
        for r in range(self.launch.world_size):
            key = f"{self.prefix}who/{r}"
            if r not in self.who and r != self.launch.rank and self.store.check([key]):
                pid, host = json.loads(self.store.get(key))
                self.who[r] = (int(pid), str(host))

    def fate(self, r: int) -> str | None:
        """What became of rank ``r`` as far as this rank can tell, as the end of a sentence
        ("died (...)", "left: ...", "is stopped (...)"), or None when it looks alive or cannot be
        seen (another host, nothing said). Reads the store only while it answers."""
        try:
            why = self.store.check([f"{self.prefix}gone/{r}"]) and self.store.get(f"{self.prefix}gone/{r}").decode()
        except Exception:  # noqa: BLE001 - the store is gone: judge by the process alone
            why = None
        if why:
            return f"stopped: {why}"
        with contextlib.suppress(Exception):  # the store may be gone: what was learned before stands
            self._learn_who()
        if r not in self.who:
            return None
        pid, host = self.who[r]
        if host != socket.gethostname():
            return None
        state = process_state(pid)
        if state == "gone":
            return f"died (pid {pid} on host {host} ended without a word: killed, crashed or exited)"
        if state == "stopped":
            return f"is stopped (pid {pid} on host {host}, by SIGSTOP or Ctrl-Z; SIGCONT resumes it)"
        return None

    def blame(self) -> tuple[int, str] | None:
        """The first other rank whose fate is known: (rank, fate), else None."""
        for r in range(self.launch.world_size):
            if r != self.launch.rank:
                fate = self.fate(r)
                if fate is not None:
                    return r, fate
        return None

    def arrive(self) -> None:
        """Wait until every rank reaches its next collective; DistributedError naming a rank that
        has been silent for ``timeout``."""
        if self.silent:
            raise DistributedError(self.silent)
        self.step += 1
        key, n = f"{self.prefix}at/{self.step}", self.launch.world_size
        self.store.add(key, 1)
        now = time.monotonic()
        seen = {r: (-1, now) for r in range(n) if r != self.launch.rank}
        delay = 0.01  # the last rank's arrival is seen within a few ms, then checks back off to the beat
        while int(self.store.add(key, 0)) < n:
            now = time.monotonic()
            for r, (beats, since) in seen.items():
                current = int(self.store.add(f"{self.prefix}beat/{r}", 0))
                if current != beats:
                    seen[r] = (current, now)
                    continue
                fate = self.fate(r) if now - since > 2 * self.interval else None
                if fate is not None and not fate.startswith("is stopped"):
                    self.silent, self.dead = f"rank {r} of {n} {fate}", r if fate.startswith("died") else None
                    raise DistributedError(self.silent)
                if now - since > self.timeout:
                    what = f": it {fate}" if fate else ""
                    self.silent = (f"rank {r} of {n} has not answered for {self.timeout:g} s (stopped or hung{what}; "
                                   f"--rank-timeout or PACKER_TORCHRUN_TIMEOUT sets how long a rank may stay silent)")
                    raise DistributedError(self.silent)
            time.sleep(delay)
            delay = min(self.interval, 2 * delay)
        self._learn_who()


def process_state(pid: int) -> str:
    """``"gone"`` (no such process, or a zombie), ``"stopped"`` (SIGSTOP, Ctrl-Z) or ``"alive"``, from
    ``/proc`` (``"alive"`` where there is none to ask)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"
    except (OSError, IndexError):
        return "alive"
    return {b"Z": "gone", b"X": "gone", b"T": "stopped", b"t": "stopped"}.get(state, "alive")


def _start_peers(launch: Launch, timeout: timedelta) -> _Peers | None:
    """The liveness watch of this job, or None where torch offers no store to keep it in (then the
    process group's own timeout bounds each wait)."""
    from torch.distributed import distributed_c10d

    get_store = getattr(distributed_c10d, "_get_default_store", None)
    if get_store is None or launch.world_size < 2:
        return None
    return _Peers(get_store(), launch, timeout)


def _broadcast_json(obj: Any, peers: _Peers | None, src: int = 0) -> Any:
    """``obj`` of rank ``src``, on every rank."""
    import torch
    import torch.distributed as dist

    if peers is not None:
        peers.arrive()

    data = json.dumps(obj).encode() if dist.get_rank() == src else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(size, src)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(int(size), dtype=torch.uint8)
    dist.broadcast(buf, src)
    return json.loads(buf.numpy().tobytes())


def _gather_json(obj: Any, peers: _Peers | None) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    import torch
    import torch.distributed as dist

    if peers is not None:
        peers.arrive()

    data = json.dumps(obj).encode()
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64))
    longest = max(int(s) for s in sizes)
    bufs = [torch.zeros(longest, dtype=torch.uint8) for _ in sizes]
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.all_gather(bufs, mine)
    return [json.loads(b.numpy()[: int(s)].tobytes()) for b, s in zip(bufs, sizes)]


# -- the conversion ---------------------------------------------------------------------------------
def convert_imagefolder_torchrun(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], fmt: str, options: ConvertOptions, launch: Launch,
    timeout: timedelta | None = None,
) -> ConvertReport:
    """Convert the image folder ``src`` to ``fmt`` at ``dst`` as rank ``launch.rank`` of a torchrun
    job (every rank calls it with the same arguments; a gloo process group is started unless one is
    already). Rank 0 holds the destination's claim from the scan to the publish; each rank uses
    ``options.workers`` processes. Every rank returns the report of the merged dataset, or raises:
    its own error, or DistributedError naming the rank that failed, or the rank that stayed silent
    (stopped, hung) for ``timeout`` (default: :func:`rank_timeout`); a live rank is waited for
    however long its part takes."""
    import torch.distributed as dist

    t0 = time.perf_counter()
    src, dst = os.fspath(src), os.fspath(dst)
    timeout = rank_timeout() if timeout is None else timeout
    own = not dist.is_initialized()
    if own:
        try:
            dist.init_process_group("gloo", timeout=timeout)
        except RuntimeError:
            raise DistributedError(
                f"rank {launch.rank} of {launch.world_size}: not every rank joined within {timeout.total_seconds():g} s "
                f"(a rank did not start or failed before joining, or cannot reach the master {launch.master})"
            ) from None
    peers = None
    try:
        peers = _start_peers(launch, timeout)
        if launch.rank == 0:
            check_destination(src, dst)
            with claim_destination(dst):
                return _run_rank0(src, dst, fmt, options, launch, t0, peers)
        return _run_rank(src, dst, fmt, options, launch, t0, peers)
    except RuntimeError as e:
        if isinstance(e, PackerError):
            if peers is not None and peers.dead is not None:
                drop_stale_claim(dst if peers.dead == 0 else part_path(dst, peers.dead, launch.world_size))
            raise
        raise _peer_failure(launch, peers, dst, None) from None  # torch's store or gloo: say which rank, not how
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM: torchrun stopping the job after another rank failed
        failure = _peer_failure(launch, peers, dst, e)
        if failure is not None:
            raise failure from None
        if peers is not None:
            peers.leave("terminated (SIGTERM)" if type(e).__name__ == "Terminated" else "interrupted (Ctrl-C)")
        raise
    finally:
        if peers is not None:
            peers.close()
        if own:
            dist.destroy_process_group()


def _peer_failure(launch: Launch, peers: _Peers | None, dst: str,
                  interrupt: KeyboardInterrupt | None) -> DistributedError | None:
    """The one-line error for a failure that torch reported in its own words (a store or gloo
    connection that closed) or an ``interrupt`` that torchrun sent after another rank failed:
    the rank that died, left or stopped, and what became of it. A dead rank's claim files (rank
    0's on the destination, another rank's on its part) are removed, as its process cannot.
    For an interrupt with no other rank to blame: None (the interrupt is this rank's own)."""
    n = launch.world_size
    blamed = None
    deadline = time.monotonic() + 1.0  # a closed connection may come a moment before the process is gone
    while peers is not None:
        blamed = peers.blame()
        if blamed is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if blamed is None:
        if interrupt is not None:
            return None
        return DistributedError(f"rank {launch.rank} of {n} lost touch with the other ranks (the job's store at "
                                f"{launch.master} or another rank's connection closed: a rank or its node died, or "
                                f"the network failed)")
    r, fate = blamed
    if fate.startswith("died"):
        drop_stale_claim(dst if r == 0 else part_path(dst, r, n))
    error = DistributedError(f"rank {r} of {n} {fate}" + ("; torchrun stopped this rank" if interrupt else ""))
    error.names_the_cause = True  # type: ignore[attr-defined]  # the CLI says this, not "terminated"
    return error


def _run_rank0(src: str, dst: str, fmt: str, options: ConvertOptions, launch: Launch, t0: float,
               peers: _Peers | None) -> ConvertReport:
    """Scan, share the plan, convert part 0, merge every part and publish, share the outcome."""
    try:
        samples, template, errors = scan_ordered(src, dst, fmt, options)
    except BaseException as e:
        _broadcast_json({"error": f"{type(e).__name__}: {e}"}, peers)
        raise
    plan = {"src": src, "classes": template.classes,
            "items": [[s.relpath.replace(os.sep, "/"), s.label, *file_stamp(s.path)] for s in samples]}
    _broadcast_json(plan, peers)
    _agree_on_sources(plan, src, launch, peers)
    outcome, own_error = _convert_part(plan, src, dst, fmt, options, launch)
    outcomes = _gather_json(outcome, peers)
    failed = None
    try:
        if own_error is not None:
            raise own_error
        failed = next((r for r, o in enumerate(outcomes) if o["error"]), None)
        if failed is not None:
            raise DistributedError(f"rank {failed} of {launch.world_size} failed: {outcomes[failed]['error']}")
        report = _merge_parts(outcomes, src, dst, options, template)
    except BaseException as e:
        if peers is None or not peers.silent:  # a silent rank would not take the news
            _broadcast_json({"error": outcomes[failed]["error"] if failed is not None else f"{type(e).__name__}: {e}",
                             "rank": failed if failed is not None else 0}, peers)
        finished = [o["part"] for o in outcomes if o.get("part")]
        if finished and not getattr(e, "partial_output", None):
            e.partial_output = ", ".join(finished)  # type: ignore[attr-defined]  # the CLI's --resume hint
        raise
    for r in range(launch.world_size):
        shutil.rmtree(part_path(dst, r, launch.world_size), ignore_errors=True)
    _broadcast_json({"error": None}, peers)
    kept = [str(r) for r, o in enumerate(outcomes) if o.get("kept")]
    notes = [f"kept the parts of {noun(len(kept), 'rank')} {', '.join(kept)}, finished by an earlier run"] if kept else []
    return ConvertReport(dst, report.manifest, time.perf_counter() - t0, list(report.manifest.skipped), errors,
                         notes=notes, left_small=sum(o.get("left_small", 0) for o in outcomes))


def _run_rank(src: str, dst: str, fmt: str, options: ConvertOptions, launch: Launch, t0: float,
              peers: _Peers | None) -> ConvertReport:
    """Any rank but 0: take the plan, convert this rank's part, wait for rank 0's merge."""
    plan = _broadcast_json(None, peers)
    if plan.get("error"):
        raise DistributedError(f"rank 0 of {launch.world_size} failed: {plan['error']}")
    _agree_on_sources(plan, src, launch, peers)
    outcome, own_error = _convert_part(plan, src, dst, fmt, options, launch)
    _gather_json(outcome, peers)
    final = _broadcast_json(None, peers)
    if own_error is not None:
        raise own_error
    if final["error"]:
        raise DistributedError(f"rank {final['rank']} of {launch.world_size} failed: {final['error']}")
    manifest = read_manifest(dst)
    return ConvertReport(dst, manifest, time.perf_counter() - t0, list(manifest.skipped))


def _agree_on_sources(plan: dict[str, Any], src: str, launch: Launch, peers: _Peers | None) -> None:
    """Before any image is converted: every rank checks that it was given rank 0's SRC and that
    each file of its share is the one rank 0 listed (size and modification time, one ``os.stat``
    each); when any rank sees other files, every rank raises DistributedError naming that rank
    and the file. The conversion then checks each file again as it reads it."""
    problems = _gather_json(_source_problem(plan, src, launch), peers)
    bad = next((r for r, p in enumerate(problems) if p), None)
    if bad is not None:
        raise DistributedError(f"rank {bad} of {launch.world_size} sees other source files than rank 0: "
                               f"{problems[bad]}; every rank must see the same source (one shared folder, or "
                               f"identical copies with the same modification times)")


def _source_problem(plan: dict[str, Any], src: str, launch: Launch) -> str | None:
    """How this rank's view of the source differs from rank 0's plan, or None."""
    if os.path.normpath(plan["src"]) != os.path.normpath(src):
        return f"it was given SRC {src}, rank 0 {plan['src']}"
    start, stop = part_range(len(plan["items"]), launch.world_size, launch.rank)
    first, differ = "", 0
    for rel, _, size, mtime in plan["items"][start:stop]:
        path = os.path.join(src, *rel.split("/"))
        found = file_stamp(path)
        if found != (size, mtime):
            differ += 1
            first = first or f"{path} is {describe_stamp(found)} there, {describe_stamp((size, mtime))} on rank 0"
    more = f" (and {differ - 1} more of the {plural(stop - start, 'file')} of its share)" if differ > 1 else ""
    return first + more if differ else None


def _convert_part(plan: dict[str, Any], src: str, dst: str, fmt: str, options: ConvertOptions,
                  launch: Launch) -> tuple[dict[str, Any], BaseException | None]:
    """Convert this rank's share of the plan into its part folder: the outcome every rank is told
    (``error``, ``part``: the folder or None, ``skipped`` of a share with no image), and the error."""
    start, stop = part_range(len(plan["items"]), launch.world_size, launch.rank)
    share = plan["items"][start:stop]
    path = part_path(dst, launch.rank, launch.world_size)
    items = [(os.path.join(src, *rel.split("/")), label, None) for rel, label, _, _ in share]
    stats = [(size, mtime) for _, _, size, mtime in share]
    opts = replace(options, overwrite=True, progress=options.progress and launch.rank == 0)
    try:
        if not items:
            return {"error": None, "part": None, "skipped": []}, None
        report = convert_items(items, path, fmt, opts, plan["classes"], root=src, expected_stats=stats,
                               record_files=False)  # the plan is the record; the merged manifest drops it
        kept = bool(report.notes) and report.notes[0].startswith("kept ")
        return {"error": None, "part": path, "skipped": None, "kept": kept, "left_small": report.left_small}, None
    except SourceError as e:
        skipped = getattr(e, "skipped", None)
        if skipped is None:
            return {"error": f"{type(e).__name__}: {e}"}, e
        return {"error": None, "part": None, "skipped": [[k.path, k.reason] for k in skipped]}, None
    except Exception as e:  # noqa: BLE001 - every rank is told, then each raises
        return {"error": f"{type(e).__name__}: {e}"}, e


def _merge_parts(outcomes: list[dict[str, Any]], src: str, dst: str, options: ConvertOptions,
                 template: Manifest) -> Any:
    """Merge the parts in rank order into ``dst``, with the facts of the image folder conversion:
    its source, seed and ignored counts, and the skips in the order one process lists them."""
    skipped: list[Skipped] = []
    for o in outcomes:
        skipped += read_manifest(o["part"]).skipped if o["part"] else [Skipped(p, r) for p, r in o["skipped"]]
    parts = [o["part"] for o in outcomes if o["part"]]
    if not parts:
        raise nothing_converted(src, skipped + list(template.skipped))
    facts = {"source": template.source, "ignored": template.ignored, "shuffle_seed": template.shuffle_seed,
             "skipped": skipped + list(template.skipped)}
    return merge(parts, dst, options.overwrite, describe=lambda m: replace(m, **facts), link=True)
