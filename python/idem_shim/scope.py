"""What one decorated request holds, and the accessors route code uses to reach it.

``connection()`` gives the handler the request's database connection with a transaction open on
it. On a claimed request it is the connection that ran ``idem_claim``; its transaction also
carries ``idem_complete``, so the handler's writes and the completion commit together (or roll
back together). In passthrough (no key, kill switch off, store down on a fail-open route) it is a
pool connection too, and the decorator commits it for a response < 500 and rolls it back
otherwise, so a route's code is the same either way.

Rules for route code: do not call ``commit()`` / ``rollback()`` on it (psycopg refuses inside the
decorator's transaction block; use ``with conn.transaction():`` for a savepoint), and do not keep
it after the request.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from datetime import datetime
from typing import Protocol

import psycopg
from flask import g, has_app_context
from psycopg.pq import TransactionStatus

from . import queries
from .errors import (
    ClaimLostError,
    ConfigError,
    NotClaimedError,
    OutsideRequestError,
    StoreRefusedError,
    StoreUnavailableError,
)
from .logs import error_text, key_hint, log_event, store_outage
from .policy import Policy
from .prepared import RequestBlock
from .records import ClaimRequest, UserId
from .sqlstates import Conn, is_failover, transient_rollback
from .state import IdemState


class Closes(Protocol):
    """What a request holds open beside its connection until the handler returns: the ORM
    session joined to it (``sqlalchemy.Joined``)."""

    def close(self) -> None: ...


_G_SCOPE = "_idem_scope"
#: The scope of an ``idempotent()`` call running in this context (jobs.py), outside any request.
JOB_SCOPE: ContextVar[RequestScope | None] = ContextVar("idem_job_scope", default=None)
#: A namespace names a downstream call ("broker", "stripe"); the bound keeps it a name.
MAX_NAMESPACE_CHARS = 200
_OPEN = (TransactionStatus.INTRANS, TransactionStatus.INERROR)


class RequestScope:
    """One decorated request: the app's state, the route's policy, its scope (endpoint, key),
    its claim, and its connection (taken lazily) with the transaction block open on it."""

    __slots__ = (
        "_conn",
        "_downstream",
        "_tx",
        "attempt",
        "began",
        "claim_request",
        "claim_token",
        "claim_xid",
        "endpoint",
        "key",
        "key_format",
        "key_id",
        "orm",
        "policy",
        "state",
        "store_lost",
        "untracked",
        "user_id",
    )

    def __init__(self, state: IdemState, endpoint: str, policy: Policy) -> None:
        self.state = state
        self.endpoint = endpoint
        self.policy = policy
        self.key: str | None = None  # the canonical key, once the header parsed
        self.key_format = "uuid"  # the rule it was read under (the SQL API's p_key_format)
        self.key_id: int | None = None  # the claim's id: set only on a claimed request
        self.claim_token: str | None = None  # and the token that fences it
        self.attempt: int | None = None  # and which execution of the key it is
        #: the claim's arguments, to record an in_transaction failure afresh (claimed.py)
        self.claim_request: ClaimRequest | None = None
        #: and its transaction's id, which finds it if the handler prepared it (claimed.py)
        self.claim_xid: str | None = None
        self.user_id: UserId | None = None  # the key's user scope, once read
        # Why the request holds no claim, for downstream_key()/attempt() to say (None: claimed).
        self.untracked = "the request has not been claimed yet"
        self._downstream: dict[str, str] = {}
        # The claim just found the store unreachable (fail-open): connection() re-raises it.
        self.store_lost: StoreUnavailableError | None = None
        self._conn: Conn | None = None
        self._tx: RequestBlock | None = None
        #: the handler opened a transaction on the connection (its work is in the key's)
        self.began = False
        #: the SQLAlchemy session joined to the connection (sqlalchemy.py), while the handler runs
        self.orm: Closes | None = None

    def adopt(
        self, conn: Conn, key_id: int, claim_token: str | None, attempt: int | None, block: RequestBlock | None = None
    ) -> None:
        """Take over the connection that ran the claim, its id, its token and its attempt; under
        ``claim="in_transaction"`` also the block the claim opened, which the handler's work joins."""
        self._conn = conn
        self._tx = block
        self.claim_xid = None if block is None else block.claim_xid
        self.key_id = key_id
        self.claim_token = claim_token
        self.attempt = attempt or 1  # a store too old to count heals: taken as the first execution

    @property
    def key_hint(self) -> str | None:
        return None if self.key is None else key_hint(self.key)

    def connection(self) -> Conn:
        if self._conn is None:
            if self.store_lost is not None:
                # The claim just found the store unreachable: do not wait for it a second time.
                raise self.store_lost
            self._conn = self.state.store.getconn_for_handler()
        if self._tx is None:
            tx = RequestBlock(self._conn)  # what conn.transaction() would enter (prepared.py)
            try:
                tx.__enter__()  # BEGIN, only when the handler first asks for the connection
            except psycopg.InternalError as exc:
                # PgBouncer relays the server's FATAL and adds its own error when the server
                # behind it went away: two results for BEGIN, which psycopg reports as an
                # InternalError. The connection is gone; say so the way every other lost
                # connection is said, so the host's "database unavailable" answer (a 503)
                # applies rather than a 500 (found by the chaos soak).
                if not (self._conn.closed or self._conn.broken):
                    raise
                raise psycopg.OperationalError(f"the connection was lost at BEGIN: {exc}") from exc
            self._tx = tx
        self.began = True
        return self._conn

    @property
    def claims_in_transaction(self) -> bool:
        """The claim is the handler's transaction's (``claim="in_transaction"``, contract §4e): its
        row commits with the work, and a failure rolls back to ``idem_work``, not the whole."""
        return self.key_id is not None and self.policy.claim == "in_transaction"

    @property
    def conn(self) -> Conn | None:
        return self._conn

    @property
    def block(self) -> RequestBlock | None:
        """The handler's open transaction block, which ``commit`` ends."""
        return self._tx

    def in_open_transaction(self) -> bool:
        """True if the handler used the connection and its transaction can still commit."""
        return (
            self._tx is not None
            and self._conn is not None
            and self._conn.info.transaction_status == TransactionStatus.INTRANS
        )

    def end_orm(self) -> None:
        """The handler returned: close its joined ORM session, if any (its uncommitted work
        returns to its savepoint); the transaction stays the decorator's to end."""
        orm, self.orm = self.orm, None
        if orm is not None:
            orm.close()

    def commit(self) -> None:
        tx, self._tx = self._tx, None
        if tx is not None:
            tx.__exit__(None, None, None)

    def rollback(self) -> bool:
        """Undo the handler's work: under an in_transaction claim, back to the savepoint after the
        claim (the claim's row stays in the open transaction, for its failure or completion to
        commit: True); else the whole transaction (False). False under an in_transaction claim
        too when the savepoint is gone: the claim's transaction ended under the handler (its own
        COMMIT, which may have committed the row, or a ROLLBACK), or the connection did."""
        if self.claims_in_transaction and self._tx is not None and self._conn is not None:
            try:
                self._conn.execute(queries.ROLLBACK_TO_WORK, prepare=False)
                return True
            except psycopg.Error as exc:  # connection gone: the claim went with the transaction
                log_event(logging.DEBUG, "rollback_failed", endpoint=self.endpoint, error=error_text(exc))
        self.abort()
        return False

    def abort(self) -> None:
        """Roll the whole transaction back (an in_transaction claim's row with it)."""
        tx, self._tx = self._tx, None
        try:
            if tx is not None:
                tx.force_rollback = True
                tx.__exit__(None, None, None)
            elif self._conn is not None and self._conn.info.transaction_status in _OPEN:
                # A pipelined COMMIT that failed leaves the transaction aborted, not ended.
                self._conn.rollback()
        except psycopg.Error as exc:  # connection gone: nothing left to roll back
            log_event(logging.DEBUG, "rollback_failed", endpoint=self.endpoint, error=error_text(exc))

    def autocommit_conn(self) -> Conn:
        """A connection with no transaction block open, for one committed statement."""
        self.abort()
        if self._conn is None:
            self._conn = self.state.store.getconn_for_handler()
        return self._conn

    def lost_by(self, exc: BaseException) -> bool:
        """True if the handler's ``exc`` is the request's connection (the store's) gone under it:
        the server went away, restarted or failed over. Answered as the store unavailable (503),
        never as the handler's own error."""
        conn = self._conn
        return driver_error(exc) is not None and conn is not None and (conn.broken or conn.closed)

    @staticmethod
    def rolled_back_by(exc: BaseException) -> bool:
        """True if the handler's ``exc`` is, or was raised from, a serialization failure or a
        deadlock of its database work (40001, 40P01): the server rolled it back whole, and a
        retry may succeed (``on_failure="replay"`` does not store it)."""
        return transient_rollback(exc)

    def drop_if_failover(self, exc: BaseException) -> None:
        """The handler's connection answered as a server going away or read-only does (a
        failover under it): give it back closed, so that whatever runs next on this request
        (``idem_fail``) and every later request take a new one, from the primary of now."""
        raised = driver_error(exc)
        if self._conn is None or raised is None or not is_failover(raised):
            return
        self.rollback()
        conn, self._conn = self._conn, None
        conn.close()
        self.state.store.putconn(conn)

    def release(self) -> None:
        self.abort()
        conn, self._conn = self._conn, None
        if conn is not None:
            self.state.store.putconn(conn)


