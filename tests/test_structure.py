"""The house rules of the source tree, checked on every run so that they do not drift.

- functions and methods are at most 60 lines, not counting their docstring; modules at most 700
  lines and classes at most 400 (today's larger ones are listed, to shrink);
- module docstrings are at most 20 lines (user guides live in docs/);
- no module edits ``sys.path`` (packages import as installed, tools and tests as packages);
- readers (``packer.datasets``) import no writer (``packer.converters``);
- a format's name is compared only in its modules and the registry, a source's in the source
  table and its module, a field kind's in packer/fields/; ``argparse`` only in packer.cli and tools;
- imports point down the layers (``import x`` and ``from x import y`` alike, lazy ones included):
  the foundation, files, images, the dataset description, storage, layouts, writers and readers,
  the format registry (``packer.formats``, above the parts it lists), the readers' front door
  (``open_dataset``, ``StreamingDataset``), then a layer per room: the conversion pipeline, the
  operations on packed datasets, the options table, the sources, the conversion, the Python API
  (``packer.api``) and the command line (``packer.cli``);
- no circle of imports between modules, lazy ones included; the registry's loaders, which import
  each format's writer, reader and layout when it is asked for, are the one exemption;
- no private name (``_x``) imported from another module; tests import tools only from a list.
The rules are functions over a module table (imports, or syntax trees), each also run on a tiny
made-up table; each tree is parsed once per run.
"""

from __future__ import annotations

import ast
import functools
import gc
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREES = ("packer", "converters", "datasets", "tests", "tools")
PACKAGE = ("packer", "converters", "datasets")
MAX_FUNCTION_LINES = 60
MAX_MODULE_DOCSTRING_LINES = 20
MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 400
FORMAT_NAMES = {"lmdb", "hdf5", "tar", "tfrecord"}
#: The layers, bottom up. A module's layer is that of its longest matching key; a key matches the
#: module it names and the modules under it, a key ending in ".*" only the modules under it.
LAYERS = {"packer": 0, "packer.errors": 0, "packer.sizes": 0, "packer.progress": 0, "packer.checks": 0,
          "packer.wording": 0, "packer.files": 1, "packer.images": 2, "packer.fields": 2, "packer.description": 3, "packer.storage": 4,
          "packer.layouts": 5, "packer.converters": 6, "packer.datasets.*": 6, "packer.formats": 7,
          "packer.datasets": 8, "packer.datasets.opening": 8, "packer.datasets.streaming": 8,
          "packer.pipeline": 9, "packer.operations": 10, "packer.conversion.options": 11, "packer.sources": 12,
          "packer.conversion": 13, "packer.api": 14, "packer.cli": 15, "packer.__main__": 15,
          "packer.engines": 15}
#: Where a format's name may be compared: its layout, writer and reader, and the registry.
FORMAT_HOMES = ("packer/layouts/", "converters/", "datasets/formats/", "packer/formats.py")
#: Compiled modules (no .py file), known so that imports of them resolve.
EXTENSION_MODULES = ("packer.images._jpegwindow",)
#: The registry's loaders: each imports one format's writer, reader or layout when that format is
#: asked for, so the registry lists every format without importing them all. The one exemption
#: from the cycle rule (their imports point down the layers, so they obey the layer rule).
REGISTRY_LOADERS = {("packer.formats", name) for name in (
    "_lmdb_writer", "_lmdb_reader", "_tar_writer", "_tar_reader", "_tfrecord_writer", "_tfrecord_reader",
    "_hdf5_writer", "_hdf5_reader", "_locate_tar", "_locate_tfrecord", "_identify_lmdb", "_identify_hdf5",
    "_identify_tar", "_identify_tfrecord", "_tar_suffixes", "_tfrecord_suffixes")}
