"""Exceptions the shim raises to its callers (route code, app start-up, the CLI), and the one
way any of them (or a database error) is said in one line (``describe``).

Nothing here imports click or the schema tool: the request path loads this module.
"""

from __future__ import annotations

import re

#: Message of the malformed-key error, shared by the SQL API and the HTTP contract.
MALFORMED_KEY_MESSAGE = "Idempotency-Key must be a UUID string"
#: The same 400's text where ``key_format="opaque"`` is in force (contract §4b: the text names the
#: rule in force; a UUID is one such key too).
OPAQUE_MALFORMED_KEY_MESSAGE = "Idempotency-Key must be one key of 16 to 255 visible ASCII characters"
#: The ``error`` of a tracked route (required=True) called without the header.
KEY_REQUIRED_MESSAGE = "Idempotency-Key header is required"


class IdemError(Exception):
    """Base class of every error raised by idem_shim."""


class ConfigError(IdemError, ValueError):
    """A configuration mistake (a weak IDEM_RESPONSE_KEY, no database URL, a bad pool size, a
    value that does not parse). A ``ValueError`` for the app that builds the settings; the CLI
    says it in one line (``describe``) and exits 1."""


class MigrateError(IdemError):
    """The schema tool (``idem migrate|sql|status``) refused or failed, said in one line; nothing
    of the migration was committed."""


class NotInitialisedError(IdemError, RuntimeError):
    """The decorator or an accessor ran in an app where ``Idem.init_app`` was never called."""


class SchemaError(IdemError):
    """The database lacks the SQL API, or has an older version than this code needs."""


class StoreUnavailableError(IdemError, RuntimeError):
    """The idempotency store could not be reached, did not answer in time, or errored.

    ``connection_lost`` is True when no usable connection was had (connect failure, pool
    timeout, a connection that broke); False when the server answered with an error (statement
    timeout, lock timeout, missing privilege). ``connection()`` raises it in passthrough when the
    store's pool cannot give a connection: an app with another database path may catch it (it is
    a ``RuntimeError``, like ``OutsideRequestError``) and fall back to that path.
    """

    def __init__(self, message: str, *, connection_lost: bool) -> None:
        super().__init__(message)
        self.connection_lost = connection_lost


class StoreDownError(StoreUnavailableError):
    """The store was found down a moment ago and no probe has found it back yet (``breaker.py``):
    answered at once, without asking the pool; one log line per change of state, none per request."""

    def __init__(self, message: str) -> None:
        super().__init__(message, connection_lost=True)


class StoreBusyError(StoreUnavailableError):
    """The pool had no connection for this request in time, and the store answers: a probe
    connected, or the server refused one more connection with an error of its own (``53300``
    too many connections, ``57P03``, ...). The store is up, so the breaker stays closed and
    nothing runs without dedup: this request alone is answered 503 with ``Retry-After``, on
    either tier (``breaker.py``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, connection_lost=True)


class StoreRefusedError(IdemError):
    """The SQL API refused a call for one request, with an SQLSTATE of its own (sqlstates.py maps
    each SQLSTATE to one of these subclasses; nothing else in the shim looks at SQLSTATEs)."""


class MalformedKeyError(StoreRefusedError):
    """The key is not a UUID (SQLSTATE 22023): the client's mistake, answered 400."""


class InvalidFingerprintError(StoreRefusedError, ValueError):
    """The request's path or query holds text the fingerprint cannot (a NUL, a lone surrogate, a
    number jsonb cannot hold), or, on a route that chose its fingerprint, the body is not JSON or
    lacks an included member: the client's mistake, answered 400 ``invalid_request_fingerprint``
    (with ``detail`` for the client when it has one), never a store outage. Raised by the shim
    before the claim, or mapped from a data exception (SQLSTATE class 22) that ``p_request``
    raised in ``idem_claim``."""

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail


class RequestTooLargeError(IdemError, ValueError):
    """The request is more than the route takes: a multipart upload of more parts than
    ``MAX_FORM_PARTS`` (Werkzeug's bound, which the handler's own parse would hit). Raised by the
    fingerprint before the claim and answered 413 ``request_too_large``: nothing stored or run."""


