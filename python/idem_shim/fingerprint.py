"""What the shim reads from a request: the key and the request's JSON text (what a response
stores is in ``replay.py``).

The request fingerprint is computed in SQL (``request_hash`` = sha256 of ``p_request::text``), so
this module only decides *what JSON* goes in ``p_request``; PostgreSQL's jsonb then makes key order
and white space irrelevant. JSON texts are passed through as text and cast to jsonb in SQL: no
Python re-serialisation, so numbers keep their exact precision.

The fingerprint is injective over what the handler can see (SPEC §4b): two requests with the
same key and endpoint scope share it only when their method, media type, path parameters, query
and body (as JSON under a JSON media type, else its bytes) are the same. A request is one of three
shapes, and no value of one shape can be a value of another:

* the body itself: a POST (or a method the scope names) of a JSON media type whose body is JSON
  that jsonb accepts, without path parameters or a query, or an empty POST without a media type
  (SQL NULL, hashed as JSON ``null``); not a JSON ``null`` body, nor an object holding both
  ``"path"`` and ``"query"``, which the two wrappers below always do;
* the same with path parameters or a query: ``{"body": <body or null>, "path": {<view args>},
  "query": {<name>: [<values>]}}`` (exactly those three members);
* anything else: ``{"method": ..., "type": <media type and parameters, or null>, "path": ...,
  "query": ..., "body": <JSON value>}`` under a JSON media type, ``"body_sha256": <hex of the
  bytes>`` for other bytes (form data, text, binary, JSON that jsonb refuses: ``NaN``,
  ``\\u0000``), neither for an empty body (five or four members).

The first two are what earlier versions sent for those requests, so a key claimed by the
previous version during a rolling deploy replays on this one; a request of the third shape
(another media type, another method under one declared scope, ...) claimed by the previous
version is answered 422 once by this one (docs/shim.md, "The request fingerprint").
"""

from __future__ import annotations

import decimal
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.wrappers import Request

from .errors import InvalidFingerprintError

_UUID: Final = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
RAW_BODY_PREFIX: Final = "raw-body-sha256:"
#: A placeholder, not a key: every client that leaves its key unset would share it (the SQL API
#: refuses it too, 22023).
NIL_UUID: Final = "00000000-0000-0000-0000-000000000000"


def parse_key(header_value: str) -> str | None:
    """Canonical key (lower-case hyphenated UUID) from a header value, or None if malformed.

    Accepts a bare UUID in either case and the IETF draft's structured-field string form
    (``"<uuid>"``, double quotes included). Braces, URNs, unhyphenated forms and the nil UUID are
    refused.
    """
    value = header_value.strip()
    if len(value) == 38 and value[0] == '"' and value[-1] == '"':
        value = value[1:-1]
    if len(value) == 36 and _UUID.match(value) and value != NIL_UUID:
        return value.lower()
    return None


def read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None when it is larger than ``limit`` bytes.

    Checks the declared Content-Length first (nothing is read), then caps the stream itself, so a
    chunked body without a length cannot slip past the limit.
    """
    declared = request.content_length
    if declared is not None and declared > limit:
        return None
    # Cap the stream one byte past the limit: werkzeug stops an undeclared (chunked) body at the
    # cap, so reading limit + 1 bytes is how "larger than the limit" shows.
    current = request.max_content_length
    if current is None or current > limit + 1:
        request.max_content_length = limit + 1
    try:
        data = request.get_data(cache=True)
    except RequestEntityTooLarge:
        return None
    if len(data) > limit:
        return None
    return data


# PostgreSQL's numeric (jsonb's number): at most 131072 digits before the decimal point and
# 16383 after it; beyond, jsonb input raises 22003 "value overflows numeric format".
_NUMERIC_MAX_WEIGHT: Final = 131071  # Decimal.adjusted() of the largest accepted number
_NUMERIC_MAX_DSCALE: Final = 16383


def _jsonb_number(text: str) -> float:
    """``parse_float`` hook: refuse a number that jsonb's numeric cannot hold (``1e200000``).

    Found by the property-based HTTP test: such a body reached ``idem_claim``, whose
    22003 the shim took for a store outage (503 forever, and a fail-open route ran undeduplicated).
    """
    number = decimal.Decimal(text)
    exponent = number.as_tuple().exponent
    if number.adjusted() > _NUMERIC_MAX_WEIGHT or (isinstance(exponent, int) and -exponent > _NUMERIC_MAX_DSCALE):
        raise ValueError("number out of jsonb's range")
    return float(number)  # the check is what matters: the JSON text itself goes to the database


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)  # NaN, Infinity, -Infinity: valid Python, invalid jsonb


#: One decoder for every body (``json.loads`` with hooks builds a new one per call).
_JSONB_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_jsonb_number)


def jsonb_value(text: str) -> tuple[bool, Any]:
    """``(True, value)`` if ``text`` is JSON that PostgreSQL's jsonb input also accepts, else ``(False, None)``."""
    try:
        value = _JSONB_DECODER.decode(text)
    except (ValueError, RecursionError):
        return False, None
    if "\\u" in text:
        # jsonb refuses \u0000 and unpaired surrogates, which Python's parser lets through.
        if "\\u0000" in text:
            return False, None
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except (UnicodeEncodeError, RecursionError):
            return False, None
    return True, value


