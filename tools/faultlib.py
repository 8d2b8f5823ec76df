"""Fault injection shared by tests/conversion/test_faults.py and tools/fault_table.py: kill the converter at
chosen moments, flip or cut bytes of payload files, and check what readers, ``verify`` and
``--resume`` make of it. Every trial returns a small record; the tests assert on them and the
table tool counts them. Also a proxy in front of a loopback server that delays and counts requests
(the object-storage tests and benchmarks)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from packer.cli import main as cli_main
from packer.description.manifest import MANIFEST_NAME, Manifest, read_manifest
from packer.description.registry import format_names, get_format
from packer.errors import CorruptDataError

from .sample_images import make_folder

FORMATS = tuple(format_names())


def format_options(fmt: str) -> list[str]:
    """Small checkpoint intervals, so a run of ~120 images has a dozen resume points in every format:
    every 10 samples, by shard for the formats that shard, by commit for the others."""
    takes = get_format(fmt).options
    return ["--shard-samples", "10"] if "shard_samples" in takes else ["--checkpoint-samples", "10"]


def make_source(root: str, n: int = 150, seed: int = 0, lo: int = 240, hi: int = 360) -> str:
    """An ImageFolder of ``n`` images (4 classes, a third PNG) of lo..hi pixels a side."""
    rng = np.random.default_rng(seed)
    per = n // 4
    classes = {
        f"c{k}": [(f"{i}.{'png' if i % 3 == 0 else 'jpg'}", int(rng.integers(lo, hi)), int(rng.integers(lo, hi)))
                  for i in range(per)]
        for k in range(4)
    }
    make_folder(root, classes, seed=seed)
    return root


def convert_argv(fmt: str, src: str, dst: str, *extra: str, workers: int = 1) -> list[str]:
    """The CLI call of one conversion (PNG re-encode: slow enough to be killed mid-way)."""
    return [sys.executable, "-m", "packer", "convert", "imagefolder", fmt, src, dst, "--workers", str(workers),
            "--encode", "png", "-q", *format_options(fmt), *extra]


def tmp_of(dst: str) -> str:
    parent, name = os.path.split(os.path.abspath(dst))
    return os.path.join(parent, f".{name}.packer-tmp")


def identical_dirs(a: str, b: str) -> bool:
    """Same file names and byte-identical contents."""
    names = sorted(os.listdir(a))
    if names != sorted(os.listdir(b)):
        return False
    for n in names:
        with open(os.path.join(a, n), "rb") as fa, open(os.path.join(b, n), "rb") as fb:
            if fa.read() != fb.read():
                return False
    return True


def snapshot(path: str) -> list[tuple[str, int, str]]:
    """(key, label, SHA-256 of the decoded pixels) of every sample, read through the reader."""
    from packer.datasets import open_dataset

    out = []
    with open_dataset(path, output="numpy") as ds:
        for i in range(len(ds)):
            rec = ds.read_record(i)
            rgb = ds.decode(rec, i)
            out.append((rec.key, rec.label, hashlib.sha256(rgb.tobytes()).hexdigest()))
    return out


def verify_cli(path: str) -> tuple[int, str]:
    """Exit status and stderr+stdout of ``packer verify PATH``."""
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(buf):
        rc = cli_main(["verify", path])
    return rc, buf.getvalue()


# -- SIGKILL ---------------------------------------------------------------------------------------
@dataclass
class KillTrial:
    fmt: str
    delay: float
    outcome: str = ""  # "absent" (killed before publishing) or "complete"
    dst_ok: bool = False  # DST absent, or complete and equal to the reference
    tmp_refused: bool = True  # a reader refuses the temporary folder (or it is complete)
    resumed: int = -1  # samples kept by --resume (-1: not resumed, 0: started over)
    resume_ok: bool = False  # --resume finished with the reference's samples and manifest
    identical: bool = False  # ... and byte-identical files
    lost: int = 0  # samples missing or wrong in the end result
    errors: list[str] = field(default_factory=list)


def _killpg(proc: subprocess.Popen, delay: float) -> None:
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _check_published(t: KillTrial, dst: str, ref: str, ref_snapshot: list, old: str | None) -> None:
    """After the kill: DST is absent, or complete and equal to the reference (or to ``old``)."""
    if not os.path.exists(dst):
        t.outcome = "absent"
        t.dst_ok = True
        return
    t.outcome = "complete"
    try:
        got = snapshot(dst)
        rc, _ = verify_cli(dst)
        same_as_ref = got == ref_snapshot and identical_dirs(dst, ref)
        same_as_old = bool(old) and identical_dirs(dst, old)
        t.dst_ok = rc == 0 and (same_as_ref or same_as_old)
        if old and same_as_old:
            t.outcome = "old"
    except Exception as e:  # noqa: BLE001 - any failure to read a published dataset is a finding
        t.errors.append(f"published dataset unreadable: {type(e).__name__}: {e}")


def _check_tmp_refused(t: KillTrial, dst: str, ref_snapshot: list) -> None:
    """After the kill: a reader refuses the conversion's temporary folder (or it is complete)."""
    from packer.datasets import open_dataset

    tmp = tmp_of(dst)
    if not os.path.isdir(tmp):
        return
    try:
        with open_dataset(tmp) as ds:
            t.tmp_refused = os.path.exists(os.path.join(tmp, MANIFEST_NAME)) and len(ds) == len(ref_snapshot)
    except (FileNotFoundError, CorruptDataError):
        t.tmp_refused = True
    except Exception as e:  # noqa: BLE001
        t.tmp_refused = False
        t.errors.append(f"temp folder: {type(e).__name__}: {e}")


