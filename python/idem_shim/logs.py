"""One structured log line per event: ``idempotency <event> k=v ...`` plus the same fields in
``extra`` (``record.idem_event``, ``record.idem``) for JSON log formatters.

Never logged: request or response bodies, and the key itself (only its first characters: at most 4,
and at most a quarter of it, ``key_hint``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .errors import StoreDownError, describe

if TYPE_CHECKING:
    from .metrics import Metrics

logger = logging.getLogger("idem_shim")


#: The most of a key a log line shows.
KEY_HINT_CHARACTERS = 4


def key_hint(key: str) -> str:
    """Enough of a key to correlate log lines with a client's report (its first characters, which
    an operator greps for), not enough to reuse or guess it: at most 4 characters and at most a
    quarter of the key, so a 16-character opaque key shows 4 (8 once showed half of it) and a
    UUID 4 of its 32 hexadecimal digits."""
    return key[: min(KEY_HINT_CHARACTERS, len(key) // 4)]


def error_text(exc: BaseException) -> str:
    """The ``error=`` field of a log line: the exception's class and ``describe``'s one line."""
    return f"{type(exc).__name__}: {describe(exc)}"


def _format(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'
    return text


def log_event(level: int, event: str, **fields: Any) -> None:
    shown = {name: value for name, value in fields.items() if value is not None}
    line = " ".join(f"{name}={_format(value)}" for name, value in shown.items())
    logger.log(level, "idempotency %s %s", event, line, extra={"idem_event": event, "idem": shown})


def store_outage(metrics: Metrics, level: int, exc: BaseException, *, endpoint: str, stage: str, **fields: Any) -> None:
    """A store error on a request's path, reported the one way: ``idempotency_store_errors_total``
    by endpoint and stage, and one ``store_unavailable`` line (claim on either tier, completion,
    failure, heartbeat). A request answered by the breaker (the store known down) is counted and
    logged at DEBUG only: the breaker's own line says it once (``breaker.py``)."""
    metrics.record_store_error(endpoint, stage)
    if isinstance(exc, StoreDownError):
        level = logging.DEBUG
    log_event(level, "store_unavailable", endpoint=endpoint, **fields, stage=stage, error=error_text(exc))
