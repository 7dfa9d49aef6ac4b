"""``@idempotency_key``: contract §4 in front of one Flask view.

Order of work for a request (each SQL step is one statement, one round trip):

1. kill switch ``FLAG_IDEMPOTENCY_MIDDLEWARE`` read from the environment -> passthrough if "0";
2. a safe method (GET, HEAD, OPTIONS, TRACE) or no ``Idempotency-Key`` header -> passthrough
   (the latter 400 when ``required=True``);
3. malformed key -> 400; body over ``IDEM_MAX_BODY_BYTES`` -> 413; nothing is stored for either;
4. ``idem_claim`` in autocommit (under ``claim="in_transaction"``: BEGIN, the claim and a
   savepoint in one pipeline, the transaction left open for the handler, contract §4e); any
   outcome but ``claimed`` is answered from its row;
5. ``claimed``: the handler runs with ``idem_shim.connection()``; a response < 500 runs
   ``idem_complete`` inside the handler's transaction and commits both; an exception or a 5xx
   rolls the handler's transaction back and runs ``idem_fail`` in autocommit (with
   ``on_failure="release"`` the same call frees the key instead).

The scope of a key is ``(key, g.current_user_id, endpoint)`` where endpoint is the decorator's
``scope=`` or, by default, ``"<METHOD> <url rule>"``, e.g.
``"POST /api/trading/orders/<int:order_id>"``: the rule, not the concrete path, so metrics stay
low-cardinality; path parameters and the query string go into the request fingerprint instead
(see ``fingerprint.py``). ``routes.py`` refuses two routes sharing a scope unless both declare it.

An ``async def`` view (Flask[async]) runs through ``app.ensure_sync``: the claim and the
completion stay one round trip each, on the same connection, around it.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable, Generator
from dataclasses import replace
from time import perf_counter
from typing import Any, Final, ParamSpec, TypeVar, cast

from flask import Flask, Request, current_app, g, got_request_exception, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException, InternalServerError
from werkzeug.wrappers import Response

from . import claimed, http, tracing
from .config import middleware_enabled
from .errors import (
    ClaimLostError,
    ConfigError,
    ContentionError,
    InvalidFingerprintError,
    MalformedKeyError,
    RequestTooLargeError,
    ResponseRefusedError,
    StoreBusyError,
    StoreUnavailableError,
    UndecryptableResponseError,
    UnknownUserError,
)
from .fingerprint import parse_key, read_body, request_json, sql_key_format
from .in_transaction import refuse_lease_calls
from .logs import error_text, key_hint, log_event, store_outage
from .outcome import Outcome
from .policy import Policy, signature
from .records import ClaimRequest, user_id_value
from .replay import OMITTED_BODY, omitted_headers, oversized, stored_body, stored_headers
from .routes import check_routes
from .scope import RequestScope, pop_scope, push_scope
from .state import get_state
from .workers import serves_one_at_a_time, single_slot_wait

P = ParamSpec("P")
R = TypeVar("R")

HEADER = "Idempotency-Key"
#: RFC 9110 §9.2.1's safe methods: idempotent already, never claimed (a key on one is ignored).
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
_UNSET: Final = object()  # g.current_user_id never assigned (None is a declared service call)

_OUTCOME_LOG_LEVEL = {
    Outcome.REPLAY: logging.INFO,
    Outcome.IN_FLIGHT: logging.INFO,
    Outcome.STALE: logging.WARNING,
    Outcome.PREVIOUS_FAILED: logging.INFO,
    Outcome.MISMATCH: logging.WARNING,
}


def idempotency_key(**options: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a write route idempotent per ``Idempotency-Key`` (contract §4). Apply it *after*
    ``@require_session`` (i.e. below it), so ``g.current_user_id`` is set when it runs.

    The options are the fields of ``idem_shim.policy.Policy`` (each documented there and in
    docs/shim.md's table), checked now: a bad one raises ``ValueError`` or ``TypeError`` when the
    route's module is imported. ``service=True`` declares a service route (no user scope); without
    it the user scope is ``g.current_user_id``, which the request must have set (to the user's id,
    an int or a UUID as the store's users table has it, or to None for a service call): a request
    that never set it is answered 500 with one ERROR, since
    the decorator was placed above the session decorator and would otherwise put every user's
    keys in one shared scope.
    """
    policy = Policy.of("idempotency_key", options)

    # Typed by the view's own return (a response value, or a coroutine of one for an async view:
    # Flask accepts the sync wrapper in its place).
    def decorate(view: Callable[P, R]) -> Callable[P, R]:
        if policy.claim == "in_transaction":
            refuse_lease_calls(view, "@idempotency_key")
        if inspect.iscoroutinefunction(view):
            if importlib.util.find_spec("asgiref") is None:
                raise ConfigError(
                    f"@idempotency_key on async view {view.__qualname__}: install Flask with the async extra "
                    "(pip install 'Flask[async]') for async def views"
                )

            # The claim and the completion stay in this (sync) frame, so they run on the
            # request's own connection; Flask runs the coroutine to its end in between.
            @functools.wraps(view)
            def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> ResponseReturnValue:
                run = current_app.ensure_sync(view)
                return _handle(policy, functools.partial(run, *args, **kwargs))

            async_wrapper.idempotency_policy = policy  # type: ignore[attr-defined]
            return cast(Callable[P, R], async_wrapper)

        @functools.wraps(view)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> ResponseReturnValue:
            return _handle(policy, cast(Callable[[], ResponseReturnValue], functools.partial(view, *args, **kwargs)))

        wrapper.idempotency_policy = policy  # type: ignore[attr-defined]
        return cast(Callable[P, R], wrapper)

    return decorate


