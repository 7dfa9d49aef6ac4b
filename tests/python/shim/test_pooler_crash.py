"""Regression (chaos soak): PgBouncer answering BEGIN for a server that just crashed.

In transaction mode, when PostgreSQL goes away under PgBouncer, the next statement a client sends
on a pooled connection gets PgBouncer's own `ErrorResponse` ("server conn crashed?", 08P01) and
the socket closes. libpq turns that into two results (the error, then "server closed the
connection unexpectedly"); psycopg's BEGIN refuses two results with `InternalError`, not an
`OperationalError`. The chaos soak saw the handler's `idem_shim.connection()` raise it, so Raptor
answered 500 instead of the documented 503 (`make chaos`, seed 11, a fast restart of PostgreSQL
while orders went through PgBouncer). The shim must report a connection lost at BEGIN as what it
is, an `OperationalError`, so a host's "database unavailable" handling (a 503) applies.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from typing import Any

import psycopg
from flask import Flask

from idem_shim import Idem, connection, idempotency_key
from tests.python.support.shim import PgProxy, post, require_session, scalar, server_address, shim_db


def _error_response(severity: str, sqlstate: str, message: str) -> bytes:
    fields = (
        b"".join(
            tag + value.encode() + b"\0"
            for tag, value in ((b"S", severity), (b"V", severity), (b"C", sqlstate), (b"M", message))
        )
        + b"\0"
    )
    return b"E" + (4 + len(fields)).to_bytes(4, "big") + fields


# What PgBouncer relays when the server it sent BEGIN to is shutting down: the server's own
# FATAL, then PgBouncer's "server conn crashed?", then the socket closes.
CRASH_ANSWER = _error_response(
    "FATAL", "57P01", "terminating connection due to administrator command"
) + _error_response("ERROR", "08P01", "server conn crashed?")


class CrashingPooler(PgProxy):
    """Forwards like PgProxy until armed; then answers the next BEGIN the way PgBouncer does
    when the server behind it went away (CRASH_ANSWER)."""

    armed = False

    def _pump(self, source: socket.socket, target: socket.socket, from_server: bool) -> None:
        if from_server:
            super()._pump(source, target, from_server)
            return
        buffer, startup_done = b"", False
        try:
            while chunk := source.recv(65536):
                buffer += chunk
                out = b""
                if not startup_done and len(buffer) >= 4:
                    length = int.from_bytes(buffer[:4], "big")
                    if len(buffer) >= length:
                        out, buffer, startup_done = buffer[:length], buffer[length:], True
                while startup_done and len(buffer) >= 5:
                    length = int.from_bytes(buffer[1:5], "big")
                    if len(buffer) < 1 + length:
                        break
                    message, buffer = buffer[: 1 + length], buffer[1 + length :]
                    if self.armed and message[:1] == b"Q" and message[5:].startswith(b"BEGIN"):
                        self.armed = False
                        target.sendall(out)
                        source.sendall(CRASH_ANSWER)
                        return
                    out += message
                target.sendall(out)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def test_begin_answered_by_a_crashing_pooler_is_an_operational_error_not_a_500(fresh_admin_url: str) -> None:
    app_url = shim_db(fresh_admin_url)
    proxy = CrashingPooler(server_address(app_url))
    proxy.start()
    seen: list[BaseException] = []
    app = Flask("pooler_crash")
    sep = "&" if "?" in app_url else "?"
    app.config.update(
        IDEM_DATABASE_URL=proxy.url(f"{app_url}{sep}sslmode=disable"),
        IDEM_POOL_MIN_SIZE=1,
        IDEM_POOL_MAX_SIZE=2,
        IDEM_POOL_TIMEOUT=2.0,
        IDEM_PREPARE_THRESHOLD=None,
    )
    Idem(app)

    @app.post("/orders")
    @require_session
    @idempotency_key(ttl_hours=1)
    def place() -> Any:
        try:
            conn = connection()
        except psycopg.Error as exc:  # what Raptor's handler for a lost database catches
            seen.append(exc)
            if isinstance(exc, psycopg.OperationalError):
                return {"error": "service_unavailable"}, 503, {"Retry-After": "1"}
            raise
        conn.execute("INSERT INTO shim_orders (user_id, route) VALUES (1, 'orders')")
        return {"ok": True}, 201

    try:
        client = app.test_client()
        key = str(uuid.uuid4())
        # The pool's first connection is made and checked (schema, the libpq probe's own BEGIN)
        # before the pooler starts crashing: the BEGIN under test is the handler's.
        app.extensions["idem"].store.pool.wait(timeout=10)
        proxy.armed = True
        first = post(client, "/orders", key, {"item": "a"})
        assert len(seen) == 1 and isinstance(seen[0], psycopg.OperationalError), seen
        assert first.status_code == 503
        assert scalar(fresh_admin_url, "SELECT count(*) FROM shim_orders") == 0
        # the key was not completed; the broken connection left the pool: a retry goes through
        # once the claim is no longer held (failed, or in flight until the stale heal)
        status = scalar(fresh_admin_url, "SELECT status FROM idempotency_keys WHERE idem_key = %s", (key,))
        assert status in ("failed", "in_flight")
        again = post(client, "/orders", str(uuid.uuid4()), {"item": "b"})
        assert again.status_code == 201
        assert scalar(fresh_admin_url, "SELECT count(*) FROM shim_orders") == 1
    finally:
        app.extensions["idem"].store.close()
        proxy.stop()