def _resume(t: KillTrial, argv: list[str], ref_snapshot: list) -> bool:
    """Run the ``--resume`` conversion ``argv``; record what it kept. False where it failed."""
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        t.errors.append(f"--resume failed: {r.stderr.strip()}")
        t.lost = len(ref_snapshot)
        return False
    t.resumed = 0
    for line in r.stderr.splitlines():
        if line.startswith("packer: resumed: kept "):
            t.resumed = int(line.split()[3])
    return True


def _check_result(t: KillTrial, dst: str, ref: str, ref_snapshot: list) -> bool:
    """The end result against the reference: samples lost, manifest, verify, bytes. False where
    it cannot be read."""
    try:
        got = snapshot(dst)
    except Exception as e:  # noqa: BLE001
        t.errors.append(f"result unreadable: {type(e).__name__}: {e}")
        t.lost = len(ref_snapshot)
        return False
    t.lost = sum(1 for a, b in zip(got, ref_snapshot) if a != b) + abs(len(got) - len(ref_snapshot))
    with open(os.path.join(dst, MANIFEST_NAME), "rb") as a, open(os.path.join(ref, MANIFEST_NAME), "rb") as b:
        same_manifest = a.read() == b.read()
    t.resume_ok = t.lost == 0 and same_manifest and verify_cli(dst)[0] == 0
    t.identical = identical_dirs(dst, ref)
    return True


