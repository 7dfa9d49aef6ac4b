"""The idempotency store: a psycopg 3 connection pool and the SQL API calls, nothing else.

Pool connections are in autocommit, so ``idem_claim``, ``idem_fail`` and ``idem_heartbeat`` are
each one statement and one round trip. A handler's transaction is opened explicitly with
``Connection.transaction()`` (see ``scope.py``), and ``idem_complete`` runs inside it.

The pool is created lazily, in the process that first uses it: a gunicorn master that imports the
app (``--preload``) then forks never shares pool threads or sockets with its workers, and a
database that is down when the app starts does not stop it from starting.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from . import queries
from .config import Settings
from .errors import (
    ClaimLostError,
    ContentionError,
    InvalidArgumentError,
    InvalidFingerprintError,
    MalformedKeyError,
    ResponseRefusedError,
    SchemaError,
    StoreRefusedError,
    StoreUnavailableError,
    UndecryptableResponseError,
)
from .logs import error_text
from .outcome import Outcome
from .prepared import PreparedStatement, RequestBlock

logger = logging.getLogger("idem_shim")

Conn = psycopg.Connection[TupleRow]


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """One row of ``idem_claim``."""

    outcome: Outcome
    key_id: int | None
    request_hash: str | None
    response_code: int | None
    response_body: Any
    retry_after_ms: int | None
    response_headers: Any = None  # SQL API 3: the stored headers of a replay
    claim_token: str | None = None  # SQL API 5: what complete/fail/heartbeat need beside key_id
    attempt: int | None = None  # SQL API 6: 1 + the stale heals before this claim (claimed only)


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """The arguments of one ``idem_claim`` call."""

    key: str
    user_id: int | None
    endpoint: str
    request_json: str | None  # JSON text, cast to jsonb in SQL; None is SQL NULL
    ttl: timedelta
    stale_after: timedelta
    wait_ms: int
    on_stale: str

    def params(self) -> tuple[Any, ...]:
        """queries.CLAIM's parameters but the response keys, which the Store (it owns the
        secrets) appends. Intervals go as text: psycopg's timedelta dumper costs more client
        CPU than the server spends parsing "86400.0 seconds"."""
        return (
            self.key,
            self.user_id,
            self.endpoint,
            self.request_json,
            f"{self.ttl.total_seconds()} seconds",
            f"{self.stale_after.total_seconds()} seconds",
            self.wait_ms,
            self.on_stale,
        )


# -- the error boundary: every driver error of the shim's own statements is judged here --------

#: The one table of SQLSTATEs the shim judges, one exception each; the shim branches on the
#: SQLSTATE alone, never on message text. First the SQL API's refusals (sql/README.md's error
#: table is the reference), then what a failover or a restart of the server produces (docs/operations.md
#: "Failover"): the store is going, gone, or not (or no longer) the primary. Those are never the
#: request's fault: the connection is discarded (it may point at the old primary, now read-only)
#: and the call is answered as the store unavailable (Tier 1: 503; Tier 2: undeduplicated).
_SQLSTATES: Final[Mapping[str, type[StoreRefusedError] | type[StoreUnavailableError]]] = {
    "22023": MalformedKeyError,
    "IDM00": InvalidArgumentError,
    "IDM01": ClaimLostError,
    "IDM02": ContentionError,
    "IDM03": UndecryptableResponseError,
    "IDM04": ResponseRefusedError,
    # g.current_user_id names no users row: the host's bug (a session for a deleted user), a
    # 500 with its traceback, never counted or alerted as a store outage.
    "23503": InvalidArgumentError,
    "25006": StoreUnavailableError,  # read_only_sql_transaction: a standby, or a demoted primary
    "57P01": StoreUnavailableError,  # admin_shutdown: fast/immediate stop, pg_terminate_backend
    "57P02": StoreUnavailableError,  # crash_shutdown: another backend crashed, the server resets
    "57P03": StoreUnavailableError,  # cannot_connect_now: starting up, in recovery, shutting down
    "08000": StoreUnavailableError,  # connection_exception
    "08001": StoreUnavailableError,  # sqlclient_unable_to_establish_sqlconnection
    "08003": StoreUnavailableError,  # connection_does_not_exist
    "08004": StoreUnavailableError,  # sqlserver_rejected_establishment_of_sqlconnection
    "08006": StoreUnavailableError,  # connection_failure
}


#: Citus's answer when a worker fails the COMMIT of the handler's transaction ("could not commit
#: transaction for shard N on at least one active node", internal_error): the worker may or may not
#: have committed, as when the connection is lost. A handler's deferred constraint failing on a
#: worker reads the same (Citus gives both one SQLSTATE): on Citus make such constraints immediate.
_DISTRIBUTED_COMMIT_FAILED: Final = "XX000"


def pipeline_cause(exc: psycopg.Error) -> psycopg.Error:
    """The error to judge a failed pipeline by.

    When ``idem_complete`` fails inside the pipeline, the COMMIT queued behind it fails too,
    and if that result is read as the pipeline ends, Python raises ``PipelineAborted`` in place
    of the statement's own error (kept as ``__context__``). The server did answer, so it is that
    statement's error (IDM01, IDM04, ...), never a store outage.
    """
    if isinstance(exc, pg_errors.PipelineAborted) and isinstance(exc.__context__, psycopg.Error):
        return exc.__context__
    return exc


#: A claim's other data exceptions (SQLSTATE class 22: 22P05 a NUL or lone surrogate, 22P02 bad
#: JSON, 22003 an out-of-range number) can only come from ``p_request``, the client's text (every
#: other argument is the shim's own, typed): a 400, never an outage.
_CLAIM_DATA_EXCEPTION_CLASS: Final = "22"


def _refusal(exc: psycopg.Error) -> StoreRefusedError | None:
    """The SQL API's refusal behind ``exc``, or None when it is not one."""
    kind = _SQLSTATES.get(exc.sqlstate or "")
    if kind is None or not issubclass(kind, StoreRefusedError):
        return None
    return kind(str(exc.diag.message_primary or exc))


