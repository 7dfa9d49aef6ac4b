"""The app role cannot run its own code inside idem's SECURITY DEFINER functions (contract §3a).

The attack: a login role that is a member of ``idem_app`` plants ``pg_temp`` domains
over the types the function bodies name (``text``, ``jsonb``, ...) whose CHECK calls a planted
function; PostgreSQL searches ``pg_temp`` first for types unless it is placed last in the
function's ``search_path``, so the CHECK ran as the functions' owner (a superuser) and made the
attacker a superuser. Here a real second session, logged in as such a role, plants every kind of
object and then calls every function ``idem_app`` may execute through each of its code paths;
nothing planted may run and the role stays a plain member of ``idem_app``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from tests.python.support.roles import login_role
from tests.python.support.sqlapi import DictConnection, new_key, one

#: Every type name a body might write without a schema, and the aliases PostgreSQL maps to them.
PLANTED_TYPES = (
    "text",
    "jsonb",
    "json",
    "timestamptz",
    "int4",
    "int8",
    "int2",
    "integer",
    "bigint",
    "bool",
    "bytea",
    "interval",
    "uuid",
    "varchar",
    "numeric",
    "float8",
    "regclass",
)
#: Functions and a table a body might call or read unqualified (pg_temp is never searched for
#: functions, but a planted one must not run even if it were).
PLANTED_FUNCTIONS = (
    "now()",
    "clock_timestamp()",
    "sha256(bytea)",
    "encode(bytea, text)",
    "format(text)",
    "jsonb_build_object()",
    "idem_canonical_key(text)",
)


def _plant(conn: DictConnection, attacker: str) -> None:
    conn.execute(
        sql.SQL("""
        CREATE FUNCTION pg_temp.pwn(v anyelement) RETURNS boolean LANGUAGE plpgsql AS $$
        BEGIN
            IF current_user <> session_user THEN  -- running as a definer: escalate
                EXECUTE {alter};
                PERFORM set_config('idem.pwned', 'yes: ' || current_user, false);
            END IF;
            RETURN true;
        END $$""").format(alter=sql.Literal(f"ALTER ROLE {attacker} SUPERUSER"))
    )
    conn.execute("CREATE FUNCTION pg_temp.pwn0() RETURNS boolean LANGUAGE sql AS $$ SELECT pg_temp.pwn(1) $$")
    for name in PLANTED_TYPES:
        base = {"integer": "int4", "bigint": "int8"}.get(name, name)
        conn.execute(
            sql.SQL("CREATE DOMAIN pg_temp.{} AS pg_catalog.{} CHECK (pg_temp.pwn(VALUE))").format(
                sql.Identifier(name), sql.Identifier(base)
            )
        )
    for signature in PLANTED_FUNCTIONS:
        name, args = signature.split("(", 1)
        conn.execute(
            f"CREATE FUNCTION pg_temp.{name}({args} RETURNS boolean LANGUAGE sql AS $$ SELECT pg_temp.pwn0() $$"
        )
    conn.execute("CREATE TEMP TABLE idempotency_keys (id bigint CHECK (pg_temp.pwn(id)))")
    conn.execute("CREATE TEMP TABLE users (id integer CHECK (pg_temp.pwn(id)))")
    conn.execute("CREATE TEMP TABLE audit_log (id integer CHECK (pg_temp.pwn(id)))")


def _claim(conn: DictConnection, key: str, user_id: int | None, **extra: Any) -> dict[str, Any]:
    args = {"p_key": key, "p_user_id": user_id, "p_endpoint": "POST /pwn", "p_request": '{"qty": 1}', **extra}
    call = sql.SQL("SELECT * FROM public.idem_claim({})").format(
        sql.SQL(", ").join(sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in args)
    )
    return one(conn, call, args)


def _token_args(row: dict[str, Any]) -> dict[str, Any]:
    """The claim's token, on an SQL API that has one (the test must also run on older ones)."""
    return {"p_claim_token": row["claim_token"]} if "claim_token" in row else {}


