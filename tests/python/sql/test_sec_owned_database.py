"""What the app's login role can make the store's owner run where it owns its database, past
idem's DDL guard (contract §3a: no routine runs a caller's code, whoever calls it).

The attacker is a plain login role, a member of ``idem_app``, that owns its database
(``CREATE DATABASE app OWNER web``); a superuser ran ``idem migrate`` into it. The guard refuses
dropping idem's objects in ``public``, but the database's owner may still own what idem's code
names beside its own objects, or put a schema of its own before ``public`` on a DBA's path.

Each test asserts the safe outcome (the attacker stays a plain role, nothing it planted ran as
anyone else), so it fails while the hole is open.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from tests.python.support.owned import idem, pinned
from tests.python.support.sqlapi import new_key

ROOT = Path(__file__).resolve().parents[3]

#: Logs who ran it, and escalates the attacker when a superuser does.
SPY = """
CREATE FUNCTION {schema}.spy(p_what text) RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $f$ BEGIN
    IF current_user <> {attacker} THEN
        INSERT INTO public.spy_log (who, what) VALUES (current_user, p_what);
        IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
            EXECUTE {escalate};
        END IF;
    END IF;
END $f$"""


def spy(conn: psycopg.Connection[Any], owned: dict[str, str], schema: str = "public") -> None:
    """The attacker's log (written by whoever runs its code) and its spy function."""
    conn.execute("CREATE TABLE public.spy_log (who text, what text)")
    conn.execute("GRANT INSERT, SELECT ON public.spy_log TO PUBLIC")
    conn.execute(
        sql.SQL(SPY).format(
            schema=sql.Identifier(schema),
            attacker=sql.Literal(owned["role"]),
            escalate=sql.Literal(f"ALTER ROLE {sql.Identifier(owned['role']).as_string(conn)} SUPERUSER"),
        )
    )


def outcome(owned: dict[str, str]) -> tuple[bool, list[Any]]:
    with pinned(owned["url"]) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = %s", (owned["role"],)).fetchone()
        ran = conn.execute("SELECT who, what FROM public.spy_log").fetchall()
    assert row is not None
    return bool(row[0]), ran


