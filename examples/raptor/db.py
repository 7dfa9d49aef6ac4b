"""Raptor's database access: one connection per worker thread, and the business transaction.

A decorated handler must write on the connection the idempotency shim hands it, because that
connection's transaction also carries `idem_complete`: the order and the completion commit
together or not at all, and the decorator commits. Everywhere else (the session lookup, the
order route served undecorated, the DELETE route) the app uses its own connection, and
`business_transaction()` opens and commits the transaction itself. Handlers call
`business_transaction()` and never need to know which case they are in.

The app's own connection is a plain per-thread connection rather than a pool: a gunicorn sync
worker runs one request at a time, and a connection that a database restart broke is simply
replaced on the next request, with no reconnect back-off to wait out.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from flask import current_app

from .settings import Settings, prepare_threshold

try:  # the shim's per-request connection, inside a route wrapped by @idempotency_key
    from idem_shim import connection as _idem_connection
except ImportError:  # pragma: no cover - the shim is a hard dependency of the app
    _idem_connection = None

# Errors that mean "the database is not there right now" rather than "this request is wrong";
# 25006: the server reached is a standby (a multi-host URL after a failover, docs/operations.md).
UNAVAILABLE = (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction, TimeoutError)

_local = threading.local()


def _connect() -> psycopg.Connection:
    settings: Settings = current_app.extensions["raptor"]
    return psycopg.connect(
        settings.database_url,
        # autocommit: a read is one round trip; writes open an explicit transaction block,
        # exactly as the shim's connections do
        autocommit=True,
        prepare_threshold=prepare_threshold(),
        application_name="raptor_web",
        connect_timeout=max(1, round(settings.connect_timeout_s)),
    )


def app_connection(fresh: bool = False) -> psycopg.Connection:
    """This thread's connection, (re)connected if it is missing, closed or broken."""
    conn = getattr(_local, "conn", None)
    if fresh or conn is None or conn.closed or conn.broken or getattr(_local, "pid", None) != os.getpid():
        if conn is not None and getattr(_local, "pid", None) == os.getpid():
            conn.close()
        _local.conn = None  # a failed connect must not leave the old one behind
        conn = _local.conn = _connect()
        _local.pid = os.getpid()
    return conn


def drop_app_connection() -> None:
    """Forget this thread's connection (it reached a read-only server): the next one is made
    from the multi-host URL again, which finds the primary."""
    conn = getattr(_local, "conn", None)
    _local.conn = None
    if conn is not None and getattr(_local, "pid", None) == os.getpid():
        conn.close()


def fetch_one(query: str, params: Any = None) -> tuple | None:
    """One read on the app's connection (sessions, health), in autocommit: one round trip.

    A connection that died while idle (the database restarted) is only found out when used:
    then the read is sent once more on a new connection, so the first request after a
    recovery does not fail for a stale socket.
    """
    conn = app_connection()
    try:
        return conn.execute(query, params).fetchone()
    except psycopg.OperationalError:
        if not conn.broken:
            raise
    return app_connection(fresh=True).execute(query, params).fetchone()


def shim_connection() -> psycopg.Connection | None:
    """The connection of the idempotency layer's transaction for this request, or None."""
    if _idem_connection is None:
        return None
    try:
        return _idem_connection()
    except RuntimeError:  # OutsideRequestError: this route is not decorated
        return None


@contextmanager
def business_transaction() -> Iterator[psycopg.Connection]:
    """The one transaction a handler writes in.

    Inside a decorated route this is the shim's transaction (the decorator commits it together
    with the key's completion for a response < 500, or rolls it back and fails the key).
    Otherwise the app opens the transaction itself: committed when the block ends, rolled back
    if it raises. The handler code is the same both ways.
    """
    conn = shim_connection()
    if conn is not None:
        yield conn
        return
    conn = app_connection()
    with conn.transaction():
        yield conn
