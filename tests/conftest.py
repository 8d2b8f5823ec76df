"""Fixtures shared by the tests (tiny image folders made on the fly); helpers are in tests/helpers.py."""

from __future__ import annotations

import os

import cv2
import pytest

from .helpers import fixed_image, make_folder


@pytest.fixture
def tiny_folder(tmp_path):
    """3 classes, 14 images: jpg/JPEG/png, portrait and landscape, a space and unicode in names."""
    root = str(tmp_path / "src")
    pixels = make_folder(root, {
        "cat": [("c0.jpg", 48, 64), ("c1.JPEG", 64, 48), ("c 2.png", 40, 40), ("c3.jpg", 50, 70), ("c4.png", 33, 47)],
        "dog": [("d0.jpg", 60, 80), ("d1.png", 80, 60), ("hund_\u00e9\u00e8.jpg", 45, 45), ("d3.jpeg", 64, 64)],
        "ému bird": [("e0.png", 32, 48), ("e1.jpg", 48, 32), ("e2.png", 70, 50), ("e3.jpg", 40, 60), ("e4.png", 36, 36)],
    })
    return root, pixels


@pytest.fixture
def messy_folder(tmp_path):
    """Good images plus every kind of bad file that carries an image extension."""
    root = tmp_path / "messy"
    make_folder(str(root), {"a": [("ok1.jpg", 20, 20), ("ok2.png", 20, 20)], "b": [("ok3.jpg", 20, 20)]})
    good = (root / "a" / "ok1.jpg").read_bytes()
    (root / "a" / "zero.jpg").write_bytes(b"")
    (root / "a" / "text.png").write_text("not an image")
    (root / "b" / "trunc.jpg").write_bytes(good[: len(good) // 2])
    (root / "b" / "garbage.jpg").write_bytes(good[:200] + bytes(range(256)) * 4)
    return str(root)


@pytest.fixture
def one_image(tmp_path):
    """One 8x8 PNG made from fixed_image(), in class folder ``cls``; returns the source root."""
    os.makedirs(tmp_path / "src" / "cls")
    ok, buf = cv2.imencode(".png", cv2.cvtColor(fixed_image(), cv2.COLOR_RGB2BGR))
    assert ok
    (tmp_path / "src" / "cls" / "img.png").write_bytes(buf.tobytes())
    return str(tmp_path / "src")


# -- running in parallel ------------------------------------------------------------------------
# `python -m pytest` spreads the tests over worker processes (pytest-xdist; setup.cfg's addopts).
# A test that reads machine-wide state (the use of /dev/shm, every process's open files) or that
# must finish under a deadline while the machine is loaded is marked `exclusive`, per file below
# or with the marker: it runs while no other test runs in any worker, and the others wait.
EXCLUSIVE_FILES = frozenset({
    "test_node_cache.py",  # polls the use of /dev/shm as a whole
    "test_shm.py",         # lists what a killed process group left in /dev/shm
})


#: Tests that must finish, or must catch a process in the act, within a few seconds: a deadline, a
#: kill during an upload or a conversion, a rank's heartbeat ("file::name", parameters included).
EXCLUSIVE_TESTS = frozenset({
    "test_remote.py::test_a_killed_download_leaves_nothing_that_breaks_the_next",
    "test_remote.py::test_a_server_that_stops_gives_a_clear_error_in_bounded_time",
    "test_remote.py::test_a_stalled_server_fails_each_file_within_the_deadline",
    "test_remote.py::test_a_server_that_answers_every_request_slowly_fails_the_file_within_its_deadline",
    "test_remote.py::test_a_killed_upload_resumes_without_uploading_again",
    "test_gcs.py::test_a_gcs_server_that_stops_gives_a_clear_error_in_bounded_time",
    "test_range_reads.py::test_a_server_that_stops_answering_fails_a_range_read_within_the_deadline",
    "test_distributed_convert.py::test_a_rank_that_dies_stops_or_leaves_is_named",
    "test_engine.py::test_ctrl_c_stops_cleanly",
    "test_resume.py::test_ctrl_c_or_sigterm_keeps_resumable_output_and_resume_completes_it",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = f"{os.path.basename(str(item.path))}::{item.originalname}"
        if os.path.basename(str(item.path)) in EXCLUSIVE_FILES or name in EXCLUSIVE_TESTS:
            item.add_marker("exclusive")


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per usable CPU, at most 8 (each test may start processes of its own)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cpus))


@pytest.fixture(autouse=True)
def _exclusive_or_shared(request, tmp_path_factory):
    """Under xdist, a readers-writer lock over the session's workers (flock on files in the folder
    they share): an `exclusive` test holds it alone, any other test shares it. A waiting exclusive
    test holds the turnstile, so new tests queue behind it instead of starving it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import fcntl

    shared_dir = tmp_path_factory.getbasetemp().parent
    exclusive = request.node.get_closest_marker("exclusive") is not None
    with open(shared_dir / "tests-turnstile.lock", "a") as turnstile, open(shared_dir / "tests-run.lock", "a") as run:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(run, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
