"""The import graph of idem_shim has no cycle, lazy imports inside functions included (a
function-level import is how a cycle usually hides). No database needed: the modules are read
with ``ast``, not imported."""

from __future__ import annotations

import ast
from pathlib import Path

import idem_shim

PACKAGE = Path(idem_shim.__file__).resolve().parent


def module_name(path: Path) -> str:
    return "idem_shim" if path.name == "__init__.py" else f"idem_shim.{path.stem}"


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The idem_shim modules ``path`` imports, wherever in the file the import statement is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: `from . import http`, `from .db import Store`
                base = f"idem_shim.{node.module}" if node.module else "idem_shim"
            else:
                base = node.module or ""
            if base in modules and (node.module or not node.level):
                found.add(base)  # `from . import x` does not import the package's own __init__ names
            # `from . import http` names a module, `from .db import Store` a name in one
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules)
    return found - {module_name(path)}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.glob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): imports_of(path, modules) for path in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path of module names, or None (depth-first search, three colours)."""
    done: set[str] = set()
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in stack:
            return [*stack[stack.index(node) :], node]
        if node in done:
            return None
        stack.append(node)
        for target in sorted(graph[node]):
            cycle = visit(target)
            if cycle is not None:
                return cycle
        stack.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        cycle = visit(node)
        if cycle is not None:
            return cycle
    return None


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "idem_shim.db" in graph["idem_shim.decorator"]  # `from .db import ...`
    assert "idem_shim.queries" in graph["idem_shim.db"]  # `from . import queries`
    assert "idem_shim.decorator" in graph["idem_shim"]


def test_the_search_finds_a_cycle_when_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_idem_shim_has_no_import_cycle() -> None:
    assert find_cycle(import_graph()) is None


def test_only_the_package_module_imports_the_package() -> None:
    graph = import_graph()
    assert [name for name, targets in graph.items() if "idem_shim" in targets] == []
