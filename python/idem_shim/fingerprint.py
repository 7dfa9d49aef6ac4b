"""What the shim reads from a request: the key and the request's JSON text (what a response
stores is in ``replay.py``).

The request fingerprint is computed in SQL (``request_hash`` = sha256 of ``p_request::text``), so
this module only decides *what JSON* goes in ``p_request``; PostgreSQL's jsonb then makes key order
and white space irrelevant. JSON texts are passed through as text and cast to jsonb in SQL: no
Python re-serialisation, so numbers keep their exact precision.

The fingerprint is injective over what the handler can see (contract §4b): two requests with the
same key and endpoint scope share it only when their method, media type, path parameters, query
and body (as JSON under a JSON media type, else its bytes) are the same. A request is one of three
shapes, and no value of one shape can be a value of another:

* the body itself: a POST (or a method the scope names) of ``application/json`` (no parameter
  but ``charset=utf-8``) whose body is JSON that jsonb accepts, without path parameters or a
  query, or an empty POST without a media type (SQL NULL, hashed as JSON ``null``); not a JSON
  ``null`` body, nor an object holding both ``"path"`` and ``"query"``, which the two wrappers
  below always do;
* the same with path parameters or a query: ``{"body": <body or null>, "path": {<view args>},
  "query": {<name>: [<values>]}}`` (exactly those three members);
* anything else: ``{"method": ..., "type": <media type and parameters, normalised, or null>,
  "path": ..., "query": ..., "body": <JSON value>}`` under a JSON media type (another JSON type,
  ``application/merge-patch+json``, ``application/vnd.shop.v2+json``, among them), ``"body_sha256": <hex of the
  bytes>`` for other bytes (form data, text, binary, JSON that jsonb refuses: ``NaN``,
  ``\\u0000``), ``"parts_sha256": <hex>`` for a multipart body on a route that takes uploads (its parts'
  headers and bytes, not the boundary, which the media type leaves out too; at most
  ``MAX_FORM_PARTS`` parts, else 413), neither for an empty body. On a route that takes no
  upload a multipart body is bytes like any other (``"body_sha256"``, its boundary in the type):
  no part is parsed, so a body of many tiny parts costs what hashing its bytes costs;
* on a route that chooses its fingerprint (``fingerprint_include`` / ``fingerprint_exclude``, JSON
  pointers into the body): the same members but the body, and ``"included": {<pointer>: <value>}``
  or ``"excluded": [<pointers>]`` beside ``"body": <the body without them>``.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData
from werkzeug.wrappers import Request

from .errors import InvalidFingerprintError, RequestTooLargeError

_UUID: Final = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
RAW_BODY_PREFIX: Final = "raw-body-sha256:"
#: A placeholder, not a key: every client that leaves its key unset would share it (the SQL API
#: refuses it too, 22023).
NIL_UUID: Final = "00000000-0000-0000-0000-000000000000"


#: An opaque key (``key_format="opaque"``): 16 to 255 visible ASCII characters but the four that
#: give an ``Idempotency-Key`` field a structure (RFC 8941): ``"`` and ``\`` (a String and its
#: escapes), ``,`` (a List) and ``;`` (Parameters). So the field sent twice, which a server joins
#: into one value with a comma (RFC 9110 §5.3), or a list of strings, is never one key. The SQL
#: API's rule (idem_canonical_key); the OpenAPI document publishes it too. One text for Python's,
#: ECMA-262's and PostgreSQL's regular expressions.
OPAQUE_KEY_PATTERN: Final = r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]{16,255}"
#: The same characters from 1, the length checked apart (``IDEM_OPAQUE_KEY_MIN_LENGTH``; below 16
#: the SQL API's ``'opaque_short'``, which leaves the minimum to its caller).
_OPAQUE_CHARS: Final = re.compile(r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]{1,255}\Z")
#: The shortest opaque key of the SQL API's ``'opaque'`` (its default minimum, ``IDEM_OPAQUE_KEY_MIN_LENGTH``).
OPAQUE_MIN_LENGTH: Final = 16


def sql_key_format(key_format: str, min_length: int = OPAQUE_MIN_LENGTH) -> str:
    """The SQL API's ``p_key_format`` for a route's rule: ``'opaque_short'`` for an opaque key
    whose minimum is below 16 (checked here, by ``parse_key``), else the rule's own name."""
    return "opaque_short" if key_format == "opaque" and min_length < OPAQUE_MIN_LENGTH else key_format


