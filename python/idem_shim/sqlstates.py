"""The error boundary: every driver error of the shim's own statements is judged here, once.

``store_error`` turns a ``psycopg.Error`` into what the shim raises to its callers: the SQL API's
refusal (a ``StoreRefusedError`` subclass, by SQLSTATE), or the store unavailable
(``StoreUnavailableError``), or (for a completion committed with the handler's transaction) the
handler's own error as the driver raised it. The shim branches on the SQLSTATE alone, never on
message text, and nothing else in the shim looks at SQLSTATEs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import TupleRow

from .errors import (
    ClaimLostError,
    ContentionError,
    InvalidArgumentError,
    InvalidFingerprintError,
    MalformedKeyError,
    ResponseRefusedError,
    StoreRefusedError,
    StoreUnavailableError,
    UndecryptableResponseError,
    UnknownUserError,
)
from .logs import error_text

Conn = psycopg.Connection[TupleRow]

#: The one table of SQLSTATEs the shim judges, one exception each. First the SQL API's refusals
#: (sql/README.md's error table is the reference), then what a failover or a restart of the
#: server produces (docs/operations.md "Failover"): the store is going, gone, or not (or no
#: longer) the primary. Those are never the request's fault: the connection is discarded (it may
#: point at the old primary, now read-only) and the call is answered as the store unavailable
#: (Tier 1: 503; Tier 2: undeduplicated).
SQLSTATES: Final[Mapping[str, type[StoreRefusedError] | type[StoreUnavailableError]]] = {
    "22023": MalformedKeyError,
    "IDM00": InvalidArgumentError,
    "IDM01": ClaimLostError,
    "IDM02": ContentionError,
    "IDM03": UndecryptableResponseError,
    "IDM04": ResponseRefusedError,
    # The user scope names no users row: the host's bug (a session for a deleted user, the wrong
    # users table), answered 500 idempotency_user_unknown, never counted or alerted as an outage.
    "23503": UnknownUserError,
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

#: A claim's other data exceptions (SQLSTATE class 22: 22P05 a NUL or lone surrogate, 22P02 bad
#: JSON, 22003 an out-of-range number) can only come from ``p_request``, the client's text (every
#: other argument is the shim's own, typed): a 400, never an outage.
_DATA_EXCEPTION_CLASS: Final = "22"

#: Citus's answer when a worker fails the COMMIT of the handler's transaction ("could not commit
#: transaction for shard N on at least one active node", internal_error): the worker may or may not
#: have committed, as when the connection is lost. A handler's deferred constraint failing on a
#: worker reads the same (Citus gives both one SQLSTATE): on Citus make such constraints immediate.
_DISTRIBUTED_COMMIT_FAILED: Final = "XX000"


#: How libpq frames an error the server sent while a connection was being made ("FATAL:  too
#: many connections for role ..."): the severity word, a colon and two spaces, on a line of its
#: own or after libpq's "connection to server at ... failed: ". libpq keeps no SQLSTATE for such
#: an error (no result to read it from), so this framing, libpq's own and the same in every
#: locale (the severity word is the only translated part), is what says the server spoke. Its own
#: reasons (refused, timeout expired, no such host, the connection closed or reset) never carry it.
_SERVER_SPOKE: Final = re.compile(r"(?:^|: )[^\s:]+:  \S", re.MULTILINE)


def server_answered(exc: BaseException) -> bool:
    """Whether ``exc``, a failed connection attempt, met a server that answered with an error of
    its own (any SQLSTATE: 53300 too many connections, 57P03 cannot connect now, 28P01, 3D000,
    PgBouncer's refusals): the store is up and busy or refusing, not down. False for what no
    server said: a connection refused, a timeout, a reset, a name that does not resolve."""
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate:
        return True
    return _SERVER_SPOKE.search(str(exc)) is not None


#: SQLSTATE class 40, transaction rollback: 40001 serialization_failure, 40P01 deadlock_detected.
#: The server rolled the transaction back whole and says a retry of it may succeed.
_TRANSIENT_ROLLBACK: Final = ("40001", "40P01")


def transient_rollback(exc: BaseException) -> bool:
    """Whether ``exc`` (a handler's exception) is, or was raised from, a serialization failure or
    a deadlock of its database work: nothing of it committed, and a retry may succeed."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, psycopg.Error) and cause.sqlstate in _TRANSIENT_ROLLBACK:
            return True
        cause = cause.__cause__ or cause.__context__
    return False


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


def refusal(exc: psycopg.Error, *, fingerprint: bool = False) -> StoreRefusedError | None:
    """The SQL API's refusal behind ``exc``, or None when it is not one. With ``fingerprint``
    (the claim, whose only client text is ``p_request``) a data exception is the request's."""
    kind = SQLSTATES.get(exc.sqlstate or "")
    message = str(exc.diag.message_primary or exc)
    if kind is not None and issubclass(kind, StoreRefusedError):
        if kind is UnknownUserError and exc.diag.message_detail:  # which user, which table
            message = f"{message}: {exc.diag.message_detail}"
        return kind(message)
    if fingerprint and (exc.sqlstate or "").startswith(_DATA_EXCEPTION_CLASS):
        return InvalidFingerprintError(message)
    return None


def is_failover(exc: psycopg.Error) -> bool:
    """True for the SQLSTATEs of a server going away or not writable (see ``SQLSTATES``)."""
    return SQLSTATES.get(exc.sqlstate or "") is StoreUnavailableError


def discard_if_failover(conn: Conn, exc: psycopg.Error) -> None:
    """Close a connection that answered as a server going away or read-only would: given back to
    the pool closed, it is replaced by a new one, which ``target_session_attrs=read-write`` takes
    to whichever server is the primary now."""
    if is_failover(exc) and not conn.closed:
        conn.close()


def unavailable(exc: psycopg.Error, conn: Conn | None) -> StoreUnavailableError:
    """The store unavailable; ``conn`` None: no connection was had at all."""
    lost = conn is None or conn.broken or conn.closed or is_failover(exc)
    return StoreUnavailableError(error_text(exc), connection_lost=lost)


def store_error(
    raised: psycopg.Error,
    conn: Conn | None,
    *,
    fingerprint: bool = False,
    handler: bool = False,
    distributed: bool = False,
) -> Exception:
    """What the shim raises for ``raised``, a failed SQL API call on ``conn`` (None: getting a
    connection failed). A connection that answered as a failover does is closed first.

    ``handler``: the call shared a transaction with the handler's writes (the completion and its
    COMMIT), so an error that is neither a refusal nor a lost server (a deferred constraint of the
    handler's failing at COMMIT) is the handler's own: it comes back as the driver raised it (the
    pipeline's cause, or ``raised`` itself). ``distributed``: that transaction spans Citus
    workers, whose failed COMMIT leaves the outcome unknown, as a lost server does.
    """
    exc = pipeline_cause(raised)
    refused = refusal(exc, fingerprint=fingerprint)
    if refused is not None:
        return refused
    lost_server = (
        is_failover(exc)
        or (distributed and exc.sqlstate == _DISTRIBUTED_COMMIT_FAILED)
        or (isinstance(exc, psycopg.OperationalError) and not isinstance(exc, pg_errors.PipelineAborted))
    )
    if handler and not lost_server:
        return exc
    if conn is not None:
        discard_if_failover(conn, exc)
    return unavailable(exc, conn)
