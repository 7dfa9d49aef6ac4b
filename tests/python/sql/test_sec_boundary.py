"""The privilege boundary from outside (contract §3a), each attack as the attacker makes it:
a login role that is a member of ``idem_app`` (a handler with SQL injection), over its own
connection. Every attack is refused with a clear error and changes nothing; the legitimate call
beside it still works. Also: the linter's refusal of an unpinned definer, pgcrypto outside
``public`` refused by ``idem migrate``, and an erasure that leaves nothing of the user anywhere.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import testdb
from tests.python.support.owned import owned_database
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
            "SELECT idem_claim_token(1, now())",
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
        assert admin.execute("SELECT * FROM public.idem_export_user(p_user_id => %s)", (uid,)).fetchall() == []
        kept = one(admin, "SELECT count(*) AS n FROM idempotency_events WHERE scope_user_id = %s", (other,))
        assert kept["n"] == 1, "another user's events must stay"


def lint(url: str) -> subprocess.CompletedProcess[str]:
    """scripts/lint_sql.py on the database at url, as `make lint` runs it."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lint_sql.py"), url], capture_output=True, text=True, timeout=120
    )


def test_lint_refuses_a_security_definer_without_the_pinned_search_path(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
        ok = lint(fresh_admin_url)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        admin.execute(
            "CREATE FUNCTION idem_unpinned() RETURNS int LANGUAGE sql SECURITY DEFINER "
            "SET search_path = '' AS $$ SELECT 1 $$"
        )
        bad = lint(fresh_admin_url)
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


# -- the second round: another user's stored answer, tokens that come round again, stale windows,
# a writable public, the lint's rule for every routine --------------------------------------------


def test_a_handler_cannot_read_free_and_replace_another_users_stored_answer(fresh_admin_url: str, web: str) -> None:
    """The chain: export the victim's raw key and hash, erase to free the key, claim it again in
    the victim's scope, complete with a forged body and Location. Each step is refused."""
    with connect(fresh_admin_url) as admin, connect(web) as attacker, connect(web) as victim:
        uid = one(admin, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"]
        key, body = new_key(), {"qty": 1}
        theirs = claim(victim, key, user_id=uid, request=body)
        complete(victim, theirs, body={"order_id": 1})
        before = _store(admin)
        _refused(attacker, "SELECT * FROM public.idem_export_user(p_user_id => %s)", (uid,), "42501")
        _refused(attacker, "SELECT idem_erase_user(p_user_id => %s)", (uid,), "42501")
        assert _store(admin) == before
        # the key is not free: with it (which the store never told the attacker) a claim replays
        assert claim(attacker, key, user_id=uid, request=body)["outcome"] == "replay"
        forged = (
            "SELECT idem_complete(p_key_id => %s, p_response_code => 201,"
            ' p_response_body => \'{"order_id": 1, "notice": "re-verify at https://evil.example/login"}\','
            ' p_response_headers => \'{"Location": "https://evil.example/phish"}\')'
        )
        _refused(attacker, forged, (theirs["key_id"],), "IDM00")
        assert _store(admin) == before  # the replay wrote an audit row, nothing in the store
        replayed = claim(victim, key, user_id=uid, request=body)
        assert replayed["outcome"] == "replay" and replayed["response_body"] == {"order_id": 1}


def test_the_gdpr_job_in_idem_dsr_exports_and_erases_and_nothing_else(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as admin, login_role(fresh_admin_url, "idem_dsr", prefix="gdpr") as (_, url):
        uid = one(admin, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"]
        complete(admin, claim(admin, new_key(), user_id=uid), body={"balance": 1})
        with connect(url) as job:
            exported = job.execute("SELECT * FROM public.idem_export_user(p_user_id => %s)", (uid,)).fetchall()
            assert len(exported) == 1 and exported[0]["scope_user_id"] == uid
            assert one(job, "SELECT idem_erase_user(p_user_id => %s) AS n", (uid,))["n"] == 1
            for query in (
                "SELECT * FROM idem_claim(p_key => %s, p_user_id => NULL, p_endpoint => 'POST /x', p_request => '{}')",
                "SELECT * FROM idem_inspect(%s)",
                "SELECT * FROM idem_health()",
                "CALL idem_cleanup()",
            ):
                _refused(job, query, (new_key(),) if "%s" in query else None, "42501")


def test_a_token_never_fits_a_later_claim_with_the_same_key_id(fresh_admin_url: str, web: str) -> None:
    """A key_id can come round again (a Citus store's low 31 bits wrap after 2^31 claims; here the
    sequence is set back): the token an attacker kept from its own claim then names the key_id of
    another user's claim, and must not complete it."""
    with connect(fresh_admin_url) as admin, connect(web) as attacker, connect(web) as victim:
        uid = one(admin, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"]
        kept = claim(attacker, new_key(), user_id=uid)
        admin.execute("DELETE FROM idempotency_keys WHERE id = %s", (kept["key_id"],))  # expired and cleaned up
        admin.execute("SELECT setval('idempotency_keys_id_seq', %s, false)", (kept["key_id"],))
        theirs = claim(victim, new_key(), user_id=uid)
        assert theirs["key_id"] == kept["key_id"]
        assert theirs["claim_token"] != kept["claim_token"]
        before = _store(admin)
        for query in (
            "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{\"forged\": true}',"
            " p_claim_token => %s)",
            "SELECT idem_fail(p_key_id => %s, p_claim_token => %s)",
            "SELECT idem_fail(p_key_id => %s, p_claim_token => %s, p_release => true)",
            "SELECT idem_heartbeat(p_key_id => %s, p_claim_token => %s)",
        ):
            _refused(attacker, query, (theirs["key_id"], kept["claim_token"]), "IDM01")
        assert _store(admin) == before
        # reporting its own lost claim is the attacker's right; the victim's claim stays as it was
        attacker.execute(
            "SELECT idem_record_lost_claim(p_key_id => %s, p_claim_token => %s)",
            (theirs["key_id"], kept["claim_token"]),
        )
        assert _store(admin)[0] == before[0]
        complete(victim, theirs, body={"order_id": 2})  # the holder's own token still works


def test_a_handler_cannot_heal_with_a_stale_window_below_a_second(fresh_admin_url: str, web: str) -> None:
    """A stale window of a millisecond would let any member of idem_app heal a key at will and
    fill idem_health with stale heals and lost claims; below a second is the owner's and a DBA's."""
    with (
        connect(fresh_admin_url) as admin,
        connect(web) as attacker,
        login_role(fresh_admin_url, "idem_admin", prefix="dba") as (_, dba_url),
    ):
        key = new_key()
        claim(attacker, key)
        time.sleep(0.02)  # the claim is older than the millisecond stale window asked for below
        before = _store(admin)
        message = _refused(
            attacker,
            "SELECT * FROM idem_claim(p_key => %s, p_user_id => NULL, p_endpoint => 'POST /api/trading/orders',"
            " p_request => '{\"qty\": 1}', p_stale_after => '1 millisecond')",
            (key,),
            "IDM00",
        )
        assert "p_stale_after" in message and "1 second" in message, message
        assert _store(admin) == before
        assert claim(attacker, key, stale_after="1 second")["outcome"] == "in_flight"
        with connect(dba_url) as dba:
            assert claim(dba, key, stale_after="1 millisecond")["outcome"] == "stale"


@pytest.mark.parametrize("writable_by", ["the database owner", "PUBLIC", "a granted member"])
def test_migrate_and_status_say_when_public_is_writable_by_the_app(admin_url: str, writable_by: str) -> None:
    with owned_database(admin_url, owned=writable_by == "the database owner", prefix="idem_pub") as setup:
        role, url = setup["role"], setup["url"]
        with connect(url) as conn:
            if writable_by == "PUBLIC":
                conn.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
            elif writable_by == "a granted member":
                conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
        first = subprocess.run(
            [testdb.idem_command(), "migrate", "--database-url", url], capture_output=True, text=True
        )
        assert first.returncode == 0, first.stderr
        with connect(url) as conn:
            conn.execute(sql.SQL("GRANT idem_app TO {}").format(sql.Identifier(role)))
        for verb in ("migrate", "status"):
            done = subprocess.run([testdb.idem_command(), verb, "--database-url", url], capture_output=True, text=True)
            lines = [line for line in (done.stdout + done.stderr).splitlines() if "schema public is writable" in line]
            assert len(lines) == 1, f"idem {verb}: {done.stdout}{done.stderr}"
            who = "PUBLIC" if writable_by == "PUBLIC" else role
            # public's owner cannot be revoked from: it is handed to the store's owner instead
            fix = (
                f"ALTER SCHEMA public OWNER TO postgres; GRANT USAGE ON SCHEMA public TO {role};"
                if writable_by == "the database owner"
                else "REVOKE CREATE ON SCHEMA public"
            )
            assert who in lines[0] and fix in lines[0], lines[0]
        # the printed fix works: the line is gone
        with connect(url) as conn:
            if writable_by == "the database owner":
                conn.execute("ALTER SCHEMA public OWNER TO postgres")
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(role)))
            else:
                conn.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC, {}").format(sql.Identifier(role)))
        done = subprocess.run([testdb.idem_command(), "status", "--database-url", url], capture_output=True, text=True)
        assert "schema public is writable" not in done.stdout + done.stderr


def test_a_store_owned_by_a_trusted_role_says_nothing_of_public(fresh_admin_url: str) -> None:
    done = subprocess.run(
        [testdb.idem_command(), "status", "--database-url", fresh_admin_url], capture_output=True, text=True
    )
    assert "writable" not in done.stdout + done.stderr, done.stdout


@pytest.mark.parametrize(
    ("routine", "complaint"),
    [
        (
            "CREATE PROCEDURE idem_unpinned_proc() LANGUAGE plpgsql AS $$ BEGIN COMMIT; END $$",
            "idem_unpinned_proc(): error: a procedure must set",
        ),
        (
            "CREATE FUNCTION idem_unpinned_sql() RETURNS float8 LANGUAGE sql AS $$ SELECT 1::float8 / 2 $$",
            "idem_unpinned_sql(): error: neither `SET search_path = pg_catalog, pg_temp` nor a SQL-standard body",
        ),
        (
            "CREATE FUNCTION idem_unpinned_plpgsql() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END $$",
            "idem_unpinned_plpgsql(): error: neither `SET search_path = pg_catalog, pg_temp` nor a SQL-standard body",
        ),
        (  # an untyped NULL: an overload public.idem_scope(text) would win the call
            "CREATE FUNCTION idem_untyped_call() RETURNS int LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp"
            " AS $$ BEGIN RETURN public.idem_scope(NULL); END $$",
            "idem_untyped_call(): error: public.idem_scope gets an untyped NULL for its idem_user_id parameter",
        ),
        (  # a variable of another type: an overload public.idem_key_scope(integer) would win
            "CREATE FUNCTION idem_loose_call(p_id integer) RETURNS int LANGUAGE plpgsql"
            " SET search_path = pg_catalog, pg_temp AS $$ BEGIN RETURN public.idem_key_scope(p_id); END $$",
            "idem_loose_call(integer): error: public.idem_key_scope gets p_id (integer) for its bigint parameter",
        ),
        (  # read as '\x00' or as 'x00' depending on the caller's standard_conforming_strings
            "CREATE FUNCTION idem_backslash() RETURNS bytea LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp"
            " AS $$ BEGIN RETURN '\\x00'::bytea; END $$",
            "idem_backslash(): error: backslash in the plain literal '\\x00'",
        ),
    ],
)
def test_lint_refuses_any_routine_that_resolves_names_through_the_callers_path(
    fresh_admin_url: str, routine: str, complaint: str
) -> None:
    with connect(fresh_admin_url) as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
        admin.execute(routine)
        bad = lint(fresh_admin_url)
    assert bad.returncode == 1
    assert complaint in bad.stdout, bad.stdout


@pytest.mark.parametrize(
    "token", ["a" * 48, "f" * 48, "0" * 48, "0" * 32, "", "x" * 10_000, "0" * 32 + "7" + "f" * 15, "A" * 48]
)
def test_a_forged_token_of_any_shape_is_a_lost_claim_and_changes_nothing(
    fresh_admin_url: str, web: str, token: str
) -> None:
    with connect(fresh_admin_url) as admin, connect(web) as attacker, connect(web) as victim:
        theirs = claim(victim, new_key())
        before = _store(admin)
        for query in (
            "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{}',"
            " p_claim_token => %s)",
            "SELECT idem_fail(p_key_id => %s, p_claim_token => %s, p_release => true)",
            "SELECT idem_heartbeat(p_key_id => %s, p_claim_token => %s)",
            "SELECT idem_record_lost_claim(p_key_id => %s, p_claim_token => %s)",
        ):
            _refused(attacker, query, (theirs["key_id"], token), "IDM01")
        assert _store(admin) == before