class InvalidArgumentError(StoreRefusedError):
    """Any other bad argument to the SQL API (SQLSTATE IDM00): a bug in the caller, never retried."""


class UnknownUserError(InvalidArgumentError):
    """The user scope names no ``users`` row (SQLSTATE 23503): the host's bug (a session for a
    deleted user, a job given a wrong id), never a store outage."""


class ClaimLostError(StoreRefusedError):
    """Our claim was healed, completed, failed or erased by someone else (SQLSTATE IDM01).

    Raised by ``heartbeat()``; a handler that gets it should stop: its writes will not commit.
    """


class ContentionError(StoreRefusedError):
    """``idem_claim`` gave up on a key that kept changing under contention (SQLSTATE IDM02)."""


class UndecryptableResponseError(StoreRefusedError):
    """A replay's stored body is encrypted under a key the app did not give (SQLSTATE IDM03)."""


class ResponseRefusedError(StoreRefusedError):
    """The handler's answer cannot be stored for replay: the database refused it (SQLSTATE IDM04,
    e.g. a credential-named field), or the shim did (a header over 8 KiB, a header set over
    ``IDEM_MAX_BODY_BYTES``). Either way the writes roll back, the key is failed, the client gets
    a 500 and the log an ERROR ``response_refused`` line."""


class OutsideRequestError(IdemError, RuntimeError):
    """``connection()``, ``heartbeat()``, ``downstream_key()`` or ``attempt()`` was called outside a
    route wrapped by the decorator."""


class NotClaimedError(IdemError, RuntimeError):
    """``downstream_key()`` or ``attempt()`` in a decorated request that holds no claim (no
    ``Idempotency-Key`` header, the kill switch, a fail-open route with the store down): there is
    no idempotency to forward. The message says which."""


#: libpq's preamble before the reason a connection failed, and the server's severity word.
_PREAMBLE = re.compile(r"^(?:connection failed:\s*)?(?:connection to server .*? failed:\s*)?(?:(?:FATAL|ERROR):\s*)?")
#: A control character in a message (a name in it is its maker's text: a table's, an application's):
#: C0, DEL and C1 (CSI starts a terminal's escape, NEL ends a line), and the Unicode line and
#: paragraph separators. The server's own screens ([[:cntrl:]]) miss C1 where the database's
#: LC_CTYPE is C, and U+2028/9 everywhere.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def describe(exc: BaseException) -> str:
    """One line for a person: the server's primary message, or libpq's reason a connection failed
    (without the host and port it repeats), else the exception's first non-blank line, else its
    class name. Every one-line error of the CLIs and the logs is made here."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = str(primary) if primary else str(exc)
    # lines as the server and libpq end them: a NEL or U+2028 a name holds is no line's end
    line = next((ln.strip() for ln in re.split(r"\r\n|\r|\n", text) if ln.strip()), "")
    line = CONTROL.sub("?", re.sub(r"[ \t\n\r]+", " ", _PREAMBLE.sub("", line)).strip())
    return line or type(exc).__name__


# -- the duplicate outcomes of idem_shim.idempotent() (jobs.py): what a caller that is not an HTTP
#    client gets instead of a 409 or a 422 ---------------------------------------------------------


class DuplicateError(IdemError):
    """``idempotent()`` found the key already used in a way that gives no result to return."""


class InFlightError(DuplicateError):
    """Another execution holds the key (409 ``idempotency_in_flight`` over HTTP): retry the
    same call after ``retry_after_ms`` (a queue consumer leaves the message for later)."""

    def __init__(self, message: str, *, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class PreviousFailedError(DuplicateError):
    """The key's execution failed and was kept failed (``on_failure="keep"``; 409
    ``idempotency_previous_failed`` over HTTP): it is not run again under this key."""


class KeyMismatchError(DuplicateError):
    """The key was first used with other arguments (422 ``idempotency_key_body_mismatch``)."""
