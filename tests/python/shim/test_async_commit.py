"""Which of the shim's own statements commit asynchronously (queries.CLAIM, FAIL, HEARTBEAT).

The claim's transaction commits with synchronous_commit off, except a replay, whose audit row
must stay durable (it keeps the session's setting); the setting is local to that statement's
transaction, so the handler's transaction on the same connection commits as the session says.
The crash test is tests/python/e2e/test_durability.py.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg

from idem_shim import queries
from idem_shim.records import ClaimRequest


def params(key: str) -> tuple[object, ...]:
    request = ClaimRequest(
        key=key,
        user_id=None,
        endpoint="POST /async",
        request_json="{}",
        ttl=timedelta(hours=1),
        stale_after=timedelta(seconds=30),
        wait_ms=0,
        on_stale="heal",
    )
    return (*request.params(), None, None)


def test_claim_is_async_a_replay_keeps_the_session_setting(fresh_admin_url: str) -> None:
    key = str(uuid.uuid4())
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        row = conn.execute(queries.CLAIM, params(key)).fetchone()
        assert row is not None and row[0] == "claimed"
        assert row[7] is not None, "a new claim comes with its token"
        assert row[8] == "off", "a new claim commits asynchronously"
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",), (
            "the claim's setting must not outlive its own transaction"
        )
        with conn.transaction():  # the handler's transaction on the same connection
            conn.execute(queries.COMPLETE, (row[1], 201, '{"ok": true}', None, None, row[7]))
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        again = conn.execute(queries.CLAIM, params(key)).fetchone()
        assert again is not None and again[0] == "replay"
        assert again[7] is None  # a replay hands out no token
        assert again[8] == "on", "a replay writes an audit row: its commit stays synchronous"
        conn.execute("SET synchronous_commit = remote_apply")
        again = conn.execute(queries.CLAIM, params(key)).fetchone()
        assert again is not None and again[0] == "replay" and again[8] == "remote_apply"


def test_fail_and_heartbeat_are_async_for_their_own_statement_only(fresh_admin_url: str) -> None:
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")  # the test cluster's default is off
        row = conn.execute(queries.CLAIM, params(str(uuid.uuid4()))).fetchone()
        assert row is not None
        beat = conn.execute(queries.HEARTBEAT, {"key_id": row[1], "claim_token": row[7]}).fetchone()
        assert beat is not None and beat[1] == "off"
        failed = conn.execute(queries.FAIL, {"key_id": row[1], "claim_token": row[7], "response_code": 500}).fetchone()
        assert failed is not None and failed[1] == "off"
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
