"""What the shim stores from a handler's answer, and what a replay rebuilds from it (contract §4).

Stored by ``idem_complete``:

* **headers**: the answer's headers on the allow-list (``DEFAULT_REPLAY_HEADERS`` plus the app's
  ``IDEM_REPLAY_HEADERS``) as one JSON object ``{"Location": "/orders/16", ...}``; a header sent
  more than once is combined with ", " (RFC 9110 §5.3). Never a credential: ``Set-Cookie``,
  ``Authorization``, ``WWW-Authenticate``, ``Proxy-Authenticate``, every name the database's rule
  calls a credential (``credentials.credential_name``: the database refuses those) and every name
  that matches the wider ``CREDENTIAL_HEADER`` are off the list whatever the view returns.
* **body**: a JSON object answer (``application/json`` or ``*+json``) as itself: a replay gains
  ``"idempotency_replayed": true`` (with ``IDEM_REPLAY_BODY_MARKER = False``, stored as its bytes
  like any other body, so it replays byte for byte). Any other body (text, CSV, an empty 204, a JSON array or
  scalar, bytes that are not UTF-8) as its bytes, ``{"idem_raw": "text", "data": <text>}`` or
  ``{"idem_raw": "base64", "data": <base64>}``, and a replay sends those bytes unchanged.

Rows stored before the store kept headers have no headers and a body that is plain JSON: they replay as they
always did (a JSON object gains the flag, other JSON comes back as JSON, ``null`` as an empty body).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from werkzeug.wrappers import Response

from .credentials import credential_name
from .errors import ResponseRefusedError
from .fingerprint import jsonb_value

#: Replayed by default (contract §4). Matched without regard to case; stored under these spellings.
DEFAULT_REPLAY_HEADERS: Final = ("Location", "Content-Location", "ETag", "Link", "Content-Type")

#: A header whose name matches this is a credential and is never stored or replayed: Set-Cookie,
#: Cookie, Authorization, Proxy-Authorization, WWW-Authenticate, Proxy-Authenticate,
#: Authentication-Info, X-Auth-Token, X-Api-Key, X-CSRF-Token, X-Session-Id, ... Wider than the
#: database's rule (idem_credential_name, which idem_complete refuses): the shim also keeps back a
#: name that merely mentions a session or auth (X-Session-Expires).
CREDENTIAL_HEADER: Final = re.compile(
    r"auth|cookie|token|secret|passw|api[_-]?key|private[_-]?key|bearer|session|credential|csrf|xsrf",
    re.IGNORECASE,
)


def credential_header(name: str) -> bool:
    """True for a header name the shim never stores or replays: the database's rule, or wider."""
    return CREDENTIAL_HEADER.search(name) is not None or credential_name(name)


#: Headers that describe the message, not the answer: a replay computes its own.
FRAMING_HEADERS: Final = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "trailer",
        "te",
        "date",
        "idempotent-replayed",
        "idempotency-replayed",
        "idempotency-replay",
    }
)

#: The header that tells a replay of an answer over ``IDEM_MAX_STORED_RESPONSE_BYTES`` from the
#: answer itself: its status and headers came back, its body was never stored (anyonce's profile,
#: D12). Stored among the replayed headers by the shim alone: an app cannot list it.
OMITTED_HEADER: Final = "Idempotency-Replay"
OMITTED_VALUE: Final = "omitted"
#: The body stored for such an answer: no bytes.
OMITTED_BODY: Final = '{"idem_raw": "text", "data": ""}'

#: Control characters (horizontal tab aside) never go out in a header value.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,255}\Z")

#: The largest header value stored (the database refuses more).
MAX_HEADER_VALUE_BYTES: Final = 8192

RAW_MARKER: Final = "idem_raw"
_RESERVED_KEYS: Final = (RAW_MARKER, "idem_enc")
#: werkzeug turns these into URIs on the way out, so they may hold any text.
_IRI_HEADERS: Final = frozenset({"location", "content-location"})


def replay_header_name_ok(name: str) -> bool:
    """True for a name ``IDEM_REPLAYED_HEADERS`` may give the replay marker: an HTTP header name
    that is no credential and is not ``Idempotency-Replay`` (the omitted-body marker)."""
    return bool(_TOKEN.match(name)) and not credential_header(name) and name.lower() != OMITTED_HEADER.lower()


def replay_header_names(extra: Iterable[str]) -> tuple[str, ...]:
    """The allow-list: the defaults plus ``extra`` (``IDEM_REPLAY_HEADERS``), checked.

    Raises ``ValueError`` for a name that is not an HTTP header name, is a credential (never
    stored, whatever the config says) or describes the message rather than the answer.
    """
    names = list(DEFAULT_REPLAY_HEADERS)
    for name in extra:
        name = name.strip()
        if not _TOKEN.match(name):
            raise ValueError(f"idem_shim: IDEM_REPLAY_HEADERS: {name!r} is not an HTTP header name")
        if credential_header(name):
            raise ValueError(
                f"idem_shim: IDEM_REPLAY_HEADERS may not list {name!r}: credential headers (cookies, "
                "authorization, tokens, keys, sessions) are never stored for replay"
            )
        if name.lower() in FRAMING_HEADERS:
            raise ValueError(f"idem_shim: IDEM_REPLAY_HEADERS may not list {name!r}: a replay computes its own")
        if name.lower() not in (n.lower() for n in names):
            names.append(name)
    return tuple(names)


# -- storing -----------------------------------------------------------------------------------


