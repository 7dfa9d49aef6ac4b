"""
The DBA's documents run as written: every command block of docs/operations.md (its psql
cookbook on a database of its own, then the rest of the runbook) and docs/adopting.md run in
order on a fresh database, and what they print must be what the
document shows (tests/python/support/docrunner.py says how blocks are read and what is normalised).
`make demo`'s script runs once on a fresh database: docs/demo.md's transcript is what it prints.

A drifting document fails here. To refresh the outputs after a deliberate change, write what
the blocks print into the documents and review the diff:

    eval "$(make -s env)"; export PYTHONPATH=python:.
    IDEM_DOCS_UPDATE=1 .venv/bin/python -m pytest -q tests/python/ops/test_docs.py
    git diff docs/   # keep `…` wildcards where a value differs per run
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
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


# The documents create and drop the same scratch databases and roles by name: no two of them run at
# once (the group's lock, tests/python/conftest.py).
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


# --- the demo's transcripts -------------------------------------------------------------------

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: PostgreSQL's JSON timestamps drop the fraction's trailing zeros, or all of it
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d(:\d\d)?)?")


def demo_line(line: str) -> str:
    """A line of the demo with what differs per run made generic: URLs, ids and keys, numbers (ports,
    pids, amounts, times); a run of replay rows (`2-3 idempotency_replay x2`) is one row."""
    line = re.sub(r"postgresql://\S+", "<url>", line)
    line = _TIMESTAMP.sub("<ts>", line)
    line = _UUID.sub("<uuid>", line)
    line = re.sub(r"\b(?=[0-9a-f]*\d)[0-9a-f]{6,}", "<hex>", line)
    line = re.sub(r"\d+(\.\d+)?", "<n>", line)
    line = re.sub(r"<n>-<n>", "<n>", line).replace(" x<n> ", " ")
    return re.sub(r"\s+", " ", line).strip()


def demo_lines(lines: list[str]) -> list[str]:
    """The transcript's lines to compare: not the blank ones, nor the tally of step 3's race (how
    many of the ten got the replay and how many 409 differs per run; the client checks the fill)."""
    generic = [demo_line(line) for line in lines if line.strip()]
    return [line for line in generic if not re.match(r"<- <n> x ", line)]


def test_the_demo_prints_docs_demo_md_transcript(fresh_admin_url: str) -> None:
    env = {**os.environ, "EXTERNAL_DB": fresh_admin_url, "DATABASE_URL": fresh_admin_url, "PY": sys.executable}
    run = subprocess.run(
        ["bash", "examples/raptor/demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    printed = demo_lines(run.stdout.splitlines())

    doc = next(
        b.lines
        for b in docrunner.parse((ROOT / "docs" / "demo.md").read_text())
        if any(line.startswith("== 1.") for line in b.lines)
    )
    shown = demo_lines(doc)
    diff = "\n".join(difflib.unified_diff(shown, printed, "docs/demo.md", "make demo", lineterm="", n=1))
    assert shown == printed, f"docs/demo.md's transcript is not what the demo prints:\n{diff}"


def test_the_demo_comparison_can_fail() -> None:
    """What differs per run is let through, and nothing else: another key matches, another step
    or another message does not."""
    assert demo_lines(['   -> POST /x  Idempotency-Key: 7d340175…  {"qty":10}']) == demo_lines(
        ['   -> POST /x  Idempotency-Key: 0a1b2c3d…  {"qty":5}']
    )
    assert demo_lines(["     5-12  idempotency_replay x8  {}"]) == demo_lines(["       13  idempotency_replay     {}"])
    assert demo_lines(["   <-  8 x 201 replayed"]) == []
    assert demo_lines(['{"locked_at":"2026-11-30T03:40:48.870261+00:00"}']) == demo_lines(
        ['{"locked_at":"2026-12-01T20:39:14+00:00"}']
    )
    assert demo_lines(["== 7. The audit trail"]) != demo_lines(["== 7. idempotency_keys rows"])
    assert demo_lines(["   ok: refused; nothing executed"]) != demo_lines(["   ok: replayed"])
