"""Raptor's database access: one pool per worker process, and the business transaction.

A decorated handler must write on the connection the idempotency shim hands it, because that
connection's transaction also carries `idem_complete`: the order and the completion commit
together or not at all, and the decorator commits. Everywhere else (no Idempotency-Key, the
route served undecorated, the store down on a fail-open route) the handler's writes go
through the app's own pool, and `business_transaction()` commits them itself. Handlers call
`business_transaction()` and never need to know which case they are in.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from flask import current_app
from psycopg_pool import ConnectionPool

from .settings import Settings, prepare_threshold

try:  # the shim's per-request connection, when the decorator is tracking this request
    from idem_shim import connection as _idem_connection
except ImportError:  # pragma: no cover - the shim is a hard dependency of the app
    _idem_connection = None

_lock = threading.Lock()
_pools: dict[int, ConnectionPool] = {}  # by pid: a pool never crosses a gunicorn fork

# Errors that mean "the database is not there right now" rather than "this request is wrong".
UNAVAILABLE = (psycopg.OperationalError, psycopg.errors.AdminShutdown, TimeoutError)


def pool() -> ConnectionPool:
    pid = os.getpid()
    p = _pools.get(pid)
    if p is None:
        with _lock:
            p = _pools.get(pid)
            if p is None:
                settings: Settings = current_app.extensions["raptor"]
                p = ConnectionPool(
                    settings.database_url,
                    min_size=1,
                    max_size=settings.pool_max_size,
                    timeout=settings.pool_timeout_s,
                    # autocommit: a read is one round trip; writes open an explicit
                    # transaction block, as the shim's connections do
                    kwargs={"autocommit": True, "prepare_threshold": prepare_threshold(),
                            "application_name": "raptor_web", "connect_timeout": 3},
                    # a connection broken by a database restart is dropped when it comes
                    # back to the pool, and the pool reconnects: no app restart needed
                    open=False,
                    name=f"raptor-{pid}",
                )
                p.open(wait=False)
                _pools[pid] = p
    return p


def shim_connection() -> psycopg.Connection | None:
    """The connection of the idempotency claim's second transaction, or None."""
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
    with pool().connection() as conn, conn.transaction():
        yield conn


def fetch_one(query: str, params: Any = None) -> tuple | None:
    """One read on the app's pool (sessions, health), in autocommit: one round trip.

    A connection that died while idle (the database restarted) is only found out when used:
    then the pool's idle connections are checked and the read is sent once more on a fresh
    one, so the first request after a recovery does not fail for a stale socket.
    """
    for attempt in (1, 2):
        with pool().connection() as conn:
            try:
                return conn.execute(query, params).fetchone()
            except psycopg.OperationalError:
                if attempt == 2 or not conn.broken:
                    raise
        pool().check()
    return None  # pragma: no cover - the loop returns or raises
