"""
The cleanup's pg_cron job runs only in the database idem installed (issue 39, F2): pg_cron finds
the job's database by its name, ``cron.job.database``, so the name must not be the check. The
command, idem_cleanup_job()'s, first compares the database it is in with the oid recorded when
the job was scheduled, in pg_catalog alone, and does nothing else where they differ.

Contract §3a's setup (``CREATE DATABASE app OWNER web``, a superuser migrates and pg_cron's job runs
as that superuser), then the owner's two ways to another database of the same name:

- with CREATEDB: ``ALTER DATABASE app RENAME TO app_moved; CREATE DATABASE app;`` and its own
  ``public.idem_cleanup()`` there, no idem and no guard;
- without: the DBA drops and re-creates ``app OWNER web`` (a restore), and the owner defines the
  procedure before anyone migrates.

Each job runs the way pg_cron runs it: its command verbatim, one simple-protocol query, on a
connection to ``cron.job.database`` as ``cron.job.username`` with nothing but the database's
defaults (psql -c, as pg_cron's libpq connection); once really by pg_cron (slow). `idem status`
names the stale job with its fix; re-running `idem migrate` in the re-created store gives the
job the new identity, and the genuine store's job still deletes expired rows.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import testdb
from tests.python.support.owned import idem, migrated_by_the_dba, owned_database, pinned
from tests.python.support.sqlapi import connect
from tests.python.support.waiting import wait_until

#: pg_cron's one job table: with test_cron.py and test_pkg_cron.py, never at once (the group's lock)
pytestmark = pytest.mark.xdist_group("the cron database's own job")

REFUSED = "is not the database idem scheduled this job for"

#: The owner's procedure, which makes the owner superuser when a superuser calls it: every way
#: of calling public.idem_cleanup() finds it (its parameters are the real one's); and, in a
#: schema the database's path puts before pg_catalog, an oid = and a current_database().
TRAP = """
CREATE PROCEDURE public.idem_cleanup(p_batch_size integer DEFAULT 1000, INOUT p_deleted bigint DEFAULT NULL,
                                     p_pause_ms integer DEFAULT 0, p_max_rows_per_second integer DEFAULT 2500)
LANGUAGE plpgsql AS $trap$ BEGIN ALTER ROLE {role} SUPERUSER; END $trap$;
CREATE FUNCTION trap.eq(oid, oid) RETURNS boolean
LANGUAGE plpgsql AS $trap$ BEGIN ALTER ROLE {role} SUPERUSER; RETURN true; END $trap$;
CREATE OPERATOR trap.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = trap.eq);
CREATE FUNCTION trap.current_database() RETURNS name
LANGUAGE plpgsql AS $trap$ BEGIN ALTER ROLE {role} SUPERUSER; RETURN 'postgres'; END $trap$;
"""

SEED = """
INSERT INTO public.idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status,
                                     response_code, response_body, created_at, locked_at, expires_at)
SELECT pg_catalog.gen_random_uuid()::text, NULL, 'POST /x', 'h', 'completed', 201, '{}'::jsonb,
       pg_catalog.now() - s.age, pg_catalog.now() - s.age, pg_catalog.now() - s.age + interval '1 hour'
  FROM (SELECT CASE WHEN i <= %(expired)s THEN interval '2 hours' ELSE interval '1 minute' END AS age
          FROM pg_catalog.generate_series(1, %(total)s) AS i) s
"""


@pytest.fixture
def store(cron_url: str) -> Iterator[dict[str, str]]:
    """Contract §3a's store, migrated by the superuser (its job scheduled); its owner has CREATEDB.
    Every database of the name (and the moved one) is dropped after, with their jobs."""
    if os.environ.get("IDEM_CITUS"):
        pytest.skip("databases are made on every node by scripts/citus.sh: the owner's CREATE DATABASE is not")
    with owned_database(cron_url) as owned:
        with pinned(cron_url) as admin:
            admin.execute(sql.SQL("ALTER ROLE {} CREATEDB").format(sql.Identifier(owned["role"])))
        migrated_by_the_dba(owned)
        owned["moved"] = owned["db"] + "_moved"
        try:
            yield owned
        finally:
            testdb.drop(cron_url, owned["moved"])
            with pinned(cron_url) as admin:
                admin.execute(sql.SQL("ALTER ROLE {} NOSUPERUSER").format(sql.Identifier(owned["role"])))


def the_job(cron_url: str, database: str) -> dict[str, Any]:
    with connect(cron_url) as conn:
        [row] = conn.execute(
            "SELECT jobid, jobname, schedule, command, database, username FROM cron.job WHERE database = %s",
            (database,),
        ).fetchall()
    return dict(row)


def as_owner(owned: dict[str, str], dbname: str) -> psycopg.Connection[Any]:
    """The owner's own session in database ``dbname`` (autocommit)."""
    return psycopg.connect(make_conninfo(testdb.url_for(owned["url"], dbname), user=owned["role"]), autocommit=True)


