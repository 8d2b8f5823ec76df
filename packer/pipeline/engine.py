"""The conversion engine every writer shares: scan -> process (worker processes) -> write -> manifest.

Determinism: the sample order is fixed before any work starts (folder order, or a permutation from
the recorded seed), workers process chunks of that order, and the single writer consumes results
strictly in order. So the output is the same whatever ``workers`` is.

Robustness: workers are separate processes (``spawn``: no inherited threads or locks); a Python
exception on one image becomes a skip with the file and the reason; a worker that dies (segfault,
OOM kill) raises a clear error instead of hanging; Ctrl-C stops the workers and the writer. The
output is built in a hidden sibling folder and published by rename only once every payload file
and the manifest are durable, so a reader never sees half a dataset under the destination name;
``--overwrite`` swaps the new folder in with one atomic exchange where the OS has one.

Crashes and resume: at every checkpoint the writer makes its data durable and the engine writes a
journal (:mod:`packer.files.journal`); killed at any moment, a conversion leaves no dataset or a complete
one at the destination, and ``resume=True`` continues from the last checkpoint without processing
again what was written, with the same result as an uninterrupted run. A full disk removes the
partial output and raises :class:`~packer.errors.DiskFullError`. reliability.md in docs/ has the
fault-injection figures.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from .. import __version__
from ..converters.base import WriterOptions
from ..description.manifest import (
    MANIFEST_NAME,
    Manifest,
    Skipped,
    file_sha256,
    with_mask_dtype,
    without_item_records,
    write_manifest,
)
from ..description.samples import SampleTableWriter
from ..errors import ImageError, PackerError, ResumeError, SourceError
from ..files.filesystem import (
    check_destination,
    claim_destination,
    disk_full_error,
    fsync_dir,
    holding_claim,
    no_space,
    publish,
    recover_publish,
    space_at_failure,
    temp_dir_for,
)
from ..files.journal import (
    JOURNAL_NAME,
    Journal,
    digest,
    read_journal,
    remove_journal,
    write_journal,
)
from ..formats import formats_taking, get_format, read_manifest, writer_class
from ..images.imageproc import ProcessedImage, ProcessOptions, Resize
from ..progress import LOG_INTERVAL, Progress
from ..wording import describe_skips, plural
from .order import recorded_seed, write_order
from .pool import ordered_map
from .scan import Sample, scan_imagefolder
from .sourcefiles import (
    NO_STAMP,
    Result,
    Stamp,
    describe_stamp,
    file_stamp,
    process_data,
    process_file,
    stamp_mismatch,
)

__all__ = [
    "ConvertOptions",
    "ConvertReport",
    "ItemSource",
    "convert_source",
    "convert_imagefolder",
    "temp_dir_for",
    "publish",
    "recover_publish",
    "ordered_map",
    "write_packed",
    "write_packed_result",
    "options_fingerprint",
    "process_data",
    "scan_ordered",
    "left_small",
    "nothing_converted",
    "interrupted_samples",
    "differences",
    "Stamp",
    "NO_STAMP",
    "file_stamp",
    "describe_stamp",
    "stamp_mismatch",
]



@dataclass(frozen=True)
class ConvertOptions:
    """How to convert: image processing, parallelism, order, failure policy, format options."""

    processing: ProcessOptions = ProcessOptions()
    writer: WriterOptions = WriterOptions()
    workers: int = 1
    shuffle: bool = True
    seed: int = 0
    strict: bool = False
    overwrite: bool = False
    #: Show progress on stderr: a bar on a terminal, else a plain line every ``progress_interval`` s.
    progress: bool = False
    progress_interval: float = LOG_INTERVAL
    #: Continue an interrupted conversion from its temporary folder (see :mod:`packer.files.journal`);
    #: without it, a leftover temporary folder is removed and the conversion starts over.
    resume: bool = False
    #: Pin the class list (e.g. the training set's, so a validation set's labels line up): label
    #: ``i`` is ``classes[i]``; a source class not in it is an error naming it. None: the source's.
    classes: tuple[str, ...] | None = None


@dataclass
class ConvertReport:
    """What a conversion did."""

    output: str
    manifest: Manifest
    seconds: float
    skipped: list[Skipped] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    #: With ``resume``: what was kept from the interrupted run, ``{"consumed": source items,
    #: "written": samples}``, or None when it started from the beginning (see ``notes``).
    resumed: dict[str, int] | None = None
    notes: list[str] = field(default_factory=list)
    #: Images stored smaller than the resize target (never enlarged without ``upscale``), in the
    #: whole output (with ``resume``: the interrupted run's part included).
    left_small: int = 0
    #: With ``resume``: the destination was already complete, with the same source and options.
    already_complete: bool = False

    @property
    def rate(self) -> float:
        """Images written per second by this run (samples a ``--resume`` kept are not counted)."""
        kept = self.resumed["written"] if self.resumed else 0
        return (self.manifest.num_samples - kept) / self.seconds if self.seconds > 0 else 0.0


def _process_chunk(paths: Sequence[str], opts: ProcessOptions) -> list[Result]:
    return [process_file(p, opts) for p in paths]


#: One sample on its way to a writer: (key, label, image, None), or (key, label, None, reason) for a skip.
Item = tuple[str, int, ProcessedImage | None, str | None]


#: Items for :func:`write_packed`: an iterable, or ``start -> iterable`` of the items from source
#: position ``start`` on (needed to resume).
Items = Iterable[Item] | Callable[[int], Iterable[Item]]


class ItemSource(Protocol):
    """What :func:`convert_source` reads of a source, by position in write order: ``process``
    (picklable) turns a chunk of ``sources(start)`` entries into results, in worker processes."""

    process: Callable[[Sequence[Any]], list[Result]]

    def __len__(self) -> int: ...

    def sources(self, start: int) -> Sequence[Any]:
        """What ``process`` gets for the items from position ``start`` on (sliced into chunks)."""
        ...

    def sample(self, pos: int) -> tuple[str, Any]:
        """Item ``pos``'s key and label (a number, or a Label of packer.description.samples)."""
        ...

    def name(self, pos: int) -> str:
        """Item ``pos`` as errors name it (a crashed worker, a bad image under ``strict``)."""
        ...