def stored_headers(response: Response, names: tuple[str, ...], max_bytes: int) -> str:
    """The ``p_response_headers`` JSON text for an answer; raises ``ResponseRefusedError``."""
    spelled = _spellings(names)
    found: dict[str, list[str]] = {}
    for header, value in response.headers.items():  # one pass: the answer has a few headers
        name = spelled.get(header.lower())
        if name is not None:
            found.setdefault(name, []).append(value)
    kept: dict[str, str] = {}
    for name in names if found else ():  # stored in the allow-list's order and spelling
        if name not in found:
            continue
        value = ", ".join(found[name])
        size = len(value.encode("utf-8"))
        if size > MAX_HEADER_VALUE_BYTES:
            raise ResponseRefusedError(
                f"response header {name} is {size} bytes, over the {MAX_HEADER_VALUE_BYTES} a replay stores"
            )
        kept[name] = value
    text = json.dumps(kept, ensure_ascii=False)
    if kept and len(text.encode("utf-8")) > max_bytes:
        raise ResponseRefusedError(
            f"response headers to store are {len(text.encode('utf-8'))} bytes, over IDEM_MAX_BODY_BYTES ({max_bytes})"
        )
    return text


def omitted_headers(headers: str) -> str:
    """``stored_headers``' text with ``Idempotency-Replay: omitted`` added: the row of an answer
    whose body is over ``IDEM_MAX_STORED_RESPONSE_BYTES`` (stored as ``OMITTED_BODY``)."""
    kept = json.loads(headers)
    kept[OMITTED_HEADER] = OMITTED_VALUE
    return json.dumps(kept, ensure_ascii=False)


def oversized(response: Response, cap: int | None, mode: str) -> bool:
    """True when the answer's body is over ``cap`` (``IDEM_MAX_STORED_RESPONSE_BYTES``) and is to
    be stored without it; raises ``ResponseRefusedError`` instead when ``mode`` is ``"refuse"``."""
    if cap is None:
        return False
    size = len(response.get_data())
    if size <= cap:
        return False
    if mode == "refuse":
        raise ResponseRefusedError(
            f"response body is {size} bytes, over IDEM_MAX_STORED_RESPONSE_BYTES ({cap}), "
            'and IDEM_OVERSIZED_RESPONSE is "refuse"'
        )
    return True


def body_omitted(stored: Any) -> bool:
    """True when a stored row is an answer whose body was not stored (``omitted_headers``)."""
    return isinstance(stored, Mapping) and stored.get(OMITTED_HEADER) == OMITTED_VALUE


@functools.lru_cache(maxsize=8)
def _spellings(names: tuple[str, ...]) -> dict[str, str]:
    """The allow-list by lower-case name (an app has one list: computed once)."""
    return {name.lower(): name for name in names}


def stored_body(response: Response, *, as_json: bool = True) -> str:
    """The ``p_response_body`` JSON text for an answer; never SQL NULL (see the module docstring).
    ``as_json=False`` (``IDEM_REPLAY_BODY_MARKER = False``) stores a JSON object as its bytes too,
    so its replay is the same bytes."""
    data = response.get_data()
    if as_json and data and response.is_json:
        try:
            text: str | None = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None:
            ok, value = jsonb_value(text)
            if ok and isinstance(value, dict) and not any(k in value for k in _RESERVED_KEYS):
                return text  # a JSON object: stored as itself, replayed with the flag
    try:
        raw_text = data.decode("utf-8")
    except UnicodeDecodeError:
        raw_text = None
    if raw_text is not None and "\x00" not in raw_text:  # jsonb strings cannot hold U+0000
        return json.dumps({RAW_MARKER: "text", "data": raw_text}, ensure_ascii=False)
    return json.dumps({RAW_MARKER: "base64", "data": base64.b64encode(data).decode("ascii")})


# -- replaying ---------------------------------------------------------------------------------


def raw_bytes(body: Any) -> bytes | None:
    """The bytes of a body stored raw, or None when it is stored as JSON."""
    if not isinstance(body, dict) or len(body) != 2 or not isinstance(body.get("data"), str):
        return None
    kind = body.get(RAW_MARKER)
    if kind == "text":
        return str(body["data"]).encode("utf-8")
    if kind == "base64":
        try:
            return base64.b64decode(body["data"], validate=True)
        except (binascii.Error, ValueError):
            return None
    return None


def sendable(name: str, value: Any) -> bool:
    """True if a stored header can go out as it is: never a credential, never a broken value.
    A replay drops what it cannot honour rather than fail (no 5xx from a stored header)."""
    if not isinstance(value, str) or not _TOKEN.match(name) or credential_header(name):
        return False
    if len(value) > MAX_HEADER_VALUE_BYTES or _CONTROL.search(value):
        return False
    if name.lower() not in _IRI_HEADERS:
        try:
            value.encode("latin-1")  # what WSGI servers send header values as
        except UnicodeEncodeError:
            return False
    return True


def is_json_type(content_type: str) -> bool:
    mimetype = content_type.split(";", 1)[0].strip().lower()
    return mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))


def replay_headers(stored: Any, names: tuple[str, ...]) -> dict[str, str]:
    """The stored headers a replay sends: those on the current allow-list that can be sent."""
    if not isinstance(stored, Mapping):
        return {}
    allowed = {n.lower() for n in names}
    return {
        name: value
        for name, value in stored.items()
        if isinstance(name, str) and name.lower() in allowed and sendable(name, value)
    }
