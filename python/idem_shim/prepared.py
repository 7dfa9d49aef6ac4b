"""The claim and the completion through libpq's own calls, below psycopg's cursor and pipeline.

``conn.execute`` builds a cursor, converts the query, adapts each parameter through the adapters
map, runs a generator and loads the row; ``PQsendQueryPrepared`` with the same parameters as text
and psycopg's ``Transformer`` loading the row does less of a worker's CPU (bench/HISTORY.md, "The
worker's half", has the figures). The statement is the same SQL (``queries.CLAIM``, ``%s``
spelled ``$n``), one round trip, under the connection's lock and psycopg's wait loop (so an
interrupt still cancels it); its errors are psycopg's own exceptions built from the result,
judged by ``sqlstates.py`` as any other.

The completion and the handler's COMMIT leave together in one libpq pipeline (``with_commit``),
cheaper than psycopg's ``conn.pipeline()`` around ``execute`` and the block's exit. The block
stays psycopg's ``Transaction`` (``RequestBlock``: a handler's ``conn.transaction()`` nests as a
savepoint, its ``conn.commit()`` is refused), told that its COMMIT has left, so that exiting it
only ends psycopg's bookkeeping. An in_transaction claim (contract §4e) leaves with its BEGIN and
its savepoint the same way (``begin_with``), the block told its BEGIN has left. That needs three of
psycopg's private names (``COMMIT_HOOK``, ``ENTER_HOOK``, ``BLOCK_COUNT``): the store takes these
paths only once ``probe`` has found them there and behaving on its first connection (a test
holds the probe to the pinned psycopg), and where the block is not the connection's only one
``with_commit`` says so; otherwise the caller takes psycopg's public pipeline, as before.

Prepared like psycopg prepares (``prepare_threshold``): a connection sends the statement unnamed
until it has run it that many times, then prepares it under its own name (one round trip, once
per connection). With ``prepare_threshold = None`` (PgBouncer in transaction mode) it is never
prepared. A server that lost the name (a pooler that moved the session, ``DISCARD ALL``) answers
26000 and the statement is prepared again and sent once more: the failed call ran nothing.
Each connection's name carries a random suffix (``idem_shim_claim_<16 hex>``), made again
whenever the name is lost or found taken: a statement someone else prepared under a name the shim
wants (42P05: a handler's, which shares the session) is never run as the shim's. A name the
shim prepared on an earlier call is run only behind ``queries.PREPARED_IS_OURS``, unnamed, in
the same pipeline: where the handler replaced the statement under it (``DEALLOCATE``, its own
``PREPARE``) the check fails, the server skips the EXECUTE, and the connection is closed.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Final, cast

import psycopg
from psycopg import errors as pg_errors
from psycopg import generators, pq
from psycopg.adapt import Transformer
from psycopg.rows import TupleRow

from . import queries

logger = logging.getLogger("idem_shim")

Conn = psycopg.Connection[TupleRow]

_PLACEHOLDER: Final = re.compile(r"%s")
_OK: Final = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_NAME_UNKNOWN: Final = b"26000"  # invalid_sql_statement_name: prepared elsewhere, or discarded
_NAME_TAKEN: Final = b"42P05"  # duplicate_prepared_statement: someone else's, never run
_REPLACED: Final = b"22012"  # queries.PREPARED_IS_OURS's division by zero: another statement there

#: psycopg's private names ``with_commit`` relies on: the method in which a Transaction builds
#: its COMMIT (``RequestBlock`` overrides it), and the connection's count of open blocks. A
#: psycopg minor may rename either: ``probe`` checks both before the path is taken.
COMMIT_HOOK: Final = "_get_commit_commands"
BLOCK_COUNT: Final = "_num_transactions"
#: and the one in which it builds its BEGIN (``begin_with``: an in_transaction claim's BEGIN leaves
#: in the claim's pipeline, and the block's entry then sends nothing)
ENTER_HOOK: Final = "_get_enter_commands"
_NO_TRANSACTION: Final = "25P01"  # the server's WARNING for a COMMIT outside any transaction


class RequestBlock(psycopg.Transaction):
    """The handler's transaction block (scope.py): psycopg's own, whose COMMIT may already have
    left with ``idem_complete`` (``PreparedStatement.with_commit``); its exit then sends nothing.
    Under ``claim="in_transaction"`` its BEGIN may leave with the claim (``begin_with``): its
    entry then sends nothing either."""

    commit_sent = False
    begin_sent = False
    #: an in_transaction claim's transaction id (store.py), which finds it once prepared
    claim_xid: str | None = None

    def _get_commit_commands(self) -> Iterator[bytes]:
        return iter(()) if self.commit_sent else super()._get_commit_commands()

    def _get_enter_commands(self) -> Iterator[bytes]:
        return iter(()) if self.begin_sent else super()._get_enter_commands()


def probe(conn: Conn) -> str | None:
    """Whether ``with_commit`` may run on this psycopg: None when its private hooks are there and
    behave, else the reason they do not (the caller then takes psycopg's public pipeline).

    ``conn`` must be idle and in autocommit; it is left so. Two round trips: a ``RequestBlock``
    is opened (its count must read 1), its COMMIT is sent below psycopg as ``with_commit`` sends
    it, and the block's exit must then send nothing (no "no transaction in progress" warning)
    and leave the connection idle with its count back at 0.
    """
    for hook in (COMMIT_HOOK, ENTER_HOOK):
        if not callable(getattr(psycopg.Transaction, hook, None)):
            return f"psycopg.Transaction has no {hook}()"
    if getattr(conn, BLOCK_COUNT, None) != 0:
        return f"psycopg's connection does not count its blocks in {BLOCK_COUNT}"
    warnings: list[str | None] = []

    def notice(diag: psycopg.errors.Diagnostic) -> None:
        warnings.append(diag.sqlstate)

    conn.add_notice_handler(notice)
    try:
        block = RequestBlock(conn)
        with block:
            if getattr(conn, BLOCK_COUNT, None) != 1:
                return f"{BLOCK_COUNT} does not count an open block"
            with conn.lock:
                conn.pgconn.send_query_params(b"COMMIT", None)
                (result,) = conn.wait(generators.execute(conn.pgconn))
            if result.status != pq.ExecStatus.COMMAND_OK:
                raise pg_errors.error_from_result(result, encoding=conn.info.encoding)
            block.commit_sent = True
    finally:
        conn.remove_notice_handler(notice)
    if _NO_TRANSACTION in warnings:
        return f"a block whose COMMIT has left still sends one: psycopg no longer asks {COMMIT_HOOK}()"
    if getattr(conn, BLOCK_COUNT, None) != 0 or conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return "psycopg's bookkeeping of the block did not end with it"
    # A block whose BEGIN is said sent must send none when entered (no round trip: nothing leaves).
    silent = RequestBlock(conn)
    silent.begin_sent = silent.commit_sent = True
    with silent:
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            return f"a block whose BEGIN has left still sends one: psycopg no longer asks {ENTER_HOOK}()"
        if getattr(conn, BLOCK_COUNT, None) != 1:
            return f"{BLOCK_COUNT} does not count a block entered without its BEGIN"
    if getattr(conn, BLOCK_COUNT, None) != 0 or conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return "psycopg's bookkeeping of a block entered without its BEGIN did not end with it"
    return None


def _dollar(sql: str) -> bytes:
    """``%s`` placeholders as ``$1, $2, ...`` (the statements hold no other ``%``)."""
    numbers = iter(range(1, 1000))
    return _PLACEHOLDER.sub(lambda _: f"${next(numbers)}", sql).encode()


_IS_OURS: Final = _dollar(queries.PREPARED_IS_OURS)
_PRESENT: Final = _dollar(queries.PREPARED_PRESENT)


def _pipeline(conn: Conn, send: Callable[[pq.abc.PGconn], None]) -> list[pq.abc.PGresult]:
    """What ``send`` sends, and a Sync, in one libpq pipeline (one round trip): the results, the
    Sync's last. After a command fails the server skips the rest up to the Sync
    (PIPELINE_ABORTED). The caller holds ``conn.lock``."""
    pgconn = conn.pgconn
    pgconn.enter_pipeline_mode()
    try:
        send(pgconn)
        pgconn.pipeline_sync()
        conn.wait(generators.send(pgconn))
        results: list[pq.abc.PGresult] = []
        while not results or results[-1].status != pq.ExecStatus.PIPELINE_SYNC:
            results.extend(conn.wait(generators.fetch_many(pgconn)))
    finally:
        if pgconn.pipeline_status != pq.PipelineStatus.OFF:
            try:
                pgconn.exit_pipeline_mode()
            except psycopg.Error:  # results left unread: the connection is lost anyway
                conn.close()
    return results


def begin_with(
    conn: Conn, block: RequestBlock, sql: bytes, params: Sequence[str | int | None], after: bytes
) -> tuple[Any, ...] | None:
    """BEGIN, ``sql`` (unnamed, text parameters) and ``after`` in one libpq pipeline, ``block``
    entered as the transaction they open (its BEGIN counted as sent): ``sql``'s first row, or the
    first failed statement's error (the transaction is then aborted on the server: the caller
    ends ``block``). Only on a connection whose BEGIN psycopg would send bare (``plain_begin``),
    and once ``probe`` passed."""
    block.begin_sent = True
    block.__enter__()  # psycopg's bookkeeping only: nothing leaves
    encoding = conn.info.encoding
    values = [v if v is None else str(v).encode(encoding) for v in params]
    # The names this connection's statements hold prepared: asked for in the same pipeline, since
    # this claim (unnamed) cannot find out, as the default one does, that the session lost them.
    names = PreparedStatement.held_names(conn)

    def send(pgconn: pq.abc.PGconn) -> None:
        pgconn.send_query_params(b"BEGIN", None)
        if names:
            pgconn.send_query_params(_PRESENT, [b"{" + b",".join(names) + b"}"])
        pgconn.send_query_params(sql, values)
        pgconn.send_query_params(after, None)

    with conn.lock:
        results = _pipeline(conn, send)
    if names:
        present = results.pop(1)
        if present.status == pq.ExecStatus.TUPLES_OK and int(present.get_value(0, 0) or 0) < len(names):
            PreparedStatement._forget(conn)  # each is prepared again when next due, in its pipeline
    failed = next((r for r in results if r.status == pq.ExecStatus.FATAL_ERROR), None)
    if failed is not None:
        raise pg_errors.error_from_result(failed, encoding=encoding)
    result = results[1]
    if result.ntuples == 0:
        return None
    loader = Transformer(conn)
    loader.set_pgresult(result)
    return loader.load_row(0, tuple)


def plain_begin(conn: Conn) -> bool:
    """Whether psycopg's BEGIN on ``conn`` is a bare ``BEGIN`` (no isolation level, read-only or
    deferrable set on the connection), the one ``begin_with`` sends."""
    return conn.isolation_level is None and conn.read_only is None and conn.deferrable is None


def dollar(sql: str) -> bytes:
    """A statement of ``queries`` as libpq takes it (``%s`` spelled ``$n``)."""
    return _dollar(sql)


class _ConnState:
    __slots__ = ("base", "encoding", "name", "prepared", "runs")

    def __init__(self, encoding: str, base: bytes) -> None:
        self.encoding = encoding
        self.runs = 0
        self.prepared = False
        self.base = base
        self.name = b""
        self.rename()

    def rename(self) -> None:
        """A name no one else on the server can have guessed: ``<statement>_<16 hex>``. A handler
        shares the session and ``PREPARE`` outlives its transaction, so a fixed name could be
        prepared first by the handler (or, behind PgBouncer, another client of the server
        connection) with its own SQL, and run as the claim of every later request there."""
        self.name = self.base + b"_" + secrets.token_hex(8).encode()


class PreparedStatement:
    """One statement of ``queries``, sent through libpq; per connection, what it has prepared."""

    #: Every statement: a session that lost one name (DEALLOCATE ALL) lost them all.
    _every: ClassVar[weakref.WeakSet[PreparedStatement]] = weakref.WeakSet()

    def __init__(self, name: str, sql: str, prepare_threshold: int | None) -> None:
        self.name = name.encode()
        self.sql = _dollar(sql)
        self.threshold = prepare_threshold
        self._lock = threading.Lock()
        self._conns: weakref.WeakKeyDictionary[Conn, _ConnState] = weakref.WeakKeyDictionary()
        PreparedStatement._every.add(self)

    @classmethod
    def held_names(cls, conn: Conn) -> list[bytes]:
        """The names under which this connection's statements are prepared, as far as they know."""
        held = []
        for statement in list(cls._every):
            state = statement._conns.get(conn)
            if state is not None and state.prepared:
                held.append(state.name)
        return held

    @classmethod
    def _forget(cls, conn: Conn) -> None:
        """The session behind ``conn`` holds none of our names now: each is prepared again."""
        for statement in list(cls._every):
            state = statement._conns.get(conn)
            if state is not None:
                state.prepared, state.runs = False, statement.threshold or 0
                state.rename()  # never our own older statement's name, should the session still hold it

    def _state(self, conn: Conn) -> _ConnState:
        state = self._conns.get(conn)
        if state is None:
            with self._lock:
                state = self._conns.setdefault(conn, _ConnState(conn.info.encoding, self.name))
        return state

    @staticmethod
    def _values(state: _ConnState, params: Sequence[str | int | None]) -> list[bytes | None]:
        """Text-format parameters: the SQL's casts type them, as they do psycopg's."""
        encoding = state.encoding
        return [v if v is None else str(v).encode(encoding) for v in params]

    def fetchone(self, conn: Conn, params: Sequence[str | int | None]) -> tuple[Any, ...] | None:
        """The statement's first row (None if it returned none), or the driver's exception."""
        state = self._state(conn)
        encoding = state.encoding
        values = self._values(state, params)
        with conn.lock:
            result = self._run(conn, state, values)
            if result.status not in _OK and result.error_field(pq.DiagnosticField.SQLSTATE) == _NAME_UNKNOWN:
                self._forget(conn)  # the claim finds it first: the completion after it prepares again
                result = self._run(conn, state, values)
        if result.status not in _OK:
            raise pg_errors.error_from_result(result, encoding=encoding)
        if result.ntuples == 0:
            return None
        loader = Transformer(conn)
        loader.set_pgresult(result)
        return loader.load_row(0, tuple)

    def with_commit(
        self, conn: Conn, block: psycopg.Transaction | None, params: Sequence[str | int | None], commit: Any
    ) -> bool:
        """The statement and the COMMIT of ``block`` in one libpq pipeline, then ``commit()`` (the
        scope's exit of the block, which sends nothing now). False, having sent nothing, when
        this path cannot be taken: the caller uses psycopg's pipeline.

        Raises the statement's error (the block is then aborted on the server, and the caller's
        rollback ends it), the COMMIT's (the block is over), or a lost connection's.
        """
        if (
            not isinstance(block, RequestBlock)
            or getattr(conn, BLOCK_COUNT, None) != 1  # a savepoint the handler left open
            or conn.pgconn.transaction_status != pq.TransactionStatus.INTRANS
        ):
            return False
        state = self._state(conn)
        values = self._values(state, params)
        with conn.lock:
            preparing = self._due(state)
            checking = state.prepared  # by an earlier call: the handler has had the session since

            def send(pgconn: pq.abc.PGconn) -> None:
                if preparing:
                    pgconn.send_prepare(state.name, self.sql)  # in the pipeline: no round trip of its own
                    state.prepared = True
                elif checking:
                    self._send_check(pgconn, state)
                self._send(pgconn, state, values)
                pgconn.send_query_params(b"COMMIT", None)

            results = _pipeline(conn, send)
        if preparing and results[0].status != pq.ExecStatus.COMMAND_OK:
            state.prepared = False
        block.commit_sent = True
        commit()
        if checking and results[0].error_field(pq.DiagnosticField.SQLSTATE) == _REPLACED:
            # Nothing of the block committed (the check aborted it before the completion).
            self._retire(conn, state)
        failed = next((r for r in results if r.status == pq.ExecStatus.FATAL_ERROR), None)
        if failed is None:
            return True
        if failed.error_field(pq.DiagnosticField.SQLSTATE) in (_NAME_UNKNOWN, _NAME_TAKEN):
            # The session lost the name between the claim (which would have prepared it again) and
            # now: the handler itself ran DEALLOCATE. Nothing of the block committed. Said as a
            # lost store (503, the key stays in flight until its stale heal), never as the
            # handler's failure; the next call prepares again.
            self._forget(conn)
            message = (failed.error_message or b"").decode(state.encoding, "replace").strip()
            raise psycopg.OperationalError(f"the server does not hold the prepared completion: {message}")
        raise pg_errors.error_from_result(failed, encoding=state.encoding)

    def _due(self, state: _ConnState) -> bool:
        """This connection has run the statement unnamed ``prepare_threshold`` times: prepare it."""
        return not state.prepared and self.threshold is not None and state.runs >= self.threshold

    def _send(self, pgconn: pq.abc.PGconn, state: _ConnState, values: list[bytes | None]) -> None:
        if state.prepared:
            pgconn.send_query_prepared(state.name, values)
        else:
            state.runs += 1
            pgconn.send_query_params(self.sql, values)

    def _send_check(self, pgconn: pq.abc.PGconn, state: _ConnState) -> None:
        """queries.PREPARED_IS_OURS, unnamed, to go just before the named statement."""
        pgconn.send_query_params(_IS_OURS, [state.name, self.sql])

    def _retire(self, conn: Conn, state: _ConnState) -> None:
        """The session holds someone else's statement under our name (the check failed, so it was
        not run): the connection is closed, never to be used again, and the call said lost."""
        name = state.name.decode()
        self._forget(conn)
        conn.close()
        logger.warning(
            "idempotency store: the session's prepared statement %s is not the one the shim prepared "
            "(a handler's DEALLOCATE and PREPARE?); it was not run, and the connection is closed",
            name,
        )
        raise psycopg.OperationalError(
            f"the session's prepared statement {name} was replaced by someone else's: connection closed"
        )

    def _run(self, conn: Conn, state: _ConnState, values: list[bytes | None]) -> pq.abc.PGresult:
        pgconn = conn.pgconn
        if state.prepared:
            # Prepared by an earlier call: the handler has had the session since. The check and
            # the EXECUTE leave in one pipeline; a statement not ours is skipped, never run.
            def send(pgconn: pq.abc.PGconn) -> None:
                self._send_check(pgconn, state)
                self._send(pgconn, state, values)

            checked, result, *after = _pipeline(conn, send)
            if checked.status != pq.ExecStatus.TUPLES_OK:
                if checked.error_field(pq.DiagnosticField.SQLSTATE) == _REPLACED:
                    self._retire(conn, state)
                return checked
            # The statement's transaction commits at the Sync: a commit refused there (a Citus
            # coordinator cut from a worker) is one more result after its rows, which never
            # committed. The failure is the answer, as the unpipelined path's last result is.
            return next((r for r in after if r.status == pq.ExecStatus.FATAL_ERROR), result)
        if self._due(state):
            pgconn.send_prepare(state.name, self.sql)
            (prepared,) = conn.wait(generators.execute(pgconn))
            if prepared.error_field(pq.DiagnosticField.SQLSTATE) == _NAME_TAKEN:
                # Someone else's statement under our name (never run: it is not ours): another.
                state.rename()
                pgconn.send_prepare(state.name, self.sql)
                (prepared,) = conn.wait(generators.execute(pgconn))
            if prepared.status != pq.ExecStatus.COMMAND_OK:
                # e.g. the function is missing: the same error the call would give
                return cast(pq.abc.PGresult, prepared)
            state.prepared = True
        self._send(pgconn, state, values)
        return cast(pq.abc.PGresult, conn.wait(generators.execute(pgconn))[-1])