#: What ``inspect`` and ``help()`` show: the options, from the dataclass.
idempotency_key.__signature__ = signature()  # type: ignore[attr-defined]


def endpoint_label(rq: Request | None = None) -> str:
    """``"<METHOD> <url rule>"`` of the current request: the key's scope and the metric label."""
    rq = rq if rq is not None else request
    rule = rq.url_rule
    return f"{rq.method} {rule.rule if rule is not None else rq.path}"


@tracing.request
def _handle(policy: Policy, view: Callable[[], ResponseReturnValue]) -> ResponseReturnValue:
    # The objects behind Flask's proxies, once: each use of a proxy looks its context up again,
    # some twenty times a request.
    rq: Request = request._get_current_object()  # type: ignore[attr-defined]
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    state = get_state(app)
    if not state.routes_checked:  # routes registered after init_app: checked on the first request
        check_routes(app)
        state.routes_checked = True
    req = RequestScope(state, policy.scope or endpoint_label(rq), policy)
    if not middleware_enabled():
        req.untracked = "the kill switch FLAG_IDEMPOTENCY_MIDDLEWARE=0 is on"
        return _passthrough(req, view)

    # The user scope first, so a misplaced decorator fails on every request, keyed or not.
    user_id = None if policy.service else g.get("current_user_id", _UNSET)
    if user_id is _UNSET:
        log_event(
            logging.ERROR,
            "user_scope_unset",
            endpoint=req.endpoint,
            error="g.current_user_id was never set when @idempotency_key ran: it must sit below "
            "@require_session (nearer the view), or the route must declare itself a service call "
            "with @idempotency_key(service=True) or g.current_user_id = None",
        )
        return http.user_scope_unset()
    user_id = user_id_value(user_id, "g.current_user_id")

    req.user_id = user_id
    if rq.method in SAFE_METHODS:
        req.untracked = f"{rq.method} is a safe method: an Idempotency-Key on it is ignored (the IETF draft's §1)"
        return _passthrough(req, view)
    # Every field line of the header: a WSGI server joins repeated ones into one value with a
    # comma (which parse_key refuses), another server may hand them over apart.
    header_lines = rq.headers.getlist(HEADER)
    if not header_lines:
        req.untracked = "the request has no Idempotency-Key header"
        return http.key_required() if policy.required else _passthrough(req, view)
    settings = state.settings
    key_format = settings.key_format if policy.key_format is None else policy.key_format
    min_length = settings.opaque_key_min_length
    key = parse_key(header_lines[0], key_format, min_length) if len(header_lines) == 1 else None
    if key is None:
        return http.malformed_key(key_format, settings.opaque_key_min_length)
    req.key = key
    req.key_format = sql_key_format(key_format, min_length)  # the SQL API's name for the rule

    data = read_body(rq, settings.max_body_bytes)
    if data is None:
        log_event(logging.INFO, "request_too_large", endpoint=req.endpoint, key=key_hint(key))
        return http.request_too_large()

    try:
        fingerprint = request_json(
            data,
            rq.view_args,
            rq.args.to_dict(flat=False) if rq.args else {},
            method=None if policy.scope is None else rq.method,  # the default scope names it
            content_type=rq.headers.get("Content-Type"),
            chosen=policy.fingerprint,
            uploads=policy.uploads,
            max_parts=rq.max_form_parts,
        )
    except InvalidFingerprintError as exc:
        return _invalid_fingerprint(req, exc)
    except RequestTooLargeError as exc:
        log_event(logging.INFO, "request_too_large", endpoint=req.endpoint, key=key_hint(key), error=str(exc))
        return http.request_too_large()
    wait_ms = policy.wait_ms_for(settings)
    if wait_ms and serves_one_at_a_time(rq.environ):  # a waiter would hold the whole worker
        wait_ms = single_slot_wait(req.endpoint, wait_ms)
    claim = ClaimRequest(
        key=key,
        user_id=user_id,
        endpoint=req.endpoint,
        request_json=fingerprint,
        ttl=policy.ttl,
        stale_after=policy.stale_after_for(settings),
        wait_ms=wait_ms,
        on_stale=policy.on_stale,
        key_format=req.key_format,
    )
    started = perf_counter()
    block = None
    try:
        if policy.claim == "in_transaction":
            conn, result, block = tracing.claim(state.store.claim_in_transaction, claim)
        else:
            conn, result = tracing.claim(state.store.claim, claim)
    except StoreUnavailableError as exc:
        return _store_unavailable(req, view, exc)
    except UndecryptableResponseError as exc:
        # The request already ran; its answer is stored under a key we were not given.
        # Never run it again, whatever the tier: 503 until the key is configured.
        state.metrics.record_store_error(req.endpoint, "replay_decrypt")
        log_event(
            logging.ERROR, "response_undecryptable", endpoint=req.endpoint, key=key_hint(key), error=error_text(exc)
        )
        return http.store_unavailable(settings.unavailable_retry_after_seconds)
    except ContentionError:
        log_event(logging.WARNING, "contention", endpoint=req.endpoint, key=key_hint(key))
        return http.in_flight(http.CLAIM_LOST_RETRY_AFTER_MS)
    except MalformedKeyError:
        return http.malformed_key(key_format, settings.opaque_key_min_length)
    except InvalidFingerprintError as exc:
        return _invalid_fingerprint(req, exc)
    except UnknownUserError as exc:
        # The session's user is not in the users table the store references (contract §4d): the
        # host's data or its install, never the client's; nothing stored or run.
        log_event(
            logging.ERROR,
            "user_unknown",
            endpoint=req.endpoint,
            key=key_hint(key),
            user_id=user_id,
            error=f"{error_text(exc)}; the user scope (g.current_user_id) must be the id of a row of the users "
            "table the store was installed with (idem status names it; docs/adopting.md, 'Your users table')",
        )
        return http.user_unknown()
    # Any other refusal (InvalidArgumentError) is a bug in this code, not an outage: it propagates.

    state.metrics.record_claim(req.endpoint, result.outcome, perf_counter() - started)
    if result.outcome == Outcome.CLAIMED:
        assert result.key_id is not None
        req.adopt(conn, result.key_id, result.claim_token, result.attempt, block)
        req.claim_request = claim
        return _run_claimed(req, view)

    state.store.putconn(conn)
    if result.outcome == Outcome.IN_FLIGHT:
        # When the holder will likely be done, from this scope's durations and its time so far,
        # within its lease (durations.py).
        wait = state.durations.retry_after_ms(req.endpoint, result.holder_elapsed_ms, result.retry_after_ms or 5000)
        result = replace(result, retry_after_ms=wait)
    log_event(
        _OUTCOME_LOG_LEVEL.get(result.outcome, logging.INFO),
        result.outcome.value,
        endpoint=req.endpoint,
        key=key_hint(key),
        key_id=result.key_id,
        user_id=claim.user_id,
        response_code=result.response_code,
        retry_after_ms=result.retry_after_ms if result.outcome in (Outcome.IN_FLIGHT, Outcome.STALE) else None,
    )
    return tracing.answer(req.endpoint, result, http.for_outcome)