def migrate_and_grant(owned: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = idem("migrate", "--database-url", owned["url"])
    if done.returncode == 0:
        with pinned(owned["url"]) as conn:
            conn.execute(sql.SQL("GRANT idem_app TO {}").format(sql.Identifier(owned["role"])))
    return done


def test_a_pgcrypto_the_database_owner_created_never_runs_its_code_as_the_store_owner(
    owned: dict[str, str],
) -> None:
    """pgcrypto is a trusted extension: the database's owner may create it, and then owns it (its
    functions are the bootstrap superuser's). idem migrate keeps a pgcrypto it finds in public,
    and the DDL guard watches idem's names only: the extension's owner drops it afterwards and
    creates its own public.pgp_sym_encrypt and public.armor, which idem_encrypt_response (called
    by the SECURITY DEFINER idem_complete with the caller's own p_response_key) runs as the
    store's owner, a superuser. Safe: migrate refuses that pgcrypto, or nothing planted runs."""
    with pinned(owned["attacker_url"]) as conn:
        conn.execute("CREATE EXTENSION pgcrypto WITH SCHEMA public")  # the app's own migration, before idem's
    done = migrate_and_grant(owned)
    if done.returncode != 0:
        assert "pgcrypto" in done.stdout + done.stderr, done.stdout + done.stderr
        return
    refused = []
    with pinned(owned["attacker_url"]) as conn:
        spy(conn, owned)
        for statement in (
            "DROP EXTENSION pgcrypto",
            "CREATE FUNCTION public.pgp_sym_encrypt(text, text, text) RETURNS bytea LANGUAGE plpgsql"
            " AS $f$ BEGIN PERFORM public.spy('public.pgp_sym_encrypt'); RETURN pg_catalog.convert_to($1, 'UTF8');"
            " END $f$",
            "CREATE FUNCTION public.armor(bytea) RETURNS text LANGUAGE sql"
            " AS $f$ SELECT pg_catalog.encode($1, 'hex') $f$",
        ):
            try:
                conn.execute(statement)
            except psycopg.Error as exc:
                refused.append(f"{exc.sqlstate}: {exc.diag.message_primary}")
        try:
            conn.execute(
                "SELECT public.idem_complete(p_key_id => c.key_id, p_response_code => 201,"
                " p_response_body => '{\"order_id\": 1}', p_claim_token => c.claim_token,"
                " p_response_key => 'k3y-0123456789-abcdefghijklmnopqrstuvwxyz')"
                " FROM public.idem_claim(p_key => %s, p_user_id => NULL, p_endpoint => 'POST /orders',"
                " p_request => '{}') c",
                (new_key(),),
            )
        except psycopg.Error as exc:
            refused.append(f"{exc.sqlstate}: {exc.diag.message_primary}")
    superuser, ran = outcome(owned)
    assert not superuser and not ran, (
        f"idem_complete ran the pgcrypto look-alike of the database's owner as {ran}"
        f" (the attacker is a superuser now: {superuser}); refused: {refused}"
    )


def _documented_cleanup_calls() -> list[str]:
    """The psql command docs/operations.md and the cleanup's own HINT give a DBA."""
    text = (ROOT / "docs" / "operations.md").read_text()
    calls = re.findall(r"^idem=# (CALL [\w.]*idem_cleanup\([^)]*\);)$", text, re.M)
    hint = re.findall(
        r"in psql: ROLLBACK, then (CALL [\w.]*idem_cleanup\(\);)",
        (ROOT / "sql" / "functions" / "080_idem_cleanup.sql").read_text(),
    )
    return sorted(set(calls + hint))


def test_the_dbas_documented_cleanup_in_psql_never_runs_a_schema_the_database_owner_made(
    owned: dict[str, str],
) -> None:
    """A session's default path is ``"$user", public``: the database's owner creates a schema
    named for the DBA (here the superuser that migrated) and in it a procedure with
    idem_cleanup's very signature; no ALTER DATABASE, nothing in public. The DBA then types in
    psql what docs/operations.md and the cleanup's HINT say. Safe: the guard refuses the
    procedure, and the command reaches idem's (or idem migrate/status refuse such a database first)."""
    calls = _documented_cleanup_calls()
    assert calls, "docs/operations.md names no CALL idem_cleanup() for psql"
    assert migrate_and_grant(owned).returncode == 0
    with pinned(owned["attacker_url"]) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(owned["dba"])))
        spy(conn, owned)
        try:  # idem's DDL guard refuses idem's names in every schema: then nothing is planted
            conn.execute(
                sql.SQL(
                    "CREATE PROCEDURE {}.idem_cleanup(p_batch_size integer DEFAULT 1000,"
                    " INOUT p_deleted bigint DEFAULT NULL,"
                    " p_pause_ms integer DEFAULT 0, p_max_rows_per_second integer DEFAULT 2500) LANGUAGE plpgsql"
                    " AS $f$ BEGIN PERFORM public.spy('the DBA''s CALL idem_cleanup()'); END $f$"
                ).format(sql.Identifier(owned["dba"]))
            )
        except psycopg.errors.InsufficientPrivilege as exc:
            assert "idem_ddl_guard: CREATE PROCEDURE refused" in str(exc.diag.message_primary), exc
    status = idem("status", "--database-url", owned["url"])
    if status.returncode != 0:
        assert owned["dba"] in status.stdout + status.stderr, status.stdout + status.stderr
        return
    for call in calls:
        done = subprocess.run(
            ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", owned["url"], "-c", call],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    superuser, ran = outcome(owned)
    assert not superuser and not ran, (
        f"{calls} in the DBA's psql ran the database owner's schema {owned['dba']!r} as {ran}"
        f" (the attacker is a superuser now: {superuser})"
    )


def test_the_database_owner_cannot_drop_the_indexes_idem_relies_on(owned: dict[str, str]) -> None:
    """The owner of a schema may drop any index in it; the guard judges a dropped object by its
    name (idem's start with ``idem``, its indexes with ``idx_idem`` or ``uq_idem``), so DROP INDEX
    of idem's indexes passes: the cleanup's ``idx_idem_keys_expires`` (every batch then scans the
    table, the nightly job included) and ``uq_idem_events_lost_claim``, the unique index that keeps
    one ``lost_claim`` event per key (idem_record_lost_claim's ``ON CONFLICT DO NOTHING`` then
    stores every report). Safe: each drop is refused (42501) and the index is still there."""
    assert migrate_and_grant(owned).returncode == 0
    with pinned(owned["url"]) as conn:
        indexes = [
            str(r[0])
            for r in conn.execute(
                "SELECT c.relname FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid"
                " WHERE i.indrelid IN ('public.idempotency_keys'::regclass, 'public.idempotency_events'::regclass)"
                "   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint c WHERE c.conindid = i.indexrelid)"
                " ORDER BY 1"
            )
        ]
    assert "idx_idem_keys_expires" in indexes and "uq_idem_events_lost_claim" in indexes, indexes
    dropped = []
    with pinned(owned["attacker_url"]) as conn:
        for index in indexes:
            try:
                conn.execute(sql.SQL("DROP INDEX public.{}").format(sql.Identifier(index)))
                dropped.append(index)
            except psycopg.Error as exc:
                assert exc.sqlstate == "42501", f"{index}: {exc.sqlstate} {exc.diag.message_primary}"
    with pinned(owned["url"]) as conn:
        left = {
            str(r[0])
            for r in conn.execute("SELECT c.relname FROM pg_catalog.pg_class c WHERE c.relname = ANY (%s)", (indexes,))
        }
    assert not dropped and left == set(indexes), (
        f"the database's owner dropped idem's indexes {dropped}; left: {sorted(left)}"
    )


#: Overloads of the pgcrypto functions idem's definers call as ``public.<name>`` (idem_complete's
#: encryption, a replay's decryption), each with one more, defaulted argument: the definer's call
#: then matches both and PostgreSQL cannot choose (42725).
PGCRYPTO_SHADOWS = (
    "CREATE FUNCTION public.armor(bytea, p_pad integer DEFAULT 0) RETURNS text LANGUAGE sql RETURN 'x'",
    "CREATE FUNCTION public.dearmor(text, p_pad integer DEFAULT 0) RETURNS bytea LANGUAGE sql RETURN '\\x00'::bytea",
    "CREATE FUNCTION public.pgp_sym_encrypt(text, text, text, p_pad integer DEFAULT 0) RETURNS bytea"
    " LANGUAGE sql RETURN '\\x00'::bytea",
    "CREATE FUNCTION public.pgp_sym_decrypt(bytea, text, p_pad integer DEFAULT 0) RETURNS text LANGUAGE sql RETURN 'x'",
)


@pytest.fixture
def other_superuser(admin_url: str, owned: dict[str, str]) -> Iterator[str]:
    """A second superuser, the DBA's own login (the store's owner is whoever runs idem migrate);
    what it owns in the owned database is handed back before it is dropped."""
    name = f"dba_{uuid.uuid4().hex[:8]}"
    with pinned(admin_url) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with pinned(owned["url"]) as conn:
            conn.execute(
                sql.SQL("REASSIGN OWNED BY {} TO {}").format(sql.Identifier(name), sql.Identifier(owned["dba"]))
            )
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        with pinned(admin_url) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_an_overload_of_pgcryptos_functions_never_stops_an_encrypted_answer(
    owned: dict[str, str], other_superuser: str
) -> None:
    """The guard refuses a routine in public under the name of one of the store owner's; idem's
    definers also call pgcrypto's public.armor, dearmor, pgp_sym_encrypt and pgp_sym_decrypt, which
    are the bootstrap superuser's, not the store owner's, where another superuser ran idem migrate
    over a pgcrypto that was there (a template's, or made by postgres before). The database's
    owner then overloads them and every encrypted completion and replay is 42725 for everyone.
    Safe: each overload is refused (42501), and an encrypted answer is stored and replayed."""
    with pinned(owned["url"]) as conn:
        conn.execute("CREATE EXTENSION pgcrypto WITH SCHEMA public")  # the bootstrap superuser's
    parts = urlsplit(owned["url"])
    done = idem(
        "migrate",
        "--database-url",
        urlunsplit(parts._replace(netloc=f"{other_superuser}@{parts.netloc.split('@')[-1]}")),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with pinned(owned["url"]) as conn:
        conn.execute(sql.SQL("GRANT idem_app TO {}").format(sql.Identifier(owned["role"])))
    planted = []
    with pinned(owned["attacker_url"]) as conn:
        for statement in PGCRYPTO_SHADOWS:
            try:
                conn.execute(statement)
                planted.append(statement.split("(")[0].removeprefix("CREATE FUNCTION "))
            except psycopg.errors.InsufficientPrivilege as exc:
                assert "idem_ddl_guard: CREATE FUNCTION refused" in str(exc.diag.message_primary), exc
    key, secret = new_key(), "k3y-0123456789-abcdefghijklmnopqrstuvwxyz"
    claimed = "SELECT c.* FROM public.idem_claim(p_key => %s, p_user_id => NULL, p_endpoint => 'POST /orders',"
    claimed += " p_request => '{}', p_response_key => %s) c"
    answers: list[object] = []
    with psycopg.connect(owned["attacker_url"], autocommit=True) as app:  # a new session: planned anew
        try:
            c = app.execute(claimed.replace("c.*", "c.key_id, c.claim_token"), (key, secret)).fetchone()
            assert c is not None
            app.execute(
                "SELECT public.idem_complete(p_key_id => %s, p_response_code => 201,"
                " p_response_body => '{\"order_id\": 1}', p_claim_token => %s, p_response_key => %s)",
                (*c, secret),
            )
            replay = app.execute(claimed.replace("c.*", "c.outcome, c.response_body"), (key, secret)).fetchone()
            answers.append(replay)
        except psycopg.Error as exc:
            answers.append(f"{exc.sqlstate}: {exc.diag.message_primary}")
    assert not planted and answers == [("replay", {"order_id": 1})], (
        f"the database's owner overloaded {planted}; the encrypted answer: {answers}"
    )


def test_an_overload_of_pgcryptos_functions_planted_before_the_first_migrate_is_refused(owned: dict[str, str]) -> None:
    """Before idem's first migrate no guard exists and pgcrypto may not either (migration 0004
    makes it): the database's owner commits an overload of each pgcrypto function idem's definers
    call in public, which CREATE EXTENSION keeps beside its own (another signature). Every
    encrypted completion after would be 42725. Safe: idem migrate refuses, naming each."""
    with pinned(owned["attacker_url"]) as conn:
        for statement in PGCRYPTO_SHADOWS:
            conn.execute(statement)
    done = migrate_and_grant(owned)
    said = done.stdout + done.stderr
    names = [statement.split("(")[0].removeprefix("CREATE FUNCTION ") for statement in PGCRYPTO_SHADOWS]
    assert done.returncode != 0 and all(f"routine {name}(" in said for name in names), (
        f"migrate: {done.returncode}; it should name {names}: {said}"
    )


#: What a forged line of the refusal says.
FORGED = "idem migrate: nothing to do; the store is up to date"


@pytest.mark.parametrize("verb", ["migrate", "sql-psql", "status"])
def test_a_name_the_database_owner_picked_never_writes_a_line_of_its_own_into_a_refusal(
    owned: dict[str, str], verb: str
) -> None:
    """A routine's name is any text its maker picks, newlines included, and the preflight's refusal
    (schema/sql/owners.sql) names each routine under an idem_ name another role made: the database's
    owner makes one whose name ends the line and writes one that reads as idem's own (psql prints
    every line), or cuts the error there (idem migrate and idem status say its first line), the
    reason and the fix unsaid. Safe: the refusal names it and says what to do, and no line of the
    output is the owner's."""
    with pinned(owned["attacker_url"]) as conn:
        conn.execute(
            sql.SQL("CREATE FUNCTION public.{}() RETURNS integer LANGUAGE sql RETURN 1").format(
                sql.Identifier(f"idem_x\n{FORGED}\n")
            )
        )
    if verb == "sql-psql":
        script = idem("sql")
        assert script.returncode == 0, script.stderr
        done = subprocess.run(
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", owned["url"]],
            input=script.stdout,
            capture_output=True,
            text=True,
            timeout=300,
        )
    else:
        done = idem(verb, "--database-url", owned["url"])
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "routine public." in said and "a superuser drops it" in said, said
    assert FORGED not in [line.strip() for line in said.splitlines()], said


@pytest.mark.parametrize("verb", ["migrate", "sql-psql"])
def test_a_column_name_of_the_host_audit_log_never_writes_a_line_of_its_own_into_a_refusal(
    owned: dict[str, str], verb: str
) -> None:
    """The database's owner made the host's audit_log with a column of its own, NOT NULL without
    a default (a replay could not insert there), named with a newline and a line that reads as
    idem's; the DBA hands the table to the store's owner, as idem's first refusal says. The
    preflight then refuses the table's shape, naming that column. Safe: the refusal says what
    does not fit, and no line of the output is the owner's."""
    with pinned(owned["attacker_url"]) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE public.audit_log (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,"
                " user_id integer, action text NOT NULL, context jsonb NOT NULL DEFAULT '{{}}', {} integer NOT NULL)"
            ).format(sql.Identifier(f"x\n{FORGED}\n"))
        )
    with pinned(owned["url"]) as conn:
        conn.execute("ALTER TABLE public.audit_log OWNER TO postgres")
    if verb == "sql-psql":
        script = idem("sql")
        assert script.returncode == 0, script.stderr
        done = subprocess.run(
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", owned["url"]],
            input=script.stdout,
            capture_output=True,
            text=True,
            timeout=300,
        )
    else:
        done = idem(verb, "--database-url", owned["url"])
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "is NOT NULL without a default" in said, said
    assert FORGED not in [line.strip() for line in said.splitlines()], said
