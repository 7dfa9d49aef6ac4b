"""Exceptions the shim raises to its callers (route code, app start-up, the CLI)."""

from __future__ import annotations

import click

#: Message of the malformed-key error, shared by the SQL API and the HTTP contract.
MALFORMED_KEY_MESSAGE = "Idempotency-Key must be a UUID string"
#: The ``error`` of a tracked route (required=True) called without the header.
KEY_REQUIRED_MESSAGE = "Idempotency-Key header is required"


class IdemError(Exception):
    """Base class of every error raised by idem_shim."""


class ConfigError(click.ClickException, IdemError, ValueError):
    """A configuration mistake (a weak IDEM_RESPONSE_KEY, no database URL, a bad pool size).

    A ``ValueError`` for the app that builds the settings; a ``click.ClickException`` so that
    ``flask idempotency …``, which builds the app before running the command, answers with one
    ``Error: …`` line and exit status 1 instead of a traceback.
    """


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


class StoreRefusedError(IdemError):
    """The SQL API refused a call for one request, with an SQLSTATE of its own (db.py maps each
    SQLSTATE to one of these subclasses; nothing else in the shim looks at SQLSTATEs)."""


class MalformedKeyError(StoreRefusedError):
    """The key is not a UUID (SQLSTATE 22023): the client's mistake, answered 400."""


class InvalidFingerprintError(StoreRefusedError, ValueError):
    """The request's path or query holds text the fingerprint cannot (a NUL, a lone surrogate, a
    number jsonb cannot hold): the client's mistake, answered 400 ``invalid_request_fingerprint``,
    never a store outage. Raised by the shim before the claim, or mapped from a data exception
    (SQLSTATE class 22) that ``p_request`` raised in ``idem_claim``."""


class InvalidArgumentError(StoreRefusedError):
    """Any other bad argument to the SQL API (SQLSTATE IDM00): a bug in the caller, never retried."""


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