def driver_error(exc: BaseException) -> psycopg.Error | None:
    """psycopg's error behind a handler's exception: itself, or the one an ORM raised it from
    (SQLAlchemy's ``DBAPIError`` is raised from the driver's)."""
    if isinstance(exc, psycopg.Error):
        return exc
    cause = exc.__cause__
    return cause if isinstance(cause, psycopg.Error) else None


def push_scope(scope: RequestScope) -> RequestScope | None:
    """Make ``scope`` the request's; return the one it hides (a decorated view calling another)."""
    previous = g.get(_G_SCOPE)
    setattr(g, _G_SCOPE, scope)
    return previous if isinstance(previous, RequestScope) else None


def pop_scope(previous: RequestScope | None) -> None:
    if previous is None:
        g.pop(_G_SCOPE, None)
    else:
        setattr(g, _G_SCOPE, previous)


def _scope(accessor: str = "connection()/heartbeat()") -> RequestScope:
    scope = current_scope()
    if scope is None:
        raise OutsideRequestError(
            f"idem_shim.{accessor} works only inside a route wrapped by @idempotency_key "
            "or inside idem_shim.idempotent()"
        )
    return scope


def current_scope() -> RequestScope | None:
    """The ``idempotent()`` call or the decorated request running here, if any."""
    job = JOB_SCOPE.get()
    if job is not None:
        return job
    scope = g.get(_G_SCOPE) if has_app_context() else None
    return scope if isinstance(scope, RequestScope) else None


