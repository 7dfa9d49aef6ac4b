"""The lists of modules the documents keep name every module there is, and none that is gone:
docs/design.md's tables of the shim's modules and of the schema tool's, and the docstring of
tests/python/support/. A module added without its line fails here, naming it."""

from __future__ import annotations

import re
from pathlib import Path

import tests.python.support as support

ROOT = Path(__file__).resolve().parents[3]
SHIM = ROOT / "python" / "idem_shim"
DESIGN = ROOT / "docs" / "design.md"


def section(text: str, heading: str) -> str:
    """The body of the `## heading` section, up to the next `## `."""
    lines = text.splitlines()
    start = lines.index(f"## {heading}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start:end])


def table_files(body: str) -> set[str]:
    """The `*.py` names in the first column of the section's table."""
    names: set[str] = set()
    for line in body.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            names |= set(re.findall(r"`([\w.]+\.py)`", line.split(" | ")[0]))
    return names


def modules(directory: Path) -> set[str]:
    return {p.name for p in directory.glob("*.py")}


def test_design_md_lists_every_module_of_the_shim() -> None:
    listed = table_files(section(DESIGN.read_text(), "The shim's layers (`idem_shim/`)"))
    assert listed, "docs/design.md's shim table names no module"
    missing = sorted(modules(SHIM) - listed)
    assert not missing, f"docs/design.md's shim table lacks these modules: {missing}"
    gone = sorted(listed - modules(SHIM))
    assert not gone, f"docs/design.md's shim table names modules that are gone: {gone}"


def test_design_md_lists_every_module_of_the_schema_tool() -> None:
    listed = table_files(section(DESIGN.read_text(), "The schema tool (`idem_shim/schema/`)"))
    assert listed, "docs/design.md's schema table names no module"
    schema = modules(SHIM / "schema")
    missing = sorted(schema - listed)
    assert not missing, f"docs/design.md's schema table lacks these modules: {missing}"
    gone = sorted(listed - schema)
    assert not gone, f"docs/design.md's schema table names modules that are gone: {gone}"


def test_the_support_docstring_lists_every_helper_module() -> None:
    listed = set(re.findall(r"``tests\.python\.support\.(\w+)``", support.__doc__ or ""))
    helpers = {p.stem for p in Path(support.__file__).parent.glob("*.py")} - {"__init__"}
    missing = sorted(helpers - listed)
    assert not missing, f"tests/python/support/__init__.py's docstring lacks these helpers: {missing}"
    gone = sorted(listed - helpers)
    assert not gone, f"tests/python/support/__init__.py's docstring names helpers that are gone: {gone}"
