"""
The SQL core under real concurrency: separate connections, released together by a barrier.

- 32 connections claim one key at once: exactly one is claimed, the rest in_flight.
- 16 detectors race on one stale row: exactly one heals it, exactly one later claim wins.
- a zombie whose late idem_complete shares its transaction with a business write leaves
  neither behind once the key was healed; and a completion that got there first wins
  over a concurrent healer (the healer then replays).
- p_wait_ms: replay when the holder completes inside the window, in_flight when not.
- heartbeat keeps a slow but live holder from being healed.

No test sleeps to order its race: a holder "hung past the stale threshold" claimed with a back-dated
p_now, and a backend that must be blocked (or waiting) before the test goes on is waited for in
pg_stat_activity (tests/python/support/races.py).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.python.support.races import wait_for_wait_event, wait_until_blocked
from tests.python.support.roles import as_app_role
from tests.python.support.sqlapi import claim, complete, connect, heartbeat, new_key


def minutes_ago(n: int) -> str:
    """A p_now n minutes back: a claim made then is long past any lease used here."""
    return (datetime.now(UTC) - timedelta(minutes=n)).isoformat()


def race(url: str, n: int, action: Any) -> list[Any]:
    """Runs action(conn) on n connections opened beforehand, released at the same instant."""
    conns = [connect(url) for _ in range(n)]
    barrier = threading.Barrier(n)

    def run(conn: psycopg.Connection[Any]) -> Any:
        barrier.wait()
        return action(conn)

    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            return list(pool.map(run, conns))
    finally:
        for c in conns:
            c.close()


def test_32_connections_claiming_one_key_yield_exactly_one_claim(fresh_app_role_url: str) -> None:
    key = new_key()
    outcomes = Counter(r["outcome"] for r in race(fresh_app_role_url, 32, lambda c: claim(c, key)))
    assert outcomes == {"claimed": 1, "in_flight": 31}


def test_32_connections_with_null_user_scope_also_dedupe(fresh_app_role_url: str) -> None:
    key = new_key()
    results = race(fresh_app_role_url, 32, lambda c: claim(c, key, user_id=None, endpoint="svc.rebalance"))
    assert Counter(r["outcome"] for r in results) == {"claimed": 1, "in_flight": 31}


def test_16_detectors_on_one_stale_row_heal_it_once_and_one_later_claim_wins(
    fresh_app_role_url: str, fresh_admin_url: str
) -> None:
    key = new_key()
    with connect(fresh_app_role_url) as conn:
        # A holder whose worker died a minute ago.
        assert claim(conn, key, now=minutes_ago(1))["outcome"] == "claimed"

    first = race(fresh_app_role_url, 16, lambda c: claim(c, key))
    second = race(fresh_app_role_url, 16, lambda c: claim(c, key))
    outcomes = Counter(r["outcome"] for r in first + second)
    assert outcomes["stale"] == 1, outcomes
    assert outcomes["claimed"] == 1, outcomes
    assert outcomes["in_flight"] == 30, outcomes

    with connect(fresh_admin_url) as admin:
        events = admin.execute("SELECT count(*) AS n FROM idempotency_events WHERE event = 'stale_heal'").fetchone()
        assert events is not None and events["n"] == 1


@pytest.fixture
def orders_table(fresh_admin_url: str) -> str:
    """A business table the app role may write, beside the store it may not."""
    with connect(fresh_admin_url) as admin:
        admin.execute("CREATE TABLE paper_orders (id serial PRIMARY KEY, key_id bigint, qty int)")
        admin.execute("GRANT INSERT, SELECT ON paper_orders TO idem_app")
        admin.execute("GRANT USAGE ON SEQUENCE paper_orders_id_seq TO idem_app")
    return as_app_role(fresh_admin_url)


def test_a_zombie_cannot_commit_its_business_write_after_a_heal(orders_table: str) -> None:
    url = orders_table
    key = new_key()
    with connect(url) as zombie_conn, connect(url) as other:
        # the zombie claimed a minute ago and hangs past the stale threshold used below
        token = claim(zombie_conn, key, now=minutes_ago(1))
        zombie_conn.autocommit = False
        zombie_conn.execute("INSERT INTO paper_orders (key_id, qty) VALUES (%s, 1)", (token["key_id"],))

        assert claim(other, key, stale_after="1 second")["outcome"] == "stale"
        healed = claim(other, key, stale_after="1 second")
        assert healed["outcome"] == "claimed"

        with pytest.raises(psycopg.Error) as lost:
            complete(zombie_conn, token)
        assert lost.value.sqlstate == "IDM01"
        zombie_conn.rollback()

        complete(other, healed, body={"order": "second attempt"})
        assert other.execute("SELECT count(*) AS n FROM paper_orders").fetchone() == {"n": 0}
        replay = claim(other, key)
        assert replay["outcome"] == "replay"
        assert replay["response_body"] == {"order": "second attempt"}


def test_a_completion_that_gets_there_first_beats_a_concurrent_healer(orders_table: str, fresh_admin_url: str) -> None:
    url = orders_table
    key = new_key()
    with connect(url) as holder:
        token = claim(holder, key, now=minutes_ago(1))  # stale by the detector's 1 s threshold...
        holder.autocommit = False
        holder.execute("INSERT INTO paper_orders (key_id, qty) VALUES (%s, 1)", (token["key_id"],))
        complete(holder, token, body={"order": 1})  # ...but its completion holds the row

        with ThreadPoolExecutor(1) as pool, connect(url) as detector:
            pending = pool.submit(claim, detector, key, stale_after="1 second")
            wait_until_blocked(fresh_admin_url, detector.info.backend_pid)
            assert not pending.done(), "the healer must wait for the holder's transaction"
            holder.commit()
            result = pending.result(timeout=10)
        assert result["outcome"] == "replay"
        assert result["response_body"] == {"order": 1}
        assert holder.execute("SELECT count(*) AS n FROM paper_orders").fetchone() == {"n": 1}


def test_wait_ms_returns_replay_when_the_holder_completes_inside_the_window(
    fresh_app_role_url: str, fresh_admin_url: str
) -> None:
    key = new_key()
    with connect(fresh_app_role_url) as holder, connect(fresh_app_role_url) as waiter:
        token = claim(holder, key)
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(claim, waiter, key, wait_ms=5000)
            # the waiter found the holder in flight and polls (pg_sleep) inside its window
            assert wait_for_wait_event(fresh_admin_url, waiter.info.backend_pid, "Timeout") == "PgSleep"
            assert not pending.done()
            started = time.monotonic()
            complete(holder, token, body={"order_id": 42})
            result = pending.result(timeout=10)
            elapsed = time.monotonic() - started
        assert result["outcome"] == "replay"
        assert result["response_body"] == {"order_id": 42}
        assert elapsed < 2.0  # answered at its next poll, not at the end of the 5 s window


def test_wait_ms_returns_in_flight_when_the_holder_does_not_finish_in_time(fresh_app_role_url: str) -> None:
    key = new_key()
    with connect(fresh_app_role_url) as holder, connect(fresh_app_role_url) as waiter:
        claim(holder, key)
        started = time.monotonic()
        result = claim(waiter, key, wait_ms=400)
        elapsed = time.monotonic() - started
        assert result["outcome"] == "in_flight"
        assert 0 < result["retry_after_ms"] <= 5000
        assert 0.4 <= elapsed < 1.5


def test_heartbeat_keeps_a_slow_live_holder_from_being_healed(fresh_app_role_url: str) -> None:
    key, unrenewed = new_key(), new_key()
    with connect(fresh_app_role_url) as holder, connect(fresh_app_role_url) as detector:
        # two holders that claimed a minute ago, on a 30 s lease: only one of them renews it
        token = claim(holder, key, now=minutes_ago(1))
        claim(holder, unrenewed, now=minutes_ago(1))
        heartbeat(holder, token)
        result = claim(detector, key)
        assert result["outcome"] == "in_flight"
        assert 0 < result["retry_after_ms"] <= 5000
        assert claim(detector, unrenewed)["outcome"] == "stale"  # what the heartbeat prevented
        complete(holder, token)