#: Import edges allowed to close a circle while a move is under way (each with its reason); none now.
IN_PROGRESS_EDGES: set[tuple[str, str]] = set()
#: Moved modules kept at their old path for the code outside the package that imports them there
#: (tests, tools): old path -> new home. An old path imports only its new home, and nothing in the
#: package imports an old path.
OLD_PATHS = {"packer.description.registry": "packer.formats",
             **{f"packer.datasets.{name}": f"packer.datasets.formats.{name}" for name in ("lmdb", "hdf5", "tar", "tfrecord")},
             "packer.datasets.skips": "packer.datasets.shm.skips", "packer.ops.engine": "packer.pipeline.engine",
             "packer.ops.items": "packer.pipeline.items", "packer.ops.merge": "packer.operations.merge"}
#: The tools modules the tests may import (shared helpers; the benchmarks are run, not imported).
TOOLS_FOR_TESTS = {"tools.sample_images", "tools.faultlib"}


@functools.cache
def _parsed(tree: str) -> tuple[tuple[str, ast.Module, int], ...]:
    """(path, syntax tree, line count) of each module under ``tree``: parsed once while this
    module's tests run, as the rules only read the trees."""
    found = []
    collecting = gc.isenabled()
    gc.disable()  # a million new nodes, none in a cycle: no collection need walk them, now or later
    try:
        for folder, dirs, files in os.walk(os.path.join(ROOT, tree)):
            dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "data"))
            for name in sorted(files):
                path = os.path.join(folder, name)
                if name.endswith(".py"):
                    with open(path, encoding="utf-8") as f:
                        text = f.read()
                    lines = text.count("\n") + (not text.endswith("\n") and text != "")  # as iterating the file counts
                    found.append((os.path.relpath(path, ROOT), ast.parse(text, path), lines))
    finally:
        gc.freeze()  # until the module's end (_release_the_trees)
        if collecting:
            gc.enable()
    return tuple(found)


@pytest.fixture(autouse=True, scope="module")
def _release_the_trees() -> Iterator[None]:
    """The parsed trees are kept while this module's tests run, then let go (so that nothing
    after them, pytest's last garbage collection included, walks a million nodes)."""
    yield
    for cached in (_parsed, _nodes, tree_imports):
        cached.cache_clear()
    gc.unfreeze()

def _modules(trees: tuple[str, ...] = TREES) -> Iterator[tuple[str, ast.Module]]:
    for tree in trees:
        for path, module, _ in _parsed(tree):
            yield path, module


@functools.cache
def _nodes(module: ast.Module) -> tuple[ast.AST, ...]:
    """Every node of ``module``, as ``ast.walk`` gives them, listed once per session."""
    return tuple(ast.walk(module))


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:] or body
    return body[-1].end_lineno - body[0].lineno + 1


def test_functions_are_at_most_60_lines():
    long = [f"{path}:{node.lineno} {node.name} ({_body_lines(node)} lines)"
            for path, module in _modules() for node in _nodes(module)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > MAX_FUNCTION_LINES]
    assert not long, "split these functions:\n" + "\n".join(long)


def test_module_docstrings_are_at_most_20_lines():
    long = []
    for path, module in _modules():
        doc = ast.get_docstring(module, clean=False)
        if doc is not None and len(doc.strip("\n").splitlines()) > MAX_MODULE_DOCSTRING_LINES:
            long.append(f"{path} ({len(doc.strip(chr(10)).splitlines())} lines)")
    assert not long, "move the guide to docs/ and keep a line or two:\n" + "\n".join(long)


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def test_no_module_edits_sys_path():
    edits = []
    for path, module in _modules():
        for node in _nodes(module):
            target = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = node.func.value
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                target = target.value if isinstance(target, ast.Subscript) else target
            if target is not None and _is_sys_path(target):
                edits.append(f"{path}:{node.lineno}")
    assert not edits, "import as a package instead of editing sys.path:\n" + "\n".join(edits)


