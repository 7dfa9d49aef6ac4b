"""The breaker tells a busy store from a down one (contract §3a: no client can switch deduplication
off for others; the breaker opens only for a store that did not answer).

Cases: one client's slow requests fill the app's role's ``CONNECTION LIMIT`` (the pool sized to
it): the request past the pool times out and gets its own 503 with ``Retry-After`` (on a
fail-open route too: the store is up, so nothing runs without dedup), the probe it starts meets
``53300 too many connections`` and the breaker stays closed, and another user's requests are
served with dedup as soon as a connection is free; a probe the server answers with an error of
its own (53300, 57P03, 3D000) never opens the breaker, and one that meets a closed port does.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.python.support.shim import AppFactory, Order, as_role, closed_port, post, with_host_port
from tests.python.support.waiting import wait_until

LIMIT = 3  # the app's role's CONNECTION LIMIT, and its pool's size
PROBE_INTERVAL = 30.0  # an open breaker would refuse every request of the test


def new_key() -> str:
    return str(uuid.uuid4())


def shim_events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage().split()[1] for r in caplog.records if r.name == "idem_shim"]


@pytest.fixture
def limited_role_url(shim_web_url: str, fresh_admin_url: str) -> Iterator[str]:
    """A login role of the app's (idem_app and the business tables) with ``CONNECTION LIMIT``
    LIMIT, for this test alone (roles are the cluster's)."""
    role = f"idem_shim_busy_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE idem_app CONNECTION LIMIT {}").format(
                sql.Identifier(role), sql.Literal(LIMIT)
            )
        )
        conn.execute(sql.SQL("GRANT SELECT, INSERT ON shim_orders, audit_log TO {}").format(sql.Identifier(role)))
    try:
        yield as_role(fresh_admin_url, role)
    finally:
        with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_one_client_filling_the_connection_limit_does_not_open_the_breaker_for_others(
    make_app: AppFactory, limited_role_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    holding = threading.Semaphore(0)

    def slow(order: Order) -> Any:
        order_id = order.write()
        if order.item == "slow":
            holding.release()
            release.wait(10)
        return {"order_id": order_id}, 201

    app = make_app(
        slow,
        url=limited_role_url,
        IDEM_POOL_MIN_SIZE=LIMIT,
        IDEM_POOL_MAX_SIZE=LIMIT,
        IDEM_POOL_TIMEOUT=0.5,
        IDEM_STORE_PROBE_INTERVAL=PROBE_INTERVAL,
    )
    assert post(app.test_client(), "/orders", new_key(), {"item": "warm"}, user=1).status_code == 201
    answers: dict[int, Any] = {}

    def attacker(i: int) -> None:
        answers[i] = post(app.test_client(), "/orders", new_key(), {"item": "slow"}, user=1)

    threads = [threading.Thread(target=attacker, args=(i,)) for i in range(LIMIT)]
    with caplog.at_level(logging.INFO, logger="idem_shim"):
        try:
            for t in threads:
                t.start()
            for _ in range(LIMIT):
                assert holding.acquire(timeout=10), "the slow requests hold every connection"
            # one more from the same client: no connection in the pool, and the probe it starts
            # meets the role's limit (53300): the server answered, the store is up
            extra = post(app.test_client(), "/orders", new_key(), {"item": "extra"}, user=1)
            assert extra.status_code == 503, extra.get_data(as_text=True)
            assert extra.headers["Retry-After"]
            # a fail-open route finds the pool busy too: the store is up, so it is this request's
            # 503, never a run without dedup
            before = app.extensions["shim_test_executions"].count
            billing = post(app.test_client(), "/billing", new_key(), user=2)
            assert billing.status_code == 503, billing.get_data(as_text=True)
            assert app.extensions["shim_test_executions"].count == before, "the handler did not run"
        finally:
            release.set()
            for t in threads:
                t.join()
        assert [answers[i].status_code for i in range(LIMIT)] == [201] * LIMIT
        # the load is over: another user is served at once, with dedup, on both tiers
        key = new_key()
        first = post(app.test_client(), "/orders", key, {"item": "mine"}, user=2)
        assert first.status_code == 201, first.get_data(as_text=True)
        again = post(app.test_client(), "/orders", key, {"item": "mine"}, user=2)
        assert again.headers.get("Idempotent-Replayed") == "true"
        key = new_key()
        assert post(app.test_client(), "/billing", key, user=2).status_code == 201
        assert post(app.test_client(), "/billing", key, user=2).headers.get("Idempotent-Replayed") == "true"
    assert "store_down" not in shim_events(caplog)


# -- what the probe met ---------------------------------------------------------------------------


class RefusingServer:
    """A TCP server that speaks the start of PostgreSQL's protocol and refuses every connection
    with one FATAL ErrorResponse of the given SQLSTATE (57P03: what a server starting up, in
    recovery or shutting down answers)."""

    def __init__(self, sqlstate: str, message: str) -> None:
        fields = b"".join(
            code + value.encode() + b"\0"
            for code, value in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", sqlstate), (b"M", message))
        )
        body = fields + b"\0"
        self._answer = b"E" + struct.pack("!I", len(body) + 4) + body
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                try:
                    while True:  # an SSL or GSS request is refused ('N'), then the startup packet
                        (length,) = struct.unpack("!I", self._read(conn, 4))
                        (code,) = struct.unpack("!I", self._read(conn, 4))
                        self._read(conn, length - 8)
                        if code in (80877103, 80877104):
                            conn.sendall(b"N")
                            continue
                        conn.sendall(self._answer)
                        break
                except OSError:
                    continue

    @staticmethod
    def _read(conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise OSError("closed")
            data += chunk
        return data

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def refusing_server() -> Iterator[RefusingServer]:
    server = RefusingServer("57P03", "the database system is starting up")
    yield server
    server.close()


def _url_for(case: str, base: str, admin_url: str, server: RefusingServer) -> str:
    if case == "53300":  # a role with no connection left to give
        role = "idem_shim_no_connections"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 0").format(sql.Identifier(role)))
        return as_role(base, role)
    if case == "57P03":
        return with_host_port(base, "127.0.0.1", server.port)
    if case == "3D000":  # no such database
        return psycopg.conninfo.make_conninfo(base, dbname="idem_no_such_database")
    return with_host_port(base, "127.0.0.1", closed_port())  # nothing listens: did not answer


@pytest.mark.parametrize(("case", "opens"), [("53300", False), ("57P03", False), ("3D000", False), ("refused", True)])
def test_a_probe_the_server_answered_never_opens_the_breaker(
    make_app: AppFactory,
    shim_web_url: str,
    fresh_admin_url: str,
    refusing_server: RefusingServer,
    caplog: pytest.LogCaptureFixture,
    case: str,
    opens: bool,
) -> None:
    url = _url_for(case, shim_web_url, fresh_admin_url, refusing_server)
    app = make_app(
        url=url,
        business_url=shim_web_url,
        IDEM_POOL_MIN_SIZE=0,
        IDEM_POOL_TIMEOUT=0.3,
        IDEM_STORE_PROBE_INTERVAL=PROBE_INTERVAL,
    )
    client = app.test_client()
    with caplog.at_level(logging.INFO, logger="idem_shim"):
        first = post(client, "/orders", new_key(), {"item": "x"})
        assert first.status_code == 503 and first.headers["Retry-After"]
        started = time.monotonic()
        assert post(client, "/orders", new_key(), {"item": "x"}).status_code == 503
        waited = time.monotonic() - started
    assert ("store_down" in shim_events(caplog)) is opens
    if opens:
        assert waited < 0.15, "an open breaker answers at once"
    else:
        assert waited >= 0.3, "a store that answers is asked again (the pool), never refused by the breaker"


def test_a_server_that_refused_while_shutting_down_and_is_gone_opens_the_breaker_without_a_request(
    make_app: AppFactory, shim_web_url: str, refusing_server: RefusingServer, caplog: pytest.LogCaptureFixture
) -> None:
    """57P03 during a shutdown is the server answering; once it is gone, the probe that follows
    the refused one (an interval later) finds no server and opens the breaker: the requests
    that come then are answered at once instead of each waiting its pool timeout."""
    app = make_app(
        url=with_host_port(shim_web_url, "127.0.0.1", refusing_server.port),
        IDEM_POOL_MIN_SIZE=0,
        IDEM_POOL_TIMEOUT=2.0,
        IDEM_STORE_PROBE_INTERVAL=0.2,
    )
    client = app.test_client()
    with caplog.at_level(logging.INFO, logger="idem_shim"):
        assert post(client, "/orders", new_key(), {"item": "x"}).status_code == 503  # busy: 57P03
        assert "store_down" not in shim_events(caplog)
        refusing_server.close()  # the server is gone: connections are refused now
        wait_until(lambda: "store_down" in shim_events(caplog), 3, 0.05, what="the follow-up probe's store_down")
        started = time.monotonic()
        assert post(client, "/orders", new_key(), {"item": "x"}).status_code == 503
        assert time.monotonic() - started < 0.5, "answered at once by the open breaker"
