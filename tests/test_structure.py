"""The house rules of the source tree, checked on every run so that they do not drift.

- functions and methods are at most 60 lines, not counting their docstring;
- module docstrings are at most 20 lines (user guides live in docs/);
- no module edits ``sys.path`` (packages import as installed, tools and tests as packages);
- readers (``packer.datasets``) import no writer (``packer.converters``);
- format names are compared only in the formats' own modules and the registry;
- imports point down the layers: the foundation (errors, sizes, progress, checks), files, images,
  the dataset description, storage, layouts, then writers and readers, then the operations. The
  one exception is the format registry, the one place that lists each format's writer, reader and
  layout: it imports them inside its functions, when a format is asked for.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREES = ("packer", "converters", "datasets", "tests", "tools")
MAX_FUNCTION_LINES = 60
MAX_MODULE_DOCSTRING_LINES = 20
FORMAT_NAMES = {"lmdb", "hdf5", "tar", "tfrecord"}
#: Where a format's name may be compared: its layout, writer and reader, and the registry.
#: The layers, bottom up (a module's layer is its longest matching prefix).
LAYERS = {"packer": 0, "packer.errors": 0, "packer.sizes": 0, "packer.progress": 0, "packer.checks": 0,
          "packer.files": 1, "packer.images": 2, "packer.fields": 2, "packer.description": 3, "packer.storage": 4, "packer.layouts": 5,
          "packer.converters": 6, "packer.datasets": 6, "packer.ops": 7, "packer.__main__": 7}
FORMAT_HOMES = ("packer/layouts/", "converters/", "datasets/lmdb.py", "datasets/hdf5.py", "datasets/tar.py",
                "datasets/tfrecord.py", "packer/description/registry.py")


def _modules(trees: tuple[str, ...] = TREES) -> Iterator[tuple[str, ast.Module]]:
    for tree in trees:
        for folder, dirs, files in os.walk(os.path.join(ROOT, tree)):
            dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "data"))
            for name in sorted(files):
                path = os.path.join(folder, name)
                if name.endswith(".py"):
                    with open(path, encoding="utf-8") as f:
                        yield os.path.relpath(path, ROOT), ast.parse(f.read(), path)


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:] or body
    return body[-1].end_lineno - body[0].lineno + 1


def test_functions_are_at_most_60_lines():
    long = [f"{path}:{node.lineno} {node.name} ({_body_lines(node)} lines)"
            for path, module in _modules() for node in ast.walk(module)
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
        for node in ast.walk(module):
            target = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = node.func.value
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                target = target.value if isinstance(target, ast.Subscript) else target
            if target is not None and _is_sys_path(target):
                edits.append(f"{path}:{node.lineno}")
    assert not edits, "import as a package instead of editing sys.path:\n" + "\n".join(edits)


def _imports(module: ast.Module, package: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            yield node.lineno, base


def test_readers_import_no_writer():
    found = [f"{path}:{line} imports {name}" for path, module in _modules(("datasets",))
             for line, name in _imports(module, "packer.datasets")
             if name == "packer.converters" or name.startswith("packer.converters.")]
    assert not found, "readers must not import writers:\n" + "\n".join(found)


def _layer(module: str) -> int:
    return LAYERS[max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len)]


def _package(path: str) -> str:
    top, *rest = path.split("/")
    base = {"packer": "packer", "converters": "packer.converters", "datasets": "packer.datasets"}[top]
    return ".".join([base, *rest[:-1]])


def test_imports_point_down_the_layers():
    up = []
    for path, module in _modules(("packer", "converters", "datasets")):
        name = _package(path) + ("" if path.endswith("__init__.py") else "." + os.path.basename(path)[:-3])
        lazy = {id(n) for f in ast.walk(module) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                or (isinstance(f, ast.If) and ast.unparse(f.test) == "TYPE_CHECKING") for n in ast.walk(f)}
        for node in ast.walk(module):
            if path == "packer/description/registry.py" and id(node) in lazy:
                continue  # the registry resolves each format's parts when asked for
            if isinstance(node, ast.ImportFrom) and node.level == 0 and not (node.module or "").startswith("packer"):
                continue
            if isinstance(node, ast.ImportFrom):
                for line, target in _imports(ast.Module(body=[node], type_ignores=[]), _package(path)):
                    if target.startswith("packer") and _layer(target) > _layer(name):
                        up.append(f"{path}:{line} {name} imports {target}")
    assert not up, "an import points up the layers:\n" + "\n".join(up)


def _compares_format_name(node: ast.AST) -> bool:
    if not isinstance(node, ast.Compare):
        return False
    values = [node.left, *node.comparators]
    for value in values:
        if isinstance(value, ast.Constant) and value.value in FORMAT_NAMES:
            return True
        if isinstance(value, (ast.Tuple, ast.List, ast.Set)) and any(
                isinstance(e, ast.Constant) and e.value in FORMAT_NAMES for e in value.elts):
            return True
    return False


def test_format_names_are_compared_only_in_the_formats_own_modules():
    found = [f"{path}:{node.lineno}" for path, module in _modules(("packer", "converters", "datasets"))
             if not path.startswith(FORMAT_HOMES) for node in ast.walk(module) if _compares_format_name(node)]
    assert not found, "ask the format's registry record instead of comparing its name:\n" + "\n".join(found)


#: The built-in field kinds' names, from their table, and where they may be compared: the kinds'
#: own modules and the table (packer/fields/). Elsewhere, ask the kind object.
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


def _compares_field_kind(node: ast.AST) -> bool:
    """A comparison with ``"mask"`` or ``"boxes"`` (a kind that names its field, so a field-name
    test is a kind test), or of a field's kind with any kind's name (``"image"`` is also the
    sample's own image, so it counts only against a kind)."""
    if not isinstance(node, ast.Compare):
        return False
    values = [node.left, *node.comparators]
    consts = [e.value for v in values for e in ([v] if isinstance(v, ast.Constant) else getattr(v, "elts", []))
              if isinstance(e, ast.Constant)]
    if any(c in FIELD_KIND_NAMES - {"image"} for c in consts):
        return True
    return any(c in FIELD_KIND_NAMES for c in consts) and any(_is_kind_expr(v) for v in values)


def test_field_kind_names_are_compared_only_in_their_modules_and_the_table():
    from packer.fields import FIELD_KINDS

    assert set(FIELD_KINDS) == FIELD_KIND_NAMES  # the names this test looks for are the table's
    found = [f"{path}:{node.lineno}" for path, module in _modules(("packer", "converters", "datasets"))
             if not path.startswith(FIELD_HOMES) for node in ast.walk(module) if _compares_field_kind(node)]
    assert not found, "ask the field kind (packer.fields) instead of comparing its name:\n" + "\n".join(found)


@pytest.mark.parametrize("source, lines", [
    ("def f():\n    '''doc\n    more'''\n    a = 1\n    return a\n", 2),
    ("def f():\n    return 1\n", 1),
])
def test_the_line_count_leaves_out_the_docstring(source, lines):
    node = ast.parse(source).body[0]
    assert _body_lines(node) == lines