def module_name(path: str) -> str:
    """The dotted name a file under ROOT imports as (``datasets/x.py`` -> ``packer.datasets.x``)."""
    top, *rest = path[:-3].split("/")
    parts = [{"converters": "packer.converters", "datasets": "packer.datasets"}.get(top, top), *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@dataclass(frozen=True)
class Import:
    """One import in a module: the module it reaches (a known module, or the name as written for
    one outside the tree), the names it takes from it, its line, the function it is in ("" at
    module level) and whether it is under ``if TYPE_CHECKING:`` (never run)."""

    target: str
    names: tuple[str, ...]
    line: int
    scope: str = ""
    typing_only: bool = False


def _known(name: str, known: Collection[str]) -> str:
    """``name``, or the longest of its parents that is a known module (``name`` when none is)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return name


def _resolved(node: ast.Import | ast.ImportFrom, package: str, known: Collection[str]) -> Iterator[tuple[str, tuple]]:
    if isinstance(node, ast.Import):  # import a.b.c [as z]: a.b.c is run (and a, a.b before it)
        yield from ((_known(alias.name, known), ()) for alias in node.names)
        return
    base = node.module or ""
    if node.level:  # relative: resolve against the importing package
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    names = []
    for alias in node.names:
        if f"{base}.{alias.name}" in known:  # from a import b, b a module
            yield f"{base}.{alias.name}", ()
        else:
            names.append(alias.name)
    if names:
        yield _known(base, known), tuple(names)


_HOLDS_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case)


def module_imports(module: ast.Module, name: str, is_package: bool, known: Collection[str]) -> list[Import]:
    """Every import in ``module`` (named ``name``), at module level and inside functions alike."""
    package = name if is_package else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, scope: str, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, _HOLDS_STATEMENTS):  # an import is a statement: skip expressions
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend(Import(t, names, child.lineno, scope, typing_only)
                             for t, names in _resolved(child, package, known))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope else child.name
                visit(child, inner if not isinstance(child, ast.ClassDef) or scope else scope, typing_only)
            elif isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), scope, True)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), scope, typing_only)
            else:
                visit(child, scope, typing_only)

    visit(module, "", False)
    return found


@functools.cache
def tree_imports(trees: tuple[str, ...] = TREES) -> dict[str, list[Import]]:
    """The module -> imports table of the files under ``trees``."""
    parsed = {module_name(path): (path, module) for path, module in _modules(trees)}
    known = {*parsed, *EXTENSION_MODULES}
    return {name: module_imports(module, name, path.endswith("__init__.py"), known)
            for name, (path, module) in parsed.items()}


def import_graph(imports: dict[str, list[Import]], exempt: Collection[tuple[str, str]] = (),
                 exempt_edges: Collection[tuple[str, str]] = ()) -> dict[str, set[str]]:
    """Module -> the modules of the table it imports (imports that run: not those under
    ``TYPE_CHECKING``; none from an ``exempt`` (module, function) pair, none on an exempt edge)."""
    return {m: {i.target for i in found if i.target in imports and i.target != m and not i.typing_only
                and (m, i.scope.split(".")[0]) not in exempt and (m, i.target) not in exempt_edges}
            for m, found in imports.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph``: each strongly connected set of two or more modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(cycles)


def _describe_cycle(graph: dict[str, set[str]], group: list[str]) -> str:
    edges = [f"{a} -> {b}" for a in group for b in sorted(graph[a]) if b in group]
    return f"{', '.join(group)}:\n    " + "\n    ".join(edges)


def test_no_import_cycles():
    graph = import_graph(tree_imports(), REGISTRY_LOADERS, IN_PROGRESS_EDGES)
    cycles = import_cycles(graph)
    assert not cycles, "break these import circles:\n" + "\n".join(_describe_cycle(graph, c) for c in cycles)


def test_the_exemptions_name_what_is_there():
    """An exemption that no longer matches an import is removed, not kept."""
    imports = tree_imports()
    scopes = {(m, i.scope.split(".")[0]) for m, found in imports.items() for i in found if i.scope}
    assert REGISTRY_LOADERS <= scopes, sorted(REGISTRY_LOADERS - scopes)
    edges = {(m, i.target) for m, found in imports.items() for i in found}
    assert IN_PROGRESS_EDGES <= edges, sorted(IN_PROGRESS_EDGES - edges)


def _layer(module: str, layers: dict[str, int] = LAYERS) -> int:
    def length(key: str) -> int:
        if key.endswith(".*"):
            return len(key) if module.startswith(key[:-1]) else -1
        return len(key) if module == key or module.startswith(key + ".") else -1

    return layers[max(layers, key=length)]


def layer_violations(imports: dict[str, list[Import]], layers: dict[str, int] = LAYERS,
                     exempt_edges: Collection[tuple[str, str]] = ()) -> list[str]:
    """``module:line imports target`` for each import (of any kind, lazy or not) of a module of
    the table from a lower layer."""
    return [f"{m}:{i.line} imports {i.target}" for m, found in imports.items() for i in found
            if i.target in imports and (m, i.target) not in exempt_edges and _layer(i.target, layers) > _layer(m, layers)]


def test_imports_point_down_the_layers():
    up = layer_violations(tree_imports(PACKAGE), LAYERS, IN_PROGRESS_EDGES | set(OLD_PATHS.items()))
    assert not up, "an import points up the layers:\n" + "\n".join(up)


def test_old_paths_only_forward_to_the_new_home():
    imports = tree_imports(PACKAGE)
    for old, new in OLD_PATHS.items():
        assert {i.target for i in imports[old]} == {new}, old
    users = [f"{m}:{i.line} imports {i.target}" for m, found in imports.items() for i in found if i.target in OLD_PATHS]
    assert not users, "import the new home:\n" + "\n".join(users)


def test_old_paths_import_what_their_new_home_exports():
    import importlib

    for old, new in OLD_PATHS.items():
        before, after = importlib.import_module(old), importlib.import_module(new)
        assert before.__all__ == after.__all__ and all(getattr(before, n) is getattr(after, n) for n in after.__all__), old


def test_readers_import_no_writer():
    found = [f"{m}:{i.line} imports {i.target}" for m, imports in tree_imports(PACKAGE).items()
             if m.startswith("packer.datasets") for i in imports
             if i.target == "packer.converters" or i.target.startswith("packer.converters.")]
    assert not found, "readers must not import writers:\n" + "\n".join(found)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(imports: dict[str, list[Import]]) -> list[str]:
    """``module imports target._name`` for each private name taken from another module, and each
    private module imported from outside its package."""
    found = []
    for m, imported in imports.items():
        for i in imported:
            found += [f"{m} imports {i.target}.{n}" for n in i.names if _private(n) and i.target != m]
            parent, _, last = i.target.rpartition(".")
            if not i.names and _private(last) and not (m == parent or m.startswith(parent + ".")):
                found.append(f"{m} imports {i.target}")
    return sorted(set(found))


#: Private names imported from another module: the list to shrink, empty today (make the name
#: public where it is a real shared helper, or move the code that needs it; never add to it).
PRIVATE_IMPORTS_TO_SHRINK: set[str] = set()


def test_no_private_name_is_imported_from_another_module():
    found = set(private_imports(tree_imports(PACKAGE + ("tools",))))
    new = sorted(found - PRIVATE_IMPORTS_TO_SHRINK)
    assert not new, "import public names only (or make the helper public):\n" + "\n".join(new)
    gone = sorted(PRIVATE_IMPORTS_TO_SHRINK - found)
    assert not gone, "these are fixed: remove them from PRIVATE_IMPORTS_TO_SHRINK:\n" + "\n".join(gone)


def tools_imports_of_tests(imports: dict[str, list[Import]], allowed: Collection[str]) -> list[str]:
    """``test imports tools.x`` for each tools module a test imports that is not ``allowed``."""
    return sorted(f"{m}:{i.line} imports {t}" for m, found in imports.items() if m.startswith("tests")
                  for i in found for t in [i.target, *(f"{i.target}.{n}" for n in i.names if i.target == "tools")]
                  if (t == "tools" and not i.names) or (t.startswith("tools.") and t not in allowed))


def test_tests_import_tools_only_from_the_list():
    found = tools_imports_of_tests(tree_imports(("tests", "tools")), TOOLS_FOR_TESTS)
    assert not found, "tests import only the tools in TOOLS_FOR_TESTS:\n" + "\n".join(found)


#: Modules longer than MAX_MODULE_LINES and classes longer than MAX_CLASS_LINES today: the list
#: to shrink (split them; never add to it).
LARGE_TO_SHRINK: set[str] = set()


def oversized(modules: Iterable[tuple[str, ast.Module, int]], max_module: int = MAX_MODULE_LINES,
              max_class: int = MAX_CLASS_LINES) -> list[str]:
    """``path (N lines)`` and ``path:Class (N lines)`` for each module and class over its limit."""
    found = []
    for path, module, lines in modules:
        if lines > max_module:
            found.append(path)
        found += [f"{path}:{node.name}" for node in _nodes(module) if isinstance(node, ast.ClassDef)
                  and node.end_lineno - node.lineno + 1 > max_class]
    return sorted(found)


def _sized_modules() -> Iterator[tuple[str, ast.Module, int]]:
    for tree in PACKAGE + ("tools",):
        yield from _parsed(tree)


def test_modules_and_classes_are_not_too_large():
    found = set(oversized(_sized_modules()))
    new = sorted(found - LARGE_TO_SHRINK)
    assert not new, f"split these (modules <= {MAX_MODULE_LINES} lines, classes <= {MAX_CLASS_LINES}):\n" + "\n".join(new)
    gone = sorted(LARGE_TO_SHRINK - found)
    assert not gone, "these are small enough now: remove them from LARGE_TO_SHRINK:\n" + "\n".join(gone)


def compared_strings(node: ast.AST) -> set[str]:
    """The strings a comparison compares with, alone or in a tuple, list or set (``x == "a"``,
    ``x in ("a", "b")``); none for a node that is not a comparison."""
    if not isinstance(node, ast.Compare):
        return set()
    return {e.value for v in [node.left, *node.comparators]
            for e in ([v] if isinstance(v, ast.Constant) else getattr(v, "elts", []))
            if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def misplaced_names(modules: Iterable[tuple[str, ast.Module]], homes: Mapping[str, Collection[str]],
                    compared: Callable[[ast.AST], set[str]] = compared_strings) -> list[str]:
    """``path:line compares 'name'`` for each comparison (what ``compared`` finds) with a name of
    ``homes`` in a module outside that name's homes (path prefixes)."""
    return [f"{path}:{node.lineno} compares {name!r}" for path, module in modules for node in _nodes(module)
            for name in sorted(compared(node)) if name in homes and not path.startswith(tuple(homes[name]))]


def test_format_names_are_compared_only_in_the_formats_own_modules():
    from packer.formats import format_names

    assert set(format_names()) == FORMAT_NAMES  # the names this test looks for are the registry's
    found = misplaced_names(_modules(PACKAGE), dict.fromkeys(FORMAT_NAMES, FORMAT_HOMES))
    assert not found, "ask the format's registry record instead of comparing its name:\n" + "\n".join(found)


#: Where each source's name (the source table's, packer/sources/table.py, but the packed formats,
#: whose names the format rule keeps) may be compared: the table, and the source's own module(s).
#: An image folder is also a destination: the list of destinations names it (packer.conversion.options).
SOURCE_HOMES = {
    "imagefolder": ("packer/pipeline/engine.py", "packer/conversion/options.py"),
    "list": ("packer/sources/listsource.py",),
    "coco": ("packer/sources/coco.py",),
    "mds": ("packer/sources/importers/mdsreader.py",),
    "litdata": ("packer/sources/importers/litreader.py",),
    "parquet": ("packer/sources/importers/parquetreader.py",),
}
SOURCE_TABLE = "packer/sources/table.py"
#: Modules that compare a source's name today, each with its reason: the list to shrink (ask the
#: source table's row, or packer.conversion.options.writes_image_folder; never add to it).
SOURCE_NAMES_TO_MOVE = {
    "packer/api.py",  # packer.pack refuses the imagefolder destination by name; it sits in a part in flight
    "packer/operations/transcode.py",  # convert_dataset dispatches on imagefolder by name, until it goes
                                       # through the one conversion funnel (a part in flight)
}


def test_source_names_are_compared_only_in_the_table_and_their_own_modules():
    from packer.formats import format_names
    from packer.sources.table import source_names

    assert set(SOURCE_HOMES) == set(source_names()) - set(format_names())  # the table's names, each with a home
    found = misplaced_names(_modules(PACKAGE), {n: (SOURCE_TABLE, *homes) for n, homes in SOURCE_HOMES.items()})
    paths = {f.split(":")[0] for f in found}
    new = [f for f in found if f.split(":")[0] not in SOURCE_NAMES_TO_MOVE]
    assert not new, "ask the source table's row instead of comparing its name:\n" + "\n".join(new)
    gone = sorted(SOURCE_NAMES_TO_MOVE - paths)
    assert not gone, "these are fixed: remove them from SOURCE_NAMES_TO_MOVE:\n" + "\n".join(gone)


#: The built-in field kinds' names, from their table, and where they may be compared: the kinds'
#: own modules and the table (packer/fields/), their one home; every other module (the manifest,
#: the writers, the readers, verify, the sources) asks the kind object (packer.fields.KINDS).
FIELD_KIND_NAMES = {"mask", "image", "boxes"}
FIELD_HOMES = ("packer/fields/",)


def _is_kind_expr(node: ast.AST) -> bool:
    """``x["kind"]``, ``x.get("kind")``, ``x.field_kind(...)`` or a name ``kind``: a field's kind."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value == "kind"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "field_kind" or (node.func.attr == "get" and any(
            isinstance(a, ast.Constant) and a.value == "kind" for a in node.args))
    return isinstance(node, ast.Name) and node.id == "kind"


def compared_field_kinds(node: ast.AST) -> set[str]:
    """The strings a comparison compares with, but ``"image"`` unless it is compared with a field's
    kind: ``"image"`` is also the sample's own image, while ``"mask"`` and ``"boxes"`` name their
    field, so a test of a field's name is a test of its kind."""
    found = compared_strings(node)
    if "image" in found and not any(_is_kind_expr(v) for v in [node.left, *node.comparators]):
        found.discard("image")
    return found


def test_field_kind_names_are_compared_only_in_their_modules_and_the_table():
    from packer.fields import FIELD_KINDS

    assert set(FIELD_KINDS) == FIELD_KIND_NAMES  # the names this test looks for are the table's
    found = misplaced_names(_modules(PACKAGE), dict.fromkeys(FIELD_KIND_NAMES, FIELD_HOMES), compared_field_kinds)
    assert not found, "ask the field kind (packer.fields) instead of comparing its name:\n" + "\n".join(found)


#: Where ``argparse`` may be imported: the command line, the tools, and the test scripts that
#: torchrun starts with flags (tests/ddp_worker.py, tests/ddp_eval_worker.py). The Python API
#: takes typed options (packer.conversion.options) and never parses flags.
ARGPARSE_HOMES = ("packer.cli", "tools", "tests.ddp_worker", "tests.ddp_eval_worker")


def argparse_users(imports: dict[str, list[Import]], homes: Collection[str]) -> list[str]:
    """``module:line imports argparse`` for each import of argparse (lazy or not) in a module that
    is not one of ``homes`` nor under one."""
    return [f"{m}:{i.line} imports argparse" for m, found in imports.items()
            if not any(m == h or m.startswith(h + ".") for h in homes)
            for i in found if i.target.split(".")[0] == "argparse"]


def test_argparse_only_in_the_command_line_and_tools():
    found = argparse_users(tree_imports(), ARGPARSE_HOMES)
    assert not found, "parse flags only in packer.cli (or tools); elsewhere take typed options:\n" + "\n".join(found)


@pytest.mark.parametrize("source, lines", [
    ("def f():\n    '''doc\n    more'''\n    a = 1\n    return a\n", 2),
    ("def f():\n    return 1\n", 1),
])
def test_the_line_count_leaves_out_the_docstring(source, lines):
    node = ast.parse(source).body[0]
    assert _body_lines(node) == lines


# -- the checkers themselves, on a tiny made-up tree: each rule fails on a deliberate violation ----
def _table(sources: dict[str, str]) -> dict[str, list[Import]]:
    """The module -> imports table of made-up modules (a name with modules under it is a package)."""
    return {name: module_imports(ast.parse(src), name, any(m.startswith(name + ".") for m in sources), sources)
            for name, src in sources.items()}


def test_the_import_reader_sees_every_kind_of_import():
    table = _table({
        "pkg": "", "pkg.b": "", "pkg.c": "", "pkg.d": "", "pkg.e": "", "pkg.f": "", "pkg.g": "",
        "pkg.a": ("import os\nimport pkg.b\nimport pkg.c as see\nfrom . import d\nfrom .e import thing\n"
                  "def lazy():\n    from pkg.f import _hidden\n"
                  "if TYPE_CHECKING:\n    from pkg.g import T\n"),
    })
    got = {(i.target, i.names, i.scope, i.typing_only) for i in table["pkg.a"]}
    assert got == {("os", (), "", False), ("pkg.b", (), "", False), ("pkg.c", (), "", False),
                   ("pkg.d", (), "", False), ("pkg.e", ("thing",), "", False),
                   ("pkg.f", ("_hidden",), "lazy", False), ("pkg.g", ("T",), "", True)}


def test_the_cycle_rule_finds_a_circle_closed_by_a_lazy_import():
    sources = {"pkg": "", "pkg.a": "from pkg.b import x\n", "pkg.b": "def load():\n    import pkg.a\n",
               "pkg.c": "if TYPE_CHECKING:\n    from pkg.a import y\n"}
    table = _table(sources)
    assert import_cycles(import_graph(table)) == [["pkg.a", "pkg.b"]]
    assert import_cycles(import_graph(table, exempt={("pkg.b", "load")})) == []
    assert import_cycles(import_graph(table, exempt_edges={("pkg.a", "pkg.b")})) == []
    longer = _table({**sources, "pkg.a": "import pkg.c\n", "pkg.c": "from . import b\n"})  # a -> c -> b -> a
    assert import_cycles(import_graph(longer)) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_layer_rule_sees_plain_lazy_and_relative_imports():
    layers = {"pkg": 0, "pkg.high": 1, "pkg.door": 2, "pkg.door.*": 1}
    for src in ("import pkg.high\n", "def f():\n    from pkg.high import x\n", "from .high import x\n"):
        table = _table({"pkg": "", "pkg.low": src, "pkg.high": ""})
        assert layer_violations(table, layers) == ["pkg.low:" + str(src.count("\n")) + " imports pkg.high"], src
        assert layer_violations(table, layers, exempt_edges={("pkg.low", "pkg.high")}) == []
    table = _table({"pkg": "", "pkg.high": "import pkg.low\n", "pkg.low": ""})
    assert layer_violations(table, layers) == []
    # a key ending in ".*" holds the modules under a package, not the package itself
    table = _table({"pkg": "", "pkg.door": "from .door import part\n", "pkg.door.part": "import pkg.door\n"})
    assert layer_violations(table, layers) == ["pkg.door.part:1 imports pkg.door"]


def test_the_layer_rule_gives_each_folder_its_layer_and_a_module_its_own():
    # rooms as folders, bottom up: pipeline < conversion.options < sources < conversion < cli;
    # a module may import its own room's modules; a module with its own key sits apart from its room
    layers = {"pkg": 0, "pkg.pipeline": 1, "pkg.conversion.options": 2, "pkg.sources": 3, "pkg.conversion": 4,
              "pkg.cli": 5}
    sources = {
        "pkg": "", "pkg.pipeline": "", "pkg.pipeline.engine": "", "pkg.pipeline.items": "from .engine import run\n",
        "pkg.sources": "", "pkg.sources.table": "from ..conversion.options import Request\n",
        "pkg.conversion": "", "pkg.conversion.options": "import pkg.pipeline.engine\n",
        "pkg.conversion.run": "from ..sources.table import get\nfrom .options import Request\n",
        "pkg.cli": "", "pkg.cli.parser": "from . import convert\n", "pkg.cli.convert": "import pkg.conversion.run\n",
    }
    assert layer_violations(_table(sources), layers) == []
    up = {"pkg.pipeline.engine": "import pkg.cli\n",  # a room below imports one above
          "pkg.conversion.options": "def check():\n    from ..sources.table import get\n"}  # the module's own key
    assert layer_violations(_table({**sources, **up}), layers) == [
        "pkg.pipeline.engine:1 imports pkg.cli", "pkg.conversion.options:2 imports pkg.sources.table"]


def test_the_private_name_rule():
    table = _table({"pkg": "", "pkg.a": "def f():\n    from pkg.b import _x, y\n", "pkg.b": "from . import _ext\n",
                    "pkg._ext": "", "pkg.sub": "", "pkg.sub._mod": "", "pkg.c": "import pkg.sub._mod\n",
                    "pkg.sub.d": "from pkg.sub import _mod\n", "pkg.e": "from pkg.b import __all__\n"})
    assert private_imports(table) == ["pkg.a imports pkg.b._x", "pkg.c imports pkg.sub._mod"]


def test_the_tools_rule():
    table = _table({"tools": "", "tools.helper": "", "tools.bench": "", "tests": "",
                    "tests.t": "from tools import helper\nimport tools.bench\nfrom tools.helper import draw\n"})
    assert tools_imports_of_tests(table, {"tools.helper"}) == ["tests.t:2 imports tools.bench"]
    assert tools_imports_of_tests(table, {"tools.helper", "tools.bench"}) == []


def test_the_size_rule():
    src = "class Small:\n    a = 1\n\n\nclass Big:\n" + "    a = 1\n" * 5
    module = ast.parse(src)
    assert oversized([("m.py", module, src.count("\n"))], max_module=20, max_class=4) == ["m.py:Big"]
    assert oversized([("m.py", module, src.count("\n"))], max_module=5, max_class=10) == ["m.py"]


def test_the_name_comparison_rule():
    modules = [("pkg/table.py", ast.parse("def get(n):\n    return n == 'coco'\n")),
               ("pkg/coco.py", ast.parse("ok = kind in ('coco', 'x')\n")),
               ("pkg/run.py", ast.parse("a = src == 'coco'\nb = src not in ['list', 'other']\nc = {'coco': 1}\n"
                                        "d = 'coco'\ne = src == 'lists'\n"))]
    homes = {"coco": ("pkg/table.py", "pkg/coco.py"), "list": ("pkg/table.py",)}
    assert misplaced_names(modules, homes) == ["pkg/run.py:1 compares 'coco'", "pkg/run.py:2 compares 'list'"]
    # field kinds: "image" counts only against a field's kind, "mask" in any comparison
    kinds = [("pkg/w.py", ast.parse("a = name == 'mask'\nb = key == 'image'\nc = f['kind'] == 'image'\n"
                                    "d = kind in ('image',)\n")), ("pkg/fields/mask.py", ast.parse("a = n == 'mask'\n"))]
    assert misplaced_names(kinds, dict.fromkeys(("mask", "image"), ("pkg/fields/",)), compared_field_kinds) == [
        "pkg/w.py:1 compares 'mask'", "pkg/w.py:3 compares 'image'", "pkg/w.py:4 compares 'image'"]


def test_the_argparse_rule():
    table = _table({"pkg": "", "pkg.cli": "", "pkg.cli.parser": "import argparse\n", "pkg.clever": "import argparse\n",
                    "pkg.api": "import os\ndef convert():\n    from argparse import Namespace\n"})
    assert argparse_users(table, ("pkg.cli",)) == ["pkg.clever:1 imports argparse", "pkg.api:3 imports argparse"]
    assert argparse_users(table, ("pkg",)) == []


def test_every_package_folder_is_installed():
    """setup.cfg lists packages by hand (converters/ and datasets/ install under packer): a folder
    left out works in an editable install and is missing from a wheel."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    listed = {p.strip() for p in cfg["options"]["packages"].split(",")}
    found = {module_name(os.path.relpath(os.path.join(folder, "__init__.py"), ROOT))
             for tree in PACKAGE for folder, _, files in os.walk(os.path.join(ROOT, tree)) if "__init__.py" in files}
    assert found == listed, f"missing from setup.cfg: {sorted(found - listed)}; not a package: {sorted(listed - found)}"