def source_items(source: ItemSource, options: ConvertOptions) -> Callable[[int], Iterator[Item]]:
    """The items of ``source`` from a start position on, processed by ``options.workers``
    processes (0 or 1: this process) and yielded in order; strict: the first bad image raises."""

    def items(start: int) -> Iterator[Item]:
        results = ordered_map(source.process, source.sources(start), options.workers, lambda k: source.name(start + k))
        for pos, (image, reason) in enumerate(results, start):
            if image is None and options.strict:
                raise ImageError(f"{source.name(pos)}: {reason}")
            key, label = source.sample(pos)
            yield key, label, image, reason

    return items


def convert_source(source: ItemSource, dst: str, fmt: str, template: Manifest, options: ConvertOptions,
                   fingerprint: dict[str, str], *, shown: str, t0: float,
                   errors: Sequence[tuple[str, str]] = ()) -> ConvertReport:
    """The one conversion pipeline every source feeds (``dst``'s claim held, the destination
    checked): ``source``'s items processed, written with ``fmt``'s writer under ``template``,
    journaled under ``fingerprint`` (so ``options.resume`` continues), published; the report, timed
    from ``t0``, with the source's ``errors`` found before writing. ``shown`` names the source."""
    counts: dict[str, int] = {}
    manifest, resumed, notes = write_packed_result(dst, fmt, source_items(source, options), template, options,
                                                   len(source), shown, fingerprint, counts)
    return ConvertReport(dst, manifest, time.perf_counter() - t0, list(manifest.skipped), list(errors),
                         resumed=resumed, notes=notes, left_small=counts["left_small"])


def options_fingerprint(fmt: str, template: Manifest, options: ConvertOptions) -> str:
    """Digest of everything besides the source that decides a conversion's output."""
    info = template.to_json()
    for k in ("num_samples", "files", "layout"):
        info.pop(k, None)
    return digest({"format": fmt, "writer": asdict(options.writer), "strict": options.strict, "manifest": info})