def _claimed_scope(accessor: str) -> RequestScope:
    scope = _scope(accessor)
    if scope.key_id is None or scope.key is None:
        raise NotClaimedError(
            f"idem_shim.{accessor} needs a claimed request, and this one is not tracked: {scope.untracked}"
        )
    return scope


def connection() -> Conn:
    """The request's connection, inside the transaction that the decorator commits.

    On a claimed request, ``idem_complete`` joins this transaction, so what the handler writes
    here commits if and only if the key is completed.
    """
    return _scope().connection()


def current_key_id() -> int | None:
    """The claim's id (``idempotency_keys.id``, for logs), or None when the request is not tracked."""
    return _scope().key_id


def heartbeat() -> datetime | None:
    """Renew the claim's lease from a long handler; None when the request is not tracked.

    Runs ``idem_heartbeat`` on a separate, autocommitted connection (the handler's own transaction
    is not committed yet, so a heartbeat inside it would be invisible to other sessions). Raises
    ``ClaimLostError`` if the claim was healed meanwhile: the handler should stop, as its
    completion will fail and its writes roll back anyway.
    """
    scope = _scope()
    if scope.key_id is None:
        return None
    refuse_in_transaction(scope, "heartbeat()")
    try:
        return scope.state.store.heartbeat(scope.key_id, scope.claim_token)
    except ClaimLostError:
        raise
    except (StoreUnavailableError, StoreRefusedError) as exc:
        # A store hiccup must not kill a live handler: the lease may lapse, but the completion
        # is fenced by its token, so a heal in the meantime still cannot cause a double commit.
        store_outage(
            scope.state.metrics, logging.WARNING, exc, endpoint=scope.endpoint, stage="heartbeat", key_id=scope.key_id
        )
        return None


