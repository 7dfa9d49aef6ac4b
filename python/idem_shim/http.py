"""HTTP answers of the shim: SPEC §4's table, one function per row, nothing else.

Bodies are serialised with the app's JSON provider so they look like the app's own answers.
"""

from __future__ import annotations

import math
from typing import Any, Final

from flask import current_app
from werkzeug.wrappers import Response

from .db import ClaimResult
from .errors import MALFORMED_KEY_MESSAGE

REPLAYED_HEADER: Final = "Idempotent-Replayed"
REPLAYED_FIELD: Final = "idempotency_replayed"
#: Retry hint when our completion found the claim lost (another worker holds the key now).
CLAIM_LOST_RETRY_AFTER_MS: Final = 1000


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    response: Response = current_app.response_class(
        current_app.json.dumps(body), status=status, mimetype="application/json"
    )
    if headers:
        response.headers.update(headers)
    return response


def _retry_after_seconds(ms: int) -> str:
    return str(max(1, math.ceil(ms / 1000)))


def key_required() -> Response:
    return _json(400, {"error": "Idempotency-Key header is required"})


def malformed_key() -> Response:
    return _json(400, {"error": MALFORMED_KEY_MESSAGE})


def request_too_large() -> Response:
    return _json(413, {"error": "request_too_large"})


def in_flight(retry_after_ms: int) -> Response:
    return _json(
        409,
        {"error": "idempotency_in_flight", "retry_after_ms": retry_after_ms},
        {"Retry-After": _retry_after_seconds(retry_after_ms)},
    )


def previous_failed() -> Response:
    return _json(409, {"error": "idempotency_previous_failed"})


def mismatch() -> Response:
    return _json(422, {"error": "idempotency_key_body_mismatch"})


def store_unavailable(retry_after_seconds: int) -> Response:
    return _json(
        503,
        {"error": "idempotency_store_unavailable"},
        {"Retry-After": str(max(1, retry_after_seconds))},
    )


def claim_lost() -> Response:
    """Our completion found the key taken over; our writes rolled back. Retry like in_flight."""
    return in_flight(CLAIM_LOST_RETRY_AFTER_MS)


def replay(status: int, body: Any) -> Response:
    """The stored answer. A JSON object gets ``"idempotency_replayed": true``; other JSON values
    (arrays, strings, numbers) come back unchanged; JSON ``null`` comes back as an empty body.
    The header ``Idempotent-Replayed: true`` is always set."""
    headers = {REPLAYED_HEADER: "true"}
    if body is None:
        response: Response = current_app.response_class(b"", status=status)
        response.headers.update(headers)
        return response
    if isinstance(body, dict):
        body = {**body, REPLAYED_FIELD: True}
    return _json(status, body, headers)


def for_outcome(result: ClaimResult) -> Response:
    """The answer for every outcome except ``claimed`` (which runs the handler)."""
    outcome = result.outcome
    if outcome == "replay":
        assert result.response_code is not None
        return replay(result.response_code, result.response_body)
    if outcome in ("in_flight", "stale"):
        return in_flight(result.retry_after_ms if result.retry_after_ms is not None else 5000)
    if outcome == "previous_failed":
        return previous_failed()
    if outcome == "mismatch":
        return mismatch()
    raise ValueError(f"idem_claim returned an unknown outcome {outcome!r}")