def write_packed(
    dst: str,
    fmt: str,
    items: Items,
    template: Manifest,
    options: ConvertOptions,
    *,
    total: int | None = None,
    source: str = "",
    fingerprint: dict[str, str] | None = None,
) -> Manifest:
    """Write ``items`` with ``fmt``'s writer into the hidden sibling of ``dst``, then the manifest,
    then publish by rename: the part every conversion shares (imagefolder or packed source).

    ``template`` holds what is known before writing (classes, processing, shuffle seed, source,
    ignored counts, and skips found before writing, listed after the items' skips); ``num_samples``,
    ``files``, ``layout`` and ``skipped`` are filled in here. Items without an image are listed as
    skipped, never written (``strict`` is the caller's: raise from ``items``). The writer's optional
    ``begin`` hook gets the dataset facts before the first sample.

    With ``items`` a function of the start position and a ``fingerprint`` (``{"source": ...,
    "options": ...}`` digests), the conversion journals checkpoints and ``options.resume``
    continues an interrupted one. On a failure the temporary folder is removed, or, when a
    checkpoint makes it resumable (Ctrl-C, a crashed worker, an I/O error other than a full
    disk), kept: the exception then has ``partial_output`` set to its path. ``dst`` is left as it
    was either way.
    """
    return write_packed_result(dst, fmt, items, template, options, total, source, fingerprint)[0]


@holding_claim
def write_packed_result(
    dst: str,
    fmt: str,
    items: Items,
    template: Manifest,
    options: ConvertOptions,
    total: int | None,
    source: str,
    fingerprint: dict[str, str] | None,
    counts: dict[str, int] | None = None,
) -> tuple[Manifest, dict[str, int] | None, list[str]]:
    """:func:`write_packed`, also returning what a resume kept (``{"consumed", "written"}`` or
    None) and notes for the user (e.g. that there was nothing to resume). A ``counts`` dict gets
    ``left_small``: the images of the output stored below the resize target (see :func:`left_small`)."""
    run = _Run(dst, fmt, items, template, options, total, source, fingerprint)
    try:
        if run.journal is not None and run.journal.phase == "closed":
            manifest = run.publish_closed()
        else:
            run.open_writer()
            run.write_items()
            manifest = run.close_and_publish()
    except BaseException as e:
        run.fail(e)
        raise
    if counts is not None:
        counts["left_small"] = run.left_small
    return manifest, run.resumed, run.notes