def parse_key(header_value: str, key_format: str = "uuid", min_length: int = OPAQUE_MIN_LENGTH) -> str | None:
    """Canonical key from a header value, or None if malformed (idem_canonical_key's rule).

    The field is one RFC 8941 Item, the IETF draft's: a String (the key in double quotes) or the
    key bare; never a List (the field sent twice, which servers join with a comma), nor an Item
    with Parameters (``;a=1``). ``"uuid"``: a UUID in either case, lower-cased. ``"opaque"``: a
    UUID the same way, else 16 to 255 visible ASCII characters but ``"``, ``\\``, ``,`` and ``;``,
    as sent: a bare key is a Token without the Token's narrower alphabet, so Stripe-style keys
    (digits first, ``=``, ``@``) stay keys. Braces, URNs, unhyphenated forms and the nil UUID are
    refused by both. ``min_length`` (``IDEM_OPAQUE_KEY_MIN_LENGTH``) is an opaque key's
    shortest length, 1 to 255.
    """
    # OWS only (RFC 9110 §5.6.3: space and tab): str.strip() would also drop NEL, NBSP and the
    # C0 separators, which a server hands over as sent, and make a key of a value SQL refuses.
    value = header_value.strip(" \t")
    if value[:1] == '"':
        # A String, and nothing after it: no second member, no parameters. An escape (\" or \\)
        # would put a quote or a backslash in the key, which neither rule admits.
        inner = value[1:-1]
        if len(value) < 2 or value[-1] != '"' or '"' in inner or "\\" in inner:
            return None
        value = inner
    if len(value) == 36 and _UUID.match(value):
        return value.lower() if value != NIL_UUID else None
    if key_format == "opaque" and len(value) >= min_length and _OPAQUE_CHARS.match(value):
        return value
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


def _jsonb_decimal(text: str) -> decimal.Decimal:
    """``parse_float`` hook keeping a number's exact digits (a body re-serialised after a pointer
    took a member out must hash as the digits sent), with ``_jsonb_number``'s range check."""
    _jsonb_number(text)
    return decimal.Decimal(text)


#: One decoder for every body (``json.loads`` with hooks builds a new one per call).
_JSONB_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_jsonb_number)
#: The same, numbers as ``Decimal``: for the routes that choose their fingerprint.
_EXACT_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_jsonb_decimal)


def jsonb_value(text: str, decoder: json.JSONDecoder = _JSONB_DECODER) -> tuple[bool, Any]:
    """``(True, value)`` if ``text`` is JSON that PostgreSQL's jsonb input also accepts, else ``(False, None)``."""
    try:
        value = decoder.decode(text)
    except (ValueError, RecursionError):
        return False, None
    if "\\u" in text:
        # jsonb refuses \u0000 and unpaired surrogates, which Python's parser lets through.
        if "\\u0000" in text:
            return False, None
        try:
            json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")
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


def _media_type(content_type: str | None) -> tuple[str | None, bool, dict[str, str]]:
    """The media type with its parameters, normalised (``None`` without one), whether it is JSON
    as Flask's ``request.is_json`` reads it (``application/json``, ``application/*+json``), and its
    parameters (the boundary of a multipart body among them).

    Normalised: what one media type written two ways differs in (case of the type and the parameter
    names, a charset's case, quoting, white space, the order of the parameters) is left out, and so
    is a JSON type's ``charset=utf-8``, which a JSON body cannot but be (RFC 8259 §8.1). Anything
    else a handler could read (``request.mimetype``, ``mimetype_params``) stays.
    """
    if content_type is None or not content_type.strip():
        return None, False, {}
    essence, params = parse_options_header(content_type)  # parameter names lower-cased, values unquoted
    essence = essence.lower()
    _check_text(content_type, "Content-Type header")
    is_json = essence == "application/json" or (essence.startswith("application/") and essence.endswith("+json"))
    if "charset" in params:
        params["charset"] = params["charset"].lower()
        if is_json and params["charset"] == "utf-8":
            del params["charset"]
    return _written(essence, params), is_json, params


#: A parameter value written bare (RFC 9110's token); any other is written as a quoted-string.
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")


def _written(essence: str, params: Mapping[str, str]) -> str:
    """``type/subtype; name=value; ...`` in the parameters' name order, each value a token or a
    quoted-string, so no two parameter lists are written alike (``a="1; b=2"`` is not ``a=1; b=2``)."""

    def value(text: str) -> str:
        return text if _TOKEN.match(text) else '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "; ".join([essence, *(f"{k}={value(v)}" for k, v in sorted(params.items()))])


