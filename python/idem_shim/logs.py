"""One structured log line per event: ``idempotency <event> k=v ...`` plus the same fields in
``extra`` (``record.idem_event``, ``record.idem``) for JSON log formatters.

Never logged: request or response bodies, and the key itself (only its first characters: at most 4,
and at most a quarter of it, ``key_hint``).

In a process whose logging nobody configured (no handler on the root logger nor on ``idem_shim``),
Python's last resort printed a WARNING as its bare message, with no time, level or source;
``Unconfigured`` prints it with them instead, to stderr as before, and steps aside as soon as the
app (``logging.basicConfig``, ``dictConfig``, a gunicorn ``--log-config``) configures any.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

from .errors import StoreDownError, describe

if TYPE_CHECKING:
    from .metrics import Metrics

logger = logging.getLogger("idem_shim")

#: What a line says where logging was never configured (gunicorn's error log looks alike).
UNCONFIGURED_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"


class Unconfigured(logging.StreamHandler):  # type: ignore[type-arg]
    """Python's last resort with the time, the pid, the level and the logger: stderr, for a process
    where no handler is configured; it hands every record over once one is (the record then
    reaches that one by propagation, printed once)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(UNCONFIGURED_FORMAT))

    @property
    def stream(self) -> Any:  # sys.stderr when emitting, as the last resort's (pytest swaps it)
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass

    def handle(self, record: logging.LogRecord) -> bool:
        if logging.getLogger().handlers or any(h is not self for h in logger.handlers):
            return False
        return bool(super().handle(record))


if not any(isinstance(h, Unconfigured) for h in logger.handlers):  # a module reloaded: still one
    logger.addHandler(Unconfigured())


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
