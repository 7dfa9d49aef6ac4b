"""Small helpers the SQL-level tests share: one call of one function, as a DBA would type it."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

CLAIM = """SELECT * FROM idem_claim(p_key => %(key)s, p_user_id => %(user_id)s,
    p_endpoint => %(endpoint)s, p_request => %(request)s,
    p_stale_after => %(stale_after)s::interval, p_wait_ms => %(wait_ms)s,
    p_now => COALESCE(%(now)s::timestamptz, now()))"""


DictConnection = psycopg.Connection[dict[str, Any]]
"""What ``connect`` returns: autocommit, rows as dicts."""


def new_key() -> str:
    return str(uuid.uuid4())


def connect(url: str) -> DictConnection:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def one(conn: DictConnection, query: str, params: Any = None) -> dict[str, Any]:
    """The one row ``query`` returns (a query that returns none is a failed test)."""
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return row


def claim(
    conn: psycopg.Connection[Any],
    key: str,
    *,
    user_id: int | None = None,
    endpoint: str = "POST /api/trading/orders",
    request: Any = None,
    stale_after: str = "30 seconds",
    wait_ms: int = 0,
    now: str | None = None,
) -> dict[str, Any]:
    row = conn.execute(
        CLAIM,
        {
            "key": key,
            "user_id": user_id,
            "endpoint": endpoint,
            "request": Jsonb(request if request is not None else {"qty": 1}),
            "stale_after": stale_after,
            "wait_ms": wait_ms,
            "now": now,
        },
    ).fetchone()
    assert row is not None
    return dict(row)


def complete(conn: psycopg.Connection[Any], key_id: int, code: int = 201, body: Any = None) -> None:
    conn.execute(
        "SELECT idem_complete(p_key_id => %s, p_response_code => %s, p_response_body => %s)",
        (key_id, code, Jsonb(body if body is not None else {"ok": True})),
    )
