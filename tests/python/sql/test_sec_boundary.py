"""The privilege boundary from outside (SPEC §3a), each attack as the attacker makes it:
a login role that is a member of ``idem_app`` (a handler with SQL injection), over its own
connection. Every attack is refused with a clear error and changes nothing; the legitimate call
beside it still works. Also: the linter's refusal of an unpinned definer, pgcrypto outside
``public`` refused by ``idem migrate``, and an erasure that leaves nothing of the user anywhere.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import testdb
from tests.python.support.roles import login_role
from tests.python.support.sqlapi import DictConnection, claim, complete, connect, fail, heartbeat, new_key, one

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def web(fresh_admin_url: str) -> Iterator[str]:
    """A handler's login role: a member of idem_app, nothing more."""
    with login_role(fresh_admin_url, "idem_app") as (_, url):
        yield url


@pytest.fixture
def dba(fresh_admin_url: str) -> Iterator[str]:
    """A DBA's login role: a member of idem_admin."""
    with login_role(fresh_admin_url, "idem_admin", prefix="dba") as (_, url):
        yield url


def _store(admin: DictConnection) -> list[Any]:
    return (
        admin.execute(
            "SELECT id, status, response_code, response_body, response_headers, locked_at, expires_at "
            "FROM idempotency_keys ORDER BY id"
        ).fetchall()
        + admin.execute("SELECT event, key_id, scope_user_id FROM idempotency_events ORDER BY id").fetchall()
    )


def _refused(conn: DictConnection, query: str, params: Any, sqlstate: str) -> str:
    with pytest.raises(psycopg.Error) as raised:
        conn.execute(query, params)
    assert raised.value.sqlstate == sqlstate, raised.value
    return str(raised.value.diag.message_primary)


