"""Faults of the setting contract §5 describes: a worker killed mid-request, a worker
frozen past the stale threshold (a zombie), the idempotency store failing while the business
database is up, and the database going away altogether."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
import requests

from tests.python.e2e.e2e_harness import Database, Server, StartServer, User, new_key
from tests.python.support.waiting import wait_until

ORDER = {"symbol": "NVDA", "side": "buy", "qty": 3}
START_CASH = 1_000_000_000


def cash(db: Database, user: User) -> int:
    return int(db.scalar("SELECT cash_cents FROM raptor.accounts WHERE user_id = %s", (user.user_id,)))


def retry_until_final(
    server: Server, user: User, key: str, body: dict[str, Any], attempts: int = 20
) -> requests.Response:
    """A well-behaved client: retry a 409 after its Retry-After hint (in ms from the body)."""
    for _ in range(attempts):
        r = server.order(user, key, body)
        if r.status_code != 409:
            return r
        time.sleep(min(r.json().get("retry_after_ms", 1000), 5000) / 1000)
    raise AssertionError(f"still 409 after {attempts} attempts")


# --- a worker killed mid-order --------------------------------------------------------------


def test_worker_killed_mid_order_heals_after_stale_window_and_fills_once(
    db: Database, start_server: StartServer
) -> None:
    stale = 2
    server = start_server(db.app_url, IDEM_STALE_AFTER_SECONDS=stale, GUNICORN_TIMEOUT=stale, RAPTOR_TEST_HOOKS=1)
    user = db.seed_user()
    key = new_key()

    with ThreadPoolExecutor(1) as pool:
        # the order writes everything, then sleeps 1.5 s inside its uncommitted transaction
        pending = pool.submit(server.order, user, key, ORDER, headers={"X-Raptor-Test-Delay-Ms": "1500"})
        pid = db.slow_order_worker()
        assert pid in server.worker_pids()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(requests.ConnectionError):
            pending.result()
    killed_at = time.monotonic()

    # the killed transaction left nothing behind; the key is held by a dead worker
    wait_until(
        lambda: (
            not db.query(
                "SELECT 1 FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()",
                (f"%raptor-test-delay pid={pid} %",),
            )
        ),
        10,
        what="the killed worker's backend to end",
    )
    assert db.orders_for_key(key) == []
    assert cash(db, user) == START_CASH
    assert db.scalar("SELECT count(*) FROM raptor.positions WHERE user_id = %s", (user.user_id,)) == 0
    assert db.scalar("SELECT count(*) FROM public.audit_log WHERE user_id = %s", (user.user_id,)) == 0
    assert db.key_rows(key) == [("in_flight", None)]

    early = server.order(user, key, ORDER)
    assert early.status_code == 409 and early.json()["error"] == "idempotency_in_flight"

    time.sleep(max(0.0, stale + 0.2 - (time.monotonic() - killed_at)))
    healed = retry_until_final(server, user, key, ORDER)
    assert healed.status_code == 201 and "Idempotent-Replayed" not in healed.headers
    replay = server.order(user, key, ORDER)
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.json()["order_id"] == healed.json()["order_id"]

    orders = db.orders_for_key(key)
    assert orders == [(healed.json()["order_id"], "filled")]
    assert db.fill_audit_rows([orders[0][0]]) == 1
    assert cash(db, user) == START_CASH - 3 * 12877
    assert db.scalar("SELECT count(*) FROM public.idempotency_events WHERE event = 'stale_heal'") == 1
    # gunicorn replaced the dead worker
    wait_until(lambda: len(server.worker_pids()) == 4, 10, what="a replacement worker")


# --- a zombie: frozen past the threshold, then resumed --------------------------------------


@pytest.mark.parametrize("freeze_at", ["before-writes", "after-writes"])
def test_zombie_worker_resumed_after_heal_cannot_commit_its_order(
    db: Database, start_server: StartServer, freeze_at: str
) -> None:
    """The holder is frozen (SIGSTOP) past the stale threshold; another request heals the key
    and fills; the holder is resumed (SIGCONT) and its completion is refused, so its order
    never commits. gunicorn's own timeout is long here: it must not kill the zombie for us.

    before-writes: the zombie is frozen before touching the account; the healer fills at once.
    after-writes: the zombie froze holding the account's row lock, so the healer waits on it
    until the zombie resumes, fails its completion and rolls back.
    """
    stale = 1.5
    server = start_server(db.app_url, IDEM_STALE_AFTER_SECONDS=stale, GUNICORN_TIMEOUT=60, RAPTOR_TEST_HOOKS=1)
    user = db.seed_user()
    key = new_key()

    with ThreadPoolExecutor(2) as pool:
        zombie_reply = pool.submit(
            server.order,
            user,
            key,
            ORDER,
            headers={"X-Raptor-Test-Delay-Ms": "1500", "X-Raptor-Test-Delay-At": freeze_at},
        )
        pid = db.slow_order_worker()
        os.kill(pid, signal.SIGSTOP)
        try:
            frozen_at = time.monotonic()
            time.sleep(stale + 0.3)
            # the first retry finds the holder stale and frees the key...
            heal = server.order(user, key, ORDER)
            assert heal.status_code == 409 and heal.json()["retry_after_ms"] <= 1000
            # ...and the next one executes, on another worker
            healer_reply = pool.submit(server.order, user, key, ORDER)
            if freeze_at == "before-writes":
                healer = healer_reply.result(timeout=10)
                assert healer.status_code == 201 and "Idempotent-Replayed" not in healer.headers
            else:
                time.sleep(0.5)
                assert not healer_reply.done(), "the healer waits on the zombie's row lock"
            assert time.monotonic() - frozen_at > stale
        finally:
            os.kill(pid, signal.SIGCONT)
        zombie = zombie_reply.result(timeout=20)
        healer = healer_reply.result(timeout=20)

    assert healer.status_code == 201 and "Idempotent-Replayed" not in healer.headers
    # the zombie's completion found its claim lost: its writes rolled back, it answers 409
    assert zombie.status_code == 409, zombie.text
    assert zombie.json()["error"] == "idempotency_in_flight"
    order_id = healer.json()["order_id"]
    assert db.orders_for_key(key) == [(order_id, "filled")]
    assert db.fill_audit_rows([order_id]) == 1
    assert cash(db, user) == START_CASH - 3 * 12877
    replay = server.order(user, key, ORDER)
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.json()["order_id"] == order_id
    assert re.search(r"claim_lost", server.log()), "the zombie's lost claim is logged"


# --- the idempotency store fails, the business database is up --------------------------------


def _assert_store_down_behaviour(server: Server, db: Database, user: User) -> None:
    orders_before = db.scalar("SELECT count(*) FROM raptor.paper_orders")
    order = server.order(user, new_key(), ORDER)
    assert order.status_code == 503
    assert order.json() == {"error": "idempotency_store_unavailable"}
    assert "Retry-After" in order.headers
    roll = server.post(
        "/api/trading/lcc/roll",
        user,
        {"leg_id": user.leg_id, "new_expiry": "2099-01-15", "new_strike_cents": 21000},
        new_key(),
    )
    assert roll.status_code == 503
    assert db.scalar("SELECT count(*) FROM raptor.paper_orders") == orders_before
    assert db.scalar("SELECT status FROM raptor.lcc_legs WHERE id = %s", (user.leg_id,)) == "open"

    log_before = len(server.log())
    billing = server.post("/api/billing/checkout-session", user, {"plan": "pro"}, new_key())
    assert billing.status_code == 201, billing.text
    assert "Idempotent-Replayed" not in billing.headers
    session_id = billing.json()["checkout_session_id"]
    assert db.scalar("SELECT count(*) FROM raptor.checkout_sessions WHERE id = %s", (session_id,)) == 1
    wait_until(lambda: "WARNING" in server.log()[log_before:], 5, what="a WARNING log line")
    warning = [line for line in server.log()[log_before:].splitlines() if "WARNING" in line]
    assert any("store_unavailable" in line and "fail_open" in line for line in warning), warning


def _assert_everything_works(server: Server, db: Database, user: User) -> None:
    key = new_key()
    order = server.order(user, key, ORDER)
    assert order.status_code == 201, order.text
    assert server.order(user, key, ORDER).headers.get("Idempotent-Replayed") == "true"
    bkey = new_key()
    billing = server.post("/api/billing/checkout-session", user, {"plan": "team"}, bkey)
    again = server.post("/api/billing/checkout-session", user, {"plan": "team"}, bkey)
    assert billing.status_code == 201 and again.headers.get("Idempotent-Replayed") == "true"
    assert again.json()["checkout_session_id"] == billing.json()["checkout_session_id"]


def test_store_locked_orders_503_billing_runs_with_warning_then_recovers(
    db: Database, start_server: StartServer
) -> None:
    """An ACCESS EXCLUSIVE lock on idempotency_keys makes every claim time out
    (IDEM_STATEMENT_TIMEOUT_MS) while the business tables answer normally."""
    server = start_server(db.app_url, IDEM_STATEMENT_TIMEOUT_MS=300)
    user = db.seed_user()
    with psycopg.connect(db.admin_url) as locker:
        locker.execute("LOCK TABLE public.idempotency_keys IN ACCESS EXCLUSIVE MODE")
        _assert_store_down_behaviour(server, db, user)
        locker.rollback()
    pids = server.worker_pids()
    _assert_everything_works(server, db, user)
    assert server.worker_pids() == pids, "recovered without restarting a worker"


def test_store_refused_orders_503_billing_runs_with_warning_then_recovers(
    db: Database, start_server: StartServer
) -> None:
    """EXECUTE on idem_claim revoked from the app's role: the claim errors at once."""
    server = start_server(db.app_url)
    user = db.seed_user()
    claim = db.scalar(
        "SELECT oid::regprocedure::text FROM pg_proc "
        "WHERE proname = 'idem_claim' AND pronamespace = 'public'::regnamespace"
    )
    db.query(f"REVOKE EXECUTE ON FUNCTION {claim} FROM idem_app")
    try:
        _assert_store_down_behaviour(server, db, user)
    finally:
        db.query(f"GRANT EXECUTE ON FUNCTION {claim} TO idem_app")
    _assert_everything_works(server, db, user)


