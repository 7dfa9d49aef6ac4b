"""The shim's request path names idem's functions through the app's own search_path.

The statements in ``idem_shim.queries`` (``FROM idem_claim(...)``, ``SELECT idem_complete(...)``)
are unqualified, and the app's sessions keep their path (its handlers need it): ``"$user",
public``. A role that may create a schema in the database (``GRANT CREATE ON DATABASE``: a
reporting service, a tenant's migration role, the database's owner) makes one named for the
app's login role, and in it an ``idem_claim`` of the very signature: the app's every claim then
runs it, as the app's role. It sees every client's raw key and request, and answers what it
likes (a forged ``replay`` with the attacker's body and ``Location``), without any privilege on
idem's tables. The test asserts the safe outcome: the shim's statement reaches idem's own
function, so it fails while the hole is open.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from idem_shim import queries
from tests.python.support.sqlapi import new_key

FAKE_CLAIM = """
CREATE FUNCTION {schema}.idem_claim(
    p_key text, p_user_id integer, p_endpoint text, p_request jsonb,
    p_ttl interval DEFAULT '24 hours', p_stale_after interval DEFAULT '30 seconds',
    p_wait_ms integer DEFAULT 0, p_on_stale text DEFAULT 'heal', p_now timestamptz DEFAULT NULL,
    p_response_key text DEFAULT NULL, p_response_key_fallback text DEFAULT NULL,
    p_key_format text DEFAULT 'uuid')
RETURNS public.idem_claim_result LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO {schema}.seen (who, idem_key, request) VALUES (current_user, p_key, p_request);
    RETURN ROW('replay', 1, 'forged', 201,
               '{{"order_id": 1, "notice": "re-verify at https://evil.example/login"}}'::jsonb,
               NULL, '{{"Location": "https://evil.example/phish"}}'::jsonb, NULL, NULL, NULL)::public.idem_claim_result;
END $f$"""


def _exec(url: str, *statements: sql.Composed | str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def test_the_shims_claim_never_runs_a_schema_named_for_the_apps_role(fresh_admin_url: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    app, other = f"api_{suffix}", f"svc_{suffix}"
    _exec(
        fresh_admin_url,
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE idem_app").format(sql.Identifier(app)),
        sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(other)),
        sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            sql.Identifier(str(psycopg.conninfo.conninfo_to_dict(fresh_admin_url)["dbname"])), sql.Identifier(other)
        ),
    )
    try:
        schema = sql.Identifier(app)
        _exec(
            make_conninfo(fresh_admin_url, user=other),
            sql.SQL("CREATE SCHEMA {}").format(schema),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO PUBLIC").format(schema),
            sql.SQL("CREATE TABLE {}.seen (who text, idem_key text, request jsonb)").format(schema),
            sql.SQL("GRANT INSERT ON {}.seen TO PUBLIC").format(schema),
        )
        # idem's DDL guard refuses idem's names in every schema (test_sec_shadow_schema.py); past
        # it, as where no superuser migrated, the shim's statements must still never reach the plant
        _exec(fresh_admin_url, "ALTER EVENT TRIGGER idem_guard_routine DISABLE")
        try:
            _exec(make_conninfo(fresh_admin_url, user=other), sql.SQL(FAKE_CLAIM).format(schema=schema))
        finally:
            _exec(fresh_admin_url, "ALTER EVENT TRIGGER idem_guard_routine ENABLE ALWAYS")
        key = new_key()
        params: tuple[Any, ...] = (
            key,
            None,
            "POST /orders",
            '{"amount": 100}',
            "24 hours",
            "30 seconds",
            0,
            "heal",
            "uuid",
            None,
            None,
        )
        with psycopg.connect(make_conninfo(fresh_admin_url, user=app), autocommit=True) as conn:
            row = conn.execute(queries.CLAIM, params).fetchone()
        with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
            seen = conn.execute(sql.SQL("SELECT who, idem_key FROM {}.seen").format(schema)).fetchall()
        assert row is not None
        assert row[0] == "claimed" and not seen, (
            f"the shim's claim ran {app}.idem_claim, another role's function, as {seen}: outcome {row[0]!r},"
            f" body {row[4]!r}, headers {row[6]!r}"
        )
    finally:
        _exec(
            fresh_admin_url,
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(app)),
            sql.SQL("DROP OWNED BY {}").format(sql.Identifier(other)),
            sql.SQL("DROP ROLE {}").format(sql.Identifier(other)),
            sql.SQL("DROP ROLE {}").format(sql.Identifier(app)),
        )
