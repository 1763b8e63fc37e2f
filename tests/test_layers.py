"""The package's shape, read from its source: subpackages import only the ones before them, no
module imports another inside a function, no import cycle, no class over 300 lines or function
over 60, and no two classes with one name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "zcoll"
# Bottom to top: a module may import its own subpackage and those before it.
LAYERS = ["core", "compression", "observe", "tune", "torch", "tools"]
MAX_CLASS_LINES, MAX_FUNCTION_LINES = 300, 60


def modules() -> dict:
    """Dotted name ("zcoll.core.communicator") -> parsed module."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = (path, ast.parse(path.read_text(), str(path)))
    return out


MODULES = modules()


def layer(name: str) -> int:
    """The layer of zcoll.<sub>...; the package root sits above every layer; _C below."""
    parts = name.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return len(LAYERS)
    if parts[1] == "_C":
        return -1
    return LAYERS.index(parts[1])


def resolve(importer: str, node: ast.AST) -> list:
    """The zcoll modules an import statement names (a `from X import y` counts y when it is a module)."""
    package = importer if (PACKAGE / Path(*importer.split(".")[1:]) / "__init__.py").exists() else importer.rsplit(".", 1)[0]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "zcoll"]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    if base.split(".")[0] != "zcoll":
        return []
    names = [f"{base}.{a.name}" for a in node.names]
    return [n for n in names if n in MODULES or n.endswith("._C")] or [base]


def imports(name: str, inner: bool) -> list:
    """(line, imported module) for each import of a zcoll module, at module level or (inner) in a function."""
    _, tree = MODULES[name]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function == inner:
                found.extend((child.lineno, m) for m in resolve(name, child))
            visit(child, nested)

    visit(tree, False)
    return found


def test_every_subpackage_is_a_known_layer():
    subpackages = {n.split(".")[1] for n in MODULES if n.count(".") >= 1 and (PACKAGE / n.split(".")[1]).is_dir()}
    assert subpackages == set(LAYERS)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name):
    up = [(line, m) for line, m in imports(name, inner=False) if layer(m) > layer(name)]
    assert not up, f"{name} imports a layer above its own ({LAYERS}): {up}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_zcoll_import_inside_a_function(name):
    assert not imports(name, inner=True), f"{name}: imports inside functions {imports(name, inner=True)}"


def test_no_import_cycle():
    graph = {n: {m for _, m in imports(n, inner=False) if m in MODULES and m != n} for n in MODULES}
    state: dict = {}

    def walk(n, path):
        if state.get(n) == "done":
            return
        assert state.get(n) != "open", f"import cycle: {' -> '.join(path + [n])}"
        state[n] = "open"
        for m in sorted(graph[n]):
            walk(m, path + [n])
        state[n] = "done"

    for n in sorted(graph):
        walk(n, [])


def definitions():
    for name, (path, tree) in MODULES.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                yield name, node, node.end_lineno - node.lineno + 1


def test_classes_and_functions_stay_small():
    big = [
        f"{name}.{node.name}: {lines} lines"
        for name, node, lines in definitions()
        if lines > (MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES)
    ]
    assert not big, "\n".join(big)


def test_class_names_are_unique():
    where: dict = {}
    for name, node, _ in definitions():
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            where.setdefault(node.name, []).append(name)
    repeated = {k: v for k, v in where.items() if len(v) > 1}
    assert not repeated, repeated