def _call(conn: DictConnection, function: str, args: dict[str, Any]) -> Any:
    call = sql.SQL("SELECT public.{}({})").format(
        sql.Identifier(function),
        sql.SQL(", ").join(sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in args),
    )
    return conn.execute(call, args).fetchall()


def _exercise(conn: DictConnection, user_id: int) -> dict[str, Callable[[], Any]]:
    """One recipe per function the app may execute, each through the paths its body has."""
    response_key = secrets.token_urlsafe(32)

    def claim_paths() -> None:
        key = new_key()
        first = _claim(conn, key, user_id, p_response_key=response_key)
        assert first["outcome"] == "claimed", first
        _call(
            conn,
            "idem_complete",
            {
                "p_key_id": first["key_id"],
                "p_response_code": 201,
                "p_response_body": '{"ok": true}',
                "p_response_key": response_key,
                "p_response_headers": '{"Location": "/x"}',
                **_token_args(first),
            },
        )
        assert _claim(conn, key, user_id, p_response_key=response_key)["outcome"] == "replay"
        assert _claim(conn, key.upper(), user_id, p_request='{"qty": 2}')["outcome"] == "mismatch"
        held = _claim(conn, new_key(), None)
        assert held["outcome"] == "claimed"
        stale_key = new_key()
        _claim(conn, stale_key, None)
        time.sleep(1.05)  # the shortest stale window a member of idem_app may pass
        assert _claim(conn, stale_key, None, p_stale_after="1 second")["outcome"] == "stale"
        assert _claim(conn, stale_key, None, p_wait_ms=1)["outcome"] == "claimed"

    def complete_paths() -> None:
        for body in (
            '{"raw": [1, "x"]}',
            '{"idem_raw": "text", "data": "a,b\\n1,2"}',
            '{"idem_raw": "base64", "data": "AAEC"}',
            "[1, 2]",
        ):
            row = _claim(conn, new_key(), user_id)
            _call(
                conn,
                "idem_complete",
                {
                    "p_key_id": row["key_id"],
                    "p_response_code": 200,
                    "p_response_body": body,
                    "p_response_headers": '{"ETag": "\\"1\\""}',
                    **_token_args(row),
                },
            )

    def fail_paths() -> None:
        key = new_key()
        row = _claim(conn, key, user_id)
        _call(conn, "idem_fail", {"p_key_id": row["key_id"], "p_response_code": 500, **_token_args(row)})
        assert _claim(conn, key, user_id)["outcome"] == "previous_failed"

    def heartbeat_paths() -> None:
        row = _claim(conn, new_key(), user_id)
        _call(conn, "idem_heartbeat", {"p_key_id": row["key_id"], **_token_args(row)})

    def lost_claim_paths() -> None:
        key = new_key()
        row = _claim(conn, key, None)
        time.sleep(1.05)
        _claim(conn, key, None, p_stale_after="1 second")  # healed: the token is lost
        with pytest.raises(psycopg.Error):
            _call(
                conn,
                "idem_complete",
                {"p_key_id": row["key_id"], "p_response_code": 200, "p_response_body": "{}", **_token_args(row)},
            )
        _call(
            conn, "idem_record_lost_claim", {"p_key_id": row["key_id"], "p_endpoint": "POST /pwn", **_token_args(row)}
        )

    return {
        "idem_schema_version": lambda: conn.execute("SELECT public.idem_schema_version()").fetchall(),
        "idem_canonical_key": lambda: _call(conn, "idem_canonical_key", {"p_key": new_key().upper()}),
        "idem_claim": claim_paths,
        "idem_complete": complete_paths,
        "idem_fail": fail_paths,
        "idem_heartbeat": heartbeat_paths,
        "idem_record_lost_claim": lost_claim_paths,
        "idem_erase_user": lambda: _call(conn, "idem_erase_user", {"p_user_id": user_id}),
        "idem_export_user": lambda: _call(
            conn, "idem_export_user", {"p_user_id": user_id, "p_response_key": response_key}
        ),
        "idem_downstream_key": lambda: _call(
            conn,
            "idem_downstream_key",
            {"p_key": new_key(), "p_user_id": user_id, "p_endpoint": "POST /pwn", "p_namespace": "broker"},
        ),
        # Granted to idem_app before migration 0008, idem_admin's since: the recipes stay so
        # that the test runs on the old grants too.
        "idem_cleanup_batch": lambda: _call(conn, "idem_cleanup_batch", {"p_batch_size": 10}),
        "idem_cleanup": lambda: conn.execute("CALL public.idem_cleanup(p_batch_size => 10)"),
        "idem_health": lambda: conn.execute("SELECT * FROM public.idem_health()").fetchall(),
        "idem_response_key_census": lambda: _call(conn, "idem_response_key_census", {"p_current_key": response_key}),
        "idem_reencrypt_responses": lambda: _call(
            conn,
            "idem_reencrypt_responses",
            {"p_old_key": response_key, "p_new_key": secrets.token_urlsafe(32), "p_after_id": 0, "p_batch_size": 10},
        ),
    }


