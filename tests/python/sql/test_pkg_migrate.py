"""
`idem migrate`, `idem sql`, `idem status`: the script a DBA applies with psql leaves the
same schema as `idem migrate` (normalised pg_dump), applying it twice changes nothing, and a later
`idem migrate` sees its migrations as applied. Bad input is refused in one line with nothing
changed: an unreachable server, an unknown role, a missing database, an `idempotency_keys` table
idem did not create, a database whose SQL API is newer than the package.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

import testdb
from idem_shim import schema as idem_schema
from idem_shim.queries import EXPECTED_SCHEMA_VERSION
from idem_shim.schema.preflight import GUARD_ONLY
from tests.python.support.schema import schema
from tests.python.support.sqlapi import connect, one

ROOT = Path(__file__).resolve().parents[3]


def idem(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([testdb.idem_command(), *args], capture_output=True, text=True, timeout=120)


def psql_apply(url: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", url],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def script() -> str:
    done = idem("sql")
    assert done.returncode == 0, done.stderr
    return done.stdout


def applied(url: str) -> list[str]:
    with connect(url) as conn:
        return [
            r["migration_id"]
            for r in conn.execute("SELECT migration_id FROM _yoyo_migration ORDER BY migration_id").fetchall()
        ]


def test_the_package_expects_the_sql_api_version_its_functions_define() -> None:
    text = (idem_schema.sql_files().functions / "000_idem_schema_version.sql").read_text()
    match = re.search(r"AS \$\$ SELECT (\d+) \$\$", text)
    assert match and int(match.group(1)) == EXPECTED_SCHEMA_VERSION


def test_idem_sql_through_psql_gives_the_schema_of_idem_migrate_and_is_seen_as_applied(
    script: str, empty_db: str, other_empty_db: str
) -> None:
    done = psql_apply(empty_db, script)
    assert done.returncode == 0, done.stderr
    migrated = idem("migrate", "--database-url", other_empty_db)
    assert migrated.returncode == 0, migrated.stderr
    reference = schema(other_empty_db)
    assert schema(empty_db) == reference

    again = psql_apply(empty_db, script)  # twice: nothing changes
    assert again.returncode == 0, again.stderr
    assert "applied migration" not in again.stderr
    assert schema(empty_db) == reference

    later = idem("migrate", "--database-url", empty_db)
    assert later.returncode == 0, later.stderr
    assert "0 migration(s) applied" in later.stdout
    assert applied(empty_db) == applied(other_empty_db) == [m.id for m in idem_schema.read_migrations()]
    assert schema(empty_db) == reference


def test_idem_sql_on_a_current_database_changes_nothing(script: str, fresh_admin_url: str) -> None:
    before, ids = schema(fresh_admin_url), applied(fresh_admin_url)
    done = psql_apply(fresh_admin_url, script)
    assert done.returncode == 0, done.stderr
    assert "applied migration" not in done.stderr
    assert schema(fresh_admin_url) == before and applied(fresh_admin_url) == ids


def test_idem_status_reports_versions_migrations_role_and_job(fresh_admin_url: str) -> None:
    done = idem("status", "--database-url", fresh_admin_url)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"SQL API: database {EXPECTED_SCHEMA_VERSION}, package {EXPECTED_SCHEMA_VERSION} (current)" in out
    assert "0 pending" in out and "roles idem_app, idem_admin, idem_dsr, idem_monitor: exist" in out
    assert "pg_cron:" in out
    # The cleanup's default pace (pg_cron's and the CLI's) against what has expired now.
    assert "cleanup pace: 2,500 rows/s; 0 expired rows take 0 s (runs every 24 h): fits" in out, out


def test_idem_status_of_an_empty_database_says_it_is_behind(empty_db: str) -> None:
    done = idem("status", "--database-url", empty_db)
    assert done.returncode == 1
    assert "none (idem is not installed)" in done.stdout and "behind: run idem migrate" in done.stdout
    assert "cleanup pace: unknown (public.idem_cleanup_plan() is missing" in done.stdout


def test_idem_status_behind_a_held_lock_answers_within_its_wait_naming_the_holder(fresh_admin_url: str) -> None:
    """A DBA's open ``LOCK TABLE`` (or a migration's) on the store hung ``idem status`` with no
    output at all, however long it waited: each lock it waits for is bounded by --wait-timeout, the
    line that needed it names the holder, and the rest of the report is printed."""
    with connect(fresh_admin_url) as holder:
        holder.autocommit = False
        holder.execute("SET application_name = 'dba_console'")
        holder.execute("LOCK TABLE public.idempotency_keys IN ACCESS EXCLUSIVE MODE")
        pid = holder.info.backend_pid
        started = time.monotonic()
        done = idem("status", "--database-url", fresh_admin_url, "--wait-timeout", "1")
        took = time.monotonic() - started
        holder.rollback()
    assert took < 30, took
    assert done.returncode == 0, done.stdout + done.stderr  # current: the line it could not read says why
    out = done.stdout
    assert f"SQL API: database {EXPECTED_SCHEMA_VERSION}, package {EXPECTED_SCHEMA_VERSION} (current)" in out
    assert "pg_cron:" in out, out
    pace = next(line for line in out.splitlines() if line.startswith("cleanup pace:"))
    assert f"waited 1 s for a lock (--wait-timeout): pid {pid} (postgres, application 'dba_console'" in pace, pace
    assert pace.endswith(" holds public.idempotency_keys)"), pace


def test_idem_status_prints_a_lock_holders_names_on_its_own_line_only(fresh_admin_url: str) -> None:
    """A table's, an application's or a gid's name is its maker's text: a newline in one would
    start a line of the report the database never said (a forged verdict); it shows as '?'."""
    forged = "cleanup pace: 2,500 rows/s; forged"
    with connect(fresh_admin_url) as holder:
        holder.execute(f'CREATE TABLE public."x\n{forged}" ()')
        holder.autocommit = False
        holder.execute(f'LOCK TABLE public."x\n{forged}", public.idempotency_keys IN ACCESS EXCLUSIVE MODE')
        done = idem("status", "--database-url", fresh_admin_url, "--wait-timeout", "0.5")
        holder.rollback()
    paces = [line for line in done.stdout.splitlines() if line.startswith("cleanup pace:")]
    assert len(paces) == 1 and "waited 0.5 s" in paces[0] and f"x?{forged}" in paces[0], done.stdout


def test_idem_status_behind_a_lock_on_yoyos_table_is_one_line_naming_the_holder(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as holder:
        holder.autocommit = False
        holder.execute("LOCK TABLE public._yoyo_migration IN ACCESS EXCLUSIVE MODE")
        done = idem("status", "--database-url", fresh_admin_url, "--wait-timeout", "0.5")
        pid = holder.info.backend_pid
    assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
    said = done.stderr.strip()
    assert said.startswith("Error: idem status: waited 0.5 s for a lock") and "\n" not in said, said
    assert f"pid {pid} (postgres, application ''" in said and said.endswith("holds public._yoyo_migration"), said


def test_idem_status_behind_a_prepared_transactions_lock_names_its_gid(fresh_admin_url: str) -> None:
    gid = f"idem_status_{uuid.uuid4().hex[:8]}"
    with connect(fresh_admin_url) as holder:
        holder.autocommit = False
        holder.execute("LOCK TABLE public.idempotency_keys IN ACCESS EXCLUSIVE MODE")
        holder.execute(f"PREPARE TRANSACTION '{gid}'")
    try:
        done = idem("status", "--database-url", fresh_admin_url, "--wait-timeout", "0.5")
    finally:
        with connect(fresh_admin_url) as conn:
            conn.execute(f"ROLLBACK PREPARED '{gid}'")
    pace = next(line for line in done.stdout.splitlines() if line.startswith("cleanup pace:"))
    assert (
        f"waited 0.5 s for a lock (--wait-timeout): prepared transaction {gid} holds public.idempotency_keys" in pace
    ), done.stdout + done.stderr


def test_idem_status_refuses_a_negative_wait(fresh_admin_url: str) -> None:
    done = idem("status", "--database-url", fresh_admin_url, "--wait-timeout", "-1")
    assert done.returncode == 2 and "--wait-timeout" in done.stderr, done.stderr


@pytest.mark.parametrize("wait", ["inf", "nan", "1e400"])
def test_idem_status_refuses_a_wait_that_is_no_number_of_seconds_in_one_line(fresh_admin_url: str, wait: str) -> None:
    """click's FloatRange(min=0) takes inf and nan (nan < 0 is false): the lock_timeout made of
    them was an OverflowError or a ValueError, a traceback."""
    done = idem("status", "--database-url", fresh_admin_url, "--wait-timeout", wait)
    assert done.returncode == 2 and done.stderr.startswith("Error: ") and "--wait-timeout" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


# --- bad input -----------------------------------------------------------------------------------


def _url_with(admin_url: str, **changes: str) -> str:
    parts = conninfo_to_dict(admin_url)
    parts.update(changes)
    user = parts.get("user", "postgres")
    return f"postgresql://{user}@{parts.get('host', '127.0.0.1')}:{parts.get('port', '5432')}/{parts['dbname']}"


@pytest.mark.parametrize("case", ["unreachable server", "unknown role", "missing database"])
def test_a_database_that_cannot_be_reached_is_one_clear_line_and_a_non_zero_exit(
    admin_url: str, empty_db: str, case: str
) -> None:
    dbname = str(conninfo_to_dict(empty_db)["dbname"])
    url = {
        "unreachable server": _url_with(admin_url, port="1", dbname=dbname),
        "unknown role": _url_with(admin_url, user="nobody_" + uuid.uuid4().hex[:6], dbname=dbname),
        "missing database": _url_with(admin_url, dbname="no_such_db_" + uuid.uuid4().hex[:6]),
    }[case]
    before = schema(empty_db)
    for verb in ("migrate", "status"):
        done = idem(verb, "--database-url", url)
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: cannot connect to "), done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""
    expected = {
        "unreachable server": "127.0.0.1:1/idem_e_",  # the URL says where; libpq's reason follows it
        "unknown role": "does not exist",
        "missing database": "does not exist; create it first: CREATE DATABASE",
    }[case]
    assert expected in lines[0]
    assert ("CREATE DATABASE" in lines[0]) == (case == "missing database"), lines[0]  # only then that hint
    assert schema(empty_db) == before  # nothing half-applied


def adr_ddl() -> str:
    """The first design's table (contract §2), as a host that built it by hand has it: migration 0002's
    CREATE TABLE without contract §2's corrections (its ``ck_*`` CHECKs and NULLS NOT DISTINCT),
    read from the migration itself so the two cannot drift apart."""
    text = (ROOT / "sql" / "migrations" / "0002.idempotency-keys.sql").read_text(encoding="utf-8")
    found = re.search(r"CREATE TABLE public\.idempotency_keys \(.*?\n\);", text, re.S)
    assert found is not None, "0002 creates public.idempotency_keys"
    table = re.sub(r"--[^\n]*", "", found.group(0))
    table = re.sub(r"CONSTRAINT ck_\w+\s+CHECK \((?:[^()]|\([^()]*\))*\)", "", table)
    table = re.sub(r",\s*\)\s*;\Z", "\n);", table.replace("NULLS NOT DISTINCT ", ""))
    assert "ck_" not in table and "NULLS NOT DISTINCT" not in table
    return "CREATE TABLE users (id integer PRIMARY KEY, name text);\n" + table.replace("public.", "")


def test_an_idempotency_keys_table_idem_did_not_create_is_refused_saying_what_differs(
    script: str, empty_db: str, admin_url: str
) -> None:
    with connect(empty_db) as conn:
        conn.execute(adr_ddl())
    before = schema(empty_db)
    done = idem("migrate", "--database-url", empty_db)
    assert done.returncode == 1
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert "idempotency_keys that idem did not create" in message
    assert "no UNIQUE NULLS NOT DISTINCT (idem_key, scope_user_id, scope_endpoint)" in message
    assert "with NULLs distinct" in message
    assert "ck_idem_key_canonical" in message and "ck_idem_retention_cap" in message
    assert message.endswith("nothing was changed")
    by_psql = psql_apply(empty_db, script)
    assert by_psql.returncode != 0 and "idem did not create" in by_psql.stderr
    assert "NULLS NOT DISTINCT" in by_psql.stderr
    assert schema(empty_db) == before  # no yoyo table, no role-less leftovers, nothing


def test_a_database_with_a_newer_sql_api_is_refused_naming_both_versions(script: str, fresh_admin_url: str) -> None:
    newer = EXPECTED_SCHEMA_VERSION + 1
    with connect(fresh_admin_url) as conn:
        conn.execute(
            f"CREATE OR REPLACE FUNCTION public.idem_schema_version() RETURNS integer "
            f"LANGUAGE sql IMMUTABLE AS $$ SELECT {newer} $$"
        )
    before, ids = schema(fresh_admin_url), applied(fresh_admin_url)
    done = idem("migrate", "--database-url", fresh_admin_url)
    assert done.returncode == 1
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert f"version {newer}, newer than the version {EXPECTED_SCHEMA_VERSION} of this package" in message
    by_psql = psql_apply(fresh_admin_url, script)
    assert by_psql.returncode != 0
    assert f"version {newer}, newer than the version {EXPECTED_SCHEMA_VERSION} of this script" in by_psql.stderr
    assert schema(fresh_admin_url) == before and applied(fresh_admin_url) == ids


def test_migrate_leaves_no_yoyo_error_in_the_server_log(admin_url: str, empty_db: str) -> None:
    """Only the migrated database's lines count: the log is the whole cluster's, and a parallel
    test's migrates waiting on yoyo's lock log its INSERT's duplicate key every half second."""
    with connect(admin_url) as conn:
        data = one(conn, "SELECT current_setting('data_directory') AS d")["d"]
        prefix = one(conn, "SELECT current_setting('log_line_prefix') AS p")["p"]
    log = Path(data).parent / "server.log"
    if not log.exists():
        pytest.skip("the server's log is not readable here (not the project's local cluster)")
    if "db=%d " not in prefix:
        pytest.skip("the cluster's log_line_prefix names no database (made before scripts/db.sh set it)")
    start = log.stat().st_size
    with connect(empty_db) as conn:  # a line of this database's, so the filter is seen to find it
        name = one(conn, "SELECT current_database() AS d")["d"]
        conn.execute("DO $$ BEGIN RAISE WARNING 'idem test: the migrates start'; END $$")
    assert idem("migrate", "--database-url", empty_db).returncode == 0
    assert idem("migrate", "--database-url", empty_db).returncode == 0
    with log.open("rb") as handle:
        handle.seek(start)
        tail = handle.read().decode(errors="replace")
    # An entry is a prefixed line and the tab-indented lines of its statement after it.
    entries = re.split(r"\n(?=\d{4}-\d\d-\d\d )", tail)
    ours = "\n".join(entry for entry in entries if f" db={name} " in entry.split("\n", 1)[0])
    assert "idem test: the migrates start" in ours, f"the filter lost {name}'s lines\n{tail[-2000:]}"
    assert 'relation "yoyo_lock" already exists' not in ours, ours[-2000:]
    assert not re.search(r'ERROR:.*"yoyo_', ours), ours[-2000:]  # nor yoyo's transactional-DDL probe


