"""Section 1 of docs/benchmarks.md (the peers): packer's own rows, one per registered format (and
the raw encoding), measured under the same protocol."""

from __future__ import annotations

import os
from typing import Any

from tools.bench.peers_protocol import (
    CROP,
    JPEG_QUALITY,
    SHORT_SIDE,
    SHUFFLE_SEED,
    BenchConfig,
    Monitor,
    converted_row,
    decode_center_crop,
    dir_size,
    fresh_dir,
    is_error,
    join_notes,
    loader_kwargs,
    make_row,
    one_line,
    one_thread_per_process,
    time_epochs,
)


# -- packer's own formats, measured in the same run ---------------------------------------------
class _PackerSharedDecode:
    """Map-style view of a packer dataset that decodes stored payloads with the shared decode."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        rec = self.ds.read_record(index)
        return decode_center_crop(rec.payload), int(rec.label)


def packer_rows(cfg: BenchConfig) -> list[dict[str, Any]]:
    """One row per format in packer's registry, same protocol as the peers.

    Converts with packer's engine (``workers=cfg.workers``, shorter:256, jpeg:90) and reads the
    packed dataset map-style (no shuffle) and streaming with packer's reader (see
    _packer_format_rows).
    Returns [] when packer is not importable here or registers no format yet; a format that fails
    gives an error row. New formats appear here by being registered, with no change to this file.
    """
    try:
        from packer.description.registry import format_names
    except ImportError:
        return []
    names = format_names()
    if not names:
        return []
    rows = []
    for fmt in names:
        try:
            rows.extend(_packer_format_rows(cfg, fmt))
        except Exception as exc:  # noqa: BLE001 - one format failing must not stop the others
            rows.append(make_row(f"packer {fmt}", note=f"error: {one_line(exc)}"))
    try:
        rows.append(_packer_raw_row(cfg))
    except Exception as exc:  # noqa: BLE001
        rows.append(make_row("packer lmdb raw", note=f"error: {one_line(exc)}"))
    return label_packer_rows(rows)


def collate_slots() -> tuple[bool, str]:
    """Whether ``packer.datasets.collate`` builds batches in shared-memory slots in this process
    (its import-time self-test passed) and, if not, why."""
    from packer.datasets import collation

    state = collation.slots_available()
    if isinstance(state, tuple):
        return bool(state[0]), str(state[1])
    return bool(state), "" if state else "slots_available() is False"


def label_packer_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Name the torch that measured each packer row (packer's rows can run under two torch
    versions in one table) and record whether ``collate``'s shared-memory batches were on."""
    import torch

    on, why = collate_slots()
    for row in rows:
        row["system"] = f"{row['system']} (torch {torch.__version__})"
        row["torch"] = torch.__version__
        if row.get("collate") == "default" or is_error(row):
            continue
        row["collate_slots"] = on
        state = "collate slots on" if on else f"collate slots OFF: {why}"
        row["note"] = join_notes(state, row.get("note", ""))
    return rows


class _Crop224:
    """Center crop of packer's C x H x W uint8 output to 224 (the shared decode's crop), picklable."""

    def __call__(self, x: Any) -> Any:
        h, w = x.shape[-2:]
        y, left = (h - CROP) // 2, (w - CROP) // 2
        return x[:, y : y + CROP, left : left + CROP]


def _packer_raw_row(cfg: BenchConfig) -> dict[str, Any]:
    """packer's ``raw`` encoding (decoded pixels stored): no decode at read time, same crop."""
    import torch

    from packer.datasets import open_dataset
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.pipeline.engine import ConvertOptions, convert_imagefolder

    one_thread_per_process()
    out = fresh_dir(os.path.join(cfg.work, "packer_lmdb_raw"))
    opts = ConvertOptions(
        processing=ProcessOptions(resize=parse_resize(f"shorter:{SHORT_SIDE}"), encoding=parse_encoding("raw")),
        workers=cfg.workers, seed=SHUFFLE_SEED, overwrite=True,
    )
    with Monitor() as conv:
        report = convert_imagefolder(cfg.src, out, "lmdb", opts)
    n = report.manifest.num_samples
    ds = open_dataset(out, transform=_Crop224())
    read = time_epochs(
        lambda: torch.utils.data.DataLoader(ds, shuffle=False, **loader_kwargs(cfg, True)), cfg.epochs, n
    )
    read["note"] = join_notes("raw pixels, packer's own reader (no decode)", read["note"])
    return converted_row("packer lmdb raw", n, conv, dir_size(out), read)


def _packer_format_rows(cfg: BenchConfig, fmt: str) -> list[dict[str, Any]]:
    """Map-style and streaming (``StreamingDataset``) through packer's own reader: the same
    ``cv2.imdecode`` to RGB and the same 224 center crop as the shared decode, giving the same
    uint8 CHW tensors, but without its extra HWC -> CHW copy (``packer.datasets.collate`` writes
    the channels straight into the batch). For lmdb, two more rows isolate the parts: the
    shared decode function itself, and torch's default_collate."""
    import torch

    from packer.datasets import StreamingDataset
    from packer.description.registry import reader_class
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.pipeline.engine import ConvertOptions, convert_imagefolder

    one_thread_per_process()
    out = fresh_dir(os.path.join(cfg.work, f"packer_{fmt}"))
    opts = ConvertOptions(
        processing=ProcessOptions(
            resize=parse_resize(f"shorter:{SHORT_SIDE}"),
            encoding=parse_encoding(f"jpeg:{JPEG_QUALITY}"),
        ),
        workers=cfg.workers,
        seed=SHUFFLE_SEED,
        overwrite=True,
    )
    with Monitor() as conv:
        report = convert_imagefolder(cfg.src, out, fmt, opts)
    n = report.manifest.num_samples
    ds = reader_class(fmt)(out, transform=_Crop224())
    read = time_epochs(
        lambda: torch.utils.data.DataLoader(ds, shuffle=False, **loader_kwargs(cfg, True)), cfg.epochs, n
    )
    if report.skipped:
        read["note"] = join_notes(f"{len(report.skipped)} images skipped", read["note"])
    rows = [converted_row(f"packer {fmt}", n, conv, dir_size(out), read)]
    if fmt == "lmdb":
        # Transparency rows: the shared decode function over packer's stored payloads (the exact
        # code the peers run), and packer's reader with torch's default_collate.
        shared = _PackerSharedDecode(reader_class(fmt)(out))
        same = time_epochs(
            lambda: torch.utils.data.DataLoader(shared, shuffle=False, **loader_kwargs(cfg, True)), cfg.epochs, n
        )
        same["note"] = join_notes("the peers' decode_center_crop over packer's payloads", same["note"])
        rows.append(converted_row(f"packer {fmt}, shared decode", n, conv, dir_size(out), same))
        plain = time_epochs(
            lambda: torch.utils.data.DataLoader(ds, shuffle=False, **loader_kwargs(cfg)), cfg.epochs, n
        )
        plain["note"] = join_notes("torch's default_collate instead of packer.datasets.collate", plain["note"])
        plain["collate"] = "default"
        rows.append(converted_row(f"packer {fmt}, default_collate", n, conv, dir_size(out), plain))
    stream = StreamingDataset(out, shuffle=False, batch_size=64, transform=_Crop224())
    sread = time_epochs(
        lambda: torch.utils.data.DataLoader(stream, **loader_kwargs(cfg, True)), cfg.epochs, n
    )
    sread["note"] = join_notes("streaming, no shuffle", sread["note"])
    rows.append(converted_row(f"packer {fmt} streaming", n, conv, dir_size(out), sread))
    return rows