@pytest.fixture
def attacker(fresh_admin_url: str) -> Iterator[tuple[str, str]]:
    """A login role that is a member of idem_app, as a handler's role is; its name and URL."""
    with login_role(fresh_admin_url, "idem_app") as role:
        yield role


def test_planted_pg_temp_objects_never_run_inside_any_function_the_app_may_execute(
    fresh_admin_url: str, attacker: tuple[str, str]
) -> None:
    name, url = attacker
    with psycopg.connect(fresh_admin_url, autocommit=True) as admin:
        user_id = admin.execute("INSERT INTO users DEFAULT VALUES RETURNING id").fetchone()[0]  # type: ignore[index]
        executable = [
            r[0]
            for r in admin.execute(
                """SELECT DISTINCT p.proname FROM pg_proc p
                    WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\\_%'
                      AND has_function_privilege('idem_app', p.oid, 'EXECUTE') ORDER BY 1"""
            )
        ]
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        # idem's DDL guard refuses idem's names in pg_temp too (test_sec_shadow_schema.py); past
        # it, as where no superuser migrated, the definers must still never resolve pg_temp
        with psycopg.connect(fresh_admin_url, autocommit=True) as admin:
            admin.execute("ALTER EVENT TRIGGER idem_guard_routine DISABLE")
            admin.execute("ALTER EVENT TRIGGER idem_guard_object DISABLE")
        try:
            _plant(conn, name)
        finally:
            with psycopg.connect(fresh_admin_url, autocommit=True) as admin:
                admin.execute("ALTER EVENT TRIGGER idem_guard_routine ENABLE ALWAYS")
                admin.execute("ALTER EVENT TRIGGER idem_guard_object ENABLE ALWAYS")
        recipes = _exercise(conn, user_id)
        missing = [f for f in executable if f not in recipes]
        assert not missing, f"no attack recipe for {missing}: add one, since idem_app may execute it"
        errors: dict[str, str] = {}
        for function in executable:
            try:
                recipes[function]()
            except psycopg.Error as exc:  # a refusal is fine; a planted object running is not
                errors[function] = f"{exc.sqlstate}: {exc}".splitlines()[0]
        pwned = one(conn, "SELECT current_setting('idem.pwned', true) AS v")["v"]
    with psycopg.connect(fresh_admin_url, autocommit=True) as admin:
        rolsuper = admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
    assert rolsuper == (False,), f"{name} became a superuser (errors along the way: {errors})"
    assert not pwned, f"a planted pg_temp object ran as {pwned}"
    # The legitimate calls all went through: the attack cost nothing to the real path.
    assert not {
        f: e
        for f, e in errors.items()
        if f in ("idem_claim", "idem_complete", "idem_fail", "idem_heartbeat", "idem_erase_user", "idem_export_user")
    }, errors
