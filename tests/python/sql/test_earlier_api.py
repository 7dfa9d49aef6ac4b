"""The one mechanism for "a database at an earlier SQL API" (tests/python/support/earlier.py):
each generated fixture is exactly its commit's sql/ (so a checkout without history builds the
same database as one with it), and each builds a database that says its version."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import testdb
from tests.python.support import earlier
from tests.python.support.sqlapi import connect


@pytest.mark.parametrize("api", sorted(earlier.API_COMMITS))
def test_the_fixture_is_its_commits_sql_tree(api: int) -> None:
    commit = earlier.API_COMMITS[api]
    if not earlier.has_history(commit):
        pytest.skip(f"no git history with {commit[:7]}: the fixture is what this checkout has")
    fixture = earlier.files_of(earlier.fixture(api).read_bytes())
    assert fixture == earlier.files_of(earlier.archive_from_history(api)), (
        f"{earlier.fixture(api).name} differs from sql/ at {commit[:7]}: "
        "python -m tests.python.support.earlier --write-fixtures"
    )


@pytest.mark.parametrize("api", sorted(earlier.API_COMMITS))
def test_a_database_built_at_an_earlier_api_says_its_version(api: int, admin_url: str, tmp_path: Path) -> None:
    name = f"idem_at_api_{api}_{uuid.uuid4().hex[:8]}"
    url = testdb.create(admin_url, name)
    try:
        earlier.build(url, api, tmp_path)
        with connect(url) as conn:
            assert conn.execute("SELECT public.idem_schema_version() AS v").fetchone() == {"v": api}
            forward = [p for p in (tmp_path / "sql" / "migrations").iterdir() if ".rollback." not in p.name]
            applied = conn.execute("SELECT count(*) AS n FROM _yoyo_migration").fetchone()
            assert applied == {"n": len(forward)}, "every migration of that version is applied"
    finally:
        testdb.drop(admin_url, name)