def _multipart_digest(data: bytes, boundary: str, max_parts: int | None) -> str | None:
    """The digest of a multipart body's parts, in order: each part's headers (name, filename and
    content type among them) and bytes, length-prefixed so no two part lists share an encoding.
    The boundary, the preamble and the epilogue (which a handler never sees) are left out, so the
    same upload sent again with a new random boundary has the same digest. None for a body that
    does not parse as multipart (it is then fingerprinted by its bytes). ``RequestTooLargeError``
    past ``max_parts`` parts (Flask's ``MAX_FORM_PARTS``, counted as Werkzeug's own parser
    counts them): parsing stops there, as the handler's would."""
    decoder = MultipartDecoder(boundary.encode("latin-1", "replace"), max_parts=max_parts)
    outer = hashlib.sha256()
    parts = 0
    part: Any = None
    try:
        decoder.receive_data(data)
        decoder.receive_data(None)
        while True:
            event = decoder.next_event()
            if isinstance(event, Field | File):
                headers = list(event.headers.items())
                outer.update(len(headers).to_bytes(4, "big"))
                for name, value in headers:
                    for text in (name.lower(), value):
                        encoded = text.encode("utf-8", "surrogatepass")
                        outer.update(len(encoded).to_bytes(4, "big") + encoded)
                part = hashlib.sha256()
                parts += 1
            elif isinstance(event, Data):
                if part is None:
                    return None
                part.update(event.data)
                if not event.more_data:
                    outer.update(part.digest())
                    part = None
            elif isinstance(event, Epilogue):
                break
            elif isinstance(event, NeedData):
                return None  # the body ended inside a part: not a whole multipart body
    except RequestEntityTooLarge:
        raise RequestTooLargeError(f"a multipart body of more than {max_parts} parts (MAX_FORM_PARTS)") from None
    except ValueError:
        return None
    if part is not None:
        return None
    return hashlib.sha256(parts.to_bytes(4, "big") + outer.digest()).hexdigest()


# -- a route's chosen fingerprint: JSON pointers (RFC 6901) into the body ----------------------------


def parse_pointer(pointer: object) -> tuple[str, ...]:
    """The reference tokens of an RFC 6901 JSON pointer naming a member of the body
    (``"/client_ts"``, ``"/items/0/note"``, ``"/a~1b"`` for the key ``a/b``); ``ValueError`` for
    anything else, the root pointer ``""`` included (it names the whole body: the default)."""
    if not isinstance(pointer, str):
        raise TypeError(f"a fingerprint pointer must be a str such as '/client_ts', got {pointer!r}")
    if not pointer.startswith("/"):
        raise ValueError(
            f"fingerprint pointer {pointer!r} is not a JSON pointer (RFC 6901): it starts with '/', e.g. '/client_ts'"
            + (" (the root pointer '' names the whole body, which is the default)" if pointer == "" else "")
        )
    if re.search(r"~(?![01])", pointer):
        raise ValueError(f"fingerprint pointer {pointer!r}: '~' is written '~0' and '/' inside a name '~1' (RFC 6901)")
    if not pointer.isprintable():
        raise ValueError(f"fingerprint pointer {pointer!r} holds a control character")
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/"))


_ARRAY_INDEX: Final = re.compile(r"(?:0|[1-9][0-9]*)\Z")


@dataclass(frozen=True, slots=True)
class ChosenFingerprint:
    """What of a JSON body makes two requests the same, as a route declared it: only the members
    at ``include``'s pointers, or everything but those at ``exclude``'s (one of the two)."""

    pointers: tuple[str, ...]
    include: bool
    #: each pointer's reference tokens, parsed once when the route is declared
    tokens: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.pointers:
            raise ValueError("a chosen fingerprint names at least one JSON pointer")
        object.__setattr__(self, "tokens", tuple(parse_pointer(p) for p in self.pointers))

    def body(self, value: Any) -> tuple[str, Any]:
        """The member of the fingerprint that stands for the body, and its value: ``"included"``
        with the value at each pointer (``InvalidFingerprintError`` for one the body lacks), or
        ``"body"`` with the body, the members at the pointers taken out (absent ones: nothing to
        take out; an array element is replaced by null, so the indices after it stay)."""
        if self.include:
            picked: dict[str, Any] = {}
            for pointer, tokens in zip(self.pointers, self.tokens, strict=True):
                found, member = _resolve(value, tokens)
                if not found:
                    raise InvalidFingerprintError(
                        f"the request body has no {pointer}, which this route's fingerprint includes",
                        detail=f"the request body must hold {pointer} (this route's fingerprint_include)",
                    )
                picked[pointer] = member
            return "included", picked
        for tokens in self.tokens:
            found, parent = _resolve(value, tokens[:-1])
            last = tokens[-1]
            if not found:
                continue
            if isinstance(parent, dict):
                parent.pop(last, None)
            elif isinstance(parent, list) and _ARRAY_INDEX.match(last) and int(last) < len(parent):
                parent[int(last)] = None
        return "body", value