# --- the database stopped, then started again ------------------------------------------------


@pytest.mark.slow
def test_database_stopped_orders_503_then_recover_without_restart(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, IDEM_POOL_TIMEOUT=1, IDEM_CONNECT_TIMEOUT=1, RAPTOR_DB_CONNECT_TIMEOUT_S=1)
    user = db.seed_user()
    _assert_everything_works(server, db, user)
    pids = server.worker_pids()

    db.cluster.stop("fast")
    try:
        statuses = set()
        for _ in range(6):  # every worker, whatever its pool held before
            r = server.order(user, new_key(), ORDER, timeout=15)
            statuses.add(r.status_code)
            assert r.status_code == 503, r.text
            assert "Retry-After" in r.headers
        assert statuses == {503}
    finally:
        db.cluster.start()

    # back: the first requests may still meet a connection the restart broke, then all works
    def order_ok() -> bool:
        return server.order(user, new_key(), ORDER, timeout=15).status_code == 201

    wait_until(order_ok, 20, 0.2, what="orders to work again")
    for _ in range(8):
        _assert_everything_works(server, db, user)
    assert server.worker_pids() == pids, "recovered without restarting a worker"
    orders = db.scalar("SELECT count(*) FROM raptor.paper_orders WHERE user_id = %s", (user.user_id,))
    keys = db.scalar(
        "SELECT count(*) FROM public.idempotency_keys WHERE scope_user_id = %s "
        "AND scope_endpoint = 'POST /api/trading/orders' AND status = 'completed'",
        (user.user_id,),
    )
    assert orders == keys, "every executed order has its completed key, and no more"


