"""
Data-subject rights: erasure leaves no row of the user, in the keys or the events
(contract §3a), and reports the count, and its own event carries no user id; export returns every
row; deleting the user from the host's users table cascades to their keys (and an in-flight holder
of an erased key loses its claim).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.python.support.sqlapi import DictConnection, claim, complete, connect, new_key, one

ORDERS = "POST /api/trading/orders"
CHECKOUT = "POST /api/billing/checkout-session"


def seed_user(conn: DictConnection, done: int = 2, in_flight: int = 1) -> tuple[int, list[dict[str, Any]]]:
    """A user with ``done`` completed keys and ``in_flight`` held ones (their claim rows)."""
    uid = one(conn, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"]
    for n in range(done):
        complete(conn, claim(conn, new_key(), user_id=uid, endpoint=(ORDERS, CHECKOUT)[n % 2]))
    holders = [claim(conn, new_key(), user_id=uid) for _ in range(in_flight)]
    return uid, holders


def count(conn: DictConnection, uid: int) -> int:
    return int(one(conn, "SELECT count(*) AS n FROM idempotency_keys WHERE scope_user_id = %s", (uid,))["n"])


def test_deleting_a_user_cascades_to_their_keys(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as conn:
        uid, holders = seed_user(conn)
        other, _ = seed_user(conn)
        service = claim(conn, new_key(), user_id=None)["key_id"]
        assert count(conn, uid) == 3
        conn.execute("DELETE FROM users WHERE id = %s", (uid,))
        assert count(conn, uid) == 0
        assert count(conn, other) == 3  # nobody else's rows
        assert conn.execute("SELECT count(*) AS n FROM idempotency_keys WHERE id = %s", (service,)).fetchone() == {
            "n": 1
        }
        with pytest.raises(psycopg.Error) as lost:  # the erased key's holder cannot complete
            complete(conn, holders[0])
        assert lost.value.sqlstate == "IDM01"


def test_erasure_reports_the_count_leaves_no_row_and_logs_no_content(fresh_admin_url: str) -> None:
    with connect(fresh_admin_url) as conn:
        uid, _ = seed_user(conn, done=4, in_flight=2)
        other, _ = seed_user(conn)
        # a stale heal of one of the user's keys: an event that names the user and the key
        healed_key = new_key()
        long_ago = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
        claim(conn, healed_key, user_id=uid, endpoint=ORDERS, now=long_ago)
        assert claim(conn, healed_key, user_id=uid, endpoint=ORDERS)["outcome"] == "stale"
        claim(conn, healed_key, user_id=uid, endpoint=ORDERS)  # the retry claims it again: 7 keys
        assert one(conn, "SELECT count(*) AS n FROM idempotency_events WHERE scope_user_id = %s", (uid,))["n"] == 1
        exported = conn.execute("SELECT * FROM public.idem_export_user(p_user_id => %s)", (uid,)).fetchall()
        assert len(exported) == 7 and {r["scope_user_id"] for r in exported} == {uid}
        assert {"idem_key", "scope_endpoint", "status", "response_body", "expires_at"} <= set(exported[0])
        assert conn.execute("SELECT idem_erase_user(p_user_id => %s) AS n", (uid,)).fetchone() == {"n": 7}
        assert count(conn, uid) == 0 and count(conn, other) == 3
        assert conn.execute("SELECT * FROM public.idem_export_user(p_user_id => %s)", (uid,)).fetchall() == []
        assert conn.execute("SELECT idem_erase_user(p_user_id => %s) AS n", (uid,)).fetchone() == {"n": 0}
        events = conn.execute(
            "SELECT scope_user_id, detail FROM idempotency_events WHERE event = 'erasure' ORDER BY id"
        ).fetchall()
        # the second erasure found nothing and logs nothing: idem_health counts real erasures; the
        # erasure's own event does not name the user it erased
        assert events == [{"scope_user_id": None, "detail": {"rows": 7}}]
        # nothing of the user is left anywhere in the store: no event names them or their keys
        leftovers = conn.execute(
            "SELECT e::text AS t FROM idempotency_events e WHERE scope_user_id = %s OR e::text LIKE %s",
            (uid, f"%{healed_key}%"),
        ).fetchall()
        assert leftovers == []
