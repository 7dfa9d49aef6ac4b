"""The store found down a moment ago (contract §4's last row), in one process: answered at once until
a probe finds it back, one log line per change of state; and what a handler meets when the
store's database is gone (fail-open never a 500), the kill switch's lines, a setting from the
environment.

Cases: a server stopped under a warm pool (a TCP proxy cut off) is found down by the first
request and every later one is answered without waiting the pool timeout, the first request
after it is back is served, and the log holds one ``store_down`` and one ``store_back``; a pool
whose every connection is busy is not a store down (a probe connects: no breaker, no line); a
fail-open handler that writes through ``connection()`` gets Tier 1's 503 (problem+json), never
a 500, and so does a request without a key; the kill switch logs once when it turns on and once
when it turns off; ``IDEM_WAIT_MS`` from the environment makes a duplicate wait.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import pytest
from flask import Flask, g

from idem_shim import Idem, connection, idempotency_key
from tests.python.support.shim import AppFactory, Order, PgProxy, post, scalar, server_address, settled, state_of

POOL_TIMEOUT = 2.0  # what each request waited before the breaker: the bound "at once" is held to


def new_key() -> str:
    return str(uuid.uuid4())


def shim_events(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    """The events (``store_down``, ...) of the shim's lines at ``level`` and above."""
    return [r.getMessage().split()[1] for r in caplog.records if r.name == "idem_shim" and r.levelno >= level]


def timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_a_store_found_down_is_answered_at_once_until_a_probe_finds_it_back(
    make_app: AppFactory, shim_web_url: str, fresh_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = PgProxy(server_address(fresh_admin_url)).start()
    try:
        app = make_app(
            url=proxy.url(shim_web_url),
            business_url=shim_web_url,
            IDEM_POOL_TIMEOUT=POOL_TIMEOUT,
            IDEM_STORE_PROBE_INTERVAL=0.2,
        )
        client = app.test_client()
        assert post(client, "/orders", new_key(), {"item": "warm"}).status_code == 201

        settled(app)  # resets done: a reset the stop cuts would find the store down first
        proxy.stop()  # the server goes away under a pool holding live connections
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="idem_shim"):
            answers = [timed(lambda: post(client, "/orders", new_key(), {"item": "x"})) for _ in range(20)]
            billing = [timed(lambda: post(client, "/billing", new_key())) for _ in range(5)]
        assert [r.status_code for r, _ in answers] == [503] * 20
        assert all(r.headers["Retry-After"] == "1" for r, _ in answers)
        # the first request found the store down (a dead connection, then a probe refused); none
        # of them waited for the pool
        slowest = max(seconds for _, seconds in answers + billing)
        assert slowest < POOL_TIMEOUT / 2, f"a request waited {slowest:.2f} s: the pool was asked"
        assert [r.status_code for r, _ in billing] == [201] * 5, "fail-open runs without dedup"
        assert shim_events(caplog) == ["store_down"], "one line for the change, none per request"
        store_errors = state_of(app).metrics.registry.get_sample_value(
            "idempotency_store_errors_total", {"endpoint": "POST /orders", "stage": "claim"}
        )
        assert store_errors == 20, "every answer is still counted"

        proxy.start()  # the server is back
        time.sleep(0.3)  # past the probe interval: the next request probes and is served
        caplog.clear()
        key = new_key()
        with caplog.at_level(logging.INFO, logger="idem_shim"):
            first = post(client, "/orders", key, {"item": "back"})
            assert first.status_code == 201, first.get_json()
            assert post(client, "/orders", key, {"item": "back"}).headers["Idempotent-Replayed"] == "true"
        assert shim_events(caplog) == ["store_back"]
        line = next(r.getMessage() for r in caplog.records if "store_back" in r.getMessage())
        assert "down_s=" in line
    finally:
        proxy.stop()