def _invalid_fingerprint(req: RequestScope, exc: InvalidFingerprintError) -> ResponseReturnValue:
    """400: the client's path, query or body, not the store (no store-error metric, nothing stored)."""
    log_event(logging.INFO, "invalid_request_fingerprint", endpoint=req.endpoint, key=req.key_hint, error=str(exc))
    return http.invalid_request_fingerprint(exc.detail)


def _store_unavailable(
    req: RequestScope, view: Callable[[], ResponseReturnValue], exc: StoreUnavailableError
) -> ResponseReturnValue:
    metrics, endpoint, key = req.state.metrics, req.endpoint, req.key_hint
    if isinstance(exc, StoreBusyError):
        # The store answers, with no connection free for this request: Tier 2's run without
        # dedup is for a store that is down, and a client that fills the pool must not switch
        # dedup off for the others. This request's 503, on either tier; nothing else changes.
        tier = "fail_closed" if req.policy.fail_closed else "fail_open"
        store_outage(metrics, logging.WARNING, exc, endpoint=endpoint, stage="claim", key=key, tier=tier, action="503")
        return http.store_unavailable(req.state.settings.unavailable_retry_after_seconds)
    if req.policy.fail_closed:
        store_outage(
            metrics, logging.ERROR, exc, endpoint=endpoint, stage="claim", key=key, tier="fail_closed", action="503"
        )
        return http.store_unavailable(req.state.settings.unavailable_retry_after_seconds)
    action = "handler_runs_without_dedup"
    store_outage(
        metrics, logging.WARNING, exc, endpoint=endpoint, stage="claim", key=key, tier="fail_open", action=action
    )
    if exc.connection_lost:
        req.store_lost = exc
    req.untracked = "the idempotency store is unreachable and this fail-open route runs without dedup"
    return _passthrough(req, view)


