"""Every fenced code block of README.md and docs/*.md runs as written, on small data
(docs/benchmarks.md, whose commands measure a machine, is exempt). How, for docs authors: the comment below."""

# How a document is run, for docs authors:
#
# - Each document runs top to bottom in one fresh folder that is both HOME and the working
#   directory, so ``~/data/train`` and ``data/train`` name the same thing and a block may use what an
#   earlier block of the same document made. One test per block, named ``FILE:LINE``; running one
#   block alone runs the blocks above it first.
# - ```python blocks run as a script (``python block.py``, so ``if __name__ == "__main__":`` holds);
#   ```bash / ```sh blocks run with ``bash -e`` (line by line, stopping at the first failure);
#   ```console blocks too, with their ``$ `` prompts stripped and the lines without one (output)
#   left out. ``python``, ``pip`` and ``torchrun`` are this interpreter's. Other blocks (```text,
#   plain ```) are output, not run.
# - The home starts with these names (made once per session by the fixtures below):
#
#   ``~/data/train/``   an image folder: classes ``cat``, ``dog``, ``eel``; ``0.png``, ``1.jpg``, ...
#                       (8 images each, about 300 x 260 pixels)
#   ``~/data/val/``     an image folder with the same classes, 2 images each
#   ``~/data/wds/``     WebDataset shards written without packer: ``shard-000000.tar`` ..
#                       ``shard-000003.tar``, members ``KEY.jpg`` and ``KEY.cls`` (6 samples each)
#   ``~/tools/``        the repository's ``tools/`` folder (run ``python tools/train_ddp.py ...``)
#   ``~/tests/data/``   the repository's ``tests/data/`` (e.g. ``tests/data/importers/``: small
#                       datasets other tools wrote), to read, not to write into
#
#   A document that needs more makes it as a user would, in a block of its own (the user guide
#   runs ``python -m packer demo --workdir ~/demo`` for its 512-image ``~/demo/sample.lmdb``).
#
# - A block that mentions ``s3://`` runs with ``AWS_ENDPOINT_URL`` (and test credentials) set to
#   a moto S3 server on 127.0.0.1. Each document starts with one bucket, ``bucket``, holding
#   ``wds/shard-000000.tar`` .. ``wds/shard-000003.tar`` as in ``~/data/wds``. Write S3 examples for
#   the standard variable, never an endpoint flag.
# - An HTML comment on the line right before a block changes how it runs:
#
#   ``<!-- docs-test: skip (needs a GPU) -->``  not run; the reason must say that the block needs a
#       GPU, a cluster (several machines) or the public internet: nothing else is skipped;
#   ``<!-- docs-test: file NAME -->``  the block is saved as ``~/NAME`` (a script that a later block
#       runs), not run;
#   ``<!-- docs-test: needs MODULE -->``  an optional extra: skipped when MODULE does not import
#       (a failure under PACKER_REQUIRE_OPTIONAL=1, as in CI);
#   ``<!-- docs-test: slow (repeats tests/FOLDER/test_x.py) -->``  runs in the slow suite only (CI runs it),
#       for a block that takes long and repeats what the named test file checks in the default suite.
#       A slow block is never run as the prerequisite of a later block, so it must leave nothing
#       that a later block needs (the default suite, which skips it, proves that).
#
# To give docs a new name, add a builder to ``FIXTURES`` (name -> function that makes it in a folder).

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from tests.helpers import import_optional, make_folder, moto_s3

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXEMPT = {"docs/benchmarks.md"}
RUN = {"python", "bash", "sh", "console"}
SKIP_REASONS = ("GPU", "cluster", "internet")
TIMEOUT = 300


# -- the blocks ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    """One fenced block: its document, the line of its opening fence, language, text and marker."""

    doc: str
    line: int
    lang: str
    text: str
    marker: str  # "" or the text of the docs-test comment right before it

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def documents() -> list[str]:
    """README.md and docs/*.md, relative to the repository root, the exempt ones left out."""
    docs = sorted(f"docs/{n}" for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md"))
    return [d for d in ["README.md", *docs] if d not in EXEMPT]


_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)[^\n]*$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")