def test_a_handler_cannot_forge_complete_fail_renew_or_report_another_users_claim(
    fresh_admin_url: str, web: str
) -> None:
    with connect(fresh_admin_url) as admin, connect(web) as attacker, connect(web) as victim:
        uid = one(admin, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"]
        theirs = claim(victim, new_key(), user_id=uid)
        mine = claim(attacker, new_key())
        before = _store(admin)
        forged = {"p_response_body": '{"forged": true}', "p_response_headers": '{"Location": "/evil"}'}
        message = _refused(
            attacker,
            "SELECT idem_complete(p_key_id => %(id)s, p_response_code => 201, p_response_body => %(p_response_body)s,"
            " p_response_headers => %(p_response_headers)s)",
            {"id": theirs["key_id"], **forged},
            "IDM00",
        )
        assert "p_claim_token is required" in message
        _refused(
            attacker,
            "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{}',"
            " p_claim_token => %s)",
            (theirs["key_id"], mine["claim_token"]),
            "IDM01",
        )
        _refused(attacker, "SELECT idem_fail(p_key_id => %s)", (theirs["key_id"],), "IDM00")
        _refused(attacker, "SELECT idem_heartbeat(p_key_id => %s)", (theirs["key_id"],), "IDM00")
        _refused(attacker, "SELECT idem_record_lost_claim(p_key_id => %s, p_endpoint => 'POST /x')", (10**9,), "IDM00")
        assert _store(admin) == before, "a refused attack changed the store"
        # the legitimate holders, beside the attacks, still work with their own tokens
        heartbeat(victim, theirs)
        complete(victim, theirs, body={"order": 1})
        fail(attacker, mine, 500)
        assert claim(victim, theirs_key(admin, theirs), user_id=uid)["outcome"] == "replay"


def theirs_key(admin: DictConnection, row: dict[str, Any]) -> str:
    return str(one(admin, "SELECT idem_key FROM idempotency_keys WHERE id = %s", (row["key_id"],))["idem_key"])


def test_a_handler_cannot_move_the_clock_clean_up_rekey_or_read_health(fresh_admin_url: str, web: str) -> None:
    with connect(fresh_admin_url) as admin, connect(web) as attacker:
        live = claim(attacker, new_key())
        complete(attacker, live)
        before = _store(admin)
        key = new_key()
        message = _refused(
            attacker,
            "SELECT * FROM idem_claim(p_key => %s, p_user_id => NULL, p_endpoint => 'POST /x', p_request => '{}',"
            " p_now => now() + interval '50 years')",
            (key,),
            "IDM00",
        )
        assert "only the functions' owner may pass it" in message
        for query in (
            "SELECT idem_cleanup_batch(p_batch_size => 10, p_now => 'infinity')",
            "CALL idem_cleanup()",
            "SELECT * FROM idem_reencrypt_responses(NULL, 'attacker-key-attacker-key-attacker-key', 0, 100)",
            "SELECT * FROM idem_response_key_census(NULL)",
            "SELECT * FROM idem_health()",
            "SELECT * FROM idem_health",
            "SELECT * FROM idem_inspect(%s)",
            "SELECT * FROM idem_secret",
            "SELECT idem_claim_token(1)",
        ):
            _refused(attacker, query, (key,) if "%s" in query else None, "42501")
        assert _store(admin) == before
        assert claim(attacker, theirs_key(admin, live))["outcome"] == "replay"  # the live key survived


def test_a_dba_in_idem_admin_runs_cleanup_and_health_and_completes_by_key_id(fresh_admin_url: str, dba: str) -> None:
    with connect(fresh_admin_url) as admin, connect(dba) as conn:
        held = claim(admin, new_key())
        conn.execute(
            "SELECT idem_complete(p_key_id => %s, p_response_code => 200, p_response_body => '{}')", (held["key_id"],)
        )  # a DBA's named-argument call, no token
        assert conn.execute("CALL idem_cleanup()").fetchone() == {"p_deleted": 0}
        assert conn.execute("SELECT count(*) AS n FROM idem_health").fetchone() is not None
        _refused(conn, "SELECT idem_cleanup_batch(p_batch_size => 10, p_now => 'infinity')", None, "IDM00")


def test_erasure_leaves_nothing_of_the_user_in_any_table_of_the_store(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as admin:
        uid, other = (one(admin, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"] for _ in range(2))
        for user in (uid, other):
            complete(admin, claim(admin, new_key(), user_id=user), body={"balance": 100})
            stale = new_key()
            claim(admin, stale, user_id=user)
            admin.execute(
                "UPDATE idempotency_keys SET locked_at = locked_at - interval '1 hour' WHERE idem_key = %s", (stale,)
            )
            assert claim(admin, stale, user_id=user)["outcome"] == "stale"  # a stale_heal event naming the user
        assert admin.execute("SELECT idem_erase_user(%s) AS n", (uid,)).fetchone() == {"n": 1}
        tables = [
            r["t"]
            for r in admin.execute(
                "SELECT c.oid::regclass::text AS t FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind = 'r'"
                " AND (c.relname LIKE 'idem%' OR c.relname LIKE 'idempotency%')"
            )
        ]
        assert {"idempotency_keys", "idempotency_events", "idem_secret"} <= set(tables)
        for table in tables:
            rows = admin.execute(sql.SQL("SELECT to_jsonb(t) AS r FROM {} t").format(sql.Identifier(table))).fetchall()
            mentions = [r["r"] for r in rows if r["r"].get("scope_user_id") == uid or f'"user_id": {uid}' in str(r)]
            assert mentions == [], f"{table} still holds user {uid}: {mentions}"
        assert admin.execute("SELECT idem_export_user(%s) AS e", (uid,)).fetchone() == {"e": []}
        kept = one(admin, "SELECT count(*) AS n FROM idempotency_events WHERE scope_user_id = %s", (other,))
        assert kept["n"] == 1, "another user's events must stay"


def test_lint_refuses_a_security_definer_without_the_pinned_search_path(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
        ok = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "lint_sql.py"), fresh_admin_url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ok.returncode == 0, ok.stdout + ok.stderr
        admin.execute(
            "CREATE FUNCTION idem_unpinned() RETURNS int LANGUAGE sql SECURITY DEFINER "
            "SET search_path = '' AS $$ SELECT 1 $$"
        )
        bad = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "lint_sql.py"), fresh_admin_url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert bad.returncode == 1
    assert "idem_unpinned(): error: SECURITY DEFINER without `SET search_path = pg_catalog, pg_temp`" in bad.stdout


def test_idem_migrate_refuses_pgcrypto_outside_public_and_changes_nothing(admin_url: str) -> None:
    name = f"idem_sec_{uuid.uuid4().hex[:8]}"
    url = testdb.create(admin_url, name)
    try:
        with connect(url) as conn:
            conn.execute("CREATE SCHEMA crypto")
            conn.execute("CREATE EXTENSION pgcrypto WITH SCHEMA crypto")
        done = subprocess.run(
            [testdb.idem_command(), "migrate", "--database-url", url], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 1
        assert "pgcrypto is installed in schema crypto" in done.stderr
        assert "ALTER EXTENSION pgcrypto SET SCHEMA public;" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        with connect(url) as conn:
            assert conn.execute("SELECT to_regclass('public.idempotency_keys') AS t").fetchone() == {"t": None}
            conn.execute("ALTER EXTENSION pgcrypto SET SCHEMA public")  # the printed fix works
        fixed = subprocess.run(
            [testdb.idem_command(), "migrate", "--database-url", url], capture_output=True, text=True, timeout=120
        )
        assert fixed.returncode == 0, fixed.stderr
        script = subprocess.run([testdb.idem_command(), "sql"], capture_output=True, text=True, timeout=60, check=True)
        assert "pgcrypto is installed in schema" in script.stdout  # `idem sql` carries the same guard
    finally:
        testdb.drop(admin_url, name)