def run_as_pg_cron(cron_url: str, job: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """The job's command verbatim, as pg_cron sends it: one simple-protocol query on a connection
    to cron.job.database as cron.job.username, with the database's defaults and nothing else."""
    url = make_conninfo(testdb.url_for(cron_url, job["database"]), user=job["username"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", job["command"], url],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def is_superuser(cron_url: str, role: str) -> bool:
    with connect(cron_url) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    return bool(row and row["rolsuper"])


def arm_the_trap(owned: dict[str, str], dbname: str) -> None:
    """In the look-alike database, the owner's public.idem_cleanup(), and every setting of
    ALTER DATABASE ... SET that could bend what the job's command resolves."""
    with as_owner(owned, dbname) as conn:
        conn.execute("CREATE SCHEMA trap")
        conn.execute(sql.SQL(TRAP).format(role=sql.Identifier(owned["role"])))
        # an explicit path may put the owner's schema before pg_catalog; messages silenced
        for name, value in (("search_path", "trap, public, pg_catalog"), ("client_min_messages", "error")):
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(dbname), sql.Identifier(name), sql.Literal(value)
                )
            )


def rename_and_recreate(owned: dict[str, str]) -> None:
    """The owner, with CREATEDB: the store moves aside and a database of its name is the owner's."""
    with as_owner(owned, "postgres") as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                sql.Identifier(owned["db"]), sql.Identifier(owned["moved"])
            )
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(owned["db"])))
    arm_the_trap(owned, owned["db"])


def drop_and_recreate(cron_url: str, owned: dict[str, str], *, trap: bool = True) -> None:
    """The DBA, restoring: the store is dropped and made again for its owner, who has no CREATEDB
    (and, with ``trap``, defines its procedure there first)."""
    with pinned(cron_url) as admin:
        admin.execute(sql.SQL("ALTER ROLE {} NOCREATEDB").format(sql.Identifier(owned["role"])))
    with pinned(testdb.url_for(cron_url, "postgres")) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(owned["db"])))
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(owned["db"]), sql.Identifier(owned["role"]))
        )
    if trap:
        arm_the_trap(owned, owned["db"])


def assert_refused(cron_url: str, owned: dict[str, str], ran: subprocess.CompletedProcess[str]) -> None:
    assert not is_superuser(cron_url, owned["role"]), "the job ran the owner's procedure as the superuser"
    assert ran.returncode != 0 and REFUSED in ran.stderr, ran.stdout + ran.stderr


def test_a_renamed_store_and_the_owners_database_of_its_name(cron_url: str, store: dict[str, str]) -> None:
    job = the_job(cron_url, store["db"])
    assert job["username"] == store["dba"]  # the superuser who migrated
    rename_and_recreate(store)
    assert_refused(cron_url, store, run_as_pg_cron(cron_url, job))


def test_a_store_dropped_and_re_created_for_its_owner(cron_url: str, store: dict[str, str]) -> None:
    job = the_job(cron_url, store["db"])
    drop_and_recreate(cron_url, store)
    assert_refused(cron_url, store, run_as_pg_cron(cron_url, job))


def test_idem_status_names_the_stale_job_and_its_fix(cron_url: str, store: dict[str, str]) -> None:
    job = the_job(cron_url, store["db"])
    drop_and_recreate(cron_url, store, trap=False)
    # from the re-created database (restored, not migrated yet: idem is not installed there)
    done = idem("status", "--database-url", store["url"])
    lines = [line for line in done.stdout.splitlines() if f"(jobid {job['jobid']})" in line and "WARNING" in line]
    assert len(lines) == 1, done.stdout + done.stderr
    assert store["db"] in lines[0] and f"SELECT cron.unschedule({job['jobid']})" in lines[0], lines[0]
    assert "idem migrate" in lines[0], lines[0]


def test_idem_status_names_a_job_whose_store_was_renamed(cron_url: str, store: dict[str, str]) -> None:
    job = the_job(cron_url, store["db"])
    rename_and_recreate(store)
    done = idem("status", "--database-url", testdb.url_for(store["url"], store["moved"]))
    lines = [line for line in done.stdout.splitlines() if f"(jobid {job['jobid']})" in line and "WARNING" in line]
    assert len(lines) == 1, done.stdout + done.stderr
    assert store["moved"] in lines[0], lines[0]  # the database that oid is now


