"""The published contract (contract §4b, the IETF draft's "idempotency specification" of a resource):
an OpenAPI 3.1 document of every route wrapped by ``@idempotency_key``.

Per operation: the ``Idempotency-Key`` header parameter (a UUID, required or not), an
``x-idempotency`` object with the route's policy (every option of ``policy.Policy``, ttl in
seconds: the draft's expiry policy; the headers a replay carries), a ``default`` answer
(the handler's, with ``Idempotent-Replayed`` on a replay) and the shim's own 400, 409, 413, 422
and 503 answers with their ``application/json`` and ``application/problem+json`` schemas.
The handler's own answers are the app's to describe: docs/adopting.md merges this fragment into
an app's spec. ``idem openapi --app MODULE:APP`` and ``flask idempotency openapi`` print it.
"""

from __future__ import annotations

import re
from typing import Any, Final

from flask import Flask

from . import http
from .config import Settings
from .errors import KEY_REQUIRED_MESSAGE, MALFORMED_KEY_MESSAGE, OPAQUE_MALFORMED_KEY_MESSAGE
from .fingerprint import OPAQUE_KEY_PATTERN
from .replay import DEFAULT_REPLAY_HEADERS
from .routes import DecoratedRoute, decorated_routes
from .state import EXTENSION_KEY, IdemState

OPENAPI_VERSION: Final = "3.1.0"
HEADER: Final = "Idempotency-Key"

_CONVERTER: Final = re.compile(
    r"<(?:(?P<converter>[a-zA-Z_][a-zA-Z0-9_]*)(?:\([^)]*\))?:)?(?P<name>[a-zA-Z_][a-zA-Z0-9_]*)>"
)
_PATH_TYPES: Final = {"int": "integer", "float": "number"}

#: The ``error`` values each status of the shim can carry (contract §4's table).
_ERRORS: Final[dict[int, tuple[str, ...]]] = {
    400: (MALFORMED_KEY_MESSAGE, "invalid_request_fingerprint", KEY_REQUIRED_MESSAGE),
    409: ("idempotency_in_flight", "idempotency_previous_failed"),
    413: ("request_too_large",),
    422: ("idempotency_key_body_mismatch",),
    503: ("idempotency_store_unavailable",),
}
_DESCRIPTIONS: Final = {
    400: "The Idempotency-Key is not a UUID (or is missing on a route that requires it), or the path or query "
    "holds text the fingerprint cannot hold; nothing was stored or run.",
    409: "Another request with this key is in progress (retry after Retry-After with the same key and body), "
    "or the first one failed and is kept failed (on_failure keep).",
    413: "The body is larger than the shim accepts; nothing was stored or run.",
    422: "The key was first used with another body, path or query.",
    503: "The idempotency store is unavailable; the handler did not run. Retry after Retry-After.",
}


