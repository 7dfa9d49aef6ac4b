"""bench/levers/orm_cost.py (`make bench-orm`) still runs: one round of a few requests per app.

Times are not checked (the benchmark asserts no timing); only that the three apps answered 201
(the script stops otherwise) and printed their rows, and that the joined route costs round trips
beyond the plain one's (its SAVEPOINT at least).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.levers import orm_cost


def test_the_orm_cell_prints_its_three_rows(
    fresh_admin_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The script sets PROMETHEUS_MULTIPROC_DIR (as under gunicorn) in its own process: here, the
    # test's, where it must not outlive the test (docs/adopting.md's scrape read its counters).
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    orm_cost.main([fresh_admin_url, "1", "5"])
    out = capsys.readouterr().out
    rows = {
        cell: next(line for line in out.splitlines() if line.startswith(f"| {orm_cost.LABELS[cell]} |"))
        for cell in orm_cost.CELLS
    }
    trips = {cell: float(re.findall(r"\| ([0-9.]+) \(", row)[-1]) for cell, row in rows.items()}
    assert trips["joined"] > trips["plain"], out