def kill_trial(fmt: str, src: str, ref: str, ref_snapshot: list, work: str, delay: float,
               workers: int = 1, old: str | None = None) -> KillTrial:
    """Convert ``src`` to ``work/out``, SIGKILL the process group after ``delay`` seconds, check
    the destination, then ``--resume`` and compare with the reference ``ref``. With ``old`` (a
    finished dataset), the destination starts as a copy of it and the run uses ``--overwrite``:
    then DST must be the old dataset or the new one at every moment."""
    t = KillTrial(fmt, delay)
    dst = os.path.join(work, "out")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    extra = ["--overwrite"] if old else []
    if old:
        shutil.copytree(old, dst)
    proc = subprocess.Popen(convert_argv(fmt, src, dst, *extra, workers=workers), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    _killpg(proc, delay)
    _check_published(t, dst, ref, ref_snapshot, old)
    _check_tmp_refused(t, dst, ref_snapshot)
    if t.outcome != "complete" and \
            not _resume(t, convert_argv(fmt, src, dst, "--resume", *extra, workers=workers), ref_snapshot):
        return t
    if not _check_result(t, dst, ref, ref_snapshot):
        return t
    # A kill while the replaced dataset was being deleted leaves .out.packer-trash; the next
    # conversion to DST deletes it first (recover_publish), as it does here.
    from packer.pipeline.engine import recover_publish

    recover_publish(dst)
    leftovers = [n for n in os.listdir(work) if n != "out" and not _stale_claim(os.path.join(work, n))]
    if leftovers:
        t.errors.append(f"left behind: {leftovers}")
    return t


def _stale_claim(path: str) -> bool:
    """Whether ``path`` is a destination's claim file that no process holds: a kill between the
    publish and the claim's removal leaves it, and the next conversion to DST takes it over."""
    import fcntl

    if not path.endswith(".packer-lock"):
        return False
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def kill_delays(n: int, timing: tuple[float, float], seed: int) -> list[float]:
    """``n`` kill times over a run that starts writing at ``timing[0]`` and ends at ``timing[1]``
    seconds: a fifth of them during start-up (scan, imports), the rest spread over the writing
    and a little beyond its end; one kill in each equal slice, at a random point of it (fixed seed)."""
    rng = random.Random(seed)
    start, end = timing
    early = max(1, n // 5) if n > 2 else 0
    late = n - early
    out = [start * (i + rng.random()) / early for i in range(early)]
    out += [start + (end * 1.05 - start) * (i + rng.random()) / late for i in range(late)]
    return out


def timed_run(fmt: str, src: str, dst: str, workers: int = 1) -> tuple[float, float]:
    """(seconds until the conversion creates its temporary folder, seconds it takes in all) of an
    uninterrupted run, start-up included."""
    t0 = time.monotonic()
    proc = subprocess.Popen(convert_argv(fmt, src, dst, workers=workers), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    tmp, first = tmp_of(dst), None
    while proc.poll() is None:
        if first is None and os.path.exists(tmp):
            first = time.monotonic() - t0
        time.sleep(0.002)
    total = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"reference conversion to {fmt} failed")
    return (first if first is not None else total / 2), total


# -- flipped and cut bytes -------------------------------------------------------------------------
@dataclass
class ByteTrial:
    fmt: str
    file: str
    offset: int
    kind: str = "flip"  # or "truncate"
    expected_sample: int | None = None  # the sample the byte belongs to, when the test can tell
    verify_rc: int = 0
    verify_named_file: bool = False
    verify_named_sample: bool = True  # only meaningful when expected_sample is not None
    reader: str = ""  # "refused" (raised at open), "raised" (some samples), "correct", "wrong", "leak"
    raised_samples: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def detected(self) -> bool:
        return self.verify_rc != 0 and self.verify_named_file and self.verify_named_sample

    @property
    def reader_ok(self) -> bool:
        return self.reader in ("refused", "raised", "correct")


def _tar_regions(path: str, m: Manifest) -> dict[str, list[tuple[int, int, int]]]:
    """Each sample's members in its shard, and its entry and key in the shard's index."""
    from packer.layouts.tar import INDEX_ENTRY, INDEX_HEADER, INDEX_SUFFIXES, unpack_index

    out = {}
    for f in m.files:
        if not f.name.endswith(INDEX_SUFFIXES):
            continue
        with open(os.path.join(path, f.name), "rb") as fh:
            first, e, keys = unpack_index(fh.read(), f.name)
        shard = f.name[: f.name.rindex(".")] + ".tar"
        starts = [int(o) - 512 for o in e["offset"]]
        ends = starts[1:] + [_tar_members_end(os.path.join(path, shard), starts[-1])]
        out[shard] = [(a, b, first + j) for j, (a, b) in enumerate(zip(starts, ends))]
        n = len(e)
        idx = [(INDEX_HEADER.size + j * INDEX_ENTRY.itemsize, INDEX_HEADER.size + (j + 1) * INDEX_ENTRY.itemsize,
                first + j) for j in range(n)]
        base, prev = INDEX_HEADER.size + n * INDEX_ENTRY.itemsize, 0
        for j, ke in enumerate(e["key_end"]):
            idx.append((base + prev, base + int(ke), first + j))
            prev = int(ke)
        out[f.name] = idx
    return out


def _tfrecord_regions(path: str, m: Manifest) -> dict[str, list[tuple[int, int, int]]]:
    """Each sample's index line, and its record where the file is not compressed."""
    out = {}
    for f in m.files:
        if not f.name.endswith(".idx"):
            continue
        with open(os.path.join(path, f.name), "rb") as fh:
            lines = fh.read().splitlines(keepends=True)
        pos, idx, rec = 0, [], []
        for j, line in enumerate(lines):
            idx.append((pos, pos + len(line), f.first + j))
            pos += len(line)
            off, length = map(int, line.split())
            rec.append((off, off + length, f.first + j))
        out[f.name] = idx
        if not m.layout.get("gzip"):
            out[f.name[:-4] + ".tfrecord"] = rec
    return out


def _lmdb_regions(path: str, m: Manifest) -> dict[str, list[tuple[int, int, int]]]:
    """Each record whose first 64 bytes occur once in the environment."""
    from packer.datasets import open_dataset
    from packer.description.placement import place_seed
    from packer.description.record import pack_record

    with open(os.path.join(path, "data.mdb"), "rb") as fh:
        data = fh.read()
    regions = []
    with open_dataset(path) as ds:
        for i in range(len(ds)):
            r = ds.read_record(i)
            value = pack_record(r.key, r.label, r.codec, r.height, r.width, bytes(r.payload),
                                place_seed(m.files[0].id, i))
            at = data.find(value[:64])
            if at >= 0 and data.count(value[:64]) == 1:
                regions.append((at, at + len(value), i))
    return {"data.mdb": regions}


def _hdf5_regions(path: str, m: Manifest) -> dict[str, list[tuple[int, int, int]]]:
    """Each payload's bytes in its chunks, and each key that occurs once in the file."""
    import h5py

    fp = os.path.join(path, "data.h5")
    with open(fp, "rb") as fh:
        data = fh.read()
    regions = []
    with h5py.File(fp, "r") as f:
        images = f["images"]
        per = images.chunks[0] * int(np.prod(images.chunks[1:]))
        table = {}
        images.id.chunk_iter(lambda info: table.__setitem__(info.chunk_offset[0] // images.chunks[0],
                                                            info.byte_offset))
        if f.attrs["storage"] == "flat":
            offs = f["offsets"][:].astype(np.int64)
        else:
            row = int(np.prod(images.shape[1:]))
            offs = np.arange(images.shape[0] + 1, dtype=np.int64) * row
        for i in range(len(offs) - 1):
            a = int(offs[i])
            while a < offs[i + 1]:
                c, r = divmod(a, per)
                b = min(int(offs[i + 1]), (c + 1) * per)
                regions.append((table[c] + r, table[c] + r + (b - a), i))
                a = b
        for i, k in enumerate(f["keys"].asstr()[:].tolist()):
            raw = k.encode("utf-8")
            if data.count(raw) == 1:
                at = data.find(raw)
                regions.append((at, at + len(raw), i))
    return {"data.h5": regions}


#: format -> the byte ranges of its files that belong to one sample.
_REGIONS = {"tar": _tar_regions, "tfrecord": _tfrecord_regions, "lmdb": _lmdb_regions, "hdf5": _hdf5_regions}


def sample_regions(path: str) -> dict[str, list[tuple[int, int, int]]]:
    """file name -> [(start, end, sample)] byte ranges that belong to one sample, where the test
    can tell from the layout (tar and TFRecord: all of a sample's bytes, index lines and entries;
    LMDB: each record; HDF5: each payload and each key that occurs once in the file)."""
    m = read_manifest(path)
    regions = _REGIONS.get(m.format)
    return regions(path, m) if regions else {}


def _tar_members_end(path: str, start: int) -> int:
    """End of the last sample's three members (header + data + padding each) starting at ``start``."""
    with open(path, "rb") as fh:
        pos = start
        for _ in range(3):
            fh.seek(pos)
            head = fh.read(512)
            size = int(head[124:135].rstrip(b"\0 ") or b"0", 8)
            pos += 512 + -(-size // 512) * 512
    return pos


def _owner(regions: list[tuple[int, int, int]], offset: int) -> int | None:
    for a, b, s in regions:
        if a <= offset < b:
            return s
    return None


def check_reader(path: str, ref_snapshot: list) -> tuple[str, int, list[str]]:
    """What a reader makes of a damaged dataset: "refused" at open, "raised" CorruptDataError for
    some samples and returned every other one correctly, "correct" everywhere, "wrong" (returned
    different data without an error) or "leak" (raised something other than CorruptDataError)."""
    from packer.datasets import open_dataset

    try:
        ds = open_dataset(path, output="numpy")
    except CorruptDataError:
        return "refused", 0, []
    except Exception as e:  # noqa: BLE001 - the finding
        return "leak", 0, [f"open: {type(e).__name__}: {e}"]
    raised, problems = 0, []
    with ds:
        for i in range(len(ds)):
            try:
                rec = ds.read_record(i)
                rgb = ds.decode(rec, i)
                rgb2, label2 = ds.load(i)
            except CorruptDataError:
                raised += 1
                continue
            except Exception as e:  # noqa: BLE001
                problems.append(f"sample {i}: {type(e).__name__}: {e}")
                continue
            got = (rec.key, rec.label, hashlib.sha256(rgb.tobytes()).hexdigest())
            if got != ref_snapshot[i] or label2 != rec.label or not np.array_equal(rgb, rgb2):
                problems.append(f"sample {i}: wrong data {got[:2]} != {ref_snapshot[i][:2]}")
    if any("wrong data" in p for p in problems):
        return "wrong", raised, problems
    if problems:
        return "leak", raised, problems
    return ("raised" if raised else "correct"), raised, problems


def byte_trial(pristine: str, work: str, ref_snapshot: list, regions: dict, name: str, offset: int,
               kind: str = "flip", rng: random.Random | None = None) -> ByteTrial:
    """Copy ``pristine`` to ``work``, flip one byte (xor with a random non-zero value) or truncate
    file ``name`` at ``offset``, then run ``packer verify`` and a reader over it."""
    m = read_manifest(pristine)
    t = ByteTrial(m.format, name, offset, kind)
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(pristine, work)
    fp = os.path.join(work, name)
    if kind == "flip":
        with open(fp, "r+b") as fh:
            fh.seek(offset)
            b = fh.read(1)[0]
            fh.seek(offset)
            fh.write(bytes([b ^ (rng or random.Random(offset)).randint(1, 255)]))
        t.expected_sample = _owner(regions.get(name, []), offset)
    else:  # a cut file: verify must name the file; which samples are lost is the reader's business
        os.truncate(fp, offset)
    rc, text = verify_cli(work)
    t.verify_rc = rc
    t.verify_named_file = name in text
    if t.expected_sample is not None:
        t.verify_named_sample = f"sample {t.expected_sample}:" in text
    t.reader, t.raised_samples, t.errors = check_reader(work, ref_snapshot)
    return t


def flip_offsets(pristine: str, trials: int, seed: int) -> list[tuple[str, int]]:
    """``trials`` (file, offset) pairs: files in turn (the manifest's order), offsets uniform."""
    m = read_manifest(pristine)
    rng = random.Random(seed)
    files = [f for f in m.files if f.bytes > 0]
    out = []
    for i in range(trials):
        f = files[i % len(files)]
        out.append((f.name, rng.randrange(f.bytes)))
    return out


def payload_ranges(path: str, regions: dict) -> dict[str, list[tuple[int, int]]]:
    """file name -> byte ranges holding image data (tar: image members' data; TFRecord: whole
    records; LMDB: whole records; HDF5: payload bytes), to aim flips at everything else."""
    m = read_manifest(path)
    out: dict[str, list[tuple[int, int]]] = {}
    if m.format == "tar":
        from packer.layouts.tar import INDEX_SUFFIXES, unpack_index

        for f in m.files:
            if f.name.endswith(INDEX_SUFFIXES):
                with open(os.path.join(path, f.name), "rb") as fh:
                    _, e, _ = unpack_index(fh.read(), f.name)
                out[f.name[: f.name.rindex(".")] + ".tar"] = [(int(o), int(o) + int(s)) for o, s in zip(e["offset"], e["size"])]
    elif m.format == "hdf5":
        import h5py

        with h5py.File(os.path.join(path, "data.h5"), "r") as f:
            keys = {k.encode("utf-8") for k in f["keys"].asstr()[:].tolist()}
        with open(os.path.join(path, "data.h5"), "rb") as fh:
            data = fh.read()
        out["data.h5"] = [(a, b) for a, b, _ in regions.get("data.h5", []) if data[a:b] not in keys]
    else:
        for name, rs in regions.items():
            if not name.endswith(".idx"):
                out[name] = [(a, b) for a, b, _ in rs]
    return out


def structural_offsets(pristine: str, regions: dict, trials: int, seed: int) -> list[tuple[str, int]]:
    """``trials`` (file, offset) pairs outside image data (headers, indexes, B-trees, padding)."""
    m = read_manifest(pristine)
    rng = random.Random(seed)
    payload = payload_ranges(pristine, regions)
    pools = []
    for f in m.files:
        mask = np.ones(f.bytes, bool)
        for a, b in payload.get(f.name, []):
            mask[a:b] = False
        free = np.flatnonzero(mask)
        if len(free):
            pools.append((f.name, free))
    out = []
    for i in range(trials):
        name, free = pools[i % len(pools)] if i % 2 else pools[rng.randrange(len(pools))]
        out.append((name, int(free[rng.randrange(len(free))])))
    return out


def lmdb_structure(path: str) -> list[tuple[int, int]]:
    """Byte ranges of data.mdb that LMDB reads to find a value: both meta pages, the header, node
    pointers and nodes of every branch and leaf page, and each overflow run's page header (free
    space inside pages and the unused tail of overflow runs are left out)."""
    fp = os.path.join(path, "data.mdb")
    with open(fp, "rb") as fh:
        data = fh.read()
    psize = 4096
    out = []
    pg = 0
    while pg * psize < len(data):
        base = pg * psize
        flags, lower, upper = int.from_bytes(data[base + 10:base + 12], "little"), \
            int.from_bytes(data[base + 12:base + 14], "little"), int.from_bytes(data[base + 14:base + 16], "little")
        if pg < 2 or flags & 0x08:  # meta: header + MDB_meta (about 136 bytes)
            out.append((base, base + 16 + 136))
            pg += 1
        elif flags & 0x04:  # overflow run: header only; mp_pages at offset 12
            out.append((base, base + 16))
            pg += max(1, int.from_bytes(data[base + 12:base + 16], "little"))
        elif flags & 0x03:  # branch or leaf
            out.append((base, base + lower))
            out.append((base + upper, base + psize))
            pg += 1
        else:
            pg += 1
    return out


def hdf5_slack(path: str) -> list[tuple[int, int]]:
    """Byte ranges of data.h5 allocated to dataset chunks but beyond the data (the unused end of
    a dataset's last chunk): bytes no reader looks at."""
    import h5py

    out = []
    with h5py.File(os.path.join(path, "data.h5"), "r") as f:
        for _name, d in f.items():
            if not isinstance(d, h5py.Dataset) or d.chunks is None:
                continue
            rows = d.chunks[0]
            row_bytes = d.dtype.itemsize * int(np.prod(d.chunks[1:])) if d.dtype.kind != "O" else 16
            n = d.shape[0]

            def visit(info, rows=rows, row_bytes=row_bytes, n=n):
                start = info.chunk_offset[0]
                used = max(0, min(rows, n - start)) * row_bytes
                if used < info.size:
                    out.append((info.byte_offset + used, info.byte_offset + info.size))

            d.id.chunk_iter(visit)
    return out


def structure_offsets(pristine: str, regions: dict, trials: int, seed: int) -> list[tuple[str, int]]:
    """``trials`` (file, offset) pairs in the bytes a format's own structures use: tar member
    headers, .cls/.json, index files; TFRecord index files; LMDB meta, branch and leaf pages and
    overflow headers; HDF5 everything but payload and the unused ends of chunks."""
    m = read_manifest(pristine)
    rng = random.Random(seed)
    if m.format == "lmdb":
        pools = [("data.mdb", lmdb_structure(pristine))]
    elif m.format == "hdf5":
        size = os.path.getsize(os.path.join(pristine, "data.h5"))
        mask = np.ones(size, bool)
        for a, b in [*payload_ranges(pristine, regions)["data.h5"], *hdf5_slack(pristine)]:
            mask[a:b] = False
        free = np.flatnonzero(mask)
        pools = [("data.h5", [(int(x), int(x) + 1) for x in free])]
    else:
        return structural_offsets(pristine, regions, trials, seed)
    out = []
    for _ in range(trials):
        name, ranges = pools[0]
        weights = np.array([b - a for a, b in ranges], np.float64)
        a, b = ranges[int(np.searchsorted(np.cumsum(weights), rng.random() * weights.sum(), side="right"))]
        out.append((name, a + rng.randrange(b - a)))
    return out


class LatencyProxy:
    """A TCP proxy to ``target`` that waits ``delay`` seconds before forwarding each HTTP request
    (each client chunk that starts with a method name) and counts the bytes sent back (``down``)
    and the GET and HEAD requests (``requests``)."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target, self.delay, self.down, self.requests = target, delay, 0, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
                server = socket.create_connection(self.target)
            except OSError:  # the proxy closed, or the server stopped
                return
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if upstream and data[:4] in (b"GET ", b"HEAD", b"PUT ", b"POST"):
                    self.requests += data[:4] in (b"GET ", b"HEAD")
                    time.sleep(self.delay)
                if not upstream:
                    self.down += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def reset(self) -> None:
        """Count from zero."""
        self.down = self.requests = 0

    def options(self, key: str = "x") -> dict:
        """fsspec storage options that reach the S3 server through this proxy (credentials ``key``)."""
        return {"key": key, "secret": key, "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{self.port}",
                                                              "region_name": "us-east-1"}}