def blocks_of(doc: str) -> list[Block]:
    """Every fenced block of ``doc`` (a path relative to the repository root), in order."""
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        return parse_blocks(doc, f.read())


def parse_blocks(doc: str, text: str) -> list[Block]:
    """Every fenced block of the Markdown ``text`` in order (indented fences too, their indent
    removed), each with the docs-test marker on the line before it or one blank line above."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:j]]
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = _MARKER.match(lines[k]) if k >= 0 and k >= i - 2 else None
        found.append(Block(doc, i + 1, lang, "\n".join(body) + "\n", marker.group(1) if marker else ""))
        i = j + 1
    return found


def runnable(doc: str) -> list[Block]:
    return [b for b in blocks_of(doc) if b.lang in RUN]


ALL = [b for d in documents() for b in runnable(d)]
_SLOW = re.compile(r"slow \(repeats (tests/(?:\w+/)*test_\w+\.py)\b.*\)")


def _param(block: Block):
    """``block`` as a test parameter, marked slow when its docs-test marker says so."""
    return pytest.param(block, id=block.id, marks=[pytest.mark.slow] if _SLOW.fullmatch(block.marker) else [])


# -- the names a home starts with ---------------------------------------------------------------
def _image_folder(dst: str, per_class: int, size: tuple[int, int]) -> None:
    h, w = size
    make_folder(dst, {c: [(f"{i}.{'png' if i % 2 == 0 else 'jpg'}", h + 4 * i, w - 2 * i) for i in range(per_class)]
                      for c in ("cat", "dog", "eel")})


def _wds_shards(dst: str) -> None:
    """Four WebDataset shards as ShardWriter lays them out, written with tarfile alone."""
    import cv2

    os.makedirs(dst)
    rng = np.random.default_rng(0)
    for s in range(4):
        with tarfile.open(os.path.join(dst, f"shard-{s:06d}.tar"), "w") as tar:
            for k in range(6):
                key = f"s{s}_{k:03d}"
                pixels = rng.integers(0, 255, (40, 48, 3), np.uint8)
                jpeg = cv2.imencode(".jpg", pixels)[1].tobytes()
                for name, data in ((f"{key}.jpg", jpeg), (f"{key}.cls", str((s + k) % 3).encode())):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(data), 0
                    tar.addfile(info, io.BytesIO(data))


#: name under the home -> the function that makes it at the path it is given.
FIXTURES: dict[str, Callable[[str], None]] = {
    "data/train": lambda d: _image_folder(d, 8, (260, 300)),
    "data/val": lambda d: _image_folder(d, 2, (260, 300)),
    "data/wds": _wds_shards,
}


@pytest.fixture(scope="session")
def start_home(tmp_path_factory) -> str:
    """A folder holding every name of FIXTURES, made once; each document gets a copy."""
    base = str(tmp_path_factory.mktemp("docs-start"))
    for name, make in FIXTURES.items():
        make(os.path.join(base, name))
    return base


# -- object storage ------------------------------------------------------------------------------
@dataclass(frozen=True)
class S3Server:
    """A moto S3 server on 127.0.0.1: the environment that reaches it (the standard AWS variables,
    nothing packer-specific) and how to bring it back to its starting state."""

    env: dict[str, str]
    wds: str

    def reset(self) -> None:
        """Empty the server, then make the bucket ``bucket`` with ``wds/`` in it."""
        import urllib.request

        import boto3

        endpoint = self.env["AWS_ENDPOINT_URL"]
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).close()
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        client.create_bucket(Bucket="bucket")
        for name in sorted(os.listdir(self.wds)):
            client.upload_file(os.path.join(self.wds, name), "bucket", f"wds/{name}")


@pytest.fixture(scope="session")
def s3_server(start_home):
    import_optional("s3fs", "s3:// blocks need s3fs: pip install 'packer[s3]'")
    with moto_s3() as endpoint:
        yield S3Server({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"},
                       os.path.join(start_home, "data", "wds"))


# -- running a document --------------------------------------------------------------------------
@dataclass
class Session:
    """One document's home and how far through its blocks it has run."""

    home: str
    done: dict[int, str | None] = field(default_factory=dict)  # line -> None (ran) or why it failed
    s3: S3Server | None = None  # the server, once a block of this document has used it


