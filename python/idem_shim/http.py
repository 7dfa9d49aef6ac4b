"""HTTP answers of the shim: contract §4's table, one function per row, nothing else.

Bodies are serialised with the app's JSON provider so they look like the app's own answers. The
shim's own errors are ``{"error": ...}`` by default, RFC 9457 problem details with
``IDEM_ERROR_FORMAT = "problem+json"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from flask import current_app
from werkzeug.wrappers import Response

from .errors import KEY_REQUIRED_MESSAGE, MALFORMED_KEY_MESSAGE, OPAQUE_MALFORMED_KEY_MESSAGE
from .outcome import Outcome
from .records import ClaimResult
from .replay import (
    DEFAULT_REPLAY_HEADERS,
    OMITTED_HEADER,
    OMITTED_VALUE,
    body_omitted,
    is_json_type,
    raw_bytes,
    replay_headers,
)
from .state import get_state

REPLAYED_HEADER: Final = "Idempotent-Replayed"
REPLAYED_FIELD: Final = "idempotency_replayed"
PROBLEM_MIMETYPE: Final = "application/problem+json"
#: Retry hint when our completion found the claim lost (another worker holds the key now).
CLAIM_LOST_RETRY_AFTER_MS: Final = 1000


def _json(
    status: int, body: Any, headers: dict[str, str] | None = None, mimetype: str = "application/json"
) -> Response:
    response: Response = current_app.response_class(current_app.json.dumps(body), status=status, mimetype=mimetype)
    if headers:
        response.headers.update(headers)
    return response


def _retry_after_seconds(ms: int) -> str:
    return str(max(1, math.ceil(ms / 1000)))


@dataclass(frozen=True, slots=True)
class Problem:
    """One of the shim's own error answers, in both forms. ``slug`` ends the RFC 9457 ``type``."""

    slug: str
    title: str
    detail: str


#: Every error the shim answers by itself. With IDEM_ERROR_FORMAT = "problem+json" the body is
#: {"type": IDEM_PROBLEM_TYPE_BASE + slug, "title", "status", "detail", "error", ...}; the
#: default is {"error": ..., ...} (contract §4). docs/shim.md lists the types.
PROBLEMS: Final[dict[str, Problem]] = {
    KEY_REQUIRED_MESSAGE: Problem(
        "idempotency-key-required",
        "Idempotency-Key header is required",
        "This endpoint needs an Idempotency-Key header (a UUID) on every request.",
    ),
    MALFORMED_KEY_MESSAGE: Problem(
        "idempotency-key-malformed",
        "Idempotency-Key must be a UUID string",
        "Send the Idempotency-Key as a UUID (8-4-4-4-12 hex digits), bare or in double quotes.",
    ),
    OPAQUE_MALFORMED_KEY_MESSAGE: Problem(
        "idempotency-key-malformed-opaque",
        OPAQUE_MALFORMED_KEY_MESSAGE,
        "Send one Idempotency-Key of 16 to 255 visible ASCII characters, bare or in double quotes.",
    ),
    "invalid_request_fingerprint": Problem(
        "invalid-request-fingerprint",
        "The request cannot be fingerprinted",
        "The path or query string holds text that cannot be stored (a NUL character, a lone UTF-16 "
        "surrogate, an out-of-range number); nothing was stored or run.",
    ),
    "idempotency_user_scope_unset": Problem(
        "idempotency-user-scope-unset",
        "The route's idempotency scope is misconfigured",
        "The server could not tell whose request this is; nothing was stored or run. (Server side: "
        "@idempotency_key must sit below the session decorator, or the route declares service=True.)",
    ),
    "idempotency_user_unknown": Problem(
        "idempotency-user-unknown",
        "The request's user is unknown to the idempotency store",
        "The server's session names a user that its idempotency store's users table does not hold; nothing "
        "was stored or run. (Server side: g.current_user_id must be an id of the users table idem was "
        "installed with: idem migrate --users-table.)",
    ),
    "request_too_large": Problem(
        "request-too-large",
        "Request body too large",
        "The request body is larger than this endpoint accepts; nothing was stored or run.",
    ),
    "idempotency_in_flight": Problem(
        "idempotency-in-flight",
        "A request with this Idempotency-Key is in progress",
        "Retry after retry_after_ms milliseconds with the same key and body: the retry gets the "
        "first request's answer.",
    ),
    "idempotency_previous_failed": Problem(
        "idempotency-previous-failed",
        "The first request with this Idempotency-Key failed",
        "It is not run again under this key; send the request with a new Idempotency-Key.",
    ),
    "idempotency_key_body_mismatch": Problem(
        "idempotency-key-body-mismatch",
        "Idempotency-Key reused with a different request",
        "This key was first used with another body, path or query; use a new key for a new request.",
    ),
    "idempotency_store_unavailable": Problem(
        "idempotency-store-unavailable",
        "Idempotency store unavailable",
        "The request was not run; retry after the Retry-After delay.",
    ),
}


def _error(
    status: int, error: str, headers: dict[str, str] | None = None, *, detail: str | None = None, **members: Any
) -> Response:
    """The shim's own error answer: ``{"error": ...}`` or RFC 9457 problem details. ``detail``
    says more than the error's code where the shim knows more (a ``detail`` member, or the
    problem's own ``detail``)."""
    settings = get_state().settings
    if settings.docs_url is not None:
        # The IETF draft: the 400, 409 and 422 answers SHOULD link to the documentation.
        headers = {**(headers or {}), "Link": f'<{settings.docs_url}>; rel="describedby"'}
    if settings.error_format != "problem+json":
        body: dict[str, Any] = {"error": error, **members}
        if detail is not None:
            body["detail"] = detail
        return _json(status, body, headers)
    problem = PROBLEMS[error]
    body = {
        "type": settings.problem_types + problem.slug,
        "title": problem.title,
        "status": status,
        "detail": detail if detail is not None else problem.detail,
        "error": error,
        **members,
    }
    return _json(status, body, headers, mimetype=PROBLEM_MIMETYPE)


