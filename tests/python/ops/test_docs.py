"""
The DBA's documents run as written: every command block of docs/operations.md (its psql
cookbook on a database of its own, then the rest of the runbook) and docs/adopting.md run in
order on a fresh database, and what they print must be what the
document shows (tests/python/support/docrunner.py says how blocks are read and what is normalised).

A drifting document fails here. To refresh the outputs after a deliberate change, write what
the blocks print into the documents and review the diff:

    eval "$(make -s env)"; export PYTHONPATH=python:.
    IDEM_DOCS_UPDATE=1 .venv/bin/python -m pytest -q tests/python/ops/test_docs.py
    git diff docs/   # keep `…` wildcards where a value differs per run
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import testdb
from tests.python.support import docrunner

ROOT = Path(__file__).resolve().parents[3]

COOKBOOK = "psql cookbook for DBAs"
#: document -> (file, the one `## ` section to run, or None for all, and a section left out).
DOCS = {
    "docs/operations.md#psql-cookbook-for-dbas": (ROOT / "docs" / "operations.md", COOKBOOK, None),
    "docs/operations.md": (ROOT / "docs" / "operations.md", None, COOKBOOK),
    "docs/adopting.md": (ROOT / "docs" / "adopting.md", None, None),
}
#: Databases the documents create and drop themselves (docs/operations.md §4, docs/adopting.md).
SCRATCH_DATABASES = ["idem_ops_demo", "idem_demo_shop", "idem_demo_byhand"]


def _without(text: str, heading: str) -> str:
    """The text with one `## heading` section blanked (line numbers kept for the report)."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line[3:].strip() == heading
        out.append("" if inside else line)
    return "\n".join(out)


def _run(path: Path, heading: str | None, skip: str | None, url: str) -> tuple[list[docrunner.Result], int]:
    text = path.read_text()
    if skip is not None:
        text = _without(text, skip)
    if heading is not None:
        body = docrunner.section(text, heading)
        offset = text.splitlines().index(f"## {heading}") + 1
    else:
        body, offset = text, 0
    blocks = docrunner.parse(body)
    for b in blocks:
        b.line_no += offset
    runner = docrunner.Runner(docrunner.base_env(url))
    results = [r for r in (runner.run(b) for b in blocks) if r is not None]
    return results, sum(1 for b in blocks if b.skipped)


# The documents create and drop the same scratch databases and roles by name: under pytest-xdist
# they run one after another on one worker.
@pytest.mark.xdist_group("docs' scratch databases")
@pytest.mark.parametrize("doc", list(DOCS))
def test_document_runs_as_written(doc: str, fresh_admin_url: str, admin_url: str) -> None:
    path, heading, skip = DOCS[doc]
    for name in SCRATCH_DATABASES:  # a run that failed half-way may have left one
        testdb.drop(admin_url, name)
    try:
        results, _skipped = _run(path, heading, skip, fresh_admin_url)
    finally:
        for name in SCRATCH_DATABASES:
            testdb.drop(admin_url, name)
    assert results, f"{doc}: no runnable block found"
    failed = [r for r in results if not r.ok]
    if failed and os.environ.get("IDEM_DOCS_UPDATE") == "1":
        docrunner.rewrite(path, failed)
    assert not failed, docrunner.report(str(path.relative_to(ROOT)), results)


def test_a_wrong_output_fails() -> None:
    """The comparison can fail: a changed value, a missing row, an extra line."""
    shown = [" outcome ", "---------", " claimed", "(1 row)"]
    assert docrunner.matches(shown, [" outcome", "-------", " claimed ", "(1 row)"])
    assert not docrunner.matches(shown, [" outcome", "-------", " replay", "(1 row)"])
    assert not docrunner.matches(shown, [" outcome", "-------", "(0 rows)"])
    assert not docrunner.matches(shown[:2], [" outcome", "-------", " claimed"])
    # the normaliser lets through only what legitimately changes
    assert docrunner.matches(
        [" 2026-11-30 03:48:49.012188+00 | 00:02:05.45 | 17.403 ms"], [" 2027-01-02 11:00:00.5+00 | 01:00:00 | 3 ms"]
    )
    assert docrunner.matches(["a", "...", "z"], ["a", "b", "c", "z"])
    assert not docrunner.matches(["a", "...", "z"], ["a", "b", "c"])
    assert docrunner.matches(["kid … count"], ["kid da22d334 count"])


def test_skipped_blocks_say_why() -> None:
    """A block the test does not run carries its reason where a reader sees it."""
    blocks = docrunner.parse(
        "Some text.\n\nNot run by the docs test: it stops the cluster.\n\n"
        "```console\n$ make db-down\n```\n\n```console\n$ true\n```\n"
    )
    assert blocks[0].skipped and "stops the cluster" in blocks[0].skipped
    assert blocks[1].skipped is None


def test_a_here_document_is_the_commands_input() -> None:
    """`$ cmd <<'EOF'`: the lines up to EOF are typed, the output comes after them."""
    block = docrunner.parse("```console\n$ cat <<'EOF'\nhello\nEOF\nhello\n$ echo done\ndone\n```\n")[0]
    result = docrunner.Runner(docrunner.base_env("postgresql://unused/none")).run(block)
    assert result is not None and result.ok, result
    assert result.actual == ["$ cat <<'EOF'", "hello", "EOF", "hello", "$ echo done", "done"]


def test_the_error_table_names_every_sqlstate_the_functions_raise() -> None:
    """One error table (sql/README.md#errors): every ERRCODE a function raises, and the two a DBA
    meets from PostgreSQL itself (23503 unknown user, 42883 a misspelt argument), are in it; the
    runbook links to it instead of keeping a copy."""
    readme = (ROOT / "sql" / "README.md").read_text()
    table = readme[readme.index("## Errors") : readme.index("## Data model")]
    first_cells = [row.split("|")[1] for row in table.splitlines() if row.startswith("| ")]
    listed = {code for cell in first_cells for code in re.findall(r"`(\w{5})`", cell)}
    raised = set()
    for path in (ROOT / "sql" / "functions").glob("*.sql"):
        raised |= set(re.findall(r"ERRCODE = '(\w{5})'", path.read_text()))
    assert raised, "no ERRCODE found: the scan is broken"
    missing = (raised | {"23503", "42883", "2D000"}) - listed
    assert not missing, f"sql/README.md#errors lacks {sorted(missing)}"
    ops = (ROOT / "docs" / "operations.md").read_text()
    assert "sql/README.md#errors" in ops and "| SQLSTATE |" not in ops, "the runbook must link, not copy"
