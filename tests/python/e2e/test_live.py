"""Exactly-once past the database (contract §4a/§5): the live route against the broker
simulator, with the faults the downstream key exists for. Each case ends with one fill per
client_order_id in the broker's ledger, the client's retry answering with that fill, and the
re-execution reporting attempt 2 (adopting the order an earlier execution had sent).

- a live order fills once and replays; the gates (paper account, live trading off, no key);
- a worker SIGKILLed after the broker accepted and before the completion;
- a worker SIGSTOPped past the stale window, resumed after the heal: it calls the broker with the
  same client_order_id (422 duplicate, nothing filled) and cannot complete;
- the database lost after the broker filled (the handler's backend terminated): the key is
  released, and the retry adopts the fill;
- the broker dropping the connection after accepting: the execution looks the order up and
  adopts it; and with the worker killed right after the dropped answer, the re-execution does;
- the checkout route forwards downstream_key("stripe") (a re-execution gets Stripe's replay).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from examples.simulators.process import Simulator
from tests.python.e2e.e2e_harness import Database, Server, StartServer, User, new_key, wait_until

LIVE = "/api/trading/live/orders"
ORDER = {"symbol": "AAPL", "side": "buy", "qty": 2}


def live_server(start_server: StartServer, db: Database, broker: Simulator, stale: float, **env: Any) -> Server:
    env.setdefault("RAPTOR_LIVE_TRADING", 1)
    return start_server(
        db.app_url, 4, IDEM_STALE_AFTER_SECONDS=stale, RAPTOR_TEST_HOOKS=1, RAPTOR_BROKER_URL=broker.url, **env
    )


def retry_until_final(server: Server, user: User, key: str, attempts: int = 30) -> requests.Response:
    for _ in range(attempts):
        r = server.post(LIVE, user, ORDER, key)
        if r.status_code != 409:
            return r
        time.sleep(min(r.json().get("retry_after_ms", 1000), 5000) / 1000)
    raise AssertionError(f"still 409 after {attempts} attempts")


def one_fill_per_order(broker: Simulator) -> list[dict[str, Any]]:
    fills = broker.fills()
    per_order = Counter(f["client_order_id"] for f in fills)
    assert all(n == 1 for n in per_order.values()), f"double fill: {per_order}"
    return fills


def backend_gone(db: Database, pid: int) -> None:
    wait_until(
        lambda: (
            not db.query(
                "SELECT 1 FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()",
                (f"%raptor-test-delay pid={pid} %",),
            )
        ),
        15,
        what="the killed worker's backend to end",
    )


def test_a_live_order_fills_once_and_its_replay_answers_with_that_fill(
    db: Database, start_server: StartServer, broker: Simulator
) -> None:
    server = live_server(start_server, db, broker, stale=5)
    user = db.seed_user(mode="live")
    key = new_key()
    first = server.post(LIVE, user, ORDER, key)
    assert first.status_code == 201, first.text
    body = first.json()
    assert body["attempt"] == 1 and body["adopted"] is False and body["status"] == "filled"
    assert key not in body["client_order_id"] and str(user.user_id) != body["client_order_id"]
    replay = server.post(LIVE, user, ORDER, key)
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.json()["broker_order_id"] == body["broker_order_id"]
    fills = one_fill_per_order(broker)
    assert [f["client_order_id"] for f in fills] == [body["client_order_id"]]
    # the DBA's view: the broker's client_order_id is idem_downstream_key of the stored key
    assert (
        db.scalar(
            "SELECT idem_downstream_key(k.idem_key, k.scope_user_id, k.scope_endpoint, 'broker')"
            "  FROM idempotency_keys k WHERE k.idem_key = %s",
            (key,),
        )
        == body["client_order_id"]
    )
    # the gates sit outside the layer: a paper account, and no key, are refused; nothing sent
    paper = db.seed_user()
    assert server.post(LIVE, paper, ORDER, new_key()).json()["error"] == "account_not_live"
    assert server.post(LIVE, user, ORDER, None).status_code == 400
    assert len(broker.fills()) == 1


def test_live_trading_off_refuses_the_order_before_the_layer(
    db: Database, start_server: StartServer, broker: Simulator
) -> None:
    server = live_server(start_server, db, broker, stale=5, RAPTOR_LIVE_TRADING=0)
    user = db.seed_user(mode="live")
    r = server.post(LIVE, user, ORDER, new_key())
    assert r.status_code == 403 and r.json()["error"] == "live_trading_disabled"
    assert broker.fills() == []


def test_worker_killed_after_the_broker_accepted_is_adopted_by_the_re_execution(
    db: Database, start_server: StartServer, broker: Simulator
) -> None:
    stale = 2
    server = live_server(start_server, db, broker, stale, GUNICORN_TIMEOUT=stale)
    user = db.seed_user(mode="live")
    key = new_key()
    delay = {"X-Raptor-Test-Delay-Ms": "3000", "X-Raptor-Test-Delay-At": "after-broker"}
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(server.post, LIVE, user, ORDER, key, delay)
        pid = db.slow_order_worker()
        assert len(broker.fills()) == 1  # the broker filled; the worker has not completed
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(requests.ConnectionError):
            pending.result()
    backend_gone(db, pid)
    assert db.scalar("SELECT count(*) FROM raptor.live_orders") == 0
    assert db.key_rows(key) == [("in_flight", None)]

    healed = retry_until_final(server, user, key)
    assert healed.status_code == 201, healed.text
    body = healed.json()
    assert body["attempt"] == 2 and body["adopted"] is True
    fills = one_fill_per_order(broker)
    assert len(fills) == 1 and fills[0]["client_order_id"] == body["client_order_id"]
    assert body["broker_order_id"] == fills[0]["order_id"]
    replay = server.post(LIVE, user, ORDER, key)
    assert (
        replay.headers.get("Idempotent-Replayed") == "true" and replay.json()["broker_order_id"] == fills[0]["order_id"]
    )
    assert db.scalar("SELECT count(*) FROM raptor.live_orders") == 1


def test_the_database_lost_after_the_broker_filled_is_adopted_by_the_retry(
    db: Database, start_server: StartServer, broker: Simulator
) -> None:
    """Found by the chaos soak (an orphan fill): the handler's connection was terminated after
    the broker filled, as it recorded the order; under on_failure="keep" the key was failed and
    the client's retry told 409 previous_failed, so no key ever named the fill. The broker
    dedupes on downstream_key, so the route releases a failed key and the retry adopts."""
    server = live_server(start_server, db, broker, 30)
    user = db.seed_user(mode="live")
    key = new_key()
    delay = {"X-Raptor-Test-Delay-Ms": "3000", "X-Raptor-Test-Delay-At": "after-broker"}
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(server.post, LIVE, user, ORDER, key, delay)
        pid = db.slow_order_worker()
        assert len(broker.fills()) == 1  # the broker filled; the order is not recorded yet
        db.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()",
            (f"%raptor-test-delay pid={pid} %",),
        )
        first = pending.result()
    assert first.status_code == 503, first.text
    retried = retry_until_final(server, user, key)
    assert retried.status_code == 201, retried.text
    assert retried.json()["adopted"] is True
    fills = one_fill_per_order(broker)
    assert len(fills) == 1 and retried.json()["broker_order_id"] == fills[0]["order_id"]
    assert db.key_rows(key)[0][0] == "completed"


def test_zombie_woken_after_the_heal_calls_the_broker_and_nothing_fills_twice(
    db: Database, start_server: StartServer, broker: Simulator
) -> None:
    stale = 1.5
    server = live_server(start_server, db, broker, stale, GUNICORN_TIMEOUT=60)
    user = db.seed_user(mode="live")
    key = new_key()
    delay = {"X-Raptor-Test-Delay-Ms": "300", "X-Raptor-Test-Delay-At": "before-broker"}
    with ThreadPoolExecutor(1) as pool:
        zombie_reply = pool.submit(server.post, LIVE, user, ORDER, key, delay)
        pid = db.slow_order_worker()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(stale + 0.5)
            healed = retry_until_final(server, user, key)
            assert healed.status_code == 201, healed.text
            assert healed.json()["attempt"] == 2 and healed.json()["adopted"] is False
            assert len(broker.fills()) == 1
        finally:
            os.kill(pid, signal.SIGCONT)
        zombie = zombie_reply.result(timeout=30)
    # the zombie reached the broker with the same client_order_id (422, nothing filled), then its
    # completion was fenced: its client never gets a second order
    assert zombie.status_code == 409 and zombie.json()["error"] == "idempotency_in_flight", zombie.text
    wait_until(lambda: broker.get("/_sim/orders")["orders"], 5, what="the broker's orders")
    fills = one_fill_per_order(broker)
    assert len(fills) == 1 and fills[0]["client_order_id"] == healed.json()["client_order_id"]
    replay = server.post(LIVE, user, ORDER, key)
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.json()["broker_order_id"] == fills[0]["order_id"]
    assert db.scalar("SELECT count(*) FROM raptor.live_orders") == 1
    assert "claim_lost" in server.log() or "claim lost" in server.log()


def test_broker_dropping_the_connection_after_accepting(
    db: Database, start_server: StartServer, broker: Simulator
) -> None:
    stale = 2
    server = live_server(start_server, db, broker, stale, GUNICORN_TIMEOUT=stale)
    user = db.seed_user(mode="live")
    # the same execution finds the order it could not hear about, and adopts it
    broker.faults(drop_after_accept=1)
    key = new_key()
    r = server.post(LIVE, user, ORDER, key)
    assert r.status_code == 201, r.text
    assert r.json()["attempt"] == 1 and r.json()["adopted"] is True
    assert server.post(LIVE, user, ORDER, key).json()["broker_order_id"] == r.json()["broker_order_id"]
    assert broker.faults()["applied"]["drop_after_accept"] == 1

    # dropped, and the worker killed before it completed: the re-execution adopts the order
    broker.faults(drop_after_accept=1)
    key2 = new_key()
    delay = {"X-Raptor-Test-Delay-Ms": "3000", "X-Raptor-Test-Delay-At": "after-broker"}
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(server.post, LIVE, user, ORDER, key2, delay)
        pid = db.slow_order_worker()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(requests.ConnectionError):
            pending.result()
    backend_gone(db, pid)
    healed = retry_until_final(server, user, key2)
    assert healed.status_code == 201, healed.text
    assert healed.json()["attempt"] == 2 and healed.json()["adopted"] is True
    fills = one_fill_per_order(broker)
    assert len(fills) == 2
    assert server.post(LIVE, user, ORDER, key2).json()["broker_order_id"] == healed.json()["broker_order_id"]


def test_broker_5xx_before_accepting_is_retried_with_the_same_client_order_id(
    db: Database, start_server: StartServer, broker: Simulator
) -> None:
    server = live_server(start_server, db, broker, stale=5)
    user = db.seed_user(mode="live")
    broker.faults(fail_before_accept=2)
    r = server.post(LIVE, user, ORDER, new_key())
    assert r.status_code == 201 and r.json()["adopted"] is False, r.text
    assert len(one_fill_per_order(broker)) == 1 and broker.faults()["applied"]["fail_before_accept"] == 2


def test_checkout_forwards_the_stripe_downstream_key(
    db: Database, start_server: StartServer, stripe: Simulator
) -> None:
    stale = 2
    server = start_server(
        db.app_url,
        IDEM_STALE_AFTER_SECONDS=stale,
        GUNICORN_TIMEOUT=stale,
        RAPTOR_TEST_HOOKS=1,
        RAPTOR_STRIPE_URL=stripe.url,
    )
    user = db.seed_user()
    key = new_key()
    first = server.post("/api/billing/checkout-session", user, {"plan": "pro"}, key)
    assert first.status_code == 201, first.text
    session_id = first.json()["checkout_session_id"]
    assert session_id.startswith("cs_test_")
    sessions = stripe.get("/_sim/sessions")["sessions"]
    assert [s["id"] for s in sessions] == [session_id]
    assert (
        server.post("/api/billing/checkout-session", user, {"plan": "pro"}, key).json()["checkout_session_id"]
        == session_id
    )
    # another key is another session; no key: Stripe is called without one
    other = server.post("/api/billing/checkout-session", user, {"plan": "pro"}, new_key())
    assert other.json()["checkout_session_id"] != session_id
    assert server.post("/api/billing/checkout-session", user, {"plan": "pro"}, None).status_code == 201
    assert len(stripe.get("/_sim/sessions")["sessions"]) == 3