def _is_jsonb_safe(text: str) -> bool:
    """True if ``text`` is JSON that PostgreSQL's jsonb input also accepts."""
    return jsonb_value(text)[0]


def body_json(data: bytes) -> str | None:
    """JSON text for a body: None (SQL NULL) if empty, itself if jsonb-safe JSON, else a digest."""
    if not data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.strip() and _is_jsonb_safe(text):
        return text
    return json.dumps(RAW_BODY_PREFIX + hashlib.sha256(data).hexdigest())


#: An integer path parameter beyond this many digits is refused: jsonb's numeric stops at 131072
#: and Python's int-to-text conversion at 4300 (a ValueError that would have been a 500).
_MAX_PATH_INT_DIGITS: Final = 1000


def _check_text(text: str, where: str) -> None:
    """The guard the body has (``jsonb_value``), for a path or query string: jsonb refuses a NUL
    and a lone surrogate (22P05), which the shim once took for a store outage."""
    if "\x00" in text:
        raise InvalidFingerprintError(f"the request's {where} holds a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidFingerprintError(f"the request's {where} holds a lone UTF-16 surrogate") from None


def _path_value(name: str, value: Any) -> str | int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > _MAX_PATH_INT_DIGITS * 3.33:
            raise InvalidFingerprintError(f"the request's path parameter {name} is too large a number")
        return value
    text = value if isinstance(value, str) else str(value)
    _check_text(text, "path")
    return text


def _media_type(content_type: str | None) -> tuple[str | None, bool]:
    """The media type with its parameters, normalised (``None`` without one), and whether it is JSON
    as Flask's ``request.is_json`` reads it (``application/json``, ``application/*+json``)."""
    if content_type is None or not content_type.strip():
        return None, False
    essence, params = parse_options_header(content_type)
    essence = essence.lower()
    _check_text(content_type, "Content-Type header")
    written = "; ".join([essence, *(f"{k.lower()}={v}" for k, v in sorted(params.items()))])
    is_json = essence == "application/json" or (essence.startswith("application/") and essence.endswith("+json"))
    return written, is_json


def request_json(
    data: bytes,
    view_args: Mapping[str, Any] | None,
    query: Mapping[str, list[str]],
    *,
    method: str | None,
    content_type: str | None,
) -> str | None:
    """The ``p_request`` JSON text for a request (see the module docstring). ``method`` is None when
    the endpoint scope names it (the default ``"<METHOD> <url rule>"``); ``content_type`` is the
    request's header, None without one.

    Raises ``InvalidFingerprintError`` when the path, query or media type holds what jsonb cannot
    (the body cannot: it falls back to its digest).
    """
    path = {name: _path_value(name, value) for name, value in (view_args or {}).items()}
    for name, values in query.items():
        _check_text(name, "query string")
        for item in values:
            _check_text(item, "query string")
    media, is_json = _media_type(content_type)
    body_value: Any = None
    if is_json and data:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        safe, body_value = jsonb_value(text) if text.strip() else (False, None)
        if not safe:
            is_json = False  # bytes that jsonb cannot hold: fingerprinted by their digest
    posted = method is None or method == "POST"
    wrapper_shaped = isinstance(body_value, dict) and "path" in body_value and "query" in body_value
    plain = posted and ((not data and media is None) or (is_json and body_value is not None and not wrapper_shaped))
    if plain:
        body = body_json(data)  # the JSON text as sent (exact digits), or None
        if not path and not query:
            return body
        return (
            '{"body": '
            + (body if body is not None else "null")
            + ', "path": '
            + json.dumps(path, sort_keys=True)
            + ', "query": '
            + json.dumps(dict(query), sort_keys=True)
            + "}"
        )
    fields: dict[str, Any] = {"method": method, "type": media, "path": path, "query": dict(query)}
    if data and not is_json:
        fields["body_sha256"] = hashlib.sha256(data).hexdigest()
    wrapped = json.dumps(fields, sort_keys=True)
    if data and is_json:  # the body's own JSON text, unparsed (exact digits), as its first member
        wrapped = '{"body": ' + data.decode("utf-8") + ", " + wrapped[1:]
    return wrapped
