"""
pg_cron wherever it lives: the project cluster's cron.database_name is DATABASE_URL's
database; the stores here are other databases of the same server. `idem migrate` connects to
pg_cron's database with the same credentials and schedules 'idem-cleanup:<store>' there with
cron.schedule_in_database, to run in the store; one job per store, never overwriting another
store's; migrating again changes nothing; a job under the old name 'idempotency-cleanup' for the
same store goes. A role that may not schedule gets the exact statement, which works when run as
printed; once the job exists, the hint stops.
"""

from __future__ import annotations

import difflib
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

import testdb
from tests.python.support import docrunner
from tests.python.support.owned import declared_command, owned_database
from tests.python.support.sqlapi import connect

ROOT = Path(__file__).resolve().parents[3]

SCHEDULE = "0 4 * * *"
#: The command of an idem before the job checked its database's identity (issue 39).
OLD_COMMAND = "CALL public.idem_cleanup()"


def quoted(text: str) -> str:
    """``text`` as a SQL literal, as the printed statement has it."""
    return "'" + text.replace("'", "''") + "'"


def idem_migrate(url: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [testdb.idem_command(), "migrate", "--database-url", url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


# pg_cron's one job table: with test_cron.py, whose "nothing changes" checks a job row a
# concurrent reschedule here would renew, never at once (the group's lock, tests/python/conftest.py)
pytestmark = pytest.mark.xdist_group("the cron database's own job")


def jobs(cron_url: str, store: str) -> list[dict[str, Any]]:
    with connect(cron_url) as conn:
        return [
            dict(r)
            for r in conn.execute(
                "SELECT jobid, jobname, schedule, command, database, username, active, xmin::text AS xmin FROM cron.job"
                " WHERE database = %s ORDER BY jobid",
                (store,),
            ).fetchall()
        ]


@pytest.fixture
def store(admin_url: str, cron_url: str) -> Iterator[str]:
    """An empty database of the same server that is not pg_cron's."""
    name = f"idem_store_{uuid.uuid4().hex[:8]}"
    url = testdb.create(admin_url, name)
    yield url
    testdb.drop(admin_url, name)  # also unschedules its jobs


@pytest.fixture
def second_store(admin_url: str, cron_url: str) -> Iterator[str]:
    name = f"idem_store_{uuid.uuid4().hex[:8]}"
    url = testdb.create(admin_url, name)
    yield url
    testdb.drop(admin_url, name)


def dbname(url: str) -> str:
    return str(conninfo_to_dict(url)["dbname"])


def test_a_store_in_another_database_gets_its_job_in_pg_crons_database_once(cron_url: str, store: str) -> None:
    name = dbname(store)
    out = idem_migrate(store).stdout
    assert f"pg_cron job 'idem-cleanup:{name}'" in out and "cleanup schedule: scheduled" in out
    [job] = jobs(cron_url, name)
    assert (job["jobname"], job["schedule"], job["command"], job["database"], job["active"]) == (
        f"idem-cleanup:{name}",
        SCHEDULE,
        declared_command(store),
        name,
        True,
    )

    again = idem_migrate(store).stdout
    assert "cleanup schedule: unchanged" in again and "pg_cron job" not in again
    assert jobs(cron_url, name) == [job]  # the same row, not rewritten (same xmin)


def test_two_stores_on_one_server_keep_one_job_each(cron_url: str, store: str, second_store: str) -> None:
    for url in (store, second_store, store, second_store):
        idem_migrate(url)
    for url in (store, second_store):
        assert [j["jobname"] for j in jobs(cron_url, dbname(url))] == [f"idem-cleanup:{dbname(url)}"]


def test_a_job_of_the_old_name_for_this_store_is_replaced(cron_url: str, store: str) -> None:
    name = dbname(store)
    with connect(cron_url) as conn:
        conn.execute(
            "SELECT cron.schedule_in_database('idempotency-cleanup', %s, %s, %s)", (SCHEDULE, OLD_COMMAND, name)
        )
    idem_migrate(store)
    assert [j["jobname"] for j in jobs(cron_url, name)] == [f"idem-cleanup:{name}"]


def test_a_job_of_an_older_idems_command_is_replaced(cron_url: str, store: str) -> None:
    """An existing store upgrades: its job's command, which checked no database's identity, is
    the declared one after the next migrate."""
    name = dbname(store)
    with connect(cron_url) as conn:
        conn.execute(
            "SELECT cron.schedule_in_database(%s, %s, %s, %s)", (f"idem-cleanup:{name}", SCHEDULE, OLD_COMMAND, name)
        )
    assert "cleanup schedule: scheduled" in idem_migrate(store).stdout
    [job] = jobs(cron_url, name)
    assert (job["jobname"], job["command"]) == (f"idem-cleanup:{name}", declared_command(store))


def test_a_drifted_job_is_put_back_once(cron_url: str, store: str) -> None:
    name = dbname(store)
    idem_migrate(store)
    with connect(cron_url) as conn:
        conn.execute(
            "SELECT cron.alter_job(job_id => jobid, schedule => '0 5 * * *', active => false)"
            "  FROM cron.job WHERE jobname = %s",
            (f"idem-cleanup:{name}",),
        )
    assert "cleanup schedule: scheduled" in idem_migrate(store).stdout
    [job] = jobs(cron_url, name)
    assert (job["schedule"], job["active"]) == (SCHEDULE, True)


@pytest.fixture
def owner(admin_url: str, cron_url: str) -> Iterator[tuple[str, str]]:
    """A login role that owns a store database: no superuser, no USAGE on schema cron, and
    cron.database_name is hidden from it (pg_cron's setting is superuser-only)."""
    with owned_database(admin_url, prefix="idem_store") as owned:
        role, parts = owned["role"], conninfo_to_dict(admin_url)
        url = f"postgresql://{role}@{parts.get('host', '127.0.0.1')}:{parts.get('port', '5432')}/{owned['db']}"
        try:  # the CLI takes a URL
            yield role, url
        finally:
            with connect(cron_url) as conn:
                conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE username = %s", (role,))
                conn.execute(sql.SQL("REVOKE ALL ON SCHEMA cron FROM {}").format(sql.Identifier(role)))


def test_a_role_that_may_not_schedule_gets_a_statement_that_works_and_then_no_hint(
    cron_url: str, owner: tuple[str, str]
) -> None:
    role, url = owner
    name = dbname(url)
    first = idem_migrate(url)  # succeeds although nothing could be scheduled
    out = first.stdout + first.stderr
    assert "cleanup schedule: not_permitted" in first.stdout
    match = re.search(r"hint: as a superuser, in database (\S+) run: (.+)$", out, re.MULTILINE)
    assert match, out
    assert match.group(1) == dbname(cron_url)
    statement = match.group(2)
    assert (
        f"SELECT cron.schedule_in_database('idem-cleanup:{name}', '0 4 * * *', {quoted(declared_command(url))}, "
        f"'{name}', '{role}');" in statement
    )
    assert jobs(cron_url, name) == []

    ran = subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", statement, cron_url], capture_output=True, text=True
    )  # exactly as printed, as a superuser
    assert ran.returncode == 0, ran.stderr
    [job] = jobs(cron_url, name)
    assert (job["jobname"], job["database"], job["username"]) == (f"idem-cleanup:{name}", name, role)

    second = idem_migrate(url)
    assert "hint" not in second.stdout + second.stderr
    assert "cleanup schedule: unchanged" in second.stdout
    assert jobs(cron_url, name) == [job]
    status = subprocess.run([testdb.idem_command(), "status", "--database-url", url], capture_output=True, text=True)
    assert f"pg_cron: job 'idem-cleanup:{name}'" in status.stdout, status.stdout
    # docs/adopting.md §5 shows this very output for its own store and role (the docs test cannot
    # schedule a job in pg_cron's database): it must be what idem status prints
    shown = adopting_scheduled_status()
    printed = status.stdout.replace(name, "idem_demo_shop").replace(role, "idem_demo_owner").splitlines()
    assert docrunner.matches(shown, printed), "docs/adopting.md §5's idem status differs:\n" + "\n".join(
        difflib.unified_diff(shown, printed, "docs/adopting.md", "idem status", lineterm="")
    )


def adopting_scheduled_status() -> list[str]:
    """What docs/adopting.md §5 shows `idem status` print once the cleanup is scheduled."""
    text = (ROOT / "docs" / "adopting.md").read_text()
    blocks = docrunner.parse(docrunner.section(text, "5. Verify the cleanup schedule"))
    [block] = [b for b in blocks if b.kind == "console" and b.lines[0].startswith("$ idem status")]
    return block.lines[1:]