class _Run:
    """One call of :func:`write_packed_result`: its temporary folder, writer, journal and the
    positions and skips since the last checkpoint, with the steps of a conversion as methods."""

    def __init__(self, dst: str, fmt: str, items: Items, template: Manifest, options: ConvertOptions,
                 total: int | None, source: str, fingerprint: dict[str, str] | None) -> None:
        self.dst, self.fmt, self.items, self.template, self.options = dst, fmt, items, template, options
        self.total, self.source, self.fingerprint = total, source, fingerprint
        self.tmp = temp_dir_for(dst)
        spec = get_format(fmt)
        refused = spec.refused_options(options.writer)
        if refused:
            raise ValueError(f"writer option {refused[0]} does not apply to {fmt} output (it applies to "
                             f"{' and '.join(formats_taking(refused[0]))})")
        self.writer_class = spec.writer
        self.resumable = callable(items) and fingerprint is not None and getattr(spec.writer, "resumable", False)
        self.notes: list[str] = []
        self.journal = self._journal_to_resume() if options.resume else None
        if self.journal is None:
            if os.path.lexists(self.tmp):
                shutil.rmtree(self.tmp)
            os.makedirs(self.tmp)
        j = self.journal
        self.resumed = {"consumed": j.consumed, "written": j.written} if j is not None else None
        self.skipped: list[tuple[int, Skipped]] = []  # (source position, skip)
        # source position of each sample written since the last checkpoint (resumable runs only):
        # sample index ``positions_base + i`` came from source position ``positions[i]``
        self.positions = array("q")
        self.positions_base = 0
        self.small = bytearray()  # and whether it was left small (1) or not (0)
        self.index = self.consumed = 0
        self.writer: Any = None
        self.closed = False
        self.left_small = 0

    def _journal_to_resume(self) -> Journal | None:
        """The interrupted run's journal, refused if the source or the options changed since."""
        if not self.resumable:
            raise ResumeError(f"--resume is not supported for this conversion to {self.fmt}; run without --resume")
        journal = read_journal(self.tmp) if os.path.isdir(self.tmp) else None
        if journal is not None and journal.fingerprint != self.fingerprint:
            changed = [k for k in ("source", "options") if journal.fingerprint.get(k) != (self.fingerprint or {}).get(k)]
            raise ResumeError(
                f"cannot resume {self.dst}: the {' and the '.join(changed) or 'conversion'} changed since the "
                f"interrupted run; run without --resume to start over (this deletes the partial output in {self.tmp})"
            )
        if journal is None:
            self.notes.append(f"nothing to resume in {self.tmp}; started from the beginning")
        return journal

    def checkpoint(self, next_pos: int) -> None:
        """Make the writer's data durable, then journal how far the source was consumed."""
        assert self.writer is not None and self.fingerprint is not None
        state = self.writer.checkpoint()
        done = int(state["samples"])
        at = done - self.positions_base
        upto = self.positions[at] if 0 <= at < len(self.positions) else next_pos
        entries = [{"pos": p, "path": k.path, "reason": k.reason} for p, k in self.skipped if p < upto]
        small = self.left_small - sum(self.small[max(at, 0):])  # of the samples in the checkpoint
        write_journal(self.tmp, Journal(self.fingerprint, "writing", upto, done, entries, state, left_small=small))
        if at > 0:
            del self.positions[:at]
            del self.small[:at]
            self.positions_base = done

    def publish_closed(self) -> Manifest:
        """Finish a run killed after its payload files were final: only the manifest was missing."""
        assert self.journal is not None
        manifest = _finish_closed(self.tmp, self.journal)
        self.left_small = self.journal.left_small
        keep = {f.name for f in manifest.files} | {JOURNAL_NAME}
        for name in os.listdir(self.tmp):  # what the killed run had not deleted yet: resume-only files
            if name not in keep:
                os.remove(os.path.join(self.tmp, name))
        write_manifest(self.tmp, manifest)
        remove_journal(self.tmp)
        publish(self.tmp, self.dst, self.options.overwrite)
        return manifest

    def open_writer(self) -> None:
        """Start the writer with the dataset facts; on resume, bring it back to the checkpoint."""
        if self.template.fields and not getattr(self.writer_class, "writes_fields", False):
            raise ValueError(f"the {self.fmt} writer cannot store the samples' fields "
                             f"({', '.join(self.template.field_names)}) yet; convert to lmdb")
        # Every format also gets the sample table (labels, keys, metadata: packer.description.samples).
        self.writer = SampleTableWriter(self.writer_class(self.tmp, self.options.writer), self.template.label_kind,
                                        boxes=self.template.field_kind("boxes") is not None,
                                        checkpoints=self.resumable)
        info = self.template.to_json()
        for k in ("num_samples", "files", "layout", "skipped", "ignored"):
            del info[k]
        info["source"] = without_item_records(info["source"])  # per-item lists stay in the manifest alone
        self.writer.begin({**info, "format": self.fmt})
        j = self.journal
        if j is None:
            return
        for name in os.listdir(self.tmp):  # a manifest, or temp files of atomic writes, from the killed run
            if name == MANIFEST_NAME or name.startswith((f"{MANIFEST_NAME}.tmp-", f"{JOURNAL_NAME}.tmp-")):
                os.remove(os.path.join(self.tmp, name))
        self.writer.resume(j.writer)
        self.index, self.consumed = j.written, j.consumed
        self.positions_base = self.index
        self.left_small = j.left_small
        self.skipped = [(int(e["pos"]), Skipped(str(e["path"]), str(e["reason"]))) for e in j.skipped]
        self.checkpoint(self.consumed)

    def write_items(self) -> None:
        """Feed every item from the resume point on to the writer; items without an image are skips."""
        stream = self.items(self.consumed) if callable(self.items) else self.items
        bar = Progress(self.total, initial=self.consumed, desc=f"convert -> {self.fmt}",
                       mode="auto" if self.options.progress else "off", interval=self.options.progress_interval)
        resize, upscale = self.options.processing.resize, self.options.processing.upscale
        self.pos = self.consumed
        close = getattr(stream, "close", None)  # a generator: stop its worker processes on any error
        with bar, contextlib.closing(stream) if close else contextlib.nullcontext():
            for key, label, image, reason in stream:
                reason = reason if image is None or not image.payload else self.fields_mismatch(image)
                if reason and image is not None and self.options.strict:
                    raise ImageError(f"{key}: {reason}")
                if image is None or not image.payload or reason:  # a 0-byte image is never stored
                    self.skipped.append((self.pos, Skipped(key, reason or "empty image payload (0 bytes)")))
                else:
                    small = left_small(image, resize, upscale)
                    if self.resumable:
                        self.positions.append(self.pos)
                        self.small.append(small)
                    self.writer.add(self.index, key, label, image)
                    self.index += 1
                    self.left_small += small
                self.pos += 1
                if self.resumable and self.writer.checkpoint_due():
                    self.checkpoint(self.pos)
                bar.update(1)
        if self.index == 0:
            raise nothing_converted(self.source or self.dst, [k for _, k in self.skipped] + list(self.template.skipped))

    def fields_mismatch(self, image: ProcessedImage) -> str | None:
        """Why a sample cannot be stored with the dataset's fields (writers rely on every sample
        having exactly them, in order), or None. Other tools' data can lack one on some samples."""
        have = [f.name for f in image.fields] + (["boxes"] if image.boxes is not None else [])
        want = self.template.stored_fields + (["boxes"] if self.template.field_kind("boxes") else [])
        if have == want:
            return None
        return f"has the fields {', '.join(have) or 'none'}, the dataset's samples {', '.join(want) or 'none'}"

    def close_and_publish(self) -> Manifest:
        """Close the writer, make its files durable, write the manifest, publish by rename."""
        files, layout = self.writer.close()
        self.closed = True
        fsync_dir(self.tmp)  # every payload file's rename is durable before the manifest names it
        manifest = replace(self.template, format=self.fmt, num_samples=self.index, files=files, layout=layout,
                           skipped=[k for _, k in self.skipped] + list(self.template.skipped),
                           fields=with_mask_dtype(self.template.fields, self.writer.mask_bits,
                                                  self.template.version))
        if self.resumable:
            assert self.fingerprint is not None
            write_journal(self.tmp, Journal(self.fingerprint, "closed", self.pos, self.index, [], {}, manifest.to_json(),
                                            left_small=self.left_small))
        self.writer.forget_checkpoints()
        write_manifest(self.tmp, manifest)
        remove_journal(self.tmp)
        publish(self.tmp, self.dst, self.options.overwrite)
        return manifest

    def fail(self, e: BaseException) -> None:
        """Clean up after ``e``: keep the temporary folder when a checkpoint makes it resumable
        (then ``e.partial_output`` names it), else remove it; a full disk raises DiskFullError.
        The caller raises ``e`` itself when this returns."""
        full = no_space(e, self.tmp)
        space = space_at_failure(self.tmp, e) if full is not None else None  # before the cleanup frees it
        kept = full is None and (
            isinstance(e, ResumeError)  # the partial output stays for the user to inspect
            or (self.resumable and not isinstance(e, (SourceError, ImageError)) and _has_checkpoint(self.tmp))
        )
        if self.writer is not None and not self.closed:
            try:
                self.writer.abort() if kept else self.writer.discard()
            except Exception:  # noqa: BLE001 - already failing
                pass
        if isinstance(e, ResumeError) and full is None:
            return
        if kept:
            e.partial_output = self.tmp  # type: ignore[attr-defined]
            if hasattr(e, "add_note"):
                e.add_note(f"partial output kept in {self.tmp}; run again with --resume to continue")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if full is not None:
            raise disk_full_error(full[0], full[1], self.tmp, self.dst, space, (getattr(self, "pos", 0), self.total)) from e