def key_required() -> Response:
    return _error(400, KEY_REQUIRED_MESSAGE)


#: The rule a route with ``key_format="opaque"`` states in its 400 (the error itself is the contract's).
OPAQUE_KEY_RULE: Final = (
    "The Idempotency-Key is one key, sent once: a UUID or 16 to 255 visible ASCII characters (0x21-0x7E) with "
    "no space, comma, semicolon, double quote or backslash, bare or in double quotes, the same on every retry "
    "of one request."
)


def malformed_key(key_format: str = "uuid", min_length: int = 16) -> Response:
    """The 400 of a key that is none under the rule in force, its text naming that rule. The
    ``error`` is a fixed code; under ``"opaque"`` the ``detail`` states the app's
    ``IDEM_OPAQUE_KEY_MIN_LENGTH``."""
    if key_format == "opaque":
        return _error(
            400, OPAQUE_MALFORMED_KEY_MESSAGE, detail=OPAQUE_KEY_RULE.replace("16 to 255", f"{min_length} to 255")
        )
    return _error(400, MALFORMED_KEY_MESSAGE)


def invalid_request_fingerprint(detail: str | None = None) -> Response:
    return _error(400, "invalid_request_fingerprint", detail=detail)


def user_scope_unset() -> Response:
    return _error(500, "idempotency_user_scope_unset")


def user_unknown() -> Response:
    return _error(500, "idempotency_user_unknown")


def request_too_large() -> Response:
    return _error(413, "request_too_large")


def in_flight(retry_after_ms: int) -> Response:
    return _error(
        409,
        "idempotency_in_flight",
        {"Retry-After": _retry_after_seconds(retry_after_ms)},
        retry_after_ms=retry_after_ms,
    )


def previous_failed() -> Response:
    return _error(409, "idempotency_previous_failed")


def mismatch() -> Response:
    return _error(422, "idempotency_key_body_mismatch")


def store_unavailable(retry_after_seconds: int) -> Response:
    return _error(
        503,
        "idempotency_store_unavailable",
        {"Retry-After": str(max(1, retry_after_seconds))},
    )


def claim_lost() -> Response:
    """Our completion found the key taken over; our writes rolled back. Retry like in_flight."""
    return in_flight(CLAIM_LOST_RETRY_AFTER_MS)


def replay(
    status: int,
    body: Any,
    headers: Any = None,
    names: tuple[str, ...] = DEFAULT_REPLAY_HEADERS,
    *,
    body_marker: bool = True,
    markers: tuple[str, ...] = (REPLAYED_HEADER,),
) -> Response:
    """The stored answer (contract §4), with ``Idempotent-Replayed: true`` (each of ``markers``:
    ``IDEM_REPLAYED_HEADERS``), and ``Idempotency-Replay: omitted`` when its body was over
    ``IDEM_MAX_STORED_RESPONSE_BYTES`` (stored empty).

    A body stored raw comes back byte for byte under its stored Content-Type; a JSON object gets
    ``"idempotency_replayed": true`` (unless ``body_marker`` is off: ``IDEM_REPLAY_BODY_MARKER``);
    other JSON values (rows stored before the store kept raw bodies) come back
    as JSON, and JSON ``null`` as an empty body. The stored headers on the allow-list come back;
    one that cannot be sent (or a Content-Type that cannot describe the body) is left out, never
    turned into a 5xx.
    """
    sent = replay_headers(headers, names)
    content_type = next((sent.pop(name) for name in list(sent) if name.lower() == "content-type"), None)
    raw = raw_bytes(body)
    response: Response
    if raw is not None:
        response = current_app.response_class(raw, status=status)
        response.headers["Content-Type"] = content_type or "application/octet-stream"
    elif body is None:
        response = current_app.response_class(b"", status=status)
    else:
        if body_marker and isinstance(body, dict):
            body = {**body, REPLAYED_FIELD: True}
        json_type = content_type if content_type is not None and is_json_type(content_type) else None
        response = _json(status, body, mimetype="application/json")
        if json_type is not None:
            response.headers["Content-Type"] = json_type
    for name, value in sent.items():
        response.headers[name] = value
    for marker in markers:
        response.headers[marker] = "true"
    if body_omitted(headers):
        response.headers[OMITTED_HEADER] = OMITTED_VALUE
    return response


def for_outcome(result: ClaimResult) -> Response:
    """The answer for every outcome except ``claimed`` (which runs the handler)."""
    outcome = result.outcome
    if outcome == Outcome.REPLAY:
        assert result.response_code is not None
        settings = get_state().settings
        return replay(
            result.response_code,
            result.response_body,
            result.response_headers,
            settings.replay_headers,
            body_marker=settings.replay_body_marker,
            markers=settings.replayed_headers,
        )
    if outcome in (Outcome.IN_FLIGHT, Outcome.STALE):
        return in_flight(result.retry_after_ms if result.retry_after_ms is not None else 5000)
    if outcome == Outcome.PREVIOUS_FAILED:
        return previous_failed()
    if outcome == Outcome.MISMATCH:
        return mismatch()
    raise ValueError(f"idem_claim returned an unknown outcome {outcome!r}")