def _resolve(value: Any, tokens: Sequence[str]) -> tuple[bool, Any]:
    for token in tokens:
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and _ARRAY_INDEX.match(token) and int(token) < len(value):
            value = value[int(token)]
        else:
            return False, None
    return True, value


def _exact_json(value: Any) -> str:
    """JSON text of a body decoded by ``_EXACT_DECODER``: numbers with their digits as sent."""
    if isinstance(value, dict):
        return "{" + ", ".join(json.dumps(k) + ": " + _exact_json(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_exact_json(v) for v in value) + "]"
    if isinstance(value, decimal.Decimal):
        return str(value)
    return json.dumps(value)


def _chosen(rule: ChosenFingerprint, data: bytes, is_json: bool, fields: dict[str, Any]) -> str:
    """The fingerprint of a route that chose it: the request's members, and the body's as chosen."""
    text = ""
    if is_json and data:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
    ok, value = jsonb_value(text, _EXACT_DECODER) if text.strip() else (False, None)
    if not ok:
        raise InvalidFingerprintError(
            "the request body is not JSON, and this route's fingerprint names members of a JSON body",
            detail="this route's fingerprint names members of a JSON body: send a JSON body (application/json)",
        )
    member, chosen = rule.body(value)
    fields[member] = chosen
    if not rule.include:
        fields["excluded"] = list(rule.pointers)
    try:
        return _exact_json(fields)
    except RecursionError:  # pragma: no cover - the decoder refuses deeper bodies first
        raise InvalidFingerprintError("the request body is nested too deeply") from None


def request_json(
    data: bytes,
    view_args: Mapping[str, Any] | None,
    query: Mapping[str, list[str]],
    *,
    method: str | None,
    content_type: str | None,
    chosen: ChosenFingerprint | None = None,
    uploads: bool = False,
    max_parts: int | None = None,
) -> str | None:
    """The ``p_request`` JSON text for a request (see the module docstring). ``method`` is None when
    the endpoint scope names it (the default ``"<METHOD> <url rule>"``); ``content_type`` is the
    request's header, None without one; ``chosen`` the route's ``fingerprint_include`` or
    ``fingerprint_exclude``; ``uploads`` whether the route takes multipart uploads, whose parts
    (at most ``max_parts``, Flask's ``MAX_FORM_PARTS``) are then parsed. On any other route a
    multipart body is bytes like any other: what a client sends costs no more than hashing it.

    Raises ``InvalidFingerprintError`` when the path, query or media type holds what jsonb cannot
    (the body cannot: it falls back to its digest), or, on a route that chose its fingerprint, when
    the body is not JSON or lacks an included member; ``RequestTooLargeError`` for an upload of
    more than ``max_parts`` parts.
    """
    path = {name: _path_value(name, value) for name, value in (view_args or {}).items()}
    for name, values in query.items():
        _check_text(name, "query string")
        for item in values:
            _check_text(item, "query string")
    media, is_json, params = _media_type(content_type)
    if chosen is not None:
        return _chosen(chosen, data, is_json, {"method": method, "type": media, "path": path, "query": dict(query)})
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
    plain = posted and (
        (not data and media is None)
        or (media == "application/json" and body_value is not None and not wrapper_shaped and is_json)
    )
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
        parts = None
        if uploads and media is not None and media.startswith("multipart/") and params.get("boundary"):
            parts = _multipart_digest(data, params["boundary"], max_parts)
        if parts is not None and media is not None:  # the parts, not the transport: the type without its boundary
            fields["type"] = _written(media.split(";", 1)[0], {k: v for k, v in params.items() if k != "boundary"})
            fields["parts_sha256"] = parts
        else:
            fields["body_sha256"] = hashlib.sha256(data).hexdigest()
    wrapped = json.dumps(fields, sort_keys=True)
    if data and is_json:  # the body's own JSON text, unparsed (exact digits), as its first member
        wrapped = '{"body": ' + data.decode("utf-8") + ", " + wrapped[1:]
    return wrapped
