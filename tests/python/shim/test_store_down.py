"""The store down, three real ways, for both tiers; the app starting without it; recovery.

Cases: a closed port (connection refused), a server that accepts TCP but never answers
(connect timeout), a stopped server (a TCP proxy cut off, then back: the pool recovers without an
app restart), a statement that times out behind a lock held by another session. Tier 1
(fail_closed) answers 503 + Retry-After and never runs the handler; Tier 2 (fail_open) runs it
without dedup and logs exactly one WARNING. Start-up: a database that does not answer only logs;
a database without the SQL API, or with an older one, stops the app with a clear error.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from flask import Flask

import testdb
from idem_shim import Idem
from idem_shim.errors import SchemaError, StoreDownError
from idem_shim.pool import ForkSafePool
from tests.python.support.shim import (
    PgProxy,
    closed_port,
    executions,
    make_app,
    post,
    running_app,
    scalar,
    server_address,
    settled,
    shim_db,
    with_host_port,
)


def new_key() -> str:
    return str(uuid.uuid4())


def shim_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "idem_shim" and r.levelno == logging.WARNING]


def assert_tiers_while_down(
    app: Flask, admin: str, caplog: pytest.LogCaptureFixture, *, unreachable: bool, known_down: bool = False
) -> None:
    """Tier 1 answers 503 and runs nothing, Tier 2 runs without dedup, each store error counted.

    ``unreachable``: the store takes no connection (the breaker opens on the first request, or
    is open already: ``known_down``): one ``store_down`` line says so (none when known), and no
    request adds a line of its own. Else the server answers with an error (a lock): one line per
    request, the fail-open one a WARNING."""
    client = app.test_client()
    before_orders = int(scalar(admin, "SELECT count(*) FROM shim_orders"))

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="idem_shim"):
        started = time.monotonic()
        closed = post(client, "/orders", new_key(), {"item": "a"})
        assert closed.status_code == 503
        assert closed.get_json() == {"error": "idempotency_store_unavailable"}
        assert closed.headers["Retry-After"] == "1"
        assert time.monotonic() - started < 5  # bounded by the pool timeout, not a hang
        assert executions(app) == 0

        opened = post(client, "/billing", new_key())
        assert opened.status_code == 201 and "checkout_session_id" in opened.get_json()
        assert executions(app) == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "idem_shim" and r.levelno >= logging.WARNING]
    if unreachable:
        assert [line.split()[1] for line in lines] == ([] if known_down else ["store_down"]), lines
    else:
        warnings = shim_warnings(caplog)
        assert len(warnings) == 1, lines
        message = warnings[0].getMessage()
        assert "store_unavailable" in message and "fail_open" in message and 'endpoint="POST /billing"' in message
    assert int(scalar(admin, "SELECT count(*) FROM shim_orders")) == before_orders + 1

    metrics = app.extensions["idem"].metrics.registry
    assert (
        metrics.get_sample_value("idempotency_store_errors_total", {"endpoint": "POST /orders", "stage": "claim"}) == 1
    )
    assert (
        metrics.get_sample_value("idempotency_store_errors_total", {"endpoint": "POST /billing", "stage": "claim"}) == 1
    )


@pytest.fixture
def role_url(fresh_admin_url: str) -> str:
    return shim_db(fresh_admin_url)


def test_closed_port(role_url: str, fresh_admin_url: str, caplog: pytest.LogCaptureFixture) -> None:
    down = with_host_port(role_url, "127.0.0.1", closed_port())
    with caplog.at_level(logging.WARNING, logger="idem_shim"):
        app = make_app(down, business_url=role_url)  # starts although the store is down
    try:
        assert any("unreachable at start-up" in r.getMessage() for r in caplog.records)
        assert_tiers_while_down(app, fresh_admin_url, caplog, unreachable=True)
    finally:
        app.extensions["idem"].store.close()


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A TCP server that accepts connections and never says a word (a hung host)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for sock in held:
            sock.close()


def test_server_that_never_answers(role_url: str, fresh_admin_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with silent_server() as port:
        hung = with_host_port(role_url, "127.0.0.1", port)
        app = make_app(hung, business_url=role_url, IDEM_CONNECT_TIMEOUT=1)
        try:
            assert_tiers_while_down(app, fresh_admin_url, caplog, unreachable=True)
        finally:
            app.extensions["idem"].store.close()


def test_stopped_server_then_back_without_restarting_the_app(
    role_url: str, fresh_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = PgProxy(server_address(fresh_admin_url)).start()
    proxy.stop()  # the database is down when the app starts
    app = make_app(proxy.url(role_url), business_url=role_url)
    try:
        client = app.test_client()
        assert post(client, "/orders", new_key(), {"item": "x"}).status_code == 503

        proxy.start()  # the database comes back
        key = new_key()
        deadline = time.monotonic() + 10
        while (response := post(client, "/orders", key, {"item": "x"})).status_code == 503:
            assert time.monotonic() < deadline, "the pool never recovered"
            time.sleep(0.2)
        assert response.status_code == 201
        assert post(client, "/orders", key, {"item": "x"}).headers["Idempotent-Replayed"] == "true"

        settled(app)  # resets done: a reset the stop cuts would find the store down first
        proxy.stop()  # stopped again while the pool holds live connections
        app.extensions["shim_test_executions"].count = 0
        app.extensions["idem"].metrics.store_errors.clear()
        assert_tiers_while_down(app, fresh_admin_url, caplog, unreachable=True)

        proxy.start()  # and back: broken pooled connections are replaced, no restart needed
        key = new_key()
        deadline = time.monotonic() + 15
        while (response := post(client, "/orders", key, {"item": "y"})).status_code == 503:
            assert time.monotonic() < deadline, "the pool never recovered"
            time.sleep(0.2)
        assert response.status_code == 201
    finally:
        app.extensions["idem"].store.close()
        proxy.stop()


def test_a_connection_lost_while_the_pool_resets_it_is_a_store_down_at_once(
    role_url: str, fresh_admin_url: str
) -> None:
    """Found by test_outage under load: the server stopped while a finished request's connection
    was back in the pool, being reset on the pool's worker; nothing told the breaker, and the next
    request waited a whole pool timeout for a connection the pool could not make (then, the server
    back, a 503 "busy"). A reset that fails is a connection found dead: a probe decides at once."""
    proxy = PgProxy(server_address(fresh_admin_url)).start()
    app = make_app(proxy.url(role_url), business_url=role_url, IDEM_POOL_TIMEOUT=4.0)
    try:
        source = app.extensions["idem"].store.source
        assert isinstance(source, ForkSafePool)
        conn = source.getconn()
        conn.execute("SELECT 1")
        proxy.stop()  # the server goes away; the connection does not know yet (no I/O since)
        source.putconn(conn)  # the pool's worker resets it, and that fails
        started = time.monotonic()
        with pytest.raises(StoreDownError):
            source.getconn()
        waited = time.monotonic() - started
        assert waited < 2.0, f"the next request waited {waited:.1f} s (the pool timeout is 4 s)"
    finally:
        app.extensions["idem"].store.close()
        proxy.stop()


def test_statement_timeout_behind_a_lock(role_url: str, fresh_admin_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with running_app(role_url, IDEM_STATEMENT_TIMEOUT_MS=300) as app, psycopg.connect(fresh_admin_url) as locker:
        client = app.test_client()
        assert post(client, "/orders", new_key(), {"item": "warm"}).status_code == 201
        app.extensions["shim_test_executions"].count = 0
        app.extensions["idem"].metrics.store_errors.clear()
        locker.execute("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
        try:
            # the fail-open handler writes through the shim's own connection: it is healthy
            assert_tiers_while_down(app, fresh_admin_url, caplog, unreachable=False)
        finally:
            locker.rollback()
        key = new_key()
        assert post(client, "/orders", key, {"item": "after"}).status_code == 201
        assert post(client, "/orders", key, {"item": "after"}).headers["Idempotent-Replayed"] == "true"


# -- start-up --------------------------------------------------------------------------------


def test_missing_sql_api_stops_the_app_with_a_clear_error(admin_url: str) -> None:
    name = f"idem_empty_{uuid.uuid4().hex[:8]}"
    url = testdb.create(admin_url, name)
    try:
        app = Flask("no_schema")
        app.config["IDEM_DATABASE_URL"] = url
        with pytest.raises(SchemaError, match=r"idem_schema_version\(\) does not exist"):
            Idem(app)
    finally:
        testdb.drop(admin_url, name)


def test_older_sql_api_stops_the_app(fresh_admin_url: str) -> None:
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        conn.execute(
            "CREATE OR REPLACE FUNCTION public.idem_schema_version() RETURNS integer LANGUAGE sql AS 'SELECT 0'"
        )
    app = Flask("old_schema")
    app.config["IDEM_DATABASE_URL"] = fresh_admin_url
    with pytest.raises(SchemaError, match="older than"):
        Idem(app)


def test_schema_check_can_be_turned_off(admin_url: str) -> None:
    app = Flask("unchecked")
    app.config.update(IDEM_DATABASE_URL=with_host_port(admin_url, "127.0.0.1", closed_port()), IDEM_CHECK_SCHEMA=False)
    Idem(app)
    assert app.extensions["idem"].settings.check_schema is False