def test_idem_status_names_a_job_without_the_check_and_a_job_of_a_dropped_database(
    cron_url: str, store: dict[str, str]
) -> None:
    genuine = the_job(cron_url, store["db"])["jobid"]
    gone = f"idem_gone_{uuid.uuid4().hex[:8]}"
    testdb.create(cron_url, gone)  # pg_cron schedules only in a database that exists
    with connect(cron_url) as conn:
        old = conn.execute(
            "SELECT cron.schedule_in_database('idempotency-cleanup', '0 4 * * *', 'CALL public.idem_cleanup()', %s)"
            " AS id",
            (store["db"],),
        ).fetchone()
        dropped = conn.execute(
            "SELECT cron.schedule_in_database(%s, '0 4 * * *', 'CALL public.idem_cleanup()', %s) AS id",
            (f"idem-cleanup:{gone}", gone),
        ).fetchone()
    assert old and dropped
    with pinned(testdb.url_for(cron_url, "postgres")) as admin:  # pg_cron keeps its job
        admin.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(gone)))
    try:
        done = idem("status", "--database-url", store["url"])
        warned = [line for line in done.stdout.splitlines() if "WARNING" in line]
        for jobid, says in ((old["id"], "checking"), (dropped["id"], "no longer exists")):
            [line] = [w for w in warned if f"(jobid {jobid})" in w] or [f"no warning for jobid {jobid}:\n{done.stdout}"]
            assert says in line and f"SELECT cron.unschedule({jobid})" in line, line
        assert not [w for w in warned if f"(jobid {genuine})" in w], warned
        assert done.returncode == 0, done.stdout  # warnings, as status's others: the store is current
    finally:
        with connect(cron_url) as conn:
            conn.execute("SELECT cron.unschedule(%s::bigint)", (dropped["id"],))
            conn.execute("SELECT cron.unschedule(jobid) FROM cron.job WHERE jobid = %s", (old["id"],))


def test_migrate_after_a_restore_gives_the_job_the_new_identity(cron_url: str, store: dict[str, str]) -> None:
    before = the_job(cron_url, store["db"])
    drop_and_recreate(cron_url, store, trap=False)
    migrated_by_the_dba(store)
    after = the_job(cron_url, store["db"])
    assert after["jobname"] == before["jobname"] and after["command"] != before["command"]
    with pinned(store["url"]) as conn:
        declared = conn.execute("SELECT command FROM public.idem_cleanup_job()").fetchone()
    assert declared and after["command"] == declared[0]
    ran = run_as_pg_cron(cron_url, after)
    assert ran.returncode == 0, ran.stderr


def test_the_genuine_stores_job_deletes_expired_rows_in_committed_batches(cron_url: str, store: dict[str, str]) -> None:
    job = the_job(cron_url, store["db"])
    with pinned(store["url"]) as conn:
        conn.execute(SEED, {"total": 3500, "expired": 2500})
    ran = run_as_pg_cron(cron_url, job)
    assert ran.returncode == 0, ran.stderr
    with pinned(store["url"]) as conn:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE expires_at <= now()) FROM public.idempotency_keys"
        ).fetchone()
    assert row == (1000, 0)


def test_a_multi_statement_command_would_be_one_transaction(cron_url: str, store: dict[str, str]) -> None:
    """Why the command is one DO block: pg_cron sends it as one query, and two statements in one
    query are one implicit transaction, in which the cleanup's COMMITs cannot run."""
    job = the_job(cron_url, store["db"])
    ran = run_as_pg_cron(cron_url, {**job, "command": "SELECT 1; " + job["command"]})
    assert ran.returncode != 0 and "outside a transaction block" in ran.stderr, ran.stderr


@pytest.mark.slow
def test_pg_cron_itself_refuses_the_owners_database(cron_url: str, store: dict[str, str]) -> None:
    job = the_job(cron_url, store["db"])
    rename_and_recreate(store)
    with connect(cron_url) as conn:  # pg_cron 1.4 fires on the minute: every minute, for this test
        conn.execute("SELECT cron.alter_job(job_id => %s, schedule => '* * * * *')", (job["jobid"],))
        try:
            run = wait_until(
                lambda: conn.execute(
                    "SELECT status, return_message FROM cron.job_run_details WHERE jobid = %s"
                    "   AND status IN ('succeeded', 'failed') ORDER BY runid LIMIT 1",
                    (job["jobid"],),
                ).fetchone(),
                timeout=90,
                what="pg_cron's run of the job",
            )
        finally:
            conn.execute("SELECT cron.unschedule(%s::bigint)", (job["jobid"],))
            conn.execute("DELETE FROM cron.job_run_details WHERE jobid = %s", (job["jobid"],))
    assert run is not None, "pg_cron did not run the job within 90 s"
    assert not is_superuser(cron_url, store["role"]), "pg_cron ran the owner's procedure as the superuser"
    assert run["status"] == "failed" and re.search(REFUSED, run["return_message"]), run
