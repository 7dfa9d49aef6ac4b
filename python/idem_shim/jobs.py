"""``idempotent()``: SPEC §3's state machine for code outside a Flask request (SPEC §4c).

A queue consumer, a CLI command or a service-to-service call gets what a decorated route gets,
with the key, scope and user supplied by the caller and no Flask app:

    @idempotent(scope="fills.apply", db=pool, key="message_id", user="user_id")
    def apply_fill(message_id: str, user_id: int, qty: int) -> dict:
        conn = idem_shim.connection()       # the transaction idem_complete joins
        conn.execute("INSERT ...")
        return {"fill_id": 7}

    apply_fill(message_id=msg.id, user_id=msg.user_id, qty=3)   # runs once; a duplicate call
                                                                 # returns the stored result

Each call is the request's sequence: ``idem_claim`` (one round trip, committed), the work inside a
transaction on the same connection, then ``idem_complete`` in that transaction and COMMIT
pipelined together, so the work's writes and the completion commit or roll back as one. An
exception rolls the writes back and fails the key (``on_failure="release"``: frees it), then
propagates. ``idem_shim.connection()``, ``heartbeat()`` and ``current_key_id()`` work inside the
work as inside a route (the scope lives in a ``ContextVar``, not in ``flask.g``).

A duplicate call returns the stored result (any JSON value), or raises: ``InFlightError``
(another execution holds the key: retry later), ``PreviousFailedError``, ``KeyMismatchError``
(the same key with other arguments). Bad declarations and bad calls raise before anything is
claimed. docs/shim.md ("Beyond HTTP") documents each option.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Final, Literal, ParamSpec, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool

from . import queries
from .config import MAX_TTL_HOURS, MAX_WAIT_MS, MIN_STALE_AFTER_SECONDS, ON_FAILURE, Settings, validate_scope
from .db import ClaimRequest, ClaimResult, Conn, Store, _refusal, _unavailable
from .errors import (
    ClaimLostError,
    IdemError,
    InFlightError,
    KeyMismatchError,
    PreviousFailedError,
    StoreUnavailableError,
)
from .logs import error_text, log_event
from .metrics import Metrics
from .outcome import Outcome
from .scope import JOB_SCOPE, Policy, RequestScope
from .state import IdemState

P = ParamSpec("P")
R = TypeVar("R")

#: The stored body of a job's result: ``{"value": <result>}``. Wrapping keeps any JSON value
#: (``null``, a list, a string) replayable as itself and apart from idem_complete's raw-body form.
_VALUE: Final = "value"
#: The status stored for a job's completion (idem_complete wants an HTTP status).
_DONE: Final = 200

Database = psycopg.Connection[Any] | ConnectionPool[Any]


class _CallerStore(Store):
    """The Store of one ``idempotent()`` declaration: the caller's pool or connection, not one of
    the shim's own. Only heartbeats take a connection here (a second one: the lease must be
    renewed outside the work's uncommitted transaction), so they need a pool."""

    def __init__(self, db: Database) -> None:
        super().__init__(Settings())
        self._db = db

    @property
    def pool(self) -> ConnectionPool[Conn]:
        if isinstance(self._db, ConnectionPool):
            return self._db
        raise IdemError(
            "idem_shim.heartbeat() inside idempotent(db=<a connection>) cannot renew the lease: "
            "it needs a second connection; pass db=<a psycopg_pool ConnectionPool>"
        )

    def heartbeat(self, key_id: int, claim_token: str | None) -> datetime:
        try:
            with self.pool.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
                row = cur.execute(queries.HEARTBEAT, {"key_id": key_id, "claim_token": claim_token}).fetchone()
        except psycopg.Error as exc:
            raise _refusal(exc) or _unavailable(exc, connection_lost=True) from exc
        assert row is not None
        locked_at: datetime = row[0]
        return locked_at

    def putconn(self, conn: Conn) -> None:
        """The caller's connection goes back where it came from in ``_connection``."""