def _passthrough(req: RequestScope, view: Callable[[], ResponseReturnValue]) -> ResponseReturnValue:
    """Run the handler untracked; commit its transaction for a response < 500.

    A handler that cannot reach the store's database either (``connection()`` raised
    ``StoreUnavailableError``: a fail-open route with the store down, or a request without a key),
    or whose connection to it was lost under it, gets the 503 of Tier 1, never a 500."""
    hidden = push_scope(req)
    try:
        try:
            response = _respond(req, view)
        except StoreUnavailableError as exc:
            req.rollback()
            if exc is not req.store_lost:  # the claim's failure was reported already
                store_outage(
                    req.state.metrics, logging.WARNING, exc, endpoint=req.endpoint, stage="connection", key=req.key_hint
                )
            return http.store_unavailable(req.state.settings.unavailable_retry_after_seconds)
        except BaseException as exc:
            lost = req.lost_by(exc)
            req.drop_if_failover(exc)
            req.rollback()
            if not lost:
                raise
            store_outage(
                req.state.metrics, logging.WARNING, exc, endpoint=req.endpoint, stage="handler", key=req.key_hint
            )
            return http.store_unavailable(req.state.settings.unavailable_retry_after_seconds)
        if response.status_code < 500:
            req.commit()
        else:
            req.rollback()
        return response
    finally:
        req.release()
        pop_scope(hidden)


def _run_claimed(req: RequestScope, view: Callable[[], ResponseReturnValue]) -> ResponseReturnValue:
    hidden = push_scope(req)
    started = perf_counter()
    replays_failure = req.policy.on_failure == "replay"
    try:
        try:
            response = _respond(req, view)
        except HTTPException as exc:
            if exc.code is None or exc.code >= 500:
                if replays_failure:
                    return _replay_failure(req, current_app.make_response(current_app.handle_http_exception(exc)))
                claimed.fail(req, exc.code)
                raise
            # abort(4xx): the handler refused. Its writes roll back; the refusal is completed
            # (and replays) exactly like a returned 4xx.
            req.rollback()
            response = current_app.make_response(current_app.handle_http_exception(exc))
        except Exception as exc:
            lost = req.lost_by(exc)
            req.drop_if_failover(exc)  # then idem_fail runs on a connection to the primary of now
            if replays_failure and not lost:
                answer = _error_answer(exc)
                if answer is not None:
                    return _replay_failure(req, answer, transient=req.rolled_back_by(exc))
            claimed.fail(req, None)
            if lost and (req.conn is None or req.lost_by(exc)):
                # The store went away under the handler and idem_fail could not reach it either
                # (reported there): the key stays in flight, its retry runs once it is healed.
                return http.store_unavailable(req.state.settings.unavailable_retry_after_seconds)
            raise
        except BaseException:  # the worker is being stopped: nothing to answer, the key fails
            claimed.fail(req, None)
            raise
        if not req.began and 200 <= response.status_code < 300 and not req.policy.writes_elsewhere:
            _warn_unjoined(req)
        streamed = response.direct_passthrough or isinstance(response.response, Generator)
        if replays_failure and not streamed and response.status_code in RETRY_LATER:
            return _replay_failure(req, response)  # a 429 (returned or aborted): not stored
        if response.status_code >= 500:
            if replays_failure and not streamed:
                return _replay_failure(req, response)
            claimed.fail(req, response.status_code)
            return response
        if streamed:
            return _streamed(req, response)
        return _complete(req, response)
    finally:
        req.state.durations.record(req.endpoint, perf_counter() - started)
        req.release()
        pop_scope(hidden)