def _has_checkpoint(tmp: str) -> bool:
    j = read_journal(tmp)
    return j is not None and (j.written > 0 or j.phase == "closed")


def _finish_closed(tmp: str, journal: Journal) -> Manifest:
    """The manifest of a run killed after its payload files were final: checked against them."""
    assert journal.manifest is not None
    manifest = Manifest.from_json(journal.manifest, os.path.join(tmp, "journal"))
    for f in manifest.files:
        path = os.path.join(tmp, f.name)
        if not os.path.exists(path) or os.path.getsize(path) != f.bytes or file_sha256(path) != f.sha256:
            raise ResumeError(f"cannot resume: {path} differs from the journal (run without --resume to start over)")
    return manifest


def source_fingerprint(samples: Sequence[Sample]) -> str:
    """Digest of an ordered source list: each file's key, label, size and modification time."""
    rows = []
    for s in samples:
        try:
            st = os.stat(s.path)
            rows.append((s.relpath, s.label, st.st_size, st.st_mtime_ns))
        except OSError as e:
            rows.append((s.relpath, s.label, -1, str(e.strerror)))
    return digest(rows)


def convert_imagefolder(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], fmt: str, options: ConvertOptions = ConvertOptions()
) -> ConvertReport:
    """Convert an ImageFolder at ``src`` into a packed dataset of format ``fmt`` at ``dst``.

    Bad images are skipped and listed in the report and the manifest (``strict``: the first one
    raises ImageError). Raises SourceError for an unusable source and FileExistsError when ``dst``
    exists and ``overwrite`` is false.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    writer_class(fmt)  # an unknown format fails before any work
    check_destination(src, dst)
    with claim_destination(dst):
        return _convert_imagefolder_claimed(src, dst, fmt, options)


def scan_ordered(src: str, dst: str, fmt: str, options: ConvertOptions, *,
                 exists_ok: bool = False) -> tuple[list[Sample], Manifest, list[tuple[str, str]]]:
    """What a conversion of the image folder ``src`` to ``dst`` decides before any image is read
    (``dst``'s claim held): the samples in write order, the manifest template and the scan's
    errors. FileExistsError when ``dst`` exists without ``overwrite`` (or ``exists_ok``: the
    caller looks at it); strict: a scan error raises."""
    recover_publish(dst)
    if os.path.lexists(dst) and not options.overwrite and not exists_ok:
        raise FileExistsError(f"destination exists: {dst} (use --overwrite to replace it)")
    scan = scan_imagefolder(src)
    if options.strict and scan.errors:
        path, reason = scan.errors[0]
        raise SourceError(f"{path}: {reason}")
    samples, classes, empty = scan.samples, scan.classes, scan.empty_classes
    if options.classes is not None:
        samples, classes, empty = pin_classes(src, samples, scan.classes, options.classes)
    if options.shuffle:
        samples = [samples[i] for i in write_order(len(samples), options)]
    template = Manifest(
        format=fmt,
        num_samples=0,
        classes=classes,
        processing=options.processing.to_json(),
        files=[],
        shuffle_seed=recorded_seed(options),
        skipped=[Skipped(os.path.relpath(p, src), r) for p, r in scan.errors],
        ignored={"hidden": len(scan.ignored_hidden), "not_images": len(scan.ignored_other),
                 "outside_classes": len(scan.ignored_root)},
        source={"kind": "imagefolder", "empty_classes": empty},
        created_by=f"packer {__version__}",
    )
    return samples, template, scan.errors


def pin_classes(src: str, samples: list[Sample], found: list[str],
                pinned: Sequence[str]) -> tuple[list[Sample], list[str], list[str]]:
    """``samples`` relabelled to the ``pinned`` class list, the list, and its classes without a
    sample; SourceError naming the source classes ``pinned`` lacks."""
    pinned = list(pinned)
    index = {c: i for i, c in enumerate(pinned)}
    missing = [c for c in found if c not in index]
    if missing:
        shown = ", ".join(repr(c) for c in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise SourceError(f"{src}: class {shown} is not in the pinned class list ({plural(len(pinned), 'class')}); "
                          f"the labels would not line up")
    relabel = [index[c] for c in found]
    present = {relabel[s.label] for s in samples}
    out = [replace(s, label=relabel[s.label]) for s in samples]
    return out, pinned, [c for i, c in enumerate(pinned) if i not in present]


def _convert_imagefolder_claimed(src: str, dst: str, fmt: str, options: ConvertOptions) -> ConvertReport:
    t0 = time.perf_counter()
    complete = options.resume and not options.overwrite
    samples, template, errors = scan_ordered(src, dst, fmt, options, exists_ok=complete)
    if complete and os.path.lexists(dst):
        differ = differences(dst, fmt, samples, template, options)
        if differ:
            raise FileExistsError(f"destination exists: {dst}, and it is not what this conversion makes "
                                  f"({'; '.join(differ)}); use --overwrite to replace it")
        m = read_manifest(dst)
        return ConvertReport(dst, m, time.perf_counter() - t0, list(m.skipped), errors, already_complete=True)

    fingerprint = {"source": source_fingerprint(samples), "options": options_fingerprint(fmt, template, options)}
    return convert_source(_FolderItems(samples, options.processing), dst, fmt, template, options, fingerprint,
                          shown=src, t0=t0, errors=errors)


class _FolderItems:
    """An image folder's samples (in write order) as an :class:`ItemSource`: keyed by their path
    relative to the root, named in errors by their path."""

    def __init__(self, samples: Sequence[Sample], opts: ProcessOptions) -> None:
        self.samples = samples
        self.process = functools.partial(_process_chunk, opts=opts)

    def __len__(self) -> int:
        return len(self.samples)

    def sources(self, start: int) -> list[str]:
        return [s.path for s in self.samples[start:]]

    def sample(self, pos: int) -> tuple[str, int]:
        s = self.samples[pos]
        return s.relpath.replace(os.sep, "/"), s.label

    def name(self, pos: int) -> str:
        return self.samples[pos].path


def _results(samples: Sequence[Sample], opts: ProcessOptions, workers: int) -> Iterator[Result]:
    """Processed results in sample order, from ``workers`` processes (0 or 1: this process)."""
    source = _FolderItems(samples, opts)
    return ordered_map(source.process, source.sources(0), workers, source.name)


# -- what a user is told ---------------------------------------------------------------------------
def nothing_converted(source: str, skipped: Sequence[Skipped]) -> SourceError:
    """The error of a conversion of ``source`` that skipped every image: the skips counted by
    reason, with the first files of each, on one line; its ``skipped`` attribute lists them (for a
    caller making parts)."""
    if len(skipped) == 1:
        why = f"; the only one, {skipped[0].path}, was skipped: {skipped[0].reason}"
    elif skipped:
        why = f"; all {len(skipped)} were skipped: " + describe_skips((s.path, s.reason) for s in skipped)
    else:
        why = " (it holds none)"
    error = SourceError(f"no image in {source} could be converted{why}")
    error.skipped = list(skipped)  # type: ignore[attr-defined]
    return error


def left_small(image: ProcessedImage, resize: Resize, upscale: bool) -> bool:
    """Whether ``image`` was stored smaller than ``resize`` asks: ``shorter:N``/``longer:N`` never
    enlarge without ``upscale``, so a smaller source stays as it was (``WxH`` and ``none`` always hold)."""
    if upscale or resize.mode not in ("shorter", "longer"):
        return False
    side = min(image.height, image.width) if resize.mode == "shorter" else max(image.height, image.width)
    return side < resize.size


def interrupted_samples(dst: str) -> int | None:
    """The samples that the partial output of an interrupted conversion to ``dst`` holds (what a
    run without ``resume`` deletes), or None when there is no resumable partial output."""
    journal = read_journal(temp_dir_for(dst))
    return journal.written if journal is not None else None


def differences(dst: str, fmt: str, samples: Sequence[Sample], template: Manifest, options: ConvertOptions) -> list[str]:
    """How the complete dataset at ``dst`` differs from what converting ``samples`` (ordered, as
    :func:`scan_ordered` gives them with ``template``) with ``options`` would write; [] when it is
    the same: same format, classes, processing, order, writer options given (left out: any the
    writer recorded), source layout, sample count, and no source file modified after ``dst``'s
    manifest was written."""
    try:
        m = read_manifest(dst)
    except (PackerError, OSError) as e:
        return [f"not a complete packed dataset: {e}"]
    out = []
    for what, have, want in (("format", m.format, fmt), ("classes", m.classes, template.classes),
                             ("processing", m.processing, template.processing),
                             ("shuffle seed", m.shuffle_seed, template.shuffle_seed),
                             ("source layout", (m.source, m.ignored), (template.source, template.ignored))):
        if have != want:
            out.append(f"other {what}")
    # Writers record their options in the layout with the defaults resolved: compare those given.
    for k, v in asdict(options.writer).items():
        if v is not None and k in m.layout and m.layout[k] != v:
            out.append(f"other {k}")
    sources = len(samples) + len(template.skipped)
    if m.num_samples + len(m.skipped) != sources:
        out.append(f"{plural(m.num_samples, 'sample')} + {len(m.skipped)} skipped, the source has {plural(sources, 'file')}")
    written = os.stat(os.path.join(dst, MANIFEST_NAME)).st_mtime_ns
    newer = next((s.path for s in samples if _mtime_ns(s.path) > written), None)
    if newer is not None:
        out.append(f"{newer} changed after it was written")
    return out


def _mtime_ns(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 1 << 62  # gone: changed
