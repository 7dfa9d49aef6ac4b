"""
Cleanup on a schedule: `idem migrate` upserts the pg_cron job 'idem-cleanup:<database>'
at '0 4 * * *' in the cron database and changes nothing when re-run; the job's command deletes
expired rows only; pg_cron really runs a job of ours (slow); from a database without pg_cron,
idem_schedule_cleanup() says what to run in the cron database (a NOTICE naming the exact SQL and
`flask idempotency cleanup`); `idem migrate` schedules it there itself (tests/python/ops/test_pkg_cron.py).

The cron database is the one DATABASE_URL points at (`idem` on the local cluster); the fresh_admin_url
databases have no pg_cron.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import testdb
from tests.python.support.owned import declared_command
from tests.python.support.sqlapi import connect, one
from tests.python.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]

SEED = """
INSERT INTO idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status,
                              response_code, response_body, created_at, locked_at, expires_at)
SELECT gen_random_uuid()::text, NULL, 'POST /api/trading/orders', 'h', s.status, 201, '{}'::jsonb,
       now() - s.age, now() - s.age, now() - s.age + interval '1 hour'
  FROM (SELECT CASE i %% 3 WHEN 0 THEN 'in_flight' WHEN 1 THEN 'completed' ELSE 'failed' END AS status,
               CASE WHEN i <= %(expired)s THEN interval '2 hours' ELSE interval '1 minute' END AS age
          FROM generate_series(1, %(total)s) AS i) s
