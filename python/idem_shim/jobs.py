"""``idempotent()``: contract §3's state machine for code outside a Flask request (contract §4c).

A queue consumer, a CLI command or a service-to-service call gets what a decorated route gets,
with the key, scope and user supplied by the caller and no Flask app:

    @idempotent(scope="fills.apply", db=pool, key="message_id", user="user_id")
    def apply_fill(message_id: str, user_id: int, qty: int) -> dict:
        conn = idem_shim.connection()       # the transaction idem_complete joins
        conn.execute("INSERT ...")
        return {"fill_id": 7}

    apply_fill(message_id=msg.id, user_id=msg.user_id, qty=3)   # runs once; a duplicate call
                                                                 # returns the stored result

It is the decorator's engine with another front: the same ``Store`` (over the caller's pool or
connection, ``pool.py``), the same claim row mapping, the same completion and failure
(``claimed.py``); only a duplicate's answer differs (an exception or the stored result, not a
409). Each call is the request's sequence: ``idem_claim`` (one round trip, committed), the work inside a
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
import os
import uuid
from collections.abc import Callable
from dataclasses import replace
from time import perf_counter
from typing import Any, Final, ParamSpec, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from . import claimed
from .config import ConfigVars, Settings
from .errors import (
    ClaimLostError,
    IdemError,
    InFlightError,
    KeyMismatchError,
    PreviousFailedError,
    UnknownUserError,
    describe,
)
from .fingerprint import parse_key
from .in_transaction import refuse_lease_calls
from .metrics import Metrics
from .outcome import Outcome
from .policy import Policy, signature
from .pool import CallerConnection, CallerPool
from .records import ClaimRequest, ClaimResult, UserId, user_id_value
from .scope import JOB_SCOPE, RequestScope
from .state import IdemState
from .store import Store

P = ParamSpec("P")
R = TypeVar("R")

#: The stored body of a job's result: ``{"value": <result>}``. Wrapping keeps any JSON value
#: (``null``, a list, a string) replayable as itself and apart from idem_complete's raw-body form.
_VALUE: Final = "value"
#: The status stored for a job's completion (idem_complete wants an HTTP status).
_DONE: Final = 200

Database = psycopg.Connection[Any] | ConnectionPool[Any]


def idempotent(
    *, db: Database, key: str = "key", user: str | None = None, **options: Any
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the decorated function at most once per (key, user, scope); see the module's text.

    db: a psycopg ``Connection`` (no transaction open when called) or a ``psycopg_pool``
        ``ConnectionPool`` (a connection is taken per call; heartbeats need one).
    key: the name of the parameter holding the idempotency key, a UUID (str or uuid.UUID), or
        with ``key_format="opaque"`` 16 to 255 visible ASCII characters but ``"``, ``\\``, ``,`` and ``;``.
    user: the name of the parameter holding the user id (an int, or None), or None for a
        service call with no user scope (such calls dedupe too: NULLS NOT DISTINCT).
    options: the fields of ``idem_shim.policy.Policy`` that a job takes (docs/shim.md's table):
        ``scope`` (required), ``ttl_hours``, ``on_failure`` (``keep`` or ``release``), ``on_stale``,
        ``stale_after_seconds``, ``wait_ms``, ``key_format``, ``claim`` (``"in_transaction"``: the claim
        is the work's transaction's first statement, contract §4e).

    The other arguments are the call's fingerprint (JSON, as a request body is): the same key
    with other arguments raises ``KeyMismatchError``. They and the result must be
    JSON-serialisable (``TypeError`` otherwise, and nothing is claimed or kept).
    """
    policy = Policy.of("idempotent", options, job=True)
    if isinstance(db, ConnectionPool):
        source: CallerPool | CallerConnection = CallerPool(db)
    elif isinstance(db, psycopg.Connection):
        source = CallerConnection(db)
    else:
        raise TypeError(
            f"idempotent(): db must be a psycopg Connection or a psycopg_pool ConnectionPool, got {type(db).__name__}"
        )
    # A job has no app config. Of the environment it reads IDEM_KEY_FORMAT, the key space it
    # shares with the app's routes (contract §4b); its other defaults are a job's own (docs/shim.md).
    shared = {name: os.environ[name] for name in (ConfigVars.KEY_FORMAT,) if name in os.environ}
    settings = Settings.from_mapping({}, shared, require_url=False)
    key_format = policy.key_format_for(settings)
    state = IdemState(settings=settings, store=Store(settings, source), metrics=Metrics())
    scope = policy.scope
    assert scope is not None  # Policy.of(job=True) refuses a job without one

    def decorate(work: Callable[P, R]) -> Callable[P, R]:
        if policy.claim == "in_transaction":
            refuse_lease_calls(work, "idempotent")
        parameters = inspect.signature(work)
        for role, name in (("key", key), ("user", user)):
            if name is not None and name not in parameters.parameters:
                raise TypeError(f"idempotent(): {work.__qualname__} has no parameter {name!r} (the {role}= argument)")
        if inspect.iscoroutinefunction(work):
            raise TypeError(f"idempotent(): {work.__qualname__} is async; decorate a plain function")

        @functools.wraps(work)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = parameters.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            request = ClaimRequest(
                key=_canonical_key(arguments.pop(key), key_format),
                user_id=_user_id(arguments.get(user) if user is not None else None),
                endpoint=scope,
                request_json=_json_text({"args": arguments}, f"the arguments of {work.__qualname__}"),
                ttl=policy.ttl,
                stale_after=policy.stale_after_for(settings),
                wait_ms=policy.wait_ms_for(settings),
                on_stale=policy.on_stale,
                key_format=key_format,
            )
            job = RequestScope(state, scope, policy)
            job.key = request.key
            job.key_format = key_format
            job.user_id = request.user_id  # the key's user scope: downstream_key() derives from it
            result = _claim(job, request)
            if result.outcome != Outcome.CLAIMED:
                return _duplicate(result, request, state)  # type: ignore[no-any-return]
            return _run(job, functools.partial(work, *args, **kwargs), work.__qualname__)

        call.idempotency_policy = policy  # type: ignore[attr-defined]
        return call

    return decorate


