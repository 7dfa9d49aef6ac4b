"""Small helpers the SQL-level tests share: one call of one function, as a DBA would type it."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

CLAIM = """SELECT * FROM idem_claim(p_key => %(key)s, p_user_id => %(user_id)s,
    p_endpoint => %(endpoint)s, p_request => %(request)s,
    p_stale_after => %(stale_after)s::interval, p_wait_ms => %(wait_ms)s,
    p_now => %(now)s::timestamptz)"""


DictConnection = psycopg.Connection[dict[str, Any]]
"""What ``connect`` returns: autocommit, rows as dicts."""


def new_key() -> str:
    return str(uuid.uuid4())


def connect(url: str) -> DictConnection:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def one(conn: DictConnection, query: str | sql.Composed, params: Any = None) -> dict[str, Any]:
    """The one row ``query`` returns (a query that returns none is a failed test)."""
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return row


def claim(
    conn: psycopg.Connection[Any],
    key: str,
    *,
    user_id: int | uuid.UUID | str | None = None,
    endpoint: str = "POST /api/trading/orders",
    request: Any = None,
    stale_after: str = "30 seconds",
    wait_ms: int = 0,
    now: str | None = None,
) -> dict[str, Any]:
    """One ``idem_claim``; the row as a dict (``key_id`` and ``claim_token`` for the helpers below).

    With ``now`` (a moved clock, which only the store's owner may pass) the call is
    made as the session's login role, i.e. with the ``-c role=idem_app`` of ``roles.as_app_role``
    reset for it: the row is the same whoever claimed it, and its token works for any holder."""
    params = {
        "key": key,
        "user_id": user_id,
        "endpoint": endpoint,
        "request": Jsonb(request if request is not None else {"qty": 1}),
        "stale_after": stale_after,
        "wait_ms": wait_ms,
        "now": now,
    }
    role = conn.execute("SELECT current_setting('role')").fetchone() if now is not None else None
    previous = None if role is None else (role["current_setting"] if isinstance(role, dict) else role[0])
    if previous not in (None, "none"):
        conn.execute("SET ROLE NONE")  # RESET would restore the startup option's role
    try:
        row = conn.execute(CLAIM, params).fetchone()
    finally:
        if previous not in (None, "none"):
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(str(previous))))
    assert row is not None
    return dict(row)


Claim = int | dict[str, Any]
"""A claim as the helpers take it: the row ``claim`` returned (its key_id and claim_token), or a bare
key_id, which only the owner and idem_admin may use (contract §3a)."""


def token_args(claim: Claim) -> tuple[int, str | None]:
    """(key_id, claim_token) of a claim row, or (key_id, None) for a bare id."""
    if isinstance(claim, dict):
        return int(claim["key_id"]), claim.get("claim_token")
    return int(claim), None


def complete(conn: psycopg.Connection[Any], claim: Claim, code: int = 201, body: Any = None) -> None:
    key_id, token = token_args(claim)
    conn.execute(
        "SELECT idem_complete(p_key_id => %s, p_response_code => %s, p_response_body => %s, p_claim_token => %s)",
        (key_id, code, Jsonb(body if body is not None else {"ok": True}), token),
    )


def fail(conn: psycopg.Connection[Any], claim: Claim, code: int | None = None) -> None:
    key_id, token = token_args(claim)
    conn.execute("SELECT idem_fail(p_key_id => %s, p_response_code => %s, p_claim_token => %s)", (key_id, code, token))


def heartbeat(conn: psycopg.Connection[Any], claim: Claim) -> Any:
    key_id, token = token_args(claim)
    row = conn.execute("SELECT idem_heartbeat(p_key_id => %s, p_claim_token => %s)", (key_id, token)).fetchone()
    return None if row is None else (row["idem_heartbeat"] if isinstance(row, dict) else row[0])
