"""OpenTelemetry spans of a decorated request, when the app has ``opentelemetry-api``.

Spans (children of whatever span is current, e.g. the Flask instrumentation's server span):
``idem.request`` around the decorator's work, and inside it ``idem.claim``, ``idem.replay``
(building a stored answer), ``idem.complete`` and ``idem.fail``. Attributes: ``idem.endpoint``
(the key's endpoint scope), ``idem.outcome``, ``idem.replayed``, ``idem.attempt`` once the scope
carries one, ``http.response.status_code``; an exception sets ``error.type`` to its class name.
Never the key, the user, the request hash or a body: an exception's message is not recorded
either (a driver's text could quote a value).

Without the package nothing of it is imported (``find_spec`` looks without importing), and each
helper below calls straight through: the decorator's path is unchanged. With the API but no SDK
(no tracer provider set: every span would be a no-op), each helper calls straight through too,
after one check of the global provider: no-op spans still cost a worker's CPU on every request
(bench/levers/worker_buckets.py measures it; bench/HISTORY.md has the figure).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .outcome import Outcome

if TYPE_CHECKING:
    from werkzeug.wrappers import Response

    from .records import ClaimRequest, ClaimResult
    from .scope import RequestScope

R = TypeVar("R")
#: a store's claim's answer: (connection, ClaimResult) or (connection, ClaimResult, block)
C = TypeVar("C", tuple[Any, "ClaimResult"], tuple[Any, "ClaimResult", Any])

#: The package's own tracer name (the instrumentation scope spans are reported under).
SCOPE: Final = "idem_shim"

_tracer: Any = None
if find_spec("opentelemetry") is not None:  # pragma: no branch - both sides are tested
    from opentelemetry import trace as _trace

    _tracer = _trace.get_tracer(SCOPE)
    _NO_OP_PROVIDERS: Final = (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)

_recording = False  # a real provider was seen: the API sets it once per process, for good


def enabled() -> bool:
    return _tracer is not None


def _live() -> bool:
    """Spans can record: the API is installed and a tracer provider (an SDK's) has been set.
    Asked once per request, by ``request``; the spans inside it read ``_recording``."""
    global _recording
    if not _recording and _tracer is not None:
        _recording = not isinstance(_trace.get_tracer_provider(), _NO_OP_PROVIDERS)
    return _recording


@contextmanager
def _span(name: str, endpoint: str | None, **attributes: Any) -> Iterator[Any]:
    with _tracer.start_as_current_span(name, record_exception=False, set_status_on_exception=False) as span:
        if endpoint is not None:
            span.set_attribute("idem.endpoint", endpoint)
        _annotate(span, attributes)
        try:
            yield span
        except BaseException as exc:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


def _annotate(span: Any, attributes: dict[str, Any]) -> None:
    for name, value in attributes.items():
        if value is not None:
            span.set_attribute(name, value)


def _attempt(req: RequestScope) -> int | None:
    """``attempt()`` of the request when the scope knows it (contract §4a), else None."""
    value = getattr(req, "attempt", None)
    return value if isinstance(value, int) else None


def request(handle: Callable[..., R]) -> Callable[..., R]:
    """``idem.request`` around the decorator's handling of one request."""
    if _tracer is None:
        return handle

    @functools.wraps(handle)
    def traced(*args: Any, **kwargs: Any) -> R:
        if not _live():
            return handle(*args, **kwargs)
        with _span("idem.request", None):
            return handle(*args, **kwargs)

    return traced


def claim(run: Callable[[ClaimRequest], C], claim: ClaimRequest) -> C:
    """``run(claim)`` (the store's claim: its result second) in ``idem.claim``; the outcome also
    marks ``idem.request``."""
    if not _recording:
        return run(claim)
    parent = _trace.get_current_span()
    with _span("idem.claim", claim.endpoint) as span:
        answered = run(claim)
        result: ClaimResult = answered[1]
        found = {"idem.outcome": result.outcome.value, "idem.replayed": result.outcome == Outcome.REPLAY}
        _annotate(span, found)
        _annotate(parent, {"idem.endpoint": claim.endpoint, **found})
        return answered


def answer(endpoint: str, result: ClaimResult, build: Callable[[ClaimResult], Response]) -> Response:
    """``build(result)``, the answer of a non-claimed outcome; a replay's in ``idem.replay``."""
    if not _recording or result.outcome != Outcome.REPLAY:
        return build(result)
    with _span(
        "idem.replay",
        endpoint,
        **{"idem.outcome": result.outcome.value, "idem.replayed": True},
    ) as span:
        response = build(result)
        span.set_attribute("http.response.status_code", response.status_code)
        return response


#: What became of a completion, by the status of the answer ``_complete`` gave instead.
_COMPLETION_OUTCOME: Final = {409: "claim_lost", 503: "store_unavailable"}


def completion(complete: Callable[[RequestScope, Response], Response]) -> Callable[[RequestScope, Response], Response]:
    """``idem.complete`` around the decorator's completion of a claimed request."""
    if _tracer is None:
        return complete

    @functools.wraps(complete)
    def traced(req: RequestScope, response: Response) -> Response:
        if not _recording:
            return complete(req, response)
        with _span(
            "idem.complete",
            req.endpoint,
            **{"idem.attempt": _attempt(req), "http.response.status_code": response.status_code},
        ) as span:
            answer = complete(req, response)
            done = "completed" if answer is response else _COMPLETION_OUTCOME.get(answer.status_code, "not_completed")
            span.set_attribute("idem.outcome", done)
            return answer

    return traced


def failure(fail: Callable[[RequestScope, int | None], None]) -> Callable[[RequestScope, int | None], None]:
    """``idem.fail`` around the decorator's failing of a claimed request."""
    if _tracer is None:
        return fail

    @functools.wraps(fail)
    def traced(req: RequestScope, response_code: int | None) -> None:
        if not _recording:
            fail(req, response_code)
            return
        with _span(
            "idem.fail",
            req.endpoint,
            **{"idem.attempt": _attempt(req), "http.response.status_code": response_code, "idem.outcome": "failed"},
        ):
            fail(req, response_code)

    return traced
