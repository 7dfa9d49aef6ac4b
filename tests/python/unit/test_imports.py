"""The import graph of idem_shim: no cycle, lazy imports inside functions included (a
function-level import is how a cycle usually hides), and the request path alone: what
``import idem_shim`` reaches never reaches the CLI, the schema tool, click or yoyo. No database
needed: the modules are read with ``ast``, not imported (one test imports the package in a
fresh interpreter to confirm what it loads)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import idem_shim

PACKAGE = Path(idem_shim.__file__).resolve().parent
#: What only a command line needs: the CLI, the schema tool, and the libraries they bring.
CLI_ONLY = ("idem_shim.cli", "idem_shim.schema")
CLI_LIBRARIES = ("click", "yoyo")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: Path) -> str:
    """The package a module's relative imports start from."""
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def imports_of(path: Path, modules: set[str], *, external: bool = False) -> set[str]:
    """The idem_shim modules ``path`` imports, wherever in the file the import statement is
    (with ``external``: the top-level names of the other packages it imports)."""
    found: set[str] = set()
    others: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
            others.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: `from . import http`, `from .store import Store`, `from .. import x`
                package = _package_of(path).split(".")
                anchor = ".".join(package[: len(package) - (node.level - 1)])
                base = f"{anchor}.{node.module}" if node.module else anchor
            else:
                base = node.module or ""
                others.add(base.split(".")[0])
            if base in modules and (node.module or not node.level):
                found.add(base)  # `from . import x` does not import the package's own __init__ names
            # `from . import http` names a module, `from .store import Store` a name in one
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules)
    if external:
        return others - {"idem_shim", "__future__", ""}
    return found - {module_name(path)}


def _paths() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(path) for path in _paths()}
    return {module_name(path): imports_of(path, modules) for path in _paths()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


def request_path() -> set[str]:
    """Every module ``import idem_shim`` can reach, function-level imports included."""
    return reachable(import_graph(), "idem_shim")


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
    assert "idem_shim.records" in graph["idem_shim.decorator"]  # `from .records import ...`
    assert "idem_shim.queries" in graph["idem_shim.store"]  # `from . import prepared, queries`
    assert "idem_shim.decorator" in graph["idem_shim"]


def test_the_search_finds_a_cycle_when_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_idem_shim_has_no_import_cycle() -> None:
    assert find_cycle(import_graph()) is None


def test_only_the_package_module_imports_the_package() -> None:
    graph = import_graph()
    assert [name for name, targets in graph.items() if "idem_shim" in targets] == []


def test_the_request_path_never_reaches_the_cli_or_the_schema_tool() -> None:
    path = request_path()
    assert {"idem_shim.decorator", "idem_shim.extension", "idem_shim.store"} <= path  # the search works
    reached = sorted(m for m in path if m.startswith(CLI_ONLY))
    assert reached == [], f"import idem_shim reaches {reached}: import them inside the CLI's verbs"


def test_no_request_path_module_imports_click_or_yoyo() -> None:
    by_name = {module_name(p): p for p in _paths()}
    offenders = {
        name: sorted(imports_of(by_name[name], set(), external=True) & set(CLI_LIBRARIES))
        for name in sorted(request_path())
    }
    assert {name: libs for name, libs in offenders.items() if libs} == {}
    assert "click" in imports_of(by_name["idem_shim.cli"], set(), external=True)  # the scan sees imports


def test_the_cli_imports_the_schema_tool_only_inside_its_verbs() -> None:
    """At module level cli.py does not reach schema/: `idem --help` and the
    operations never load the schema tool; its verbs do."""
    tree = ast.parse((PACKAGE / "cli.py").read_text(encoding="utf-8"))
    top_level = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    named = {alias.name for n in top_level for alias in n.names} | {
        n.module or "" for n in top_level if isinstance(n, ast.ImportFrom)
    }
    assert not {"migrate", "schema"} & {name.split(".")[-1] for name in named}, named


def test_importing_idem_shim_loads_neither_the_cli_nor_the_schema_tool() -> None:
    """The same, observed: a fresh interpreter imports the package and lists what it loaded."""
    probe = "import sys, idem_shim; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout.split()
    assert "idem_shim.decorator" in loaded
    assert [m for m in loaded if m.startswith(CLI_ONLY) or m.split(".")[0] == "yoyo"] == []


#: The driver's side: the store, its connections, its error boundary, libpq below psycopg.
DRIVER = {
    "idem_shim.store",
    "idem_shim.pool",
    "idem_shim.sqlstates",
    "idem_shim.admission",
    "idem_shim.startup",
    "idem_shim.prepared",
}


def test_the_request_path_reads_records_not_the_driver() -> None:
    """The HTTP answers, the spans and the decorator take claims and outcomes from records.py
    and outcome.py, never from the modules that talk to the database."""
    graph = import_graph()
    for name in ("idem_shim.http", "idem_shim.tracing", "idem_shim.decorator"):
        assert graph[name] & DRIVER == set(), name
    assert graph["idem_shim.records"] == {"idem_shim.outcome"}, "records are plain data"
    assert "idem_shim.records" in graph["idem_shim.http"]


def test_the_store_is_split_by_concern_and_layered() -> None:
    """store.py composes the pool, the admission bound, the start-up checks and the one error
    mapping; none of those reaches back up to it, nor to the request path."""
    graph = import_graph()
    assert {"idem_shim.pool", "idem_shim.admission", "idem_shim.startup", "idem_shim.sqlstates"} <= graph[
        "idem_shim.store"
    ]
    below = ("idem_shim.pool", "idem_shim.admission", "idem_shim.startup", "idem_shim.sqlstates", "idem_shim.records")
    upper = {"idem_shim.store", "idem_shim.scope", "idem_shim.decorator", "idem_shim.jobs", "idem_shim.claimed"}
    for name in below:
        assert reachable(graph, name) & upper == set(), name


def test_jobs_and_the_decorator_share_one_engine() -> None:
    """idempotent() reaches the database through the same Store and claim helpers as a route."""
    graph = import_graph()
    assert {"idem_shim.store", "idem_shim.claimed", "idem_shim.policy"} <= graph["idem_shim.jobs"]
    assert {"idem_shim.claimed", "idem_shim.policy"} <= graph["idem_shim.decorator"]


def test_no_module_imports_another_modules_private_names() -> None:
    offenders = []
    for path in _paths():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                offenders += [f"{module_name(path)}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert offenders == []
