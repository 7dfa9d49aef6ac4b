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
  Its ``Breaker`` (``breaker.py``) answers at once while the store is known down; the pool of
  the outage is closed when the store is found down (no reconnection attempts, no lines of its
  own) and a fresh one is made when a probe finds it back (no back-off left to wait out).
  Each connection given back is reset (``reset_session``): the next request, any user's, never
  meets a handler's committed ``SET``.
- ``CallerPool``, ``CallerConnection``: what ``idempotent(db=...)`` was given.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Final, Protocol

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolClosed

from . import queries
from .breaker import Breaker
from .config import Settings
from .errors import IdemError, StoreBusyError

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


def reset_session(conn: Conn) -> None:
    """A connection given back to the own pool: what a handler left on its session goes
    (``queries.RESET_SESSION``). psycopg_pool runs it on its worker, after the request."""
    conn.execute(queries.RESET_SESSION, prepare=False)


#: The name of the shim's pools, in psycopg_pool's log lines.
POOL_NAME: Final = "idem"


class _QuietAttempts(logging.Filter):
    """psycopg_pool logs each failed connection attempt of a pool, again and again while a server
    is down; for the shim's pools the breaker says it once (``store_down``), so those lines go."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (
            args
            and args[0] == POOL_NAME
            and str(record.msg).startswith(("error connecting in", "reconnection attempt in pool"))
        )


_QUIET_ATTEMPTS: Final = _QuietAttempts()


class ForkSafePool:
    """An app's psycopg_pool, made again in each process that uses it, behind the breaker."""

    def __init__(self, settings: Settings, configure: Callable[[Conn], None]) -> None:
        self.settings = settings
        self._configure = configure  # runs on every new connection (the start-up checks)
        self._lock = threading.Lock()
        self._pool: ConnectionPool[Conn] | None = None
        self._pid = 0
        self._breaker = self._new_breaker()
        # The pool each connection lent out came from: one made before the last change of the
        # breaker's state is closed, and takes its connections back only to close them.
        self._lent: dict[int, ConnectionPool[Conn]] = {}
        # Pools inherited through fork() are kept referenced, never closed or collected: closing
        # them in a child would terminate the parent's server sessions over the shared sockets.
        self._inherited: list[ConnectionPool[Conn]] = []
        logging.getLogger("psycopg.pool").addFilter(_QUIET_ATTEMPTS)  # once: a filter is added once

    def _here(self) -> Breaker:
        """This process's breaker; after a fork, a new breaker and (lazily) a new pool."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    if self._pool is not None:
                        self._inherited.append(self._pool)
                    self._pool, self._lent = None, {}
                    self._breaker = self._new_breaker()
                    self._pid = os.getpid()
        return self._breaker

    def _new_breaker(self) -> Breaker:
        s = self.settings
        return Breaker(
            self._probe,
            interval=s.store_probe_interval,
            probe_wait=max(2, s.connect_timeout) + 1.0,  # libpq waits at least 2 s to connect
            on_change=lambda opened: self._retire(),
        )

    def _probe(self) -> None:
        """Connect as the pool would, and leave: the store takes connections again."""
        psycopg.connect(self.settings.database_url, **connect_kwargs(self.settings)).close()

    def _reset(self, conn: Conn) -> None:
        """``reset_session`` on the pool's worker. A reset that fails is a connection found dead
        while it was idle in the pool (the server stopped after the request): the pool drops it
        and cannot make another, so a probe decides now; else the next request would wait a pool
        timeout for a connection that cannot be made."""
        try:
            reset_session(conn)
        except psycopg.OperationalError:
            self._here().suspect(wait=False)
            raise

    def _retire(self) -> None:
        """Close the pool of before the change: found down, its attempts stop; found back, the
        next request gets a fresh pool instead of one still backing off."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:  # its threads may be inside a connection attempt: not in our way
            threading.Thread(target=pool.close, name="idem-pool-retire", daemon=True).start()

    @property
    def pool(self) -> ConnectionPool[Conn]:
        self._here()
        pool = self._pool
        if pool is not None:
            return pool
        with self._lock:
            if self._pool is None:
                self._pool = self._new_pool()
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
            reset=self._reset,
            name=POOL_NAME,
            open=False,
        )
        pool.open(wait=False)  # connects in the background; a dead database is retried
        return pool

    def getconn(self) -> Conn:
        breaker = self._here()
        retired = False
        while True:
            breaker.admit()  # StoreDownError at once while the store is known down
            pool = self.pool
            try:
                conn = pool.getconn()
            except PoolClosed:
                if retired or self._pool is pool:  # closed by close(), or twice: not a race
                    raise
                retired = True  # retired by a change of the breaker's state while we waited
                continue
            except psycopg.Error as exc:
                # Timed out: the store down, or every connection busy? A probe tells them apart;
                # down, this request is answered as the breaker answers (no line of its own);
                # answered (connected, or refused by the server: 53300), this request alone is
                # told the store is busy, and the breaker stays closed for everyone else.
                answered = breaker.suspect()
                breaker.refuse_if_open()
                if answered:
                    met = f" (a probe met: {breaker.answer})" if breaker.answer else ""
                    raise StoreBusyError(
                        f"no idempotency store connection within {self.settings.pool_timeout:g} s, and the "
                        f"store answers{met}: every connection is busy"
                    ) from exc
                raise
            self._lent[id(conn)] = pool
            return conn

    def putconn(self, conn: Conn) -> None:
        pool = self._lent.pop(id(conn), None)
        if conn.broken or conn.closed:
            # The server went away under this request: the pool drops the connection, and the
            # next request would wait a pool timeout for one it cannot make. A probe decides now.
            self._here().suspect(wait=False)
        if pool is not None and self._pid == os.getpid():
            pool.putconn(conn)
        else:  # pragma: no cover - only after a fork in the middle of a request
            conn.close()

    def connection(self, timeout: float | None = None) -> AbstractContextManager[Conn]:
        self._here().admit()
        return self.pool.connection(timeout=timeout)

    def check(self) -> None:
        breaker = self._here()
        breaker.suspect()  # a connection died: the server restarted, or it is gone
        if not breaker.is_open:
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
