"""What the database's owner sets for every session of its database (``ALTER DATABASE ... SET``)
against the DBA's other tools there: the ``idem sql`` script through psql and the Flask app's
admin verbs on IDEM_ADMIN_DATABASE_URL (``idem status`` and ``idem migrate``: test_sec_status.py).

Two kinds of setting: the transaction defaults that make a session's first statement wait,
holding no lock, for as long as the owner keeps a serializable transaction open (a deferrable
transaction's safe snapshot: owned.SAFE_SNAPSHOT_TRAP), and the text settings psycopg reads its
answers by (``client_encoding = SQL_ASCII`` returns bytes; another IntervalStyle cannot be read).
And the role they run as: ``ALTER DATABASE ... SET role`` starts every session there as the role
it names, a superuser's too (a member of every role). Each test asserts the safe outcome, so it
fails while the hole is open."""

from __future__ import annotations

import contextlib
import re
import subprocess
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import testdb
from idem_shim.schema.connection import connect
from tests.python.support.owned import (
    SAFE_SNAPSHOT_TRAP,
    attacker_session,
    hold_a_serializable_transaction,
    idem,
    pinned,
    prints_bytes,
    set_database,
)

WAIT_S = 60
SEED = """
INSERT INTO public.idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status,
                                     response_code, response_body, created_at, locked_at, expires_at)
SELECT pg_catalog.gen_random_uuid()::pg_catalog.text, NULL, 'POST /orders', 'h', s.status, s.code,
       s.body::pg_catalog.jsonb, pg_catalog.now() OPERATOR(pg_catalog.-) '2 hours'::pg_catalog.interval,
       pg_catalog.now() OPERATOR(pg_catalog.-) '2 hours'::pg_catalog.interval,
       pg_catalog.now() OPERATOR(pg_catalog.+) '1 hour'::pg_catalog.interval
  FROM (VALUES ('completed', 201, '{"ok": true}'), ('in_flight', NULL, NULL)) AS s (status, code, body)
"""


def _ran(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=WAIT_S, **kwargs)  # type: ignore[call-overload,no-any-return]
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(args[:3])} … still ran after {WAIT_S} s: {exc.stdout!r} {exc.stderr!r}")


