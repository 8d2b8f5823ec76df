"""``packer preview`` contact sheets and ``packer bench --plot``: real PNGs, opened and looked at."""

from __future__ import annotations

import functools
import http.server
import threading

import cv2
import numpy as np
import pytest

from packer.cli import main
from packer.datasets import open_dataset
from packer.description.registry import format_names
from packer.operations.loaderbench import BenchRow, bench_series
from packer.operations.preview import caption_text, contact_sheet
from tests.helpers import import_optional, pack

TILE, CAPTION, GAP = 160, 22, 4
BACKGROUND = (32, 32, 32)


def read_png(path, flags: int = cv2.IMREAD_UNCHANGED) -> np.ndarray:
    bgr = cv2.imread(str(path), flags)
    assert bgr is not None and bgr.dtype == np.uint8 and bgr.ndim == 3 and bgr.shape[2] == 3
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def tiles(sheet: np.ndarray, n: int, tile: int = TILE) -> list[np.ndarray]:
    cols = int(np.ceil(np.sqrt(n)))
    out = []
    for k in range(n):
        r, c = divmod(k, cols)
        top, left = GAP + r * (tile + CAPTION + GAP), GAP + c * (tile + GAP)
        out.append(sheet[top : top + tile + CAPTION, left : left + tile])
    return out


