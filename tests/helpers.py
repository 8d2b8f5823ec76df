"""Helpers shared by the tests: converting a folder, comparing images, forging manifests."""

from __future__ import annotations

import os

import numpy as np

from tools.sample_images import draw, make_folder, write_image

__all__ = ["TESTS", "ROOT", "DATA", "draw", "write_image", "make_folder", "need_optional", "import_optional", "psnr", "pack", "forge_manifest_sizes", "records_by_key", "place_seed_by_spec", "fixed_image", "moto_s3",
           "tree"]

#: The tests folder, the repository's root and the archived datasets (tests/data), for a test
#: module in any folder under tests/.
TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
DATA = os.path.join(TESTS, "data")


def need_optional(available: bool, reason: str) -> None:
    """Skip the calling test with ``reason`` when an optional part of packer (a built C module,
    torch's shared-memory batches, an importable extra) is absent here. Under
    ``PACKER_REQUIRE_OPTIONAL=1`` (set by CI, which installs everything) the absence is a failure
    instead, so no optional part can silently drop out of CI."""
    import pytest

    if available:
        return
    if os.environ.get("PACKER_REQUIRE_OPTIONAL") == "1":
        pytest.fail(f"PACKER_REQUIRE_OPTIONAL=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_optional(name: str, reason: str):  # noqa: ANN201 - a module
    """``pytest.importorskip`` for an optional dependency, through :func:`need_optional`: the
    module, or a skip with ``reason`` (a failure under ``PACKER_REQUIRE_OPTIONAL=1``)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        need_optional(False, f"{reason} ({exc})")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB between two uint8 arrays of the same shape."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def pack(src, dst, fmt, encode="jpeg:90", resize="none", writer=None, **options):
    """Convert ``src`` to ``fmt`` at ``dst``: image options as CLI strings, ``writer`` as a dict of
    WriterOptions fields, anything else as ConvertOptions fields (workers, seed, shuffle, ...)."""
    from packer.converters.base import WriterOptions
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.pipeline.engine import ConvertOptions, convert_imagefolder

    opts = ConvertOptions(processing=ProcessOptions(resize=parse_resize(resize), encoding=parse_encoding(encode)),
                          writer=WriterOptions(**(writer or {})), **options)
    return convert_imagefolder(src, dst, fmt, opts)


def forge_manifest_sizes(path) -> None:
    """Record the files' current sizes and checksums in the manifest of the dataset at ``path``:
    a tampered file with a manifest forged to match, so a test reaches the checks behind the
    reader's size check at open."""
    from packer.description.manifest import file_sha256, read_manifest, write_manifest

    m = read_manifest(path)
    for f in m.files:
        full = os.path.join(str(path), f.name)
        f.bytes, f.sha256 = os.path.getsize(full), file_sha256(full)
    write_manifest(str(path), m)


def records_by_key(ds):
    """key -> (RGB array, label) for every sample, read through read_record (keys are in records)."""
    out = {}
    for i in range(len(ds)):
        rec = ds.read_record(i)
        out[rec.key] = (ds.decode(rec, i), rec.label)
    return out


def place_seed_by_spec(ordinal: int, first_key: str, first_payload: bytes, position: int) -> tuple[str, int]:
    """(file id, seed) as docs/FORMATS.md specifies them, written out here independently of packer."""
    import hashlib
    import struct

    import crc32c

    fid = hashlib.sha256(b"packer file" + struct.pack("<Q", ordinal) + first_key.encode() + b"\0"
                         + first_payload).hexdigest()[:16]
    return fid, crc32c.crc32c(b"PKPL" + bytes.fromhex(fid) + struct.pack("<Q", position))


def fixed_image() -> np.ndarray:
    """A fixed 8x8 RGB array, for exact-bytes tests of the on-disk layouts."""
    return (np.arange(8 * 8 * 3, dtype=np.uint16).reshape(8, 8, 3) * 5 % 256).astype(np.uint8)


def tree(root) -> dict[str, bytes]:
    """relpath -> bytes of every file under root."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            p = os.path.join(folder, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def fields_sources(n: int = 6, seed: int = 0, sizes=((48, 64), (40, 30), (33, 57))):
    """``n`` samples with fields, made in memory: (key, PNG image bytes, label, source RGB, 8-bit
    mask array, extra image ``left`` RGB (same size), boxes in source pixels, box labels)."""
    import cv2

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = sizes[i % len(sizes)]
        rgb, left = draw(rng, h, w), draw(rng, h, w)
        mask = ((np.arange(h)[:, None] // 3 + np.arange(w)[None, :] // 5 + i) % 7).astype(np.uint8)
        mask[: h // 3, : w // 4] = 255  # an "ignore" region, as segmentation datasets mark it
        boxes = [[1.0, 2.0, w / 2, h / 2], [w / 4, h / 5, w - 1.5, h - 0.5]][: i % 3]
        png = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))[1].tobytes()
        out.append((f"s{i:03d}.png", png, i % 2, rgb, mask, left, boxes, [(i + k) % 2 for k in range(len(boxes))]))
    return out


def write_fields_dataset(dst, fmt: str, n: int = 6, resize: str = "shorter:24", encode: str = "png",
                         mask: bool = True, images=("left",), boxes: bool = True, seed: int = 0, classes=("a", "b"),
                         **writer):
    """A dataset with fields (the current version) of ``fmt`` at ``dst`` (masks, extra images named ``images``, boxes with
    labels) from :func:`fields_sources`, through packer's own processing and writer. Returns the
    sources, for the test to compare against."""
    import cv2

    from packer.converters.base import WriterOptions
    from packer.description.manifest import FIELDS_VERSION, Manifest
    from packer.images.fields import FieldSources, process_sample
    from packer.images.imageproc import ProcessOptions, parse_encoding, parse_resize
    from packer.pipeline.engine import ConvertOptions, write_packed

    opts = ProcessOptions(resize=parse_resize(resize), encoding=parse_encoding(encode))
    src = fields_sources(n, seed)

    def png(a):
        return cv2.imencode(".png", a if a.ndim == 2 else cv2.cvtColor(a, cv2.COLOR_RGB2BGR))[1].tobytes()

    items = []
    for key, data, label, _rgb, m, left, bx, bl in src:
        fs = FieldSources(png(m) if mask else None, tuple((name, png(left)) for name in images),
                          bx if boxes else None, bl if boxes else None)
        items.append((key, label, process_sample(data, opts, fs), None))
    declared = ([{"name": "mask", "kind": "mask"}] if mask else []) + [{"name": x, "kind": "image"} for x in images]
    declared += [{"name": "boxes", "kind": "boxes", "labels": True}] if boxes else []
    template = Manifest(format=fmt, num_samples=0, classes=list(classes), processing=opts.to_json(), files=[],
                        version=FIELDS_VERSION, fields=declared, source={"kind": "test"})
    write_packed(str(dst), fmt, items, template, ConvertOptions(processing=opts, writer=WriterOptions(**writer)))
    return src


def run_bounded(code: str, extra_mb: int, tmp_path) -> str:
    """Run ``code`` in a child Python whose address space may grow ``extra_mb`` past what its imports
    took (RLIMIT_AS); its stdout, or AssertionError with its output when it fails."""
    import subprocess
    import sys

    script = tmp_path / "bounded.py"
    script.write_text(
        "import resource\nimport cv2, numpy, torch, packer.images.fields, packer.pipeline.items\n"
        "size = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        f"resource.setrlimit(resource.RLIMIT_AS, (size + ({extra_mb} << 20), resource.RLIM_INFINITY))\n" + code)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def moto_s3(*buckets: str):  # noqa: ANN201 - a context manager
    """A context manager: moto's S3 server on 127.0.0.1 (a free port) holding the empty
    ``buckets``, as a test starts it; yields its endpoint URL (credentials ``testing``)."""
    import contextlib
    import socket

    @contextlib.contextmanager
    def served():  # noqa: ANN202
        moto_server = import_optional("moto.server", "s3:// tests need moto's server: pip install 'moto[server]'")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        try:
            endpoint = f"http://127.0.0.1:{port}"
            if buckets:
                import boto3

                client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                                      aws_secret_access_key="testing", region_name="us-east-1")
                for b in buckets:
                    client.create_bucket(Bucket=b)
            yield endpoint
        finally:
            server.stop()

    return served()


def _src(tmp_path, name="src", n=3):  # the trust tests' small source: 2 classes of n images
    root = str(tmp_path / name)
    make_folder(root, {"a": [(f"a{i}.jpg", 24, 24) for i in range(n)], "b": [(f"b{i}.png", 20, 28) for i in range(n)]})
    return root


def run_cli(*argv):  # noqa: ANN201 - a CompletedProcess
    """One ``packer`` command run in this process, as ``subprocess.run([... "-m", "packer", *argv],
    capture_output=True, text=True)`` would give it: exit status, stdout and stderr. In-process: no
    interpreter and torch start per call (about 2 CPU-seconds each). A traceback fails the test
    where it happens, as it would show in a child's stderr."""
    import contextlib
    import io
    import subprocess

    from packer.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return subprocess.CompletedProcess(["packer", *map(str, argv)], rc, out.getvalue(), err.getvalue())


def slow_except(values, *keep):  # noqa: ANN001, ANN201 - pytest parameters
    """``values`` as pytest parameters, those not in ``keep`` marked slow: the default suite runs
    the kept cases, the slow suite (which CI runs) the others, for a check whose cases repeat the
    same path at several seconds each."""
    import pytest

    return [v if v in keep else pytest.param(v, marks=pytest.mark.slow) for v in values]


def sigint_as_in_a_terminal() -> None:
    """A ``preexec_fn`` for a child that a test stops with SIGINT: SIGINT back at its default
    action, so Python turns it into KeyboardInterrupt. A test run started in the background by a
    shell without job control (``cmd &`` in a script, as CI runners may) inherits SIGINT ignored,
    and a Python started so keeps ignoring it, as it should."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