# --- gunicorn graceful restart (HUP) under load ----------------------------------------------


@pytest.mark.slow
def test_graceful_restart_under_load_loses_no_key_and_double_fills_nothing(
    db: Database, start_server: StartServer
) -> None:
    server = start_server(db.app_url)
    user = db.seed_user()
    stop = threading.Event()
    results: dict[str, int] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        session = requests.Session()
        while not stop.is_set():
            key = new_key()
            for _ in range(50):  # retry this key until it has a definitive answer
                try:
                    r = server.order(user, key, ORDER, session=session, timeout=10)
                except requests.ConnectionError:
                    time.sleep(0.05)
                    continue
                if r.status_code == 409:
                    time.sleep(min(r.json().get("retry_after_ms", 100), 500) / 1000)
                    continue
                with lock:
                    if r.status_code == 201:
                        results[key] = r.json()["order_id"]
                    else:
                        errors.append(f"{r.status_code} {r.text}")
                break

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            time.sleep(1.5)
            old = set(server.worker_pids())
            server.process.send_signal(signal.SIGHUP)

            def replaced(old: set[int] = old) -> bool:
                return not (set(server.worker_pids()) & old) and len(server.worker_pids()) == 4

            wait_until(replaced, 20, what="gunicorn to replace every worker")
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(60)

    assert not errors, errors[:5]
    assert len(results) > 50, f"only {len(results)} orders under load"
    rows = db.query(
        "SELECT client_key, array_agg(id) FROM raptor.paper_orders WHERE user_id = %s GROUP BY client_key",
        (user.user_id,),
    )
    by_key = dict(rows)
    assert all(len(ids) == 1 for ids in by_key.values()), "no key filled twice"
    assert set(by_key) >= set(results)
    assert all(by_key[k] == [oid] for k, oid in results.items())
    # every completed key survived the restarts: a retry now replays the same order
    with ThreadPoolExecutor(8) as pool:
        replays = list(pool.map(lambda k: server.order(user, k, ORDER), list(results)))
    assert all(r.status_code == 201 and r.headers.get("Idempotent-Replayed") == "true" for r in replays)
    assert [r.json()["order_id"] for r in replays] == list(results.values())
