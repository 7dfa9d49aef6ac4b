"""The idempotency store: the SQL API's calls, on connections from a ``ConnectionSource``.

Each call is one statement and one round trip; every driver error of them is judged by
``sqlstates.store_error``. What goes through psycopg goes with ``prepare=False``: a handler shares
the session and could replace a ``_pg3_*`` statement psycopg prepared (prepared.py checks its
own). The connections come from ``pool.py`` (an app's fork-safe pool, or what
``idempotent(db=...)`` was given), waiting claims are bounded by ``admission.py``, and what the
start-up checks found is ``startup.py``'s: the one engine of a route and a job.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Generator
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow, tuple_row
from psycopg_pool import ConnectionPool

from . import prepared, queries
from .admission import Waiters
from .config import Settings
from .errors import StoreRefusedError
from .logs import error_text
from .outcome import Outcome
from .pool import ConnectionSource, ForkSafePool, connect_kwargs
from .prepared import PreparedStatement, RequestBlock
from .records import ClaimRequest, ClaimResult, UserId
from .sqlstates import pipeline_cause, store_error
from .startup import SchemaCheck

logger = logging.getLogger("idem_shim")

Conn = psycopg.Connection[TupleRow]


#: The in_transaction claim and its savepoint as libpq takes them (prepared.begin_with).
_CLAIM_IN_TRANSACTION = prepared.dollar(queries.CLAIM_IN_TRANSACTION)
_WORK_SAVEPOINT = queries.WORK_SAVEPOINT.encode()


def _waited(request: ClaimRequest) -> ClaimResult:
    """The in_flight answer of an in_transaction claim that waited its bound on a holder whose row
    is not committed yet: the holder has run at least that long (durations.py weighs it)."""
    return ClaimResult(Outcome.IN_FLIGHT, None, None, None, None, 5000, holder_elapsed_ms=request.wait_ms)


class Store:
    """Runs the SQL API's statements for one app (its own pool) or one ``idempotent()`` (the
    caller's ``source``)."""

    def __init__(self, settings: Settings, source: ConnectionSource | None = None) -> None:
        self.settings = settings
        self.schema = SchemaCheck(settings)
        self.source: ConnectionSource = source or ForkSafePool(settings, configure=self._on_new_connection)
        # The waiters' bound protects the shim's own pool; a caller's pool is the caller's to size.
        self.waiters = Waiters(settings.pool_max_size) if source is None else None
        # Bound parameters, never settings: the keys must not show up in pg_stat_activity.
        self._response_keys = (settings.response_key, settings.response_key_fallback)
        # The claim and the completion below psycopg's cursor (prepared.py): the same SQL.
        threshold = settings.prepare_threshold
        self._claim_statement = PreparedStatement("idem_shim_claim", queries.CLAIM, threshold)
        self._complete_statement = PreparedStatement("idem_shim_complete", queries.COMPLETE, threshold)
        self._complete_in_scope_statement = PreparedStatement(
            "idem_shim_complete_in_scope", queries.COMPLETE_IN_SCOPE, threshold
        )
        #: whether the completion and its COMMIT may leave in libpq's pipeline: None until a
        #: connection has been probed (prepared.probe): the own pool's first one, else the
        #: first claim's
        self.pipelined_commit: bool | None = None if settings.libpq_path else False

    # -- connections -------------------------------------------------------------------------

    @property
    def pool(self) -> ConnectionPool[Conn]:
        """The psycopg_pool behind the store (``IdemError`` over a single given connection)."""
        return self.source.pool

    def connect_kwargs(self) -> dict[str, Any]:
        return connect_kwargs(self.settings)

    def putconn(self, conn: Conn) -> None:
        """Return a connection; a broken one is discarded and replaced by the pool."""
        self.source.putconn(conn)

    def getconn_for_handler(self) -> Conn:
        """A connection for a handler's transaction; ``StoreUnavailableError`` if none."""
        try:
            return self.source.getconn()
        except psycopg.Error as exc:
            raise store_error(exc, None) from exc

    def close(self) -> None:
        self.source.close()

    def _row(self, conn: Conn, query: Any, params: Any) -> tuple[Any, ...]:
        """One SQL API call on ``conn`` and its one row, its errors judged once."""
        try:
            with conn.cursor(row_factory=tuple_row) as cur:
                row = cur.execute(query, params, prepare=False).fetchone()
        except psycopg.Error as exc:
            raise store_error(exc, conn) from exc
        assert row is not None  # a SELECT of one function: one row
        return row

    # -- the SQL API -------------------------------------------------------------------------

    def claim(self, request: ClaimRequest) -> tuple[Conn, ClaimResult]:
        """Take a connection and run ``idem_claim`` on it; the caller owns the connection after.

        Raises ``StoreUnavailableError`` for any failure to reach or use the store, and the SQL
        API's refusals as their ``StoreRefusedError`` (``MalformedKeyError``,
        ``InvalidArgumentError``, ``ContentionError``, ``UndecryptableResponseError``,
        ``InvalidFingerprintError``).

        A connection that died while idle in the pool (server restart, failover) is noticed only
        when used; then the pool's idle connections are checked and the claim is sent once more
        on a fresh one. Re-sending is safe: if the first claim did commit before its answer was
        lost, the second sees our own row ``in_flight`` (409) and never a second execution.
        """
        waiters = self.waiters
        if request.wait_ms <= 0 or waiters is None:
            return self._claim(request)
        waiting = waiters.enter()
        if not waiting:
            request = replace(request, wait_ms=0)
        try:
            return self._claim(request)
        finally:
            if waiting:
                waiters.leave()

    def _claim(self, request: ClaimRequest) -> tuple[Conn, ClaimResult]:
        params = request.params() + self._response_keys
        for attempt in (1, 2):
            try:
                conn = self.source.getconn()
            except psycopg.Error as exc:
                raise store_error(exc, None) from exc
            try:
                if self.pipelined_commit is None:
                    self._probe(conn)
                return conn, self._claim_on(conn, params)
            except psycopg.Error as exc:
                # A server that went away (broken socket, 57P01) or is read-only now (25006: the
                # old primary come back as a standby) keeps nothing of ours: store_error drops it.
                error = store_error(exc, conn, fingerprint=True)
                broken = conn.broken or conn.closed
                self.putconn(conn)
                if isinstance(error, StoreRefusedError) or not broken or attempt == 2:
                    raise error from exc
                reason = error_text(exc)
            except BaseException:
                self.putconn(conn)
                raise
            logger.info("idempotency store connection lost (%s); checking the pool, retrying the claim once", reason)
            self.source.check()
        raise AssertionError("unreachable")  # pragma: no cover

    def claim_in_transaction(self, request: ClaimRequest) -> tuple[Conn, ClaimResult, RequestBlock | None]:
        """``claim="in_transaction"`` (contract §4e): BEGIN, ``queries.CLAIM_IN_TRANSACTION`` and
        ``SAVEPOINT idem_work`` in one pipeline (one round trip) on a connection of the source.

        ``claimed``: the connection comes back with that transaction open in the returned block,
        which the caller's completion commits. Any other outcome is committed here (a replay's
        audit row, a heal) and comes back with no block. A wait on a holder's uncommitted row that
        reached its bound (55P03) is ``in_flight`` (nothing written, rolled back); a snapshot that
        cannot see the holder's commit (40001 under REPEATABLE READ) sends the claim once more. The errors are those
        of ``claim``, whose retry on a connection lost in the pool it shares."""
        waiters = self.waiters
        waiting = request.wait_ms > 0 and waiters is not None and waiters.enter()
        if request.wait_ms > 0 and not waiting and waiters is not None:
            request = replace(request, wait_ms=0)
        try:
            return self._claim_in_transaction(request)
        finally:
            if waiting and waiters is not None:
                waiters.leave()

    def _claim_in_transaction(self, request: ClaimRequest) -> tuple[Conn, ClaimResult, RequestBlock | None]:
        # 0 would be no bound at all: a duplicate never waits longer than it was allowed to.
        lock_ms = str(max(1, request.wait_ms))
        idle_ms = str(max(1000, int(request.stale_after.total_seconds() * 1000)))
        params = (lock_ms, idle_ms, *request.params(), *self._response_keys)
        for attempt in (1, 2):
            try:
                conn = self.source.getconn()
            except psycopg.Error as exc:
                raise store_error(exc, None) from exc
            try:
                result, block = self._claim_in_transaction_on(conn, request, params)
                return conn, result, block
            except psycopg.Error as exc:
                # Nothing of the claim committed (nothing does before the handler), so a connection
                # the server closed while it sat in the pool (a restart, a failover) is sent the
                # claim once more on a fresh one, the pool's idle ones checked, as claim() does.
                error = store_error(exc, conn, fingerprint=True)
                broken = conn.broken or conn.closed
                self.putconn(conn)
                if isinstance(error, StoreRefusedError) or not broken or attempt == 2:
                    raise error from exc
                reason = error_text(exc)
            except BaseException:
                self.putconn(conn)
                raise
            logger.info("idempotency store connection lost (%s); checking the pool, retrying the claim once", reason)
            self.source.check()
        raise AssertionError("unreachable")  # pragma: no cover

    def _claim_in_transaction_on(
        self, conn: Conn, request: ClaimRequest, params: tuple[Any, ...]
    ) -> tuple[ClaimResult, RequestBlock | None]:
        """One in_transaction claim on ``conn``: its block open (claimed) or ended; the driver's
        error, the block ended, for anything but a wait that reached its bound."""
        for attempt in (1, 2):
            block = RequestBlock(conn)
            try:
                if self.pipelined_commit is None:
                    self._probe(conn)
                if self.settings.libpq_path and self.pipelined_commit and prepared.plain_begin(conn):
                    # below psycopg's cursor and pipeline, as the default claim goes (prepared.py)
                    row = prepared.begin_with(conn, block, _CLAIM_IN_TRANSACTION, params, _WORK_SAVEPOINT)
                else:
                    with conn.cursor(row_factory=tuple_row) as cur:
                        with conn.pipeline():
                            block.__enter__()  # BEGIN, queued: it leaves with the claim
                            cur.execute(queries.CLAIM_IN_TRANSACTION, params, prepare=False)
                            conn.execute(queries.WORK_SAVEPOINT, prepare=False)
                        row = cur.fetchone()
                break
            except psycopg.Error as exc:
                cause = pipeline_cause(exc)
                self._end_block(block)
                if isinstance(cause, psycopg.errors.SerializationFailure) and attempt == 1:
                    # A REPEATABLE READ or SERIALIZABLE default (the database's owner may set one):
                    # the holder we waited on committed outside this snapshot. A new transaction
                    # sees its answer (a replay) or its absence (a claim).
                    continue
                if isinstance(cause, psycopg.errors.LockNotAvailable) and self._store_locked(conn):
                    # The bound fired on the table (a DBA's lock), not on a holder: the store is
                    # unavailable, as the default shape's statement timeout says it.
                    raise
                if isinstance(cause, psycopg.errors.LockNotAvailable | psycopg.errors.SerializationFailure):
                    return _waited(request), None
                raise
            except BaseException:
                self._end_block(block)
                raise
        if row is None:  # pragma: no cover - idem_claim always returns one row
            self._end_block(block)
            raise psycopg.DataError("idem_claim returned no row")
        result = ClaimResult.from_row(row)
        if result.outcome == Outcome.CLAIMED:
            block.claim_xid = row[11]
            return result, block
        block.__exit__(None, None, None)  # COMMIT: a replay's audit row, a heal's delete
        return result, None

    @staticmethod
    def _store_locked(conn: Conn) -> bool:
        """``queries.STORE_LOCKED`` in autocommit; an error there says nothing (False)."""
        try:
            row = conn.execute(queries.STORE_LOCKED, prepare=False).fetchone()
        except psycopg.Error:
            return False
        return bool(row and row[0])

    @staticmethod
    def _end_block(block: RequestBlock) -> None:
        """Roll an in_transaction claim's block back, whatever state its connection is in."""
        if block.status != block.Status.ACTIVE:  # never entered (nothing queued), or ended
            return
        block.force_rollback = True
        try:
            block.__exit__(None, None, None)
        except psycopg.Error as exc:  # the connection is gone: nothing is left to roll back
            logger.debug("in_transaction claim: rollback failed (%s)", error_text(exc))

    def _on_new_connection(self, conn: Conn) -> None:
        """The own pool's start-up checks, on its connections until each has passed once."""
        self.schema.on_new_connection(conn)
        if self.pipelined_commit is None:
            self._probe(conn)

    def _probe(self, conn: Conn) -> None:
        reason = prepared.probe(conn)
        if reason is not None:
            logger.warning(
                "idempotency store: the completion and its COMMIT take psycopg's pipeline, not libpq's (%s)", reason
            )
        self.pipelined_commit = reason is None

    def _claim_row(self, conn: Conn, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if self.settings.libpq_path:
            return self._claim_statement.fetchone(conn, params)
        with conn.cursor(row_factory=tuple_row) as cur:
            return cur.execute(queries.CLAIM, params, prepare=False).fetchone()

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
        return ClaimResult.from_row(row)

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
            in_scope = self.schema.complete_in_scope
            if in_scope is None:
                in_scope = self.schema.learn_complete_in_scope(conn)
            if in_scope:  # Citus: delegated to the claim's worker (sql/citus/021)
                query, params = queries.COMPLETE_IN_SCOPE, (key_id >> 31, *params)
                statement = self._complete_in_scope_statement
            if commit is None:
                conn.execute(query, params, prepare=False)
            elif not (self.pipelined_commit and statement.with_commit(conn, block, params, commit)):
                # One statement added to the handler's transaction, no round trip added (an
                # error surfaces when the pipeline ends).
                with conn.pipeline():
                    conn.execute(query, params, prepare=False)
                    commit()
        except psycopg.Error as raised:
            error = store_error(raised, conn, handler=True, distributed=bool(self.schema.complete_in_scope))
            if error is raised:
                raise
            raise error from raised

    def fail(
        self,
        conn: Conn,
        key_id: int,
        claim_token: str | None,
        response_code: int | None,
        *,
        release: bool = False,
        with_work: bool = False,
    ) -> None:
        """``idem_fail`` in autocommit (``release``: the key is freed instead of failed), or with
        ``with_work`` in the work's open transaction, which the caller commits;
        ``ClaimLostError`` or ``StoreUnavailableError``."""
        if with_work:
            query = queries.RELEASE_WITH_WORK if release else queries.FAIL_WITH_WORK
        else:
            query = queries.RELEASE if release else queries.FAIL
        self._row(conn, query, {"key_id": key_id, "claim_token": claim_token, "response_code": response_code})

    def end_prepared_claim(self, conn: Conn, claim_xid: str) -> bool:
        """``ROLLBACK PREPARED`` of the transaction ``claim_xid`` where a handler prepared it (the
        session's role, this database), in autocommit: its row and writes gone, the key is free.
        False when there is none such; the errors are ``claim``'s."""
        try:
            row = conn.execute(queries.PREPARED_CLAIM, (claim_xid,), prepare=False).fetchone()
            if row is None:
                return False
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(row[0])), prepare=False)
        except psycopg.Error as exc:
            raise store_error(exc, conn) from exc
        return True

    def fail_afresh(self, conn: Conn, request: ClaimRequest, response_code: int | None) -> bool:
        """``queries.FAIL_AFRESH`` in autocommit: the key claimed and failed in one statement, for
        an in_transaction claim whose transaction is gone. False when nothing was recorded (the
        key is held or answered by another request meanwhile)."""
        params = (response_code, *replace(request, wait_ms=0).params(), *self._response_keys)
        try:
            with conn.cursor(row_factory=tuple_row) as cur:
                row = cur.execute(queries.FAIL_AFRESH, params, prepare=False).fetchone()
        except psycopg.errors.LockNotAvailable:
            return False
        except psycopg.Error as exc:
            raise store_error(exc, conn) from exc
        return row is not None

    def record_lost_claim(self, conn: Conn, key_id: int, claim_token: str | None, endpoint: str) -> None:
        """Leave a ``lost_claim`` event for a DBA, after the rollback, in autocommit."""
        self._row(conn, queries.RECORD_LOST_CLAIM, {"key_id": key_id, "claim_token": claim_token, "endpoint": endpoint})

    def downstream_key(
        self, conn: Conn, key: str, user_id: UserId | None, endpoint: str, namespace: str, key_format: str = "uuid"
    ) -> str:
        """``idem_downstream_key`` on the request's connection (in its transaction if one is open)."""
        value: str = self._row(conn, queries.DOWNSTREAM_KEY, (key, user_id, endpoint, namespace, key_format))[0]
        return value

    def heartbeat(self, key_id: int, claim_token: str | None) -> datetime:
        """Renew a claim's lease on a connection of its own, committed at once.

        Raises ``ClaimLostError`` once the claim is lost, ``StoreUnavailableError`` otherwise
        (``IdemError`` when the source has no second connection to give).
        """
        params = {"key_id": key_id, "claim_token": claim_token}
        try:
            with self.source.connection() as conn:
                locked_at: datetime = self._row(conn, queries.HEARTBEAT, params)[0]
        except psycopg.Error as exc:  # no connection to be had
            raise store_error(exc, None) from exc
        return locked_at

    def export_user(self, conn: psycopg.Connection[Any], user_id: UserId) -> Generator[Any]:
        """``idem_export_user``'s keys one at a time, decrypting bodies when the app has response
        keys: a server-side cursor fetches one row per round trip, since a user's keys together
        may be larger than this process's memory. The export is one snapshot (one transaction)."""
        with conn.transaction(), conn.cursor("idem_export_user", row_factory=tuple_row) as cursor:
            cursor.itersize = 1
            cursor.execute(queries.EXPORT_USER, (user_id, *self._response_keys))
            while (row := cursor.fetchone()) is not None:
                key = json.loads(row[0])
                del row  # its text is as large as the key: one copy of it at a time, not two
                yield key

    def health_rows(self, scopes: list[str]) -> list[TupleRow]:
        """``idem_health``'s rows for the store gauges, naming ``scopes`` (every other endpoint is
        folded into rows whose endpoint is NULL); any error propagates."""
        # A busy pool means the requests need its connections more than a scrape does.
        with self.source.connection(timeout=1.0) as conn, conn.transaction():
            conn.execute(queries.HEALTH_GAUGES_TIMEOUT, prepare=False)
            return conn.execute(queries.HEALTH_GAUGES, {"scopes": scopes}, prepare=False).fetchall()