#: What ``inspect`` and ``help()`` show: the binding arguments, then the options a job takes.
idempotent.__signature__ = signature(  # type: ignore[attr-defined]
    job=True,
    before=(
        inspect.Parameter("db", inspect.Parameter.KEYWORD_ONLY, annotation="Database"),
        inspect.Parameter("key", inspect.Parameter.KEYWORD_ONLY, default="key", annotation="str"),
        inspect.Parameter("user", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="str | None"),
    ),
)


def _canonical_key(value: object, key_format: str) -> str:
    """The key as the SQL API stores it (fingerprint.parse_key: the header's rule), else ``ValueError``."""
    if isinstance(value, uuid.UUID):
        return str(value)
    canonical = parse_key(value, key_format) if isinstance(value, str) else None
    if canonical is None:
        rule = (
            "a UUID or 16 to 255 visible ASCII characters but a comma, a semicolon, a double quote or a backslash"
            if key_format == "opaque"
            else "a UUID string"
        )
        raise ValueError(f"idempotent(): the key must be {rule} (Idempotency-Key must be a UUID string), got {value!r}")
    return canonical


def _user_id(value: object) -> UserId | None:
    return user_id_value(value, "idempotent(): the user id")


def _json_text(value: object, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"idempotent(): {what} must be JSON-serialisable: {exc}") from exc


def _claim(job: RequestScope, request: ClaimRequest) -> ClaimResult:
    """The store's claim, as a route's; a stale holder healed by this call is claimed at once by
    the next one (a job has no client to retry for it). A claimed connection stays with ``job``."""
    store = job.state.store
    for _ in range(2):
        block = None
        try:
            if job.policy.claim == "in_transaction":
                conn, result, block = store.claim_in_transaction(request)
            else:
                conn, result = store.claim(request)
        except UnknownUserError as exc:  # the caller's mistake, not an outage
            raise ValueError(
                f"idempotent(): user id {request.user_id} is not in the store's users table ({describe(exc)})"
            ) from exc
        if result.outcome == Outcome.CLAIMED:
            assert result.key_id is not None
            job.adopt(conn, result.key_id, result.claim_token, result.attempt, block)
            job.claim_request = request
            return result
        store.putconn(conn)
        if result.outcome != Outcome.STALE:
            return result
    return result


def _duplicate(result: ClaimResult, claim: ClaimRequest, state: IdemState) -> Any:
    where = f"key {claim.key[:8]}… in scope {claim.endpoint!r}"
    if result.outcome == Outcome.REPLAY:
        body = result.response_body
        return body.get(_VALUE) if isinstance(body, dict) else body
    if result.outcome in (Outcome.IN_FLIGHT, Outcome.STALE):
        retry = result.retry_after_ms if result.retry_after_ms is not None else 5000
        if result.outcome == Outcome.IN_FLIGHT:  # when the holder will likely be done (durations.py)
            retry = state.durations.retry_after_ms(claim.endpoint, result.holder_elapsed_ms, retry)
        raise InFlightError(f"idempotent(): {where} is in flight elsewhere; retry in {retry} ms", retry_after_ms=retry)
    if result.outcome == Outcome.PREVIOUS_FAILED:
        raise PreviousFailedError(f"idempotent(): {where} failed before; it is not run again under this key")
    if result.outcome == Outcome.MISMATCH:
        raise KeyMismatchError(f"idempotent(): {where} was first used with other arguments")
    raise IdemError(f"idem_claim returned an unknown outcome {result.outcome!r}")  # pragma: no cover


def _run(job: RequestScope, work: Callable[[], R], name: str) -> R:
    """The work in the claim's scope, then its completion with the work's transaction."""
    token = JOB_SCOPE.set(job)
    started = perf_counter()
    try:
        try:
            try:
                value = work()
            finally:
                job.end_orm()  # a session from idem_shim.sqlalchemy.session(), before the completion
        except BaseException:
            claimed.fail(job, None)
            raise
        try:
            body = _json_text({_VALUE: value}, f"the result of {name}")
        except TypeError:
            _free(job)  # a result that cannot be stored: nothing is kept
            raise
        try:
            claimed.complete(job, _DONE, body, None)
        except ClaimLostError:
            job.rollback()  # fenced: healed meanwhile, the writes are gone with the transaction
            claimed.claim_lost(job, "complete")
            raise
        except BaseException:
            job.rollback()
            claimed.fail(job, None)
            raise
        return value
    finally:
        job.state.durations.record(job.endpoint, perf_counter() - started)
        JOB_SCOPE.reset(token)
        job.release()


def _free(job: RequestScope) -> None:
    """Roll the work back and free its key, whatever the job's ``on_failure`` says."""
    job.policy = replace(job.policy, on_failure="release")
    claimed.fail(job, None)
