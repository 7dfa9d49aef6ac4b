"""What the database's owner can make a superuser's ``idem status``, ``idem migrate`` or ``idem sql``
script run between the check of who made idem's routines (schema/sql/owners.sql) and a call of
one, where no DDL guard holds idem's names yet: before the first install (contract §3a).

The attacker owns its database (so ``public``) and is a plain login role. It keeps ``CREATE
FUNCTION public.idem_…`` uncommitted, watches ``pg_locks`` (every role's to read) for the
superuser's owners.sql, whose statement opens pg_inherits, and commits while that statement runs,
its snapshot taken: owners.sql saw nothing, and the next statement finds the routine. A check and
a later call are two snapshots (READ COMMITTED; a routine's name is resolved on the newest
catalog), so a routine is called only where it was idem's when checked, or never: the version is
read from pg_proc.prosrc, not by calling it. Each test asserts the safe outcome, so it fails
while the hole is open."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from tests.python.sql.test_sec_owned_database import outcome, spy
from tests.python.support.owned import idem, pinned

#: How long after the superuser's owners.sql opened pg_inherits the owner commits: past the
#: statement's snapshot (owners.sql takes tens of milliseconds), before the next statement.
_INTO_THE_CHECK_S = 0.03

#: The superuser's session of this database holds a lock on pg_inherits: owners.sql's statement.
_CHECKING = """
SELECT 1 FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
 WHERE a.datname = pg_catalog.current_database() AND a.usename = %s
   AND l.relation = 'pg_catalog.pg_inherits'::pg_catalog.regclass"""


@contextmanager
def committed_during_the_check(owned: dict[str, str], ddl: str) -> Iterator[list[bool]]:
    """The owner's ``ddl``, uncommitted until the superuser's owners.sql is under way; yields
    [whether it was committed then]."""
    attacker = psycopg.connect(owned["attacker_url"], options="-c search_path=pg_catalog,pg_temp")
    watcher = psycopg.connect(owned["attacker_url"], autocommit=True)
    attacker.execute(ddl)
    done = threading.Event()
    committed = [False]

    def watch() -> None:
        while not done.is_set():
            if watcher.execute(_CHECKING, (owned["dba"],)).fetchone():
                time.sleep(_INTO_THE_CHECK_S)
                attacker.commit()
                committed[0] = True
                return
            time.sleep(0.0005)

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        yield committed
    finally:
        done.set()
        thread.join()
        attacker.commit()
        attacker.close()
        watcher.close()


def _version_spy(owned: dict[str, str]) -> str:
    with pinned(owned["attacker_url"]) as conn:
        spy(conn, owned)
    return (
        "CREATE FUNCTION public.idem_schema_version() RETURNS integer LANGUAGE plpgsql"
        " AS $f$ BEGIN PERFORM public.spy('public.idem_schema_version'); RETURN 1; END $f$"
    )


def _run(verb: str, owned: dict[str, str]) -> str:
    """The superuser's verb on the owner's database (the script through psql, as documented)."""
    if verb != "sql":
        done = idem(verb, "--database-url", owned["url"], "--wait-timeout", "5")
        return done.stdout + done.stderr
    script = idem("sql", "--wait-timeout", "5")
    assert script.returncode == 0, script.stderr
    applied = subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", owned["url"]],
        input=script.stdout,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return applied.stdout + applied.stderr


@pytest.mark.parametrize("verb", ["status", "migrate", "sql"])
def test_an_idem_schema_version_made_during_the_check_never_runs(owned: dict[str, str], verb: str) -> None:
    """Before the first install the owner commits its public.idem_schema_version() while the
    superuser's owners.sql runs: idem status's and idem migrate's read_state, and the preflight
    both verbs run before the guard, called it next, as the superuser (the owner became one, and
    idem migrate then installed over what it had become). Safe: the version is read from
    pg_proc.prosrc, never by calling what another role may have made."""
    ddl = _version_spy(owned)
    with committed_during_the_check(owned, ddl) as committed:
        said = _run(verb, owned)
    superuser, ran = outcome(owned)
    assert committed[0], f"the owner never saw the check run: {said}"
    assert not superuser and not ran, f"idem {verb} ran the owner's idem_schema_version as {ran}: {said}"


def test_idem_status_never_calls_an_idem_routine_made_after_its_check(owned: dict[str, str]) -> None:
    """Before the first install idem status called public.idem_cleanup_plan() and
    public.idem_cleanup_job(text) after owners.sql, catching only their absence: the owner,
    committing both once the check has run, had them run as the superuser. Safe: a routine is
    called only where it is the store owner's, a superuser's or the running role's."""
    with pinned(owned["attacker_url"]) as conn:
        spy(conn, owned)
    ddl = (
        "CREATE FUNCTION public.idem_cleanup_plan(OUT expired bigint, OUT max_rows_per_second integer,"
        " OUT takes interval, OUT every interval, OUT fits boolean) LANGUAGE plpgsql AS $f$ BEGIN"
        " PERFORM public.spy('public.idem_cleanup_plan'); END $f$;"
        " CREATE FUNCTION public.idem_cleanup_job(text, OUT jobname text, OUT schedule text, OUT command text,"
        " OUT legacy_jobname text) LANGUAGE plpgsql AS $f$ BEGIN"
        " PERFORM public.spy('public.idem_cleanup_job'); END $f$"
    )
    with committed_during_the_check(owned, ddl) as committed:
        said = _run("status", owned)
    superuser, ran = outcome(owned)
    assert committed[0], f"the owner never saw the check run: {said}"
    assert not superuser and not ran, f"idem status ran the owner's routines as {ran}: {said}"