def _respond(req: RequestScope, view: Callable[[], ResponseReturnValue]) -> Response:
    """The view's response. With Flask-SQLAlchemy joined (``Idem(app, sqlalchemy=db)``),
    ``db.session`` is the request's while it runs; whatever ORM session joined the request's
    connection is closed when it returns (sqlalchemy.py), before the completion."""
    orm = req.state.sqlalchemy
    outer = orm.hide() if orm is not None else None
    try:
        return current_app.make_response(view())
    finally:
        try:
            req.end_orm()
        finally:
            if orm is not None:
                orm.restore(outer)


def _warn_unjoined(req: RequestScope) -> None:
    """A claimed request answered 2xx and ran nothing on the request's connection: its writes,
    if any, went elsewhere and do not commit with the key. One WARNING per route and process."""
    state = req.state
    with state.unjoined_lock:
        if req.endpoint in state.unjoined_warned:
            return
        state.unjoined_warned.add(req.endpoint)
    log_event(
        logging.WARNING,
        "handler_ran_nothing_on_connection",
        endpoint=req.endpoint,
        key_id=req.key_id,
        hint="writes that do not go through idem_shim.connection() do not commit with the key: with "
        "Flask-SQLAlchemy use Idem(app, sqlalchemy=db), with SQLAlchemy idem_shim.sqlalchemy.session(); a route "
        "whose work is elsewhere on purpose declares @idempotency_key(writes_elsewhere=True)",
    )


def _error_answer(exc: Exception) -> Response | None:
    """What Flask would answer for ``exc``, which the view raised: the app's error handler's
    response, else its 500 handler's or its default 500, logged and signalled as Flask does for an
    exception no handler took (``got_request_exception``: error trackers listen). None when even
    that cannot be made (the key then fails as under ``keep``, and the exception propagates).
    Called while ``exc`` is being handled: Flask's lookup re-raises it when no handler matches."""
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    try:
        return app.make_response(app.handle_user_exception(exc))
    except Exception as unhandled:
        if unhandled is not exc:
            return None  # the app's handler itself failed: let Flask answer for that
    got_request_exception.send(app, _async_wrapper=app.ensure_sync, exception=exc)
    app.log_exception(sys.exc_info())  # exc is the exception being handled
    try:
        return app.make_response(app.handle_http_exception(InternalServerError(original_exception=exc)))
    except Exception:
        return None


#: Under ``on_failure="replay"``, the handler's answers that say "not done, retry later": 503
#: (RFC 9110 §15.6.4) and 429 (RFC 6585 §4). Never stored for the TTL: the key is freed.
RETRY_LATER: Final = frozenset({429, 503})


def _replay_failure(req: RequestScope, response: Response, *, transient: bool = False) -> Response:
    """``on_failure="replay"``: the failed work's writes roll back, and its answer is stored (in
    autocommit) for the retry to replay, as a completion; the client gets that answer now.

    Except a transient failure: a 503 or a 429 the handler answered, or (``transient``) an
    exception raised from a serialization failure or a deadlock of its database work. Its
    writes roll back and the key is freed (as under ``release``): the retry runs again, and
    what it answers is stored. The client gets the failure's answer now, not stored."""
    if transient or response.status_code in RETRY_LATER:
        claimed.release(req, response.status_code)
        return response
    req.rollback()
    _log_answer(req, "failure_stored", response)
    return _complete(req, response)