def test_the_idem_sql_script_never_waits_for_a_safe_snapshot_the_owner_asked_for(owned: dict[str, str]) -> None:
    """The DBA applies ``idem sql`` with psql to the owner's database, whose transactions the owner
    made SERIALIZABLE READ ONLY DEFERRABLE by default: the script's first transaction waited for
    the owner's open one, silently, for as long as the owner liked. Safe: it ends at once, on the
    read-only default (a refusal the DBA can act on), having written nothing."""
    script = idem("sql")
    assert script.returncode == 0, script.stderr
    set_database(owned, **SAFE_SNAPSHOT_TRAP)
    with hold_a_serializable_transaction(owned):
        done = _ran(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", owned["url"]], input=script.stdout)
    assert done.returncode != 0 and "read-only transaction" in done.stderr, done.stderr
    with pinned(owned["url"]) as conn:
        assert conn.execute("SELECT pg_catalog.to_regclass('public.idempotency_keys')").fetchone() == (None,)


def _admin_verb(tmp_path: Path, owned: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``flask idempotency <args>`` of an app that runs as the owner's role, its admin verbs on the
    DBA's URL (IDEM_ADMIN_DATABASE_URL), as a DBA runs them."""
    (tmp_path / "hostapp.py").write_text(
        "from flask import Flask\nfrom idem_shim import Idem\n"
        "app = Flask(__name__)\napp.config.from_prefixed_env('HOST')\nIdem(app)\n"
    )
    flask = str(Path(testdb.idem_command()).with_name("flask"))
    env = {
        "PATH": "/usr/bin:/bin",
        "HOST_IDEM_DATABASE_URL": owned["attacker_url"],
        "HOST_IDEM_ADMIN_DATABASE_URL": owned["url"],
    }
    return _ran([flask, "--app", "hostapp", "idempotency", *args], cwd=tmp_path, env=env)


def test_the_admin_verbs_never_wait_for_a_safe_snapshot_the_owner_asked_for(
    tmp_path: Path, migrated: dict[str, str]
) -> None:
    """``flask idempotency stats`` on the DBA's URL hung at its first statement under the owner's
    SERIALIZABLE READ ONLY DEFERRABLE defaults while the owner held a serializable transaction.
    Safe: it answers (it only reads)."""
    with pinned(migrated["url"]) as conn:  # the owner's app keeps plain defaults for itself
        conn.execute(
            sql.SQL("ALTER ROLE {} IN DATABASE {} SET default_transaction_read_only = off").format(
                sql.Identifier(migrated["role"]), sql.Identifier(migrated["db"])
            )
        )
        conn.execute(
            sql.SQL("ALTER ROLE {} IN DATABASE {} SET default_transaction_deferrable = off").format(
                sql.Identifier(migrated["role"]), sql.Identifier(migrated["db"])
            )
        )
    set_database(migrated, **SAFE_SNAPSHOT_TRAP)
    with hold_a_serializable_transaction(migrated):
        done = _admin_verb(tmp_path, migrated, "stats")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize(("setting", "value"), [("client_encoding", "SQL_ASCII"), ("IntervalStyle", "iso_8601")])
def test_the_admin_verbs_read_their_answers_whatever_the_owner_set_for_their_text(
    tmp_path: Path, migrated: dict[str, str], setting: str, value: str
) -> None:
    """``flask idempotency stats`` printed b'...' for every text under the owner's SQL_ASCII, and
    a traceback under an IntervalStyle psycopg cannot read. Safe: the same table as with none."""
    with pinned(migrated["url"]) as conn:  # a held key and a completed one: texts, counts, ages to print
        conn.execute(SEED)
    plain = _admin_verb(tmp_path, migrated, "stats")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    set_database(migrated, **{setting: value})
    done = _admin_verb(tmp_path, migrated, "stats")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert _no_ages(done.stdout) == _no_ages(plain.stdout) and not prints_bytes(done.stdout), done.stdout


def _no_ages(table: str) -> str:
    """The table without its ages (``2:00:00.418231``), which grow between the two runs."""
    return re.sub(r"\b\d+:\d\d:\d\d\.\d+\b", "AGE", table)


@pytest.mark.parametrize("wait", ["inf", "nan", "1e400"])
@pytest.mark.parametrize("verb", ["migrate", "sql"])
def test_migrate_and_sql_refuse_a_wait_that_is_no_number_of_seconds_in_one_line(verb: str, wait: str) -> None:
    url = [] if verb == "sql" else ["--database-url", "postgresql://x@127.0.0.1:1/x"]
    done = _ran([testdb.idem_command(), verb, "--wait-timeout", wait, *url])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("Error:") and "is not a number of seconds" in done.stderr, done.stderr


#: The owners of the store's tables and routines (idem's and yoyo's names in public).
OWNERS = """
SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class AS c
 WHERE c.relnamespace = 'public'::pg_catalog.regnamespace
   AND c.relname IN ('idempotency_keys', 'idempotency_events', 'idem_secret', '_yoyo_migration')
UNION
SELECT pg_catalog.pg_get_userbyid(p.proowner) FROM pg_catalog.pg_proc AS p
 WHERE p.pronamespace = 'public'::pg_catalog.regnamespace AND p.proname LIKE 'idem\\_%'
"""


@pytest.mark.parametrize("install", ["migrate", "sql"])
def test_the_install_is_the_dbas_whatever_role_the_owner_set_for_its_database(
    owned: dict[str, str], install: str
) -> None:
    """``ALTER DATABASE <its db> SET role = <itself>`` (the owner may) started the superuser's
    session there as the owner, so ``idem migrate`` (and the ``idem sql`` script) made the store,
    idem_secret and every routine the owner's, made no DDL guard, reported success and scheduled
    the pg_cron job ``CALL public.idem_cleanup()`` as the superuser: the owner reset the setting,
    replaced the procedure, and the next run (here the DBA's own CALL) made it a superuser.
    Safe: everything is the DBA's, the guard is there, and the owner stays a plain role."""
    set_database(owned, role=owned["role"])
    if install == "migrate":
        done = idem("migrate", "--database-url", owned["url"], "-q")
    else:
        script = idem("sql")
        assert script.returncode == 0, script.stderr
        done = _ran(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", owned["url"]], input=script.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    with pinned(owned["url"]) as conn:
        owners = {row[0] for row in conn.execute(OWNERS)}
        guard = conn.execute("SELECT pg_catalog.count(*) FROM pg_catalog.pg_event_trigger").fetchone()
    assert owners == {owned["dba"]} and guard is not None and guard[0] > 0, (owners, guard)
    with attacker_session(owned) as attacker:
        attacker.execute(sql.SQL("ALTER DATABASE {} RESET role").format(sql.Identifier(owned["db"])))
        with contextlib.suppress(psycopg.Error):
            attacker.execute(
                sql.SQL(
                    "CREATE OR REPLACE PROCEDURE public.idem_cleanup(p_batch_size integer DEFAULT 1000,"
                    " INOUT p_deleted bigint DEFAULT NULL, p_pause_ms integer DEFAULT 0,"
                    " p_max_rows_per_second integer DEFAULT 2500)"
                    " LANGUAGE plpgsql AS $$BEGIN ALTER ROLE {} SUPERUSER; END$$"
                ).format(sql.Identifier(owned["role"]))
            )
    with pinned(owned["url"]) as dba, contextlib.suppress(psycopg.Error):
        dba.execute("CALL public.idem_cleanup()")  # what the pg_cron job runs, as the DBA
    with pinned(owned["url"]) as conn:
        row = conn.execute("SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = %s", (owned["role"],))
        assert row.fetchone() == (False,)


@pytest.mark.parametrize("verb", ["status", "stats"])
def test_the_dbas_tools_answer_as_the_dba_whatever_role_the_owner_set(
    tmp_path: Path, migrated: dict[str, str], verb: str
) -> None:
    """The same default on a store the DBA made: ``idem status`` failed on a permission the owner
    lacks, and ``flask idempotency stats`` told the superuser to GRANT idem_admin to itself.
    Safe: each answers as the DBA, as with no setting."""
    set_database(migrated, role=migrated["role"])
    if verb == "status":
        done = _ran([testdb.idem_command(), "status", "--database-url", migrated["url"], "--wait-timeout", "1"])
    else:
        done = _admin_verb(tmp_path, migrated, verb)
    assert done.returncode == 0 and not done.stderr.strip(), done.stdout + done.stderr


def test_the_idem_sql_script_says_what_it_did_whatever_the_owner_set_for_messages(owned: dict[str, str]) -> None:
    """The owner's ``client_min_messages = error`` silenced what the install tells the DBA: each
    migration applied, the cleanup's scheduling hints and warnings (NOTICE, WARNING). Safe: the
    DBA hears them as with no setting."""
    script = idem("sql")
    assert script.returncode == 0, script.stderr
    set_database(owned, client_min_messages="error")
    done = _ran(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", owned["url"]], input=script.stdout)
    assert done.returncode == 0, done.stderr
    assert "NOTICE:  idem: applied migration 0001.host-tables" in done.stderr, done.stderr


def test_the_dbas_tools_sessions_hear_notices_whatever_the_owner_set(owned: dict[str, str]) -> None:
    """The same for every session of idem migrate, idem status and the admin verbs (one pin,
    schema/connection.py): the cleanup's 'pace too slow' NOTICE, the schedule's hints."""
    set_database(owned, client_min_messages="error")
    with connect(owned["url"]) as conn:
        assert conn.execute("SHOW client_min_messages").fetchone() == ("notice",)