def _environment(home: str, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PACKER_CACHE_DIR", "XDG_CACHE_HOME", "AWS_", "PYTEST_"))}
    env["PACKER_REQUIRE_OPTIONAL"] = os.environ.get("PACKER_REQUIRE_OPTIONAL", "0")
    env.update(HOME=home, PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def _console_script(text: str) -> str:
    return "".join(line[2:] + "\n" for line in text.splitlines() if line.startswith("$ "))


def _skip_reason(block: Block) -> str | None:
    """Why ``block`` is not run (None: it runs); an unknown marker or reason is an error."""
    if not block.marker:
        return None
    m = re.fullmatch(r"skip \((.+)\)", block.marker)
    if m:
        reason = m.group(1)
        assert any(w in reason for w in SKIP_REASONS), (
            f"{block.id}: a block is skipped only when it needs a GPU, a cluster or the public internet, "
            f"not for {reason!r}")
        return reason
    m = _SLOW.fullmatch(block.marker)
    if m:
        assert os.path.exists(os.path.join(ROOT, m.group(1))), f"{block.id}: {m.group(1)} does not exist"
        return None
    m = re.fullmatch(r"needs ([\w.]+)", block.marker)
    if m:
        try:
            found = importlib.util.find_spec(m.group(1)) is not None  # imports the parents, not the module
        except ImportError:
            found = False
        if not found:
            import_optional(m.group(1), f"{block.id} needs {m.group(1)} (an optional extra)")
        return None
    assert re.fullmatch(r"file [\w./-]+", block.marker), f"{block.id}: unknown docs-test marker {block.marker!r}"
    return None


def run_block(block: Block, session: Session, s3_server: Callable[[], S3Server]) -> None:
    """Run ``block`` in ``session``'s home; an assertion error with its output if it fails."""
    if block.marker.startswith("file "):
        path = os.path.join(session.home, block.marker[5:])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(block.text)
        return
    extra: dict[str, str] = {}
    if "s3://" in block.text:
        if session.s3 is None:  # each document starts from the same bucket
            session.s3 = s3_server()
            session.s3.reset()
        extra = session.s3.env
    if block.lang == "python":
        script = os.path.join(session.home, ".docs_block.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(block.text)
        argv = [sys.executable, script]
    else:
        text = _console_script(block.text) if block.lang == "console" else block.text
        argv = ["bash", "-e", "-o", "pipefail", "-c", text]
    proc = subprocess.Popen(argv, cwd=session.home, env=_environment(session.home, extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the block's whole process group: torchrun ranks, workers
        stdout, stderr = proc.communicate()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # nothing the block started outlives it
    assert proc.returncode == 0, (f"{block.id} ({block.lang}) exited {proc.returncode}:\n{block.text}\n"
                                  f"--- stdout\n{stdout[-6000:]}\n--- stderr\n{stderr[-6000:]}")


def _runs(block: Block) -> bool:
    """Whether ``block`` runs as a later block's prerequisite (an earlier block skipped for an absent
    extra does not skip the rest; a slow block is never a prerequisite)."""
    if _SLOW.fullmatch(block.marker):
        return False
    try:
        return _skip_reason(block) is None
    except pytest.skip.Exception:
        return False


@pytest.fixture(scope="session")
def sessions(start_home, tmp_path_factory):
    made: dict[str, Session] = {}

    def get(doc: str) -> Session:
        if doc not in made:
            home = str(tmp_path_factory.mktemp("home"))
            shutil.copytree(start_home, home, dirs_exist_ok=True)
            os.symlink(os.path.join(ROOT, "tools"), os.path.join(home, "tools"))
            os.makedirs(os.path.join(home, "tests"))
            os.symlink(os.path.join(ROOT, "tests", "data"), os.path.join(home, "tests", "data"))
            made[doc] = Session(home)
        return made[doc]

    return get


def _run_as_written(block: Block, sessions: Callable[[str], Session], request: pytest.FixtureRequest) -> None:
    """Run ``block``, after the blocks of its document above it that have not run yet."""
    reason = _skip_reason(block)
    if reason is not None:
        pytest.skip(reason)
    session = sessions(block.doc)

    def s3_server() -> S3Server:
        return request.getfixturevalue("s3_server")

    for earlier in runnable(block.doc):  # what the document did before this block
        if earlier.line >= block.line:
            break
        if earlier.line not in session.done and _runs(earlier):
            try:
                run_block(earlier, session, s3_server)
                session.done[earlier.line] = None
            except AssertionError as e:
                session.done[earlier.line] = str(e).splitlines()[0]
        if session.done.get(earlier.line):
            pytest.fail(f"an earlier block of {block.doc} failed: {session.done[earlier.line]}")
    try:
        run_block(block, session, s3_server)
    except AssertionError as e:
        session.done[block.line] = str(e).splitlines()[0]
        raise
    session.done[block.line] = None


def _document_tests(doc: str) -> type:
    """The test class of one document's blocks. A class per document, because the suite spreads
    its tests over workers by module and class (``--dist loadscope``): each document runs whole on
    one worker (its earlier blocks are made once) while the documents run side by side."""

    class Document:
        @pytest.mark.parametrize("block", [_param(b) for b in ALL if b.doc == doc])
        def test_block_runs_as_written(self, block, sessions, request):
            _run_as_written(block, sessions, request)

    Document.__name__ = Document.__qualname__ = "TestDocument_" + re.sub(r"\W", "_", doc)
    return Document


for _doc in sorted({b.doc for b in ALL}):
    _tests = _document_tests(_doc)
    globals()[_tests.__name__] = _tests


def test_fences_markers_and_prompts_are_read():
    text = ("Intro.\n\n<!-- docs-test: skip (needs a GPU) -->\n```python\nimport torch\n```\n\n"
            "- a list item:\n\n  ```bash\n  echo hi\n  ```\n\n```text\nout\n```\n\n"
            "<!-- docs-test: file run.py -->\n\n```console\n$ python run.py\noutput\n```\n")
    blocks = parse_blocks("x.md", text)
    assert [(b.line, b.lang, b.marker) for b in blocks] == [
        (4, "python", "skip (needs a GPU)"), (10, "bash", ""), (14, "text", ""), (20, "console", "file run.py")]
    assert blocks[1].text == "echo hi\n" and _console_script(blocks[3].text) == "python run.py\n"
    assert _skip_reason(blocks[0]) == "needs a GPU" and _skip_reason(blocks[1]) is None
    slow = Block("x.md", 1, "bash", "true\n", "slow (repeats tests/datasets/test_ddp.py: its two-rank runs)")
    assert _skip_reason(slow) is None and not _runs(slow) and _param(slow).marks[0].name == "slow"
    for marker in ("skip (slow)", "skp (needs a GPU)", "slow (takes long)", "slow (repeats tests/test_nothing.py)"):
        with pytest.raises(AssertionError):  # only a GPU, a cluster or the internet excuse a block
            _skip_reason(Block("x.md", 1, "bash", "true\n", marker))


def test_blocks_are_found():
    """The extraction sees the blocks: the README's quick start and its three examples at least."""
    readme = runnable("README.md")
    assert len(readme) >= 4 and any("packer demo" in b.text for b in readme)
    assert all(b.doc not in EXEMPT for b in ALL)