def idempotent(
    *,
    scope: str,
    db: Database,
    key: str = "key",
    user: str | None = None,
    ttl_hours: float = 24,
    on_failure: Literal["keep", "release"] = "keep",
    on_stale: Literal["heal", "quarantine"] = "heal",
    stale_after_seconds: float = 30,
    wait_ms: int = 0,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the decorated function at most once per (key, user, scope); see the module's text.

    scope: the key's endpoint scope (required: there is no URL to derive one from), e.g.
        "fills.apply"; the same names and rules as ``@idempotency_key(scope=...)``.
    db: a psycopg ``Connection`` (no transaction open when called) or a ``psycopg_pool``
        ``ConnectionPool`` (a connection is taken per call; heartbeats need one).
    key: the name of the parameter holding the idempotency key, a UUID (str or uuid.UUID).
    user: the name of the parameter holding the user id (an int, or None), or None for a
        service call with no user scope (such calls dedupe too: NULLS NOT DISTINCT).
    ttl_hours, on_stale, stale_after_seconds, wait_ms: as for the decorator and idem_claim.
    on_failure: "keep" (an exception fails the key: PreviousFailedError for a duplicate) or
        "release" (the key is freed and the next call runs again).

    The other arguments are the call's fingerprint (JSON, as a request body is): the same key
    with other arguments raises ``KeyMismatchError``. They and the result must be
    JSON-serialisable (``TypeError`` otherwise, and nothing is claimed or kept).
    """
    validate_scope(scope)
    if not isinstance(db, (psycopg.Connection, ConnectionPool)):
        raise TypeError(
            f"idempotent(): db must be a psycopg Connection or a psycopg_pool ConnectionPool, got {type(db).__name__}"
        )
    if on_failure not in ON_FAILURE:
        raise ValueError(f"on_failure must be 'keep' or 'release', got {on_failure!r}")
    if on_stale not in ("heal", "quarantine"):
        raise ValueError(f"on_stale must be 'heal' or 'quarantine', got {on_stale!r}")
    if not 0 < ttl_hours <= MAX_TTL_HOURS:
        raise ValueError(f"ttl_hours must be in (0, {MAX_TTL_HOURS}], got {ttl_hours!r}")
    if not 0 <= wait_ms <= MAX_WAIT_MS:
        raise ValueError(f"wait_ms must be in [0, {MAX_WAIT_MS}], got {wait_ms!r}")
    if not stale_after_seconds >= MIN_STALE_AFTER_SECONDS:
        raise ValueError(f"stale_after_seconds must be at least {MIN_STALE_AFTER_SECONDS}, got {stale_after_seconds!r}")
    policy = Policy(
        ttl=timedelta(hours=ttl_hours),
        fail_closed=True,
        required=True,
        wait_ms=wait_ms,
        on_stale=on_stale,
        store_response=True,
        scope=scope,
        on_failure=on_failure,
    )
    store = _CallerStore(db)
    state = IdemState(settings=store.settings, store=store, metrics=Metrics())
    stale_after = timedelta(seconds=stale_after_seconds)

    def decorate(work: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(work)
        for role, name in (("key", key), ("user", user)):
            if name is not None and name not in signature.parameters:
                raise TypeError(f"idempotent(): {work.__qualname__} has no parameter {name!r} (the {role}= argument)")
        if inspect.iscoroutinefunction(work):
            raise TypeError(f"idempotent(): {work.__qualname__} is async; decorate a plain function")

        @functools.wraps(work)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            claim = ClaimRequest(
                key=_canonical_key(arguments.pop(key)),
                user_id=_user_id(arguments.get(user) if user is not None else None),
                endpoint=scope,
                request_json=_json_text({"args": arguments}, f"the arguments of {work.__qualname__}"),
                ttl=policy.ttl,
                stale_after=stale_after,
                wait_ms=wait_ms,
                on_stale=on_stale,
            )
            with _connection(db) as conn:
                result = _claim(conn, claim)
                if result.outcome != Outcome.CLAIMED:
                    return _duplicate(result, claim)  # type: ignore[no-any-return]
                assert result.key_id is not None
                job = RequestScope(state, scope, policy)
                job.key = claim.key
                job.user_id = claim.user_id  # the key's user scope: downstream_key() derives from it
                job.adopt(conn, result.key_id, result.claim_token, result.attempt)
                return _run(job, functools.partial(work, *args, **kwargs), work.__qualname__)

        call.idempotency_policy = policy  # type: ignore[attr-defined]
        return call

    return decorate


def _canonical_key(value: object) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, str):
        try:
            parsed = uuid.UUID(value)
        except ValueError:
            parsed = None
        if parsed is not None and len(value) == 36:
            return str(parsed)
    raise ValueError(
        f"idempotent(): the key must be a UUID string (Idempotency-Key must be a UUID string), got {value!r}"
    )


def _user_id(value: object) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise TypeError(f"idempotent(): the user id must be an int or None, not {type(value).__name__}")
    return value


def _json_text(value: object, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"idempotent(): {what} must be JSON-serialisable: {exc}") from exc


@contextmanager
def _connection(db: Database) -> Iterator[Conn]:
    """The call's connection, idle and in autocommit while the shim drives it (the claim and a
    failure commit on their own; the work's transaction is opened explicitly), as it was after."""
    with db.connection() if isinstance(db, ConnectionPool) else _given(db) as conn:
        status = conn.info.transaction_status
        if status != TransactionStatus.IDLE:
            raise IdemError(
                "idempotent(): the connection has a transaction open; the claim must commit before the "
                "work runs, so call it with no transaction in progress (or pass a pool)"
            )
        autocommit = conn.autocommit
        conn.autocommit = True
        try:
            yield conn
        finally:
            if not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
                conn.autocommit = autocommit


@contextmanager
def _given(conn: psycopg.Connection[Any]) -> Iterator[Conn]:
    yield conn


def _claim(conn: Conn, claim: ClaimRequest) -> ClaimResult:
    """``idem_claim``; a stale holder healed by this call is claimed at once by the next one."""
    params = (*claim.params(), None, None)
    for _ in range(2):
        try:
            with conn.cursor(row_factory=tuple_row) as cur:
                row = cur.execute(queries.CLAIM, params).fetchone()
        except psycopg.errors.ForeignKeyViolation as exc:  # the caller's mistake, not an outage
            raise ValueError(f"idempotent(): user id {claim.user_id} is not in users(id)") from exc
        except psycopg.Error as exc:
            raise _refusal(exc) or _unavailable(exc, connection_lost=conn.broken) from exc
        assert row is not None
        result = ClaimResult(Outcome(row[0]), *row[1:8])  # the 9th column is the set_config
        if result.outcome != Outcome.STALE:
            return result
    return result


def _duplicate(result: ClaimResult, claim: ClaimRequest) -> Any:
    where = f"key {claim.key[:8]}… in scope {claim.endpoint!r}"
    if result.outcome == Outcome.REPLAY:
        body = result.response_body
        return body.get(_VALUE) if isinstance(body, dict) else body
    if result.outcome in (Outcome.IN_FLIGHT, Outcome.STALE):
        retry = result.retry_after_ms if result.retry_after_ms is not None else 5000
        raise InFlightError(f"idempotent(): {where} is in flight elsewhere; retry in {retry} ms", retry_after_ms=retry)
    if result.outcome == Outcome.PREVIOUS_FAILED:
        raise PreviousFailedError(f"idempotent(): {where} failed before; it is not run again under this key")
    if result.outcome == Outcome.MISMATCH:
        raise KeyMismatchError(f"idempotent(): {where} was first used with other arguments")
    raise IdemError(f"idem_claim returned an unknown outcome {result.outcome!r}")  # pragma: no cover


def _run(job: RequestScope, work: Callable[[], R], name: str) -> R:
    token = JOB_SCOPE.set(job)
    try:
        try:
            value = work()
        except BaseException:
            _end_failed(job, release=job.policy.on_failure == "release")
            raise
        try:
            body = _json_text({_VALUE: value}, f"the result of {name}")
        except TypeError:
            _end_failed(job, release=True)  # a result that cannot be stored: nothing is kept
            raise
        assert job.key_id is not None
        conn = job.conn
        assert conn is not None
        try:
            if job.in_open_transaction():
                job.state.store.complete(conn, job.key_id, job.claim_token, _DONE, body, None, commit=job.commit)
            else:  # the work wrote nothing (or left its transaction aborted): one autocommit call
                job.rollback()
                job.state.store.complete(conn, job.key_id, job.claim_token, _DONE, body)
        except ClaimLostError:
            job.rollback()  # fenced: healed meanwhile, the writes are gone with the transaction
            raise
        except BaseException:
            job.rollback()
            _end_failed(job, release=job.policy.on_failure == "release")
            raise
        return value
    finally:
        JOB_SCOPE.reset(token)
        job.rollback()


def _end_failed(job: RequestScope, *, release: bool) -> None:
    """Roll the work back, then fail or free the key; a lost claim is left as it is."""
    job.rollback()
    assert job.key_id is not None
    try:
        Store.fail(job.autocommit_conn(), job.key_id, job.claim_token, None, release=release)
    except ClaimLostError:
        log_event(logging.ERROR, "claim_lost", endpoint=job.endpoint, key=job.key_hint, key_id=job.key_id, stage="fail")
    except StoreUnavailableError as exc:
        # The caller gets its own exception; the key stays in flight until the stale heal frees it.
        log_event(
            logging.ERROR,
            "store_unavailable",
            endpoint=job.endpoint,
            key=job.key_hint,
            key_id=job.key_id,
            stage="fail",
            error=error_text(exc),
        )
    else:
        log_event(logging.INFO, "released" if release else "failed", endpoint=job.endpoint, key=job.key_hint)