def test_a_pool_whose_every_connection_is_busy_is_not_a_store_down(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The breaker never answers for a store that is up: a pool timeout while the server takes
    connections is this request's 503 alone; the next request, with a connection free, is served."""
    app = make_app(IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_POOL_TIMEOUT=0.3, IDEM_STORE_PROBE_INTERVAL=60)
    client = app.test_client()
    assert post(client, "/orders", new_key(), {"item": "warm"}).status_code == 201
    source = state_of(app).store.source
    held = source.getconn()  # the pool's one connection, busy elsewhere
    try:
        with caplog.at_level(logging.INFO, logger="idem_shim"):
            busy = post(client, "/orders", new_key(), {"item": "busy"})
        assert busy.status_code == 503
    finally:
        source.putconn(held)
    assert "store_down" not in shim_events(caplog, logging.DEBUG)
    # with an interval of 60 s, an open breaker would refuse this one: it is served at once
    assert post(client, "/orders", new_key(), {"item": "free"}).status_code == 201


def shared_database_app(url: str, **config: Any) -> Flask:
    """A fail-open route whose handler writes through ``connection()`` alone: the business tables
    share the store's database, the common setup."""
    app = Flask("shared_database")
    app.config.update(IDEM_DATABASE_URL=url, IDEM_POOL_TIMEOUT=1.0, IDEM_CONNECT_TIMEOUT=2, **config)

    @app.before_request
    def session() -> None:
        g.current_user_id = 1

    @app.post("/billing")
    @idempotency_key(ttl_hours=168, fail_closed=False)
    def checkout() -> Any:
        row = (
            connection()
            .execute("INSERT INTO shim_orders (user_id, route) VALUES (1, 'billing') RETURNING id")
            .fetchone()
        )
        assert row is not None
        return {"checkout_session_id": f"cs_{row[0]}"}, 201

    Idem(app)
    return app


@pytest.mark.parametrize("error_format", ["json", "problem+json"])
def test_fail_open_without_the_database_is_tier_ones_503_never_a_500(
    shim_web_url: str, fresh_admin_url: str, error_format: str
) -> None:
    proxy = PgProxy(server_address(fresh_admin_url)).start()
    app = shared_database_app(proxy.url(shim_web_url), IDEM_ERROR_FORMAT=error_format)
    try:
        client = app.test_client()
        assert post(client, "/billing", new_key()).status_code == 201
        proxy.stop()
        for key in (new_key(), new_key(), None):  # found down, known down, and untracked (no key)
            r = post(client, "/billing", key)
            assert r.status_code == 503, r.get_data(as_text=True)
            assert r.headers["Retry-After"] == "1"
            body = r.get_json()
            assert body["error"] == "idempotency_store_unavailable"
            if error_format == "problem+json":
                assert r.mimetype == "application/problem+json"
                assert body["status"] == 503 and body["type"].endswith("idempotency-store-unavailable")
            else:
                assert body == {"error": "idempotency_store_unavailable"}
    finally:
        state_of(app).store.close()
        proxy.stop()


def test_the_kill_switch_logs_once_when_it_turns_on_and_once_when_it_turns_off(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_app().test_client()
    monkeypatch.delenv("FLAG_IDEMPOTENCY_MIDDLEWARE", raising=False)
    assert post(client, "/orders", new_key(), {"item": "on"}).status_code == 201  # the switch as it is now
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="idem_shim"):
        monkeypatch.setenv("FLAG_IDEMPOTENCY_MIDDLEWARE", "0")
        key = new_key()
        for _ in range(3):
            assert "Idempotent-Replayed" not in post(client, "/orders", key, {"item": "off"}).headers
        assert shim_events(caplog) == ["kill_switch_on"]
        line = next(r.getMessage() for r in caplog.records if "kill_switch_on" in r.getMessage())
        assert "FLAG_IDEMPOTENCY_MIDDLEWARE" in line
        monkeypatch.setenv("FLAG_IDEMPOTENCY_MIDDLEWARE", "1")
        key = new_key()
        for _ in range(3):
            post(client, "/orders", key, {"item": "back"})
    assert shim_events(caplog) == ["kill_switch_on", "kill_switch_off"]


def test_idem_wait_ms_from_the_environment_makes_a_duplicate_wait(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A duplicate of a 0.6 s request: with IDEM_WAIT_MS=2000 in the environment (and nothing in
    app.config) it waits inside the claim and gets the replay, where the default answers 409."""

    def slow(order: Order) -> Any:
        time.sleep(0.6)
        return {"order_id": order.write()}, 201

    monkeypatch.setenv("IDEM_WAIT_MS", "2000")
    app = make_app(handler=slow)
    assert state_of(app).settings.wait_ms == 2000
    key, answers = new_key(), {}

    def first() -> None:
        answers["first"] = post(app.test_client(), "/orders", key, {"item": "w"})

    holder = threading.Thread(target=first)
    holder.start()
    time.sleep(0.2)  # the first request holds the key, in its handler
    duplicate = post(app.test_client(), "/orders", key, {"item": "w"})
    holder.join()
    assert answers["first"].status_code == 201
    assert duplicate.status_code == 201 and duplicate.headers["Idempotent-Replayed"] == "true"
    assert duplicate.get_json()["order_id"] == answers["first"].get_json()["order_id"]


@pytest.mark.parametrize("claimed", [True, False])
def test_the_store_lost_under_a_handler_is_a_503_never_a_500(
    make_app: AppFactory, shim_web_url: str, fresh_admin_url: str, claimed: bool
) -> None:
    """The server goes away between the claim and the handler's first statement, or under a
    handler that writes through connection() with no claim (no key): the client gets the
    store's 503 with Retry-After; a claimed key stays in flight for its retry."""
    proxy = PgProxy(server_address(fresh_admin_url)).start()

    def cut_then_write(order: Order) -> Any:
        proxy.stop()
        return {"order_id": order.write()}, 201

    try:
        app = make_app(cut_then_write, url=proxy.url(shim_web_url), business_url=shim_web_url)
        key = new_key() if claimed else None
        answer = post(app.test_client(), "/orders", key, {"item": "cut"})
        assert answer.status_code == 503, answer.get_data(as_text=True)
        assert answer.headers["Retry-After"] == "1"
        assert answer.get_json() == {"error": "idempotency_store_unavailable"}
        if key is not None:
            status = scalar(fresh_admin_url, "SELECT status FROM idempotency_keys WHERE idem_key = %s", (key,))
            assert status == "in_flight"
    finally:
        proxy.stop()


def test_a_connection_that_comes_back_broken_finds_the_store_down_for_the_next_request(
    make_app: AppFactory, shim_web_url: str, fresh_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server goes away under a request in its handler: its connection comes back broken
    and the pool drops it, so the next request would find no connection and wait the pool
    timeout. The broken connection is the sign: the next requests are answered at once."""
    proxy = PgProxy(server_address(fresh_admin_url)).start()

    def cut_then_write(order: Order) -> Any:
        proxy.stop()
        return {"order_id": order.write()}, 201

    try:
        app = make_app(
            cut_then_write,
            url=proxy.url(shim_web_url),
            business_url=shim_web_url,
            IDEM_POOL_MIN_SIZE=1,
            IDEM_POOL_MAX_SIZE=1,
            IDEM_POOL_TIMEOUT=POOL_TIMEOUT,
        )
        client = app.test_client()
        with caplog.at_level(logging.INFO, logger="idem_shim"):
            assert post(client, "/orders", new_key(), {"item": "cut"}).status_code == 503
            answers = [timed(lambda: post(client, "/orders", new_key(), {"item": "x"})) for _ in range(5)]
        assert [r.status_code for r, _ in answers] == [503] * 5
        slowest = max(seconds for _, seconds in answers)
        assert slowest < POOL_TIMEOUT / 2, f"a request waited {slowest:.2f} s: the pool was asked"
        assert shim_events(caplog).count("store_down") == 1
    finally:
        proxy.stop()