@pytest.mark.parametrize("fmt", format_names())
def test_preview_of_every_format(tiny_folder, tmp_path, capsys, fmt):
    src, _ = tiny_folder
    dst = pack(src, str(tmp_path / "ds"), fmt).output
    out = tmp_path / "grid.png"
    assert main(["preview", dst, "--out", str(out), "--n", "9", "--seed", "1"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}: 9 of 14 samples (seed 1), 496x562 pixels"
    sheet = read_png(out)
    assert sheet.shape == (3 * (TILE + CAPTION + GAP) + GAP, 3 * (TILE + GAP) + GAP, 3)
    shown = tiles(sheet, 9)
    assert all(not np.array_equal(a, b) for i, a in enumerate(shown) for b in shown[i + 1 :])
    # Each tile is its sample, upright: portrait images leave background at the sides, landscape ones
    # above and below.
    ds = open_dataset(dst, output="numpy")
    preview = contact_sheet(ds, 9, seed=1)
    assert np.array_equal(preview.image, sheet)
    for tile, i in zip(shown, preview.indices):
        h, w = ds[i][0].shape[:2]
        if h > w:
            assert (tile[:TILE, :10] == BACKGROUND).all() and not (tile[:TILE, TILE // 2] == BACKGROUND).all()
        elif w > h:
            assert (tile[:10, :] == BACKGROUND).all() and not (tile[TILE // 2, :] == BACKGROUND).all()
    assert preview.captions == [f"#{i}: {caption_text(ds[i][1], ds.classes)}" for i in preview.indices]


def test_preview_is_seeded_and_clamped_to_the_dataset(tiny_folder, tmp_path, capsys):
    src, _ = tiny_folder
    dst = pack(src, str(tmp_path / "ds"), "lmdb").output
    ds = open_dataset(dst, output="numpy")
    a, b, c = (contact_sheet(ds, 4, seed=s, tile=32) for s in (0, 0, 5))
    assert a.indices == b.indices and np.array_equal(a.image, b.image) and a.indices != c.indices
    everything = contact_sheet(ds, 100, seed=0, tile=32)
    assert everything.indices == list(range(14)) and everything.image.shape == (4 * (32 + 26) + 4, 4 * 36 + 4, 3)
    assert main(["preview", dst, "--out", str(tmp_path / "x.png"), "--n", "0"]) == 2
    assert main(["preview", dst, "--out", str(tmp_path / "no such folder" / "x.png")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert "--n must be at least 1" in err[0] and "does not exist" in err[1] and len(err) == 2


def test_caption_text():
    classes = ["cat", "ému bird", "狗"]
    assert caption_text(0, classes) == "cat (0)"
    assert caption_text(1, classes) == "emu bird (1)"  # accents dropped: OpenCV's fonts are ASCII
    assert caption_text(2, classes) == "? (2)"
    assert caption_text([0, 1], classes) == "cat (0)+emu bird (1)"
    assert caption_text(np.int64(0).item(), classes) == "cat (0)"
    assert caption_text(2.5, classes) == "2.5" and caption_text(7, classes) == "7"


def test_preview_of_a_url_reads_only_what_it_shows(tiny_folder, tmp_path, capsys):
    import_optional("aiohttp", "http(s):// reads need the [http] extra")
    src, _ = tiny_folder
    dst = pack(src, str(tmp_path / "ds"), "tar", writer={"shard_samples": 4}).output
    gets: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            gets.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/ds"
        rc = main(["preview", url, "--out", str(tmp_path / "remote.png"), "--n", "2", "--seed", "3",
                   "--cache-dir", str(tmp_path / "cache")])
    finally:
        server.shutdown()
    assert rc == 0, capsys.readouterr().err
    assert main(["preview", dst, "--out", str(tmp_path / "local.png"), "--n", "2", "--seed", "3"]) == 0
    assert np.array_equal(read_png(tmp_path / "remote.png"), read_png(tmp_path / "local.png"))
    shards = {p for p in gets if p.endswith(".tar")}
    assert 1 <= len(shards) <= 2  # 2 samples from 4 shards: not the whole dataset


def test_bench_plot_draws_a_line_per_configuration(tiny_folder, tmp_path, capsys):
    src, _ = tiny_folder
    dst = pack(src, str(tmp_path / "ds"), "lmdb").output
    out = tmp_path / "bench.png"
    rc = main(["bench", dst, "--workers", "0,1", "--batch-sizes", "4", "--cache", "none", "--samples", "8",
               "--crop", "32", "--plot", str(out), "--json"])
    assert rc == 0
    err = capsys.readouterr().err
    assert f"plot: {out} (drawn with " in err
    plot = read_png(out, cv2.IMREAD_COLOR)  # matplotlib writes RGBA
    assert plot.shape == (500, 800, 3)
    for color in [(31, 119, 180), (255, 127, 14)]:  # the two lines: packer's collate and torch's
        assert (plot == color).all(axis=2).sum() > 50
    assert len(np.unique(plot.reshape(-1, 3), axis=0)) > 10  # not a blank image


def test_bench_series_joins_the_zero_worker_point_to_every_collate():
    rows = [BenchRow(0, False, 64, "none", 100, 1, 0), BenchRow(2, False, 64, "none", 180, 1, 0, "packer"),
            BenchRow(2, False, 64, "none", 150, 1, 0, "default"), BenchRow(2, False, 64, "decoded", 400, 1, 0, "packer")]
    assert bench_series(rows) == {  # named by what differs between the lines
        "cache=none collate=default": [(0, 100), (2, 150)],
        "cache=none collate=packer": [(0, 100), (2, 180)],
        "cache=decoded collate=packer": [(2, 400)],
    }
    assert bench_series(rows[:1]) == {"all": [(0, 100)]}


def test_preview_names_every_class_of_a_multi_label_sample(tiny_folder, tmp_path):
    from packer.pipeline.items import convert_items

    src, pixels = tiny_folder
    names = sorted(pixels)
    labels = {n: ["cat", "dog"] if i % 2 else ["ému bird"] for i, n in enumerate(names)}
    dst = str(tmp_path / "multi")
    convert_items([(f"{src}/{n}", labels[n], None) for n in names], dst, "tar", root=src, label_kind="multi")
    ds = open_dataset(dst, output="numpy", fields=("image", "label", "key"))
    preview = contact_sheet(ds, 14, seed=0, tile=32)
    by_key = {ds[i][2]: caption for i, caption in zip(preview.indices, preview.captions)}
    assert by_key == {n: f"#{names.index(n)}: " + "+".join(caption_text(ds.classes.index(c), ds.classes) for c in labels[n])
                      for n in names}
    assert by_key[names[1]].endswith(": cat (0)+dog (1)")