def test_idem_status_never_reads_an_idem_relation_another_role_made(owned: dict[str, str]) -> None:
    """Before the first install the owner makes public.idem_host_users (migration 0017's record,
    which idem status reads) a view calling its function: a view's functions run as whoever
    selects, and owners.sql named only some of idem's relations. No race. Safe: idem status
    refuses it, as every verb does, and nothing it planted ran."""
    with pinned(owned["attacker_url"]) as conn:
        spy(conn, owned)
        conn.execute(
            "CREATE FUNCTION public.users_name() RETURNS text LANGUAGE plpgsql"
            " AS $f$ BEGIN PERFORM public.spy('public.idem_host_users'); RETURN 'public.users'; END $f$"
        )
        conn.execute(
            "CREATE VIEW public.idem_host_users AS SELECT public.users_name() AS users_table, 'integer' AS id_type"
        )
    said = {verb: _run(verb, owned) for verb in ("status", "migrate", "sql")}
    superuser, ran = outcome(owned)
    assert not superuser and not ran, f"the owner's view ran as {ran}: {said}"
    for verb, output in said.items():
        assert "view public.idem_host_users (owned by" in output, f"idem {verb}: {output}"


#: The owner's own store and yoyo's record as a view calling its function: owners.sql takes the
#: owner of public.idempotency_keys for the store's owner, and trusts what it made.
_OWN_STORE = """
CREATE FUNCTION public.recorded() RETURNS text LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM public.spy('public._yoyo_migration'); RETURN '0002.idempotency-keys'; END $f$;
CREATE TABLE public.idempotency_keys (id bigint);
CREATE VIEW public._yoyo_migration AS
    SELECT public.recorded()::varchar(255) AS migration_id, 'x'::varchar(64) AS migration_hash,
           pg_catalog.now()::timestamp AS applied_at_utc"""


@pytest.mark.parametrize("verb", ["status", "migrate", "sql"])
def test_yoyos_record_is_never_read_through_a_view_of_the_database_owner(owned: dict[str, str], verb: str) -> None:
    """No race: before the first install the owner makes its own public.idempotency_keys (so
    owners.sql takes it for the store's owner) and public._yoyo_migration a view calling its
    function; read_state and preflight.sql read it, as the superuser, under idem status, idem
    migrate and the idem sql script alike. Safe: yoyo's record is read only from a plain table
    (the verbs then refuse an idempotency_keys idem did not create), and nothing planted ran."""
    with pinned(owned["attacker_url"]) as conn:
        spy(conn, owned)
        conn.execute(_OWN_STORE)
    said = _run(verb, owned)
    superuser, ran = outcome(owned)
    assert not superuser and not ran, f"idem {verb} read the owner's view as {ran}: {said}"