"""


def run_migrate(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [testdb.idem_command(), "migrate", "--database-url", url], check=True, capture_output=True, text=True
    )


def counts(url: str) -> dict[str, Any]:
    with connect(url) as conn:
        row = conn.execute("""SELECT count(*) AS total,
                                     count(*) FILTER (WHERE expires_at <= now()) AS expired
                                FROM idempotency_keys""").fetchone()
    assert row is not None
    return dict(row)


#: These tests migrate DATABASE_URL itself (pg_cron's database) and read, drift and put back its
#: one job: no two of them run at once (the group's lock, tests/python/conftest.py).
pytestmark = pytest.mark.xdist_group("the cron database's own job")


@pytest.fixture(scope="module")
def migrated_cron_db(cron_url: str) -> str:
    """The cron database, migrated the way `make migrate` does it."""
    run_migrate(cron_url)
    return cron_url


def job_name(url: str) -> str:
    return f"idem-cleanup:{conninfo_to_dict(url)['dbname']}"


def quoted(text: str) -> str:
    """``text`` as a SQL literal, as the HINTs print it (%L)."""
    return "'" + text.replace("'", "''") + "'"


def job_row(url: str) -> dict[str, Any] | None:
    with connect(url) as conn:
        row = conn.execute(
            """SELECT jobid, schedule, command, database, username, active, nodename, nodeport
                                FROM cron.job WHERE jobname = %s AND username = current_user""",
            (job_name(url),),
        ).fetchone()
    return dict(row) if row else None


def test_migrate_schedules_the_nightly_cleanup_in_the_cron_database(migrated_cron_db: str) -> None:
    job = job_row(migrated_cron_db)
    assert job is not None, "idem migrate left no 'idem-cleanup:<db>' job in cron.job"
    assert job["schedule"] == "0 4 * * *"
    assert job["command"] == declared_command(migrated_cron_db)
    assert job["database"] == conninfo_to_dict(migrated_cron_db)["dbname"]
    assert job["active"] is True


def test_re_running_migrate_changes_nothing(migrated_cron_db: str) -> None:
    before = job_row(migrated_cron_db)
    with connect(migrated_cron_db) as conn:
        xmin_before = conn.execute(
            "SELECT xmin::text AS x FROM cron.job WHERE jobname = %s", (job_name(migrated_cron_db),)
        ).fetchone()
    out = run_migrate(migrated_cron_db).stdout
    assert "cleanup schedule: unchanged" in out
    with connect(migrated_cron_db) as conn:
        assert conn.execute("SELECT public.idem_schedule_cleanup() AS r").fetchone() == {"r": "unchanged"}
        xmin_after = conn.execute(
            "SELECT xmin::text AS x FROM cron.job WHERE jobname = %s", (job_name(migrated_cron_db),)
        ).fetchone()
    after = job_row(migrated_cron_db)
    # The same job, untouched. What else renews it: test_a_drifted_job_is_put_back and
    # test_a_job_of_an_older_idems_command_is_replaced below drift this same job (pg_cron's
    # database has one job of its name) and idem_schedule_cleanup() replaces it, with a new jobid;
    # beside this test, without the group's lock, they failed it 3 times in 6. They cannot use a
    # database of their own (only here does idem_schedule_cleanup() schedule in its own database),
    # so the group's lock keeps them apart from this one.
    assert after == before
    assert xmin_after == xmin_before, "the job row was rewritten although nothing changed"


def test_a_drifted_job_is_put_back(migrated_cron_db: str) -> None:
    with connect(migrated_cron_db) as conn:
        conn.execute(
            "SELECT cron.alter_job(job_id => jobid, schedule => '0 5 * * *', active => false)"
            "  FROM cron.job WHERE jobname = %s AND username = current_user",
            (job_name(migrated_cron_db),),
        )
        assert conn.execute("SELECT public.idem_schedule_cleanup() AS r").fetchone() == {"r": "scheduled"}
    job = job_row(migrated_cron_db)
    assert job is not None and (job["schedule"], job["active"]) == ("0 4 * * *", True)


def test_a_job_of_an_older_idems_command_is_replaced(migrated_cron_db: str) -> None:
    """An existing store upgrades: the command of an idem whose job checked no database's
    identity is the declared one after the next idem_schedule_cleanup (idem migrate)."""
    with connect(migrated_cron_db) as conn:
        conn.execute(
            "SELECT cron.alter_job(job_id => jobid, command => 'CALL public.idem_cleanup()')"
            "  FROM cron.job WHERE jobname = %s AND username = current_user",
            (job_name(migrated_cron_db),),
        )
        assert conn.execute("SELECT public.idem_schedule_cleanup() AS r").fetchone() == {"r": "scheduled"}
    job = job_row(migrated_cron_db)
    assert job is not None and job["command"] == declared_command(migrated_cron_db)


def test_running_the_jobs_command_deletes_expired_rows_only(migrated_cron_db: str, fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as conn:
        conn.execute(SEED, {"total": 3000, "expired": 1800})
        before = counts(fresh_admin_url)
        assert before == {"total": 3000, "expired": 1800}
        # what pg_cron runs there, outside a transaction block (the cron database's own job's
        # command refuses any other database: test_cron_identity.py)
        conn.execute(declared_command(fresh_admin_url))
    assert counts(fresh_admin_url) == {"total": 1200, "expired": 0}


def test_without_pg_cron_here_the_function_says_what_to_run_in_the_cron_database(fresh_admin_url: str) -> None:
    notices: list[str] = []
    with connect(fresh_admin_url) as conn:
        conn.add_notice_handler(lambda d: notices.append(f"{d.message_primary} {d.message_hint}"))
        assert conn.execute("SELECT public.idem_schedule_cleanup() AS r").fetchone() == {"r": "other_database"}
        assert conn.execute("SELECT to_regnamespace('cron') IS NULL AS no_cron").fetchone() == {"no_cron": True}
    out = "\n".join(notices)
    assert "flask idempotency cleanup" in out
    dbname = conninfo_to_dict(fresh_admin_url)["dbname"]
    # The NOTICE names the exact statement for the cron database, with this database's name.
    assert (
        f"SELECT cron.schedule_in_database('idem-cleanup:{dbname}', '0 4 * * *', "
        f"{quoted(declared_command(fresh_admin_url))}, '{dbname}', 'postgres')"
    ) in out


def test_a_bad_schedule_is_refused(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as conn, pytest.raises(psycopg.Error, match="five cron fields") as err:
        conn.execute("SELECT public.idem_schedule_cleanup(p_schedule => 'every night')")
    assert err.value.sqlstate == "IDM00"


# --- pg_cron really runs a job of ours ---------------------------------------------------------


@pytest.fixture
def temporary_job(cron_url: str, fresh_admin_url: str) -> Iterator[dict[str, Any]]:
    """A job of ours that runs idem_cleanup in fresh_admin_url as soon as pg_cron can; unscheduled after.

    pg_cron >= 1.5 takes '5 seconds'; older versions (Debian 12 ships 1.4) fire on the minute.
    """
    with connect(cron_url) as conn:
        version = one(conn, "SELECT extversion AS v FROM pg_extension WHERE extname = 'pg_cron'")["v"]
        major, minor = (int(p) for p in version.split("-")[0].split(".")[:2])
        schedule = "5 seconds" if (major, minor) >= (1, 5) else "* * * * *"
        name = f"idem-test-{uuid.uuid4().hex[:8]}"
        jobid = one(
            conn,
            "SELECT cron.schedule_in_database(%s, %s, %s, %s) AS id",
            (name, schedule, declared_command(fresh_admin_url), conninfo_to_dict(fresh_admin_url)["dbname"]),
        )["id"]
    try:
        yield {"jobid": jobid, "schedule": schedule, "scheduled_at": time.monotonic()}
    finally:
        with connect(cron_url) as conn:
            conn.execute("SELECT cron.unschedule(%s::bigint)", (jobid,))
            conn.execute("DELETE FROM cron.job_run_details WHERE jobid = %s", (jobid,))


@pytest.mark.slow
def test_pg_cron_runs_our_cleanup_job(cron_url: str, fresh_admin_url: str, temporary_job: dict[str, Any]) -> None:
    with connect(fresh_admin_url) as conn:
        conn.execute(SEED, {"total": 500, "expired": 300})
    deadline = temporary_job["scheduled_at"] + 75  # a minute boundary + the run; CI allows 90 s
    with connect(cron_url) as conn:
        run = wait_until(
            lambda: conn.execute(
                """SELECT status, return_message, end_time - start_time AS took
                                    FROM cron.job_run_details WHERE jobid = %s AND status IN ('succeeded', 'failed')
                                   ORDER BY runid LIMIT 1""",
                (temporary_job["jobid"],),
            ).fetchone(),
            timeout=max(0.0, deadline - time.monotonic()),
            what=f"pg_cron's first finished run of {temporary_job['schedule']!r}",
        )
    assert run["status"] == "succeeded", run["return_message"]
    assert run["return_message"] == "DO"  # the command is one DO block
    assert counts(fresh_admin_url) == {"total": 200, "expired": 0}


@pytest.mark.parametrize("where", ["cron database", "another database"])
def test_a_role_without_pg_cron_rights_still_migrates_with_a_notice(
    migrated_cron_db: str, fresh_admin_url: str, where: str
) -> None:
    """Not a superuser: no USAGE on schema cron, and cron.database_name is unreadable."""
    role = f"idem_nocron_{uuid.uuid4().hex[:8]}"
    notices: list[str] = []
    with connect(migrated_cron_db if where == "cron database" else fresh_admin_url) as conn:
        conn.execute(f"CREATE ROLE {role} NOLOGIN")  # no USAGE on schema cron
        try:
            # what idem_admin holds for scheduling: the upsert and the job it upserts
            conn.execute(
                f"GRANT EXECUTE ON FUNCTION public.idem_schedule_cleanup(text), public.idem_cleanup_job TO {role}"
            )
            conn.add_notice_handler(lambda d: notices.append(f"{d.message_primary} {d.message_hint}"))
            conn.execute(f"SET ROLE {role}")
            assert conn.execute("SELECT public.idem_schedule_cleanup() AS r").fetchone() == {"r": "not_permitted"}
            conn.execute("RESET ROLE")
        finally:
            conn.execute("RESET ROLE")
            conn.execute(
                f"REVOKE ALL ON FUNCTION public.idem_schedule_cleanup(text), public.idem_cleanup_job FROM {role}"
            )
            conn.execute(f"DROP ROLE {role}")
    expected = "may not schedule pg_cron jobs" if where == "cron database" else "may not read cron.database_name"
    url = migrated_cron_db if where == "cron database" else fresh_admin_url
    statement = f"'{job_name(url)}', '0 4 * * *', {quoted(declared_command(url))}"
    assert any(expected in n and statement in n for n in notices), notices