def downstream_key(namespace: str) -> str:
    """The key to forward to a call that leaves the database, e.g. a broker's ``client_order_id``
    or Stripe's ``Idempotency-Key`` (contract §4a): a lower-case UUID string, the same for every
    execution of this request across stale heals, another one per ``namespace`` ("broker",
    "stripe"), revealing neither the client's key nor the user.

    One round trip (``idem_downstream_key``) the first time a namespace is asked for in a
    request, on the request's connection. Raises ``ValueError`` for an empty or non-text
    namespace, and ``IdemError`` (``NotClaimedError``) when the request holds no claim: no
    ``Idempotency-Key`` header, the kill switch, or a fail-open route running with the store down.
    """
    if not isinstance(namespace, str):
        raise ValueError(f"downstream_key(namespace): namespace must be a str, not {type(namespace).__name__}")
    if not namespace or not namespace.strip():
        raise ValueError("downstream_key(namespace): namespace must be a non-empty name such as 'broker'")
    if len(namespace) > MAX_NAMESPACE_CHARS or "\x00" in namespace:
        raise ValueError(
            f"downstream_key(namespace): namespace must be at most {MAX_NAMESPACE_CHARS} characters, without NUL"
        )
    scope = _claimed_scope("downstream_key()")
    refuse_in_transaction(scope, "downstream_key()")
    known = scope._downstream.get(namespace)
    if known is not None:
        return known
    conn = scope.conn
    assert conn is not None and scope.key is not None  # a claimed request holds its claim's connection
    value = scope.state.store.downstream_key(
        conn, scope.key, scope.user_id, scope.endpoint, namespace, scope.key_format
    )
    scope._downstream[namespace] = value
    return value


def refuse_in_transaction(scope: RequestScope, accessor: str) -> None:
    """``downstream_key()`` and ``heartbeat()`` are for work that leaves the database, whose claim
    commits first; under ``claim="in_transaction"`` there is no committed claim to renew nor a
    retry across a heal to dedupe (contract §4e). Refused at the call when the decoration could
    not see it (a call through a helper)."""
    if scope.policy.claim == "in_transaction":
        raise ConfigError(
            f"idem_shim.{accessor} in {scope.endpoint!r}, which claims in the handler's transaction "
            "(claim='in_transaction'): work that calls a broker, Stripe or keeps a lease needs claim='before'"
        )


def attempt() -> int:
    """Which execution of this request's key this is: 1 the first time, n + 1 after n stale heals
    (a worker that held it died or hung). A handler seeing ``attempt() > 1`` looks its downstream
    call up by ``downstream_key()`` before making it again. Free: the claim returned it.

    Raises ``IdemError`` (``NotClaimedError``) when the request holds no claim.
    """
    scope = _claimed_scope("attempt()")
    assert scope.attempt is not None
    return scope.attempt
