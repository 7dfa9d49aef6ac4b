"""A store the install of before the plan (schema/plan.py) made keeps upgrading: the tool of
commit ``BEFORE_PLAN`` (its ``idem migrate``, its ``idem sql`` through psql), run from its own
tree, installs a database; this package's ``idem migrate`` then sees every migration applied in
yoyo's tables and leaves the schema of a fresh install, and its ``idem sql`` changes nothing."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import testdb
from tests.python.support import earlier
from tests.python.support.schema import schema
from tests.python.support.sqlapi import connect

#: main before the install plan: migrate through yoyo with its own steps, idem sql rendered apart.
BEFORE_PLAN = "0c1b1dcea4cfd0082be7189afac1352fffa55e59"


@pytest.fixture(scope="module")
def old_tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """That commit's python/ and sql/, extracted: its CLI runs from there."""
    if not earlier.has_history(BEFORE_PLAN):
        pytest.skip("no git history of the install before the plan (an exported tree)")
    dest = tmp_path_factory.mktemp("before_plan")
    archive = subprocess.run(
        ["git", "-C", str(earlier.ROOT), "archive", "--format=tar.gz", BEFORE_PLAN, "python", "sql"],
        check=True,
        capture_output=True,
    ).stdout
    for name, data in earlier.files_of(archive).items():
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    assert not (dest / "python" / "idem_shim" / "schema" / "plan.py").exists()
    return dest / "python"


def run_old(tool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    code = (
        f"import sys; sys.path.insert(0, {str(tool)!r}); from idem_shim.cli import main; sys.argv[0] = 'idem'; main()"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


def idem(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([testdb.idem_command(), *args], capture_output=True, text=True, timeout=300)


def psql_apply(url: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", url],
        input=script,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def databases(admin_url: str) -> Iterator[tuple[str, str]]:
    names = [f"idem_pu_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    urls = [testdb.create(admin_url, name) for name in names]
    yield urls[0], urls[1]
    for name in names:
        testdb.drop(admin_url, name)


def applied(url: str) -> list[tuple[str, str]]:
    with connect(url) as conn:
        rows = conn.execute("SELECT migration_hash, migration_id FROM public._yoyo_migration ORDER BY 2").fetchall()
    return [(r["migration_hash"], r["migration_id"]) for r in rows]


@pytest.mark.parametrize("how", ["migrate", "sql"])
def test_a_store_installed_before_the_plan_upgrades_with_it(
    old_tool: Path, databases: tuple[str, str], how: str
) -> None:
    old, fresh = databases
    if how == "migrate":
        done = run_old(old_tool, "migrate", "--database-url", old, "-q")
    else:
        printed = run_old(old_tool, "sql")
        assert printed.returncode == 0, printed.stderr
        done = psql_apply(old, printed.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = applied(old)

    later = idem("migrate", "--database-url", old)
    assert later.returncode == 0, later.stdout + later.stderr
    assert "0 migration(s) applied" in later.stdout, later.stdout
    assert idem("migrate", "--database-url", fresh, "-q").returncode == 0
    assert applied(old) == recorded == applied(fresh)
    assert schema(old) == schema(fresh)

    script = idem("sql")
    assert script.returncode == 0, script.stderr
    again = psql_apply(old, script.stdout)
    assert again.returncode == 0, again.stderr
    assert "applied migration" not in again.stderr
    assert schema(old) == schema(fresh) and applied(old) == recorded
    status = idem("status", "--database-url", old)
    assert status.returncode == 0 and "0 pending" in status.stdout, status.stdout