def _log_answer(req: RequestScope, event: str, response: Response, **detail: str) -> None:
    """The INFO line of an answer that ends its key another way than a plain completion."""
    log_event(
        logging.INFO,
        event,
        endpoint=req.endpoint,
        key=req.key_hint,
        key_id=req.key_id,
        response_code=response.status_code,
        **detail,
    )


def _streamed(req: RequestScope, response: Response) -> ResponseReturnValue:
    """A streamed answer (a generator body, ``stream_with_context``, a file in ``send_file``'s
    passthrough) is sent once and never stored: its body does not exist yet, and buffering it
    would defeat the stream. The handler returned < 500, so its writes commit, together with the
    key failed (``keep``, ``replay``: a retry gets 409 ``idempotency_previous_failed``, never a
    second run) or freed (``release``: a retry runs again) in the same transaction. The stream
    runs after that commit: what it writes through ``connection()`` is refused (the request's
    scope is gone)."""
    unsettled = _settle(req, lambda: claimed.end_unstored(req, response.status_code))
    if unsettled is not None:
        return unsettled
    _log_answer(
        req, "streamed_not_stored", response, key_now="released" if req.policy.on_failure == "release" else "failed"
    )
    return response


def _settle(req: RequestScope, end: Callable[[], None]) -> Response | None:
    """Run ``end`` (the completion, or a stream's end of its key) and COMMIT; None when it
    landed, else the answer for a claim lost or a store gone meanwhile (the writes rolled back)."""
    try:
        end()
    except ClaimLostError:
        # Our lease expired and another request healed the key: our writes rolled back, so
        # nothing ran twice. The client retries and gets the other request's outcome.
        req.rollback()
        claimed.claim_lost(req, "complete")
        return http.claim_lost()
    except StoreUnavailableError as exc:
        # Commit outcome unknown: leave the key in flight. If the commit landed, a retry
        # replays; if not, the stale heal frees the key and the retry executes once.
        req.rollback()
        claimed.outage(req, exc, "complete")
        return http.store_unavailable(req.state.settings.unavailable_retry_after_seconds)
    return None


@tracing.completion
def _complete(req: RequestScope, response: Response) -> Response:
    """``idem_complete`` in the handler's transaction, then COMMIT, pipelined together.

    A handler that never touched the database completes in autocommit: one round trip. The
    answer reaches the client as the view made it (Set-Cookie included); only its body and the
    allow-listed headers are stored (``replay.py``).
    """
    assert req.key_id is not None
    state = req.state
    body: str | None = None
    headers: str | None = None
    try:
        if req.policy.store_response:
            headers = stored_headers(response, state.settings.replay_headers, state.settings.max_body_bytes)
            if oversized(response, state.settings.max_stored_response_bytes, state.settings.oversized_response):
                body, headers = OMITTED_BODY, omitted_headers(headers)
            else:
                body = stored_body(response, as_json=state.settings.replay_body_marker)
    except ResponseRefusedError as refused:
        # Like a body the database refuses: writes rolled back, key failed, 500, one ERROR line.
        _log_refused(req, refused, "shorten the header or the body, or decorate with store_response=False")
        claimed.fail(req, 500)
        raise
    except Exception:  # e.g. a direct-passthrough file response: nothing we could replay
        claimed.fail(req, 500)
        raise
    try:
        unsettled = _settle(req, lambda: claimed.complete(req, response.status_code, body, headers))
    except Exception as exc:
        req.rollback()
        if isinstance(exc, ResponseRefusedError):
            # The SQL API refused what we asked it to store, e.g. a body with a credential-named
            # field (contract §3 forbids storing credentials): a bug in the route, not an outage.
            _log_refused(req, exc, "decorate with store_response=False or drop the field")
        # Anything else (a deferred constraint failing at COMMIT, ...) is the handler's failure.
        claimed.fail(req, 500)
        raise
    return response if unsettled is None else unsettled


def _log_refused(req: RequestScope, exc: ResponseRefusedError, hint: str) -> None:
    """The one ERROR line of a response that may not be stored, refused by the shim or the SQL API."""
    log_event(
        logging.ERROR,
        "response_refused",
        endpoint=req.endpoint,
        key=req.key_hint,
        key_id=req.key_id,
        error=error_text(exc),
        hint=hint,
    )
