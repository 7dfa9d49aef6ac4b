"""Where the store's connections come from: the shim's own fork-safe pool, or a caller's.

``ConnectionSource`` is what ``Store`` asks: a connection for a claim and the handler's
transaction (``getconn``/``putconn``), a second one for a statement that must commit apart from
that transaction (``connection()``: a heartbeat, the health gauges), and a check after a
connection was found dead. Every connection it gives is in autocommit: ``idem_claim``,
``idem_fail`` and ``idem_heartbeat`` are each one statement and one round trip, and a handler's
transaction is opened explicitly (``scope.py``).

- ``ForkSafePool``: an app's (``Idem``). Created lazily, in the process that first uses it: a
  gunicorn master that imports the app (``--preload``) then forks never shares pool threads or
  sockets with its workers, and a database that is down when the app starts does not stop it.
- ``CallerPool``, ``CallerConnection``: what ``idempotent(db=...)`` was given.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from .config import Settings
from .errors import IdemError

Conn = psycopg.Connection[TupleRow]


class ConnectionSource(Protocol):
    """What the store needs of a pool."""

    @property
    def pool(self) -> ConnectionPool[Conn]:
        """The pool behind it (``IdemError`` when there is none)."""
        ...

    def getconn(self) -> Conn:
        """A connection in autocommit with no transaction open; ``psycopg.Error`` when none."""
        ...

    def putconn(self, conn: Conn) -> None:
        """Give back what ``getconn`` gave (a broken one is discarded and replaced)."""
        ...

    def connection(self, timeout: float | None = None) -> AbstractContextManager[Conn]:
        """A second connection, for one statement that commits on its own."""
        ...

    def check(self) -> None:
        """A connection was found dead: look at the idle ones before the next attempt."""
        ...

    def close(self) -> None: ...


def connect_kwargs(settings: Settings) -> dict[str, Any]:
    """The keyword arguments of every connection the shim opens to its store."""
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "prepare_threshold": settings.prepare_threshold,
        "connect_timeout": settings.connect_timeout,
        "application_name": settings.application_name,
    }
    if settings.statement_timeout_ms is not None:
        # A startup option, not a SET: it survives PgBouncer's transaction pooling unchanged.
        # Appended to any options the URL already carries (e.g. ``-c role=...``).
        existing = conninfo_to_dict(settings.database_url).get("options")
        option = f"-c statement_timeout={settings.statement_timeout_ms}"
        kwargs["options"] = f"{existing} {option}" if existing else option
    return kwargs


class ForkSafePool:
    """An app's psycopg_pool, made again in each process that uses it."""

    def __init__(self, settings: Settings, configure: Callable[[Conn], None]) -> None:
        self.settings = settings
        self._configure = configure  # runs on every new connection (the start-up checks)
        self._lock = threading.Lock()
        self._pool: ConnectionPool[Conn] | None = None
        self._pid = 0
        # Pools inherited through fork() are kept referenced, never closed or collected: closing
        # them in a child would terminate the parent's server sessions over the shared sockets.
        self._inherited: list[ConnectionPool[Conn]] = []

    @property
    def pool(self) -> ConnectionPool[Conn]:
        pid = os.getpid()
        pool = self._pool
        if pool is not None and self._pid == pid:
            return pool
        with self._lock:
            if self._pool is None or self._pid != pid:
                if self._pool is not None:
                    self._inherited.append(self._pool)
                self._pool = self._new_pool()
                self._pid = pid
            return self._pool

    def _new_pool(self) -> ConnectionPool[Conn]:
        s = self.settings
        pool: ConnectionPool[Conn] = ConnectionPool(
            s.database_url,
            kwargs=connect_kwargs(s),
            min_size=s.pool_min_size,
            max_size=s.pool_max_size,
            timeout=s.pool_timeout,
            # psycopg_pool backs off exponentially while a server is down; giving up early lets
            # the next request start a fresh attempt at once, so recovery is quick after a long
            # outage instead of waiting out a minutes-long backoff.
            reconnect_timeout=s.pool_reconnect_timeout,
            configure=self._configure,
            name="idem",
            open=False,
        )
        pool.open(wait=False)  # connects in the background; a dead database is retried
        return pool

    def getconn(self) -> Conn:
        return self.pool.getconn()

    def putconn(self, conn: Conn) -> None:
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            pool.putconn(conn)
        else:  # pragma: no cover - only after a fork in the middle of a request
            conn.close()

    def connection(self, timeout: float | None = None) -> AbstractContextManager[Conn]:
        return self.pool.connection(timeout=timeout)

    def check(self) -> None:
        self.pool.check()

    def close(self) -> None:
        with self._lock:
            if self._pool is not None and self._pid == os.getpid():
                self._pool.close()
            self._pool = None


_TRANSACTION_OPEN = (
    "idempotent(): the connection has a transaction open; the claim must commit before the work "
    "runs, so call it with no transaction in progress (or pass a pool)"
)


def _adopt(conn: Conn) -> Conn:
    """A caller's connection, idle, switched to autocommit while the shim drives it (the claim
    and a failure commit on their own; the work's transaction is opened explicitly)."""
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise IdemError(_TRANSACTION_OPEN)
    conn.autocommit = True
    return conn


class CallerConnection:
    """``idempotent(db=<a connection>)``: every call runs on that one connection, left as it was
    found (its autocommit setting restored). No second connection: no heartbeats."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn: Conn = conn
        self._autocommit = conn.autocommit

    @property
    def pool(self) -> ConnectionPool[Conn]:
        raise IdemError(
            "idem_shim.heartbeat() inside idempotent(db=<a connection>) cannot renew the lease: "
            "it needs a second connection; pass db=<a psycopg_pool ConnectionPool>"
        )

    def getconn(self) -> Conn:
        self._autocommit = self._conn.autocommit
        return _adopt(self._conn)

    def putconn(self, conn: Conn) -> None:
        if not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
            conn.autocommit = self._autocommit

    def connection(self, timeout: float | None = None) -> AbstractContextManager[Conn]:
        return self.pool.connection(timeout=timeout)

    def check(self) -> None:
        """Nothing to look at: the caller owns its connection."""

    def close(self) -> None:
        """The caller's connection stays open: it is the caller's."""


class CallerPool:
    """``idempotent(db=<a psycopg_pool ConnectionPool>)``: a connection of it per call, given back
    as it was taken (its autocommit setting restored)."""

    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self._pool: ConnectionPool[Conn] = pool
        self._autocommit: dict[int, bool] = {}

    @property
    def pool(self) -> ConnectionPool[Conn]:
        return self._pool

    def getconn(self) -> Conn:
        conn = self._pool.getconn()
        self._autocommit[id(conn)] = conn.autocommit
        try:
            return _adopt(conn)
        except BaseException:
            self.putconn(conn)
            raise

    def putconn(self, conn: Conn) -> None:
        autocommit = self._autocommit.pop(id(conn), conn.autocommit)
        if not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
            conn.autocommit = autocommit
        self._pool.putconn(conn)

    def connection(self, timeout: float | None = None) -> AbstractContextManager[Conn]:
        return self._pool.connection(timeout=timeout)

    def check(self) -> None:
        self._pool.check()

    def close(self) -> None:
        """The caller's pool stays open: it is the caller's."""
