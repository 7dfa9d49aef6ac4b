"""
For the DBA in psql: the idem_health view / idem_health() aggregates, idem_inspect for
one key, and lost claims recorded honestly from outside the rolled-back transaction.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.python.support.roles import as_admin_role, as_app_role
from tests.python.support.sqlapi import claim, complete, connect, new_key, one

ORDERS = "POST /api/trading/orders"
CHECKOUT = "POST /api/billing/checkout-session"


def ago(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat()


def health(
    conn: psycopg.Connection[Any], sql: str = "SELECT * FROM idem_health"
) -> dict[tuple[str, str | None, str], dict[str, Any]]:
    return {(r["kind"], r["scope_endpoint"], r["state"]): r for r in conn.execute(sql).fetchall()}


def make_user(conn: psycopg.Connection[Any]) -> int:
    return int(one(conn, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"])


def test_health_counts_rows_stale_holders_expired_rows_and_recent_events(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as conn:
        uid = make_user(conn)
        done = claim(conn, new_key(), endpoint=ORDERS)
        complete(conn, done)
        claim(conn, new_key(), endpoint=ORDERS)  # a live holder
        stale_key = new_key()
        claim(conn, stale_key, endpoint=ORDERS, now=ago(120))  # its worker died
        claim(conn, new_key(), endpoint=CHECKOUT, user_id=uid)
        # An expired, finished row waiting for cleanup (loaded directly, as a superuser may).
        conn.execute(
            """INSERT INTO idempotency_keys (idem_key, scope_endpoint, request_hash, status,
                                                      created_at, locked_at, expires_at)
                        VALUES (gen_random_uuid()::text, %s, 'h', 'completed',
                                now() - interval '2 days', now() - interval '2 days', now() - interval '1 day')""",
            (CHECKOUT,),
        )
        h = health(conn)
        assert h[("keys", ORDERS, "completed")]["total"] == 1
        inflight = h[("keys", ORDERS, "in_flight")]
        assert (inflight["total"], inflight["stale"], inflight["expired"]) == (2, 1, 0)
        assert inflight["oldest_lease"].total_seconds() >= 119
        assert h[("keys", CHECKOUT, "completed")]["expired"] == 1
        assert h[("keys", CHECKOUT, "in_flight")]["stale"] == 0

        # A heal, an erasure and a lost claim show up as recent events.
        healed = claim(conn, stale_key, endpoint=ORDERS)
        assert healed["outcome"] == "stale"
        assert conn.execute("SELECT idem_erase_user(p_user_id => %s) AS n", (uid,)).fetchone() == {"n": 1}
        assert conn.execute("SELECT idem_record_lost_claim(p_key_id => %s) AS r", (healed["key_id"],)).fetchone() == {
            "r": True
        }
        h = health(conn)
        assert h[("event", ORDERS, "stale_heal")]["total"] == 1
        assert h[("event", ORDERS, "lost_claim")]["total"] == 1
        assert h[("event", None, "erasure")]["total"] == 1
        assert h[("keys", ORDERS, "in_flight")]["stale"] == 0  # healed: nothing waits any more
        # A narrower stale window, through the function.
        narrow = health(conn, "SELECT * FROM idem_health(p_stale_after => '1 millisecond')")
        assert narrow[("keys", ORDERS, "in_flight")]["stale"] == 1


def test_the_admin_role_reads_aggregates_only_and_the_app_role_nothing(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as admin:
        key = new_key()
        complete(admin, claim(admin, key, request={"secret": "s3cr3t-card"}), body={"card": "4242-secret"})
    with connect(as_app_role(fresh_admin_url)) as app:  # the request path has no business here
        for statement in ("SELECT * FROM idem_health", "SELECT * FROM idem_health()"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(statement)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("SELECT * FROM idem_inspect(p_key => %s)", (key,))
    with connect(as_admin_role(fresh_admin_url)) as app:
        view = app.execute("SELECT * FROM idem_health").fetchall()
        func = app.execute("SELECT * FROM idem_health()").fetchall()
        assert len(view) == len(func) == 1
        assert (
            [(r["kind"], r["state"], r["total"]) for r in view]
            == [(r["kind"], r["state"], r["total"]) for r in func]
            == [("keys", "completed", 1)]
        )
        assert set(view[0]) == {
            "kind",
            "scope_endpoint",
            "state",
            "total",
            "stale",
            "expired",
            "oldest",
            "oldest_lease",
            "latest",
        }
        assert "secret" not in repr(view) and key not in repr(view)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("SELECT * FROM idempotency_keys")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("SELECT * FROM idempotency_events")
        with pytest.raises(psycopg.Error) as moved:  # the clock is the owner's alone
            app.execute("SELECT * FROM idem_health(p_now => now() + interval '1 day')")
        assert moved.value.sqlstate == "IDM00"


def test_inspect_shows_all_three_scope_columns_and_the_body_only_when_asked(fresh_admin_url: str) -> None:
    key = new_key()
    with connect(fresh_admin_url) as conn:
        uid = make_user(conn)
        conn.execute(
            "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => %s,"
            " p_response_headers => %s)",
            (
                claim(conn, key, user_id=uid, endpoint=ORDERS)["key_id"],
                Jsonb({"order_id": 7}),
                Jsonb({"Location": "/orders/7"}),
            ),
        )
        claim(conn, key, user_id=None, endpoint=CHECKOUT)  # same key, another scope: another row
        rows = conn.execute("SELECT * FROM idem_inspect(p_key => %s)", (key.upper(),)).fetchall()
        assert [(r["idem_key"], r["scope_user_id"], r["scope_endpoint"], r["status"]) for r in rows] == [
            (key, None, CHECKOUT, "in_flight"),
            (key, uid, ORDERS, "completed"),
        ]
        assert all(r["response_body"] is None and r["response_headers"] is None for r in rows)
        assert [r["body_stored"] for r in rows] == [False, True]
        assert [r["headers_stored"] for r in rows] == [False, True]
        assert rows[1]["response_code"] == 201 and rows[1]["is_expired"] is False

        narrowed = conn.execute(
            "SELECT * FROM idem_inspect(p_key => %s, p_user_id => %s, p_with_body => true)", (key, uid)
        ).fetchall()
        assert len(narrowed) == 1 and narrowed[0]["response_body"] == {"order_id": 7}
        assert narrowed[0]["response_headers"] == {"Location": "/orders/7"}
        assert conn.execute(
            "SELECT count(*) AS n FROM idem_inspect(p_key => %s, p_endpoint => %s)", (key, CHECKOUT)
        ).fetchone() == {"n": 1}
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="Idempotency-Key must be a UUID string"):
            conn.execute("SELECT * FROM idem_inspect(p_key => 'admin')")


def test_a_lost_claim_is_recorded_after_the_rollback_once_and_with_the_databases_reason(fresh_admin_url: str) -> None:
    key = new_key()
    with connect(fresh_admin_url) as holder_conn, connect(fresh_admin_url) as other:
        held = claim(holder_conn, key, now=ago(60))
        zombie, token = held["key_id"], held["claim_token"]
        # Still holding? Then nothing is lost and nothing is written.
        assert other.execute(
            "SELECT idem_record_lost_claim(p_key_id => %s, p_claim_token => %s) AS r", (zombie, token)
        ).fetchone() == {"r": False}
        assert claim(other, key)["outcome"] == "stale"  # a duplicate heals the dead-looking holder

        # The zombie finishes: its business write and completion raise IDM01 and roll back together.
        with pytest.raises(psycopg.Error) as lost, holder_conn.transaction():
            holder_conn.execute("INSERT INTO audit_log (action) VALUES ('order_filled')")
            complete(holder_conn, held)
        assert lost.value.sqlstate == "IDM01", lost.value
        assert other.execute("SELECT count(*) AS n FROM audit_log WHERE action = 'order_filled'").fetchone() == {"n": 0}

        # What the shim does next, in a transaction of its own, with the claim's token.
        assert holder_conn.execute(
            "SELECT idem_record_lost_claim(p_key_id => %s, p_endpoint => %s, p_claim_token => %s) AS r",
            (zombie, ORDERS, token),
        ).fetchone() == {"r": True}
        assert holder_conn.execute(
            "SELECT idem_record_lost_claim(p_key_id => %s, p_claim_token => %s) AS r", (zombie, token)
        ).fetchone() == {"r": False}  # once per token
        event = other.execute(
            "SELECT scope_endpoint, detail FROM idempotency_events WHERE event = 'lost_claim'   AND key_id = %s",
            (zombie,),
        ).fetchone()
        # the request hash lets the runbook's query find the event beside the heal of that key
        assert event == {
            "scope_endpoint": ORDERS,
            "detail": {
                "reason": "healed_as_stale",
                "reported_endpoint": ORDERS,
                "request_hash": hashlib.sha256(b'{"qty": 1}').hexdigest(),
            },
        }
        assert other.execute("SELECT * FROM idem_inspect(p_key => %s)", (key,)).fetchall() == []  # healed: free
        again = claim(other, key)["key_id"]
        assert other.execute("SELECT key_id, events FROM idem_inspect(p_key => %s)", (key,)).fetchall() == [
            {"key_id": again, "events": []}
        ]

        # A token finished by someone else, and one that never existed.
        done = claim(other, new_key())
        complete(other, done)
        assert other.execute(
            "SELECT idem_record_lost_claim(p_key_id => %s, p_claim_token => %s) AS r",
            (done["key_id"], done["claim_token"]),
        ).fetchone() == {"r": True}
        # an id no claim ever had: only the owner (a DBA in psql, here) may report it without a token
        assert other.execute("SELECT idem_record_lost_claim(%s) AS r", (10**12,)).fetchone() == {"r": True}
        reasons = other.execute(
            "SELECT key_id, detail->>'reason' AS reason FROM idempotency_events WHERE event = 'lost_claim' ORDER BY id"
        ).fetchall()
        assert [r["reason"] for r in reasons] == ["healed_as_stale", "already_completed", "gone"]
        hashes = other.execute(
            "SELECT detail->>'request_hash' AS h FROM idempotency_events WHERE event = 'lost_claim' ORDER BY id"
        ).fetchall()
        assert [h["h"] is not None for h in hashes] == [True, True, False]  # gone: nothing to read


def test_the_app_role_can_report_a_lost_claim(fresh_admin_url: str) -> None:
    """The app's role reports a claim it held, with its token; a made-up id (no token, or a
    made-up one) is refused, so nothing invented shows up in idem_health (contract §3a)."""
    with connect(as_app_role(fresh_admin_url)) as app, connect(fresh_admin_url) as dba:
        held = claim(app, new_key(), endpoint=ORDERS)
        complete(dba, held["key_id"])  # finished by someone else (a DBA by key_id): the claim is lost
        assert app.execute(
            "SELECT idem_record_lost_claim(p_key_id => %s, p_endpoint => %s, p_claim_token => %s) AS r",
            (held["key_id"], ORDERS, held["claim_token"]),
        ).fetchone() == {"r": True}
        for made_up, token, sqlstate in (
            (42, None, "IDM00"),  # no token: only the owner and idem_admin may act by key_id alone
            (10**12, None, "IDM00"),
            (10**12, held["claim_token"], "IDM01"),  # another claim's token
            (None, None, "IDM00"),
        ):
            with pytest.raises(psycopg.Error) as err:
                app.execute(
                    "SELECT idem_record_lost_claim(p_key_id => %s, p_endpoint => %s, p_claim_token => %s)",
                    (made_up, ORDERS, token),
                )
            assert err.value.sqlstate == sqlstate, (made_up, err.value)
        assert dba.execute(
            "SELECT key_id, detail->>'reason' AS reason FROM idempotency_events WHERE event = 'lost_claim'"
        ).fetchall() == [{"key_id": held["key_id"], "reason": "already_completed"}]