def _schemas() -> dict[str, Any]:
    members = {
        "error": {"type": "string", "description": "what happened, one of the shim's error codes"},
        "retry_after_ms": {"type": "integer", "minimum": 0, "description": "409 in flight: when to retry"},
    }
    return {
        "IdempotencyError": {
            "type": "object",
            "required": ["error"],
            "properties": members,
        },
        "IdempotencyProblem": {
            "type": "object",
            "description": "RFC 9457 problem details (IDEM_ERROR_FORMAT = problem+json)",
            "required": ["type", "title", "status", "detail", "error"],
            "properties": {
                "type": {"type": "string", "format": "uri-reference"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "detail": {"type": "string"},
                **members,
            },
        },
    }


def _error_response(status: int, errors: tuple[str, ...], docs_url: str | None) -> dict[str, Any]:
    enum = {"properties": {"error": {"enum": list(errors)}}}
    headers: dict[str, Any] = {}
    if status == 409:
        headers["Retry-After"] = {
            "description": "seconds to wait before retrying (with idempotency_in_flight)",
            "schema": {"type": "integer"},
        }
    if status == 503:
        headers["Retry-After"] = {
            "description": "seconds to wait before retrying",
            "required": True,
            "schema": {"type": "integer"},
        }
    if docs_url is not None:
        headers["Link"] = {
            "description": f'<{docs_url}>; rel="describedby": this API\'s idempotency documentation',
            "required": True,
            "schema": {"type": "string"},
        }
    response: dict[str, Any] = {
        "description": _DESCRIPTIONS[status],
        "content": {
            "application/json": {"schema": {"allOf": [{"$ref": "#/components/schemas/IdempotencyError"}, enum]}},
            http.PROBLEM_MIMETYPE: {"schema": {"allOf": [{"$ref": "#/components/schemas/IdempotencyProblem"}, enum]}},
        },
    }
    if headers:
        response["headers"] = headers
    return response


def _path(rule: str) -> tuple[str, list[dict[str, Any]]]:
    """A werkzeug rule as an OpenAPI path template, and its path parameters."""
    parameters: list[dict[str, Any]] = []

    def template(match: re.Match[str]) -> str:
        kind = _PATH_TYPES.get(match.group("converter") or "", "string")
        parameters.append({"name": match.group("name"), "in": "path", "required": True, "schema": {"type": kind}})
        return "{" + match.group("name") + "}"

    return _CONVERTER.sub(template, rule), parameters


def _operation(route: DecoratedRoute, app: Flask, settings: Settings | None) -> dict[str, Any]:
    policy = route.policy
    replayed = settings.replay_headers if settings is not None else DEFAULT_REPLAY_HEADERS
    docs_url = settings.docs_url if settings is not None else None
    _, path_parameters = _path(route.rule)
    effective = settings or Settings()
    key_parameter = {
        "name": HEADER,
        "in": "header",
        "required": policy.required,
        "description": "A client-generated UUID, the same on every retry of one request (the IETF draft's "
        'Idempotency-Key; its quoted form "<uuid>" is accepted too).',
        "schema": {"type": "string", "format": "uuid"},
    }
    if policy.key_format_for(effective) == "opaque":
        shortest = effective.opaque_key_min_length
        key_parameter["description"] = (
            "A client-generated key, the same on every retry of one request and sent once: a UUID, or "
            f"{shortest} to 255 visible ASCII characters but a comma, a semicolon, a double quote or a backslash "
            "(compared as sent, case-sensitive; the IETF draft's quoted form is accepted too)."
        )
        pattern = OPAQUE_KEY_PATTERN.replace("{16,255}", f"{{{shortest},255}}")  # IDEM_OPAQUE_KEY_MIN_LENGTH
        key_parameter["schema"] = {"type": "string", "pattern": f'^"?{pattern}"?$'}
    errors = dict(_ERRORS)
    if policy.key_format_for(effective) == "opaque":
        errors[400] = tuple(OPAQUE_MALFORMED_KEY_MESSAGE if e == MALFORMED_KEY_MESSAGE else e for e in errors[400])
    if not policy.required:
        errors[400] = tuple(e for e in errors[400] if e != KEY_REQUIRED_MESSAGE)
    if policy.on_failure == "release":
        errors[409] = ("idempotency_in_flight",)
    marked = effective.replay_body_marker
    markers = effective.replayed_headers
    gains = f' (a JSON object body gains "{http.REPLAYED_FIELD}": true)' if marked else " (the body byte for byte)"
    view = app.view_functions.get(route.endpoint)
    summary = (view.__doc__ or "").strip().splitlines()[0] if view is not None and view.__doc__ else None
    operation: dict[str, Any] = {
        "operationId": f"{route.endpoint}_{route.method.lower()}",
        "parameters": [*path_parameters, key_parameter],
        "x-idempotency": {
            **policy.published(effective, route.scope),
            "replayed_headers": list(replayed),
            "replay_marker": {
                "header": markers[0],
                "headers": list(markers),  # IDEM_REPLAYED_HEADERS: every name a replay carries
                "body_member": http.REPLAYED_FIELD if marked else None,
            },
        },
        "responses": {
            "default": {
                "description": "The handler's answer. A retry with the same key and body gets the same status, "
                f"body and replayed headers, with {', '.join(markers)}: true{gains}"
                + (", a failure's 5xx included." if policy.on_failure == "replay" else "."),
                "headers": {
                    marker: {"description": "true on a replayed answer", "schema": {"type": "string", "enum": ["true"]}}
                    for marker in markers
                },
            },
            **{str(status): _error_response(status, errors[status], docs_url) for status in sorted(errors)},
        },
    }
    if summary:
        operation["summary"] = summary
    return operation


def document(app: Flask, *, title: str | None = None, version: str = "1") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``app``'s decorated routes (an empty ``paths`` when none)."""
    state = app.extensions.get(EXTENSION_KEY)
    settings = state.settings if isinstance(state, IdemState) else None
    paths: dict[str, dict[str, Any]] = {}
    for route in decorated_routes(app):
        path, _ = _path(route.rule)
        paths.setdefault(path, {})[route.method.lower()] = _operation(route, app, settings)
    info: dict[str, Any] = {
        "title": title or f"{app.name}: idempotent routes",
        "version": version,
        "description": "The idempotency contract of this API's write routes (IETF draft-ietf-httpapi-idempotency-key"
        "-header): which routes take an Idempotency-Key, how long a key is kept, and the answers of the "
        "idempotency layer itself.",
    }
    spec: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": info,
        "paths": paths,
        "components": {"schemas": _schemas()},
    }
    if settings is not None and settings.docs_url is not None:
        spec["externalDocs"] = {"description": "idempotency of this API", "url": settings.docs_url}
    return spec