def test_the_same_verbs_run_as_flask_idempotency(tmp_path: Path, empty_db: str, script: str) -> None:
    """`flask idempotency migrate|sql|status` on an app whose database has no SQL API yet: the app
    loads (its start-up check would refuse it otherwise) and the commands do what `idem` does."""
    (tmp_path / "hostapp.py").write_text(
        "from flask import Flask\nfrom idem_shim import Idem\n"
        "app = Flask(__name__)\napp.config.from_prefixed_env('HOST')\nIdem(app)\n"
    )
    flask = str(Path(testdb.idem_command()).with_name("flask"))
    env = {"PATH": "/usr/bin:/bin", "HOST_IDEM_DATABASE_URL": empty_db}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [flask, "--app", "hostapp", "idempotency", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert run("status").returncode == 1  # behind: nothing installed yet
    migrated = run("migrate")  # the app's IDEM_DATABASE_URL
    assert migrated.returncode == 0, migrated.stderr
    assert f"{len(idem_schema.read_migrations())} migration(s) applied" in migrated.stdout
    status = run("status")
    assert status.returncode == 0 and "(current)" in status.stdout, status.stdout + status.stderr
    printed = run("sql")
    assert printed.returncode == 0 and printed.stdout == script


def test_host_tables_that_do_not_fit_the_store_are_refused_saying_why(script: str, empty_db: str) -> None:
    with connect(empty_db) as conn:
        # a text id (integer, bigint and uuid fit: SQL API 15)
        conn.execute("CREATE TABLE users (id text PRIMARY KEY)")
        conn.execute("CREATE TABLE audit_log (id serial PRIMARY KEY, actor text NOT NULL, action text)")
    before = schema(empty_db)
    done = idem("migrate", "--database-url", empty_db)
    assert done.returncode == 1
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1, message
    for part in (
        "public.users.id is text",
        "public.audit_log has no column context (jsonb)",
        "public.audit_log has no column user_id",
        "public.audit_log.actor is NOT NULL without a default",
    ):
        assert part in message, message
    by_psql = psql_apply(empty_db, script)
    assert by_psql.returncode != 0 and "public.users.id is text" in by_psql.stderr
    assert schema(empty_db) == before


def test_host_tables_that_fit_are_used(empty_db: str) -> None:
    with connect(empty_db) as conn:
        conn.execute("CREATE TABLE users (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, email text NOT NULL)")
        conn.execute(
            "CREATE TABLE audit_log (id bigserial PRIMARY KEY, user_id bigint, action varchar(64) NOT NULL,"
            " context jsonb, at timestamptz NOT NULL DEFAULT now())"
        )
    assert idem("migrate", "--database-url", empty_db).returncode == 0
    with connect(empty_db) as conn:
        assert conn.execute("SELECT obj_description('public.users'::regclass) AS c").fetchone() == {"c": None}


def test_yoyos_lock_held_after_the_guard_is_committed_never_says_nothing_was_changed(empty_db: str) -> None:
    """yoyo's own lock is taken after idem's DDL guard is committed (a superuser migrating): its
    timeout (yoyo's 10 s, another migration's row in yoyo_lock) says the guard was changed."""
    with connect(empty_db) as conn:
        conn.execute(idem_schema.YOYO_LOCK_DDL)
        conn.execute("INSERT INTO public.yoyo_lock (locked, ctime, pid) VALUES (1, now(), 4242)")
    done = idem("migrate", "--database-url", empty_db)
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    assert done.returncode == 1 and len(lines) == 1, lines
    assert "another migration holds yoyo's lock" in lines[0] and "Process 4242" in lines[0], lines
    assert lines[0].endswith(GUARD_ONLY), lines
    with connect(empty_db) as conn:
        assert one(conn, "SELECT to_regclass('public.idempotency_keys') IS NULL AS none")["none"], "the store was made"