def is_failover(exc: psycopg.Error) -> bool:
    """True for the SQLSTATEs of a server going away or not writable (see ``_SQLSTATES``)."""
    return _SQLSTATES.get(exc.sqlstate or "") is StoreUnavailableError


def _claim_refusal(exc: psycopg.Error) -> StoreRefusedError | None:
    """``_refusal`` for ``idem_claim``, where a data exception is the request's fingerprint."""
    refusal = _refusal(exc)
    if refusal is None and (exc.sqlstate or "").startswith(_CLAIM_DATA_EXCEPTION_CLASS):
        return InvalidFingerprintError(str(exc.diag.message_primary or exc))
    return refusal


def _unavailable(exc: psycopg.Error, connection_lost: bool) -> StoreUnavailableError:
    return StoreUnavailableError(error_text(exc), connection_lost=connection_lost or is_failover(exc))


def discard_if_failover(conn: Conn, exc: psycopg.Error) -> None:
    """Close a connection that answered as a server going away or read-only would: given back to
    the pool closed, it is replaced by a new one, which ``target_session_attrs=read-write`` takes
    to whichever server is the primary now."""
    if is_failover(exc) and not conn.closed:
        conn.close()


class Store:
    """Owns the pool of one app and runs the SQL API's statements on its connections."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.schema_verified = False
        #: whether completions go through idem_complete_in_scope (a distributed store); None:
        #: not known yet (verify_schema learns it, else the first completion asks)
        self.complete_in_scope: bool | None = None
        self._lock = threading.Lock()
        self._pool: ConnectionPool[Conn] | None = None
        self._pid = 0
        # Pools inherited through fork() are kept referenced, never closed or collected: closing
        # them in a child would terminate the parent's server sessions over the shared sockets.
        self._inherited: list[ConnectionPool[Conn]] = []
        # Bound parameters, never settings: the keys must not show up in pg_stat_activity.
        self._response_keys = (settings.response_key, settings.response_key_fallback)
        # A duplicate that waits (wait_ms) holds a pool connection inside pg_sleep: at most half
        # the pool may wait at once, so a retry storm on one key cannot starve other requests.
        # A waiter over the bound is answered at once (in_flight, 409 with Retry-After).
        self.max_waiters = max(1, settings.pool_max_size // 2)
        self._waiters = threading.BoundedSemaphore(self.max_waiters)
        # The claim below psycopg's cursor (prepared.py): the same SQL, ~10 µs less CPU a request.
        self._claim_statement = PreparedStatement("idem_shim_claim", queries.CLAIM, settings.prepare_threshold)
        self._complete_statement = PreparedStatement("idem_shim_complete", queries.COMPLETE, settings.prepare_threshold)
        self._complete_in_scope_statement = PreparedStatement(
            "idem_shim_complete_in_scope", queries.COMPLETE_IN_SCOPE, settings.prepare_threshold
        )

    # -- connections -------------------------------------------------------------------------

    def connect_kwargs(self) -> dict[str, Any]:
        s = self.settings
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": s.prepare_threshold,
            "connect_timeout": s.connect_timeout,
            "application_name": s.application_name,
        }
        if s.statement_timeout_ms is not None:
            # A startup option, not a SET: it survives PgBouncer's transaction pooling unchanged.
            # Appended to any options the URL already carries (e.g. ``-c role=...``).
            existing = conninfo_to_dict(s.database_url).get("options")
            option = f"-c statement_timeout={s.statement_timeout_ms}"
            kwargs["options"] = f"{existing} {option}" if existing else option
        return kwargs

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
            kwargs=self.connect_kwargs(),
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

    def _configure(self, conn: Conn) -> None:
        """Runs on every new pool connection until the schema has been verified once."""
        if self.settings.check_schema and not self.schema_verified:
            try:
                self.verify_schema(conn)
            except SchemaError as exc:
                logger.error("idempotency schema check failed: %s", exc)
                conn.close()
                raise

    def getconn(self) -> Conn:
        return self.pool.getconn()

    def putconn(self, conn: Conn) -> None:
        """Return a connection; a broken one is discarded and replaced by the pool."""
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            pool.putconn(conn)
        else:  # pragma: no cover - only after a fork in the middle of a request
            conn.close()

    def close(self) -> None:
        with self._lock:
            if self._pool is not None and self._pid == os.getpid():
                self._pool.close()
            self._pool = None

    # -- the SQL API -------------------------------------------------------------------------

    def claim(self, request: ClaimRequest) -> tuple[Conn, ClaimResult]:
        """Take a connection and run ``idem_claim`` on it; the caller owns the connection after.

        Raises ``StoreUnavailableError`` for any failure to reach or use the store, and the SQL
        API's refusals as their ``StoreRefusedError`` (``MalformedKeyError``,
        ``InvalidArgumentError``, ``ContentionError``, ``UndecryptableResponseError``).

        A connection that died while idle in the pool (server restart, failover) is noticed only
        when used; then the pool's idle connections are checked and the claim is sent once more
        on a fresh one. Re-sending is safe: if the first claim did commit before its answer was
        lost, the second sees our own row ``in_flight`` (409) and never a second execution.
        """
        waiting = request.wait_ms > 0 and self._waiters.acquire(blocking=False)
        if request.wait_ms > 0 and not waiting:
            request = replace(request, wait_ms=0)
        try:
            return self._claim(request)
        finally:
            if waiting:
                self._waiters.release()

    def _claim(self, request: ClaimRequest) -> tuple[Conn, ClaimResult]:
        params = request.params() + self._response_keys
        for attempt in (1, 2):
            try:
                conn = self.getconn()
            except psycopg.Error as exc:
                raise _unavailable(exc, connection_lost=True) from exc
            try:
                return conn, self._claim_on(conn, params)
            except psycopg.Error as exc:
                # A server that went away (broken socket, 57P01) or is read-only now (25006: the
                # old primary come back as a standby) keeps nothing of ours: drop the connection.
                discard_if_failover(conn, exc)
                broken = conn.broken or conn.closed
                reason = error_text(exc)
                self.putconn(conn)
                refusal = _claim_refusal(exc)
                if refusal is not None:
                    raise refusal from exc
                if not broken or attempt == 2:
                    raise _unavailable(exc, connection_lost=broken) from exc
            except BaseException:
                self.putconn(conn)
                raise
            logger.info("idempotency store connection lost (%s); checking the pool, retrying the claim once", reason)
            self.pool.check()
        raise AssertionError("unreachable")  # pragma: no cover

    def getconn_for_handler(self) -> Conn:
        """A connection for a handler's transaction; ``StoreUnavailableError`` if none."""
        try:
            return self.getconn()
        except psycopg.Error as exc:
            raise _unavailable(exc, connection_lost=True) from exc

    def _claim_row(self, conn: Conn, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if self.settings.libpq_path:
            return self._claim_statement.fetchone(conn, params)
        return conn.execute(queries.CLAIM, params).fetchone()

    def _claim_on(self, conn: Conn, params: tuple[Any, ...]) -> ClaimResult:
        try:
            row = self._claim_row(conn, params)
        except (psycopg.errors.DatatypeMismatch, psycopg.errors.FeatureNotSupported):
            # A migration changed idem_claim_result under the statement this connection had
            # prepared: PostgreSQL refuses it once, then plans it again. The failed call wrote
            # nothing (autocommit), so it is sent again, once, on the same connection.
            row = self._claim_row(conn, params)
        if row is None:  # pragma: no cover - idem_claim always returns one row
            raise psycopg.DataError("idem_claim returned no row")
        # the 9th column is the set_config of queries.CLAIM; the attempt (SQL API 6) comes after it
        return ClaimResult(Outcome(row[0]), row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[9])

    def complete(
        self,
        conn: Conn,
        key_id: int,
        claim_token: str | None,
        response_code: int,
        body_json: str | None,
        headers_json: str | None = None,
        commit: Callable[[], None] | None = None,
        block: RequestBlock | None = None,
    ) -> None:
        """``idem_complete`` on ``conn``; with ``commit``, in one pipeline with that COMMIT (of
        ``block``, the scope's transaction: through libpq's own pipeline where it can).

        Raises the SQL API's refusal (``ClaimLostError``, ``ResponseRefusedError``, ...), or
        ``StoreUnavailableError`` when the connection failed and the commit's outcome is unknown.
        Any other error (a deferred constraint of the handler's failing at COMMIT) is the
        handler's own and comes through as the driver raised it.
        """
        params: tuple[Any, ...] = (
            key_id,
            response_code,
            body_json,
            self.settings.response_key,
            headers_json,
            claim_token,
        )
        query, statement = queries.COMPLETE, self._complete_statement
        try:
            if self.complete_in_scope is None:
                row = conn.execute(queries.HAS_COMPLETE_IN_SCOPE).fetchone()
                self.complete_in_scope = bool(row and row[0])
            if self.complete_in_scope:  # Citus: delegated to the claim's worker (sql/citus/021)
                query, params = queries.COMPLETE_IN_SCOPE, (key_id >> 31, *params)
                statement = self._complete_in_scope_statement
            if commit is None:
                conn.execute(query, params)
            elif not (self.settings.libpq_path and statement.with_commit(conn, block, params, commit)):
                # One statement added to the handler's transaction, no round trip added (an
                # error surfaces when the pipeline ends).
                with conn.pipeline():
                    conn.execute(query, params)
                    commit()
        except psycopg.Error as raised:
            exc = pipeline_cause(raised)
            refusal = _refusal(exc)
            if refusal is not None:
                raise refusal from raised
            committed_unknown = bool(self.complete_in_scope) and exc.sqlstate == _DISTRIBUTED_COMMIT_FAILED
            if (
                is_failover(exc)
                or committed_unknown
                or (isinstance(exc, psycopg.OperationalError) and not isinstance(exc, pg_errors.PipelineAborted))
            ):
                discard_if_failover(conn, exc)
                raise _unavailable(exc, connection_lost=conn.broken) from raised
            if exc is raised:
                raise
            raise exc from raised

    def export_user(self, conn: psycopg.Connection[Any], user_id: int) -> Any:
        """``idem_export_user``, decrypting bodies when the app has response keys."""
        row = conn.execute(queries.EXPORT_USER, (user_id, *self._response_keys)).fetchone()
        return None if row is None else next(iter(row.values())) if isinstance(row, dict) else row[0]

    @staticmethod
    def fail(
        conn: Conn, key_id: int, claim_token: str | None, response_code: int | None, *, release: bool = False
    ) -> None:
        """``idem_fail`` in autocommit (``release``: the key is freed instead of failed);
        ``ClaimLostError`` or ``StoreUnavailableError``."""
        try:
            conn.execute(
                queries.RELEASE if release else queries.FAIL,
                {"key_id": key_id, "claim_token": claim_token, "response_code": response_code},
            )
        except psycopg.Error as exc:
            raise _refusal(exc) or _unavailable(exc, connection_lost=conn.broken) from exc

    @staticmethod
    def record_lost_claim(conn: Conn, key_id: int, claim_token: str | None, endpoint: str) -> None:
        """Leave a ``lost_claim`` event for a DBA, after the rollback, in autocommit."""
        try:
            conn.execute(
                queries.RECORD_LOST_CLAIM, {"key_id": key_id, "claim_token": claim_token, "endpoint": endpoint}
            )
        except psycopg.Error as exc:
            raise _refusal(exc) or _unavailable(exc, connection_lost=conn.broken) from exc

    @staticmethod
    def downstream_key(conn: Conn, key: str, user_id: int | None, endpoint: str, namespace: str) -> str:
        """``idem_downstream_key`` on the request's connection (in its transaction if one is open)."""
        try:
            row = conn.execute(queries.DOWNSTREAM_KEY, (key, user_id, endpoint, namespace)).fetchone()
        except psycopg.Error as exc:
            raise _refusal(exc) or _unavailable(exc, connection_lost=conn.broken) from exc
        assert row is not None
        value: str = row[0]
        return value

    def heartbeat(self, key_id: int, claim_token: str | None) -> datetime:
        """Renew a claim's lease on a connection of its own, committed at once.

        Raises ``ClaimLostError`` once the claim is lost, ``StoreUnavailableError`` otherwise.
        """
        try:
            with self.pool.connection() as conn:
                row = conn.execute(queries.HEARTBEAT, {"key_id": key_id, "claim_token": claim_token}).fetchone()
        except psycopg.Error as exc:
            raise _refusal(exc) or _unavailable(exc, connection_lost=True) from exc
        assert row is not None
        locked_at: datetime = row[0]
        return locked_at

    def health_rows(self) -> list[TupleRow]:
        """The ``idem_health`` view's rows for the store gauges; any error propagates."""
        # A busy pool means the requests need its connections more than a scrape does.
        with self.pool.connection(timeout=1.0) as conn, conn.transaction():
            conn.execute(queries.HEALTH_GAUGES_TIMEOUT)
            return conn.execute(queries.HEALTH_GAUGES).fetchall()

    # -- schema ------------------------------------------------------------------------------

    def verify_schema(self, conn: Conn) -> int:
        """Check that the SQL API is installed, recent enough and open to this role; return its version."""
        expected = queries.EXPECTED_SCHEMA_VERSION
        row = conn.execute(queries.SCHEMA_VERSION).fetchone()
        assert row is not None  # one row, always
        if row[0] is None:
            raise SchemaError(
                "idem_schema_version() does not exist in this database: the idempotency SQL API "
                "is not installed. Apply it (idem migrate --database-url URL, or the script "
                "`idem sql` prints, through psql) before starting the app."
            )
        if not row[1]:
            raise SchemaError(
                "this role may not execute the idempotency SQL API: make the app's login role a "
                "member of idem_app (CREATE ROLE ... IN ROLE idem_app / GRANT idem_app TO ...)."
            )
        version = int(row[0])
        if version < expected:
            raise SchemaError(
                f"idempotency SQL API version {version} is older than the {expected} this code "
                "needs: run the migrations before deploying this code."
            )
        found = conn.execute(queries.HAS_COMPLETE_IN_SCOPE).fetchone()
        self.complete_in_scope = bool(found and found[0])
        self.schema_verified = True
        return version

    def check_schema_at_startup(self) -> None:
        """Verify the schema now if the database answers; if it does not, say so and go on."""
        try:
            with psycopg.connect(self.settings.database_url, **self.connect_kwargs()) as conn:
                self.verify_schema(conn)
                self._warn_if_read_only(conn)
        except SchemaError:
            raise
        except psycopg.OperationalError as exc:
            if self._reaches_only_read_only():
                return
            logger.warning(
                "idempotency store unreachable at start-up (%s); decorated routes answer as if "
                "the store were down until it is back, and the schema is checked on the first "
                "connection",
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            )

    def _warn_if_read_only(self, conn: Conn) -> bool:
        """A WARNING when ``conn`` reached a standby or a read-only server: every claim would
        answer 25006, so Tier 1 answers 503 until a primary is reachable."""
        row = conn.execute(
            "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_read_only') = 'on'"
        ).fetchone()
        if not row or not (row[0] or row[1]):
            return False
        logger.warning(
            "idempotency store: the database URL reaches only a read-only server (%s:%s is %s): "
            "decorated routes answer as if the store were down (Tier 1: 503) until a primary is "
            "reachable; name every node of the cluster with target_session_attrs=read-write",
            conn.info.host,
            conn.info.port,
            "a standby in recovery" if row[0] else "read-only by default_transaction_read_only",
        )
        return True

    def _reaches_only_read_only(self) -> bool:
        """After a failed start-up connection: do the URL's servers answer, only read-only
        (``target_session_attrs=read-write`` found no primary among them)?"""
        try:
            with psycopg.connect(
                self.settings.database_url, **self.connect_kwargs(), target_session_attrs="any"
            ) as conn:
                return self._warn_if_read_only(conn)
        except psycopg.Error:
            return False
