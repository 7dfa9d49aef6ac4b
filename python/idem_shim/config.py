"""Configuration keys of the shim: every ``IDEM_*`` key is defined here, once.

A Flask app sets them in ``app.config`` before ``Idem.init_app(app)``; ``Settings.from_app``
reads them (with their defaults) into one immutable object kept in ``app.extensions["idem"]``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .errors import ConfigError
from .replay import DEFAULT_REPLAY_HEADERS, replay_header_names


class ConfigVars:
    """Names of the configuration keys (the flask-limiter ``ConfigVars`` pattern)."""

    DATABASE_URL: Final = "IDEM_DATABASE_URL"
    POOL_MIN_SIZE: Final = "IDEM_POOL_MIN_SIZE"
    POOL_MAX_SIZE: Final = "IDEM_POOL_MAX_SIZE"
    POOL_TIMEOUT: Final = "IDEM_POOL_TIMEOUT"
    POOL_RECONNECT_TIMEOUT: Final = "IDEM_POOL_RECONNECT_TIMEOUT"
    CONNECT_TIMEOUT: Final = "IDEM_CONNECT_TIMEOUT"
    PREPARE_THRESHOLD: Final = "IDEM_PREPARE_THRESHOLD"
    STATEMENT_TIMEOUT_MS: Final = "IDEM_STATEMENT_TIMEOUT_MS"
    MAX_BODY_BYTES: Final = "IDEM_MAX_BODY_BYTES"
    STALE_AFTER_SECONDS: Final = "IDEM_STALE_AFTER_SECONDS"
    WAIT_MS: Final = "IDEM_WAIT_MS"
    CHECK_SCHEMA: Final = "IDEM_CHECK_SCHEMA"
    UNAVAILABLE_RETRY_AFTER_SECONDS: Final = "IDEM_UNAVAILABLE_RETRY_AFTER_SECONDS"
    APPLICATION_NAME: Final = "IDEM_APPLICATION_NAME"
    RESPONSE_KEY: Final = "IDEM_RESPONSE_KEY"
    RESPONSE_KEY_FALLBACK: Final = "IDEM_RESPONSE_KEY_FALLBACK"
    REPLAY_HEADERS: Final = "IDEM_REPLAY_HEADERS"
    ERROR_FORMAT: Final = "IDEM_ERROR_FORMAT"
    PROBLEM_TYPE_BASE: Final = "IDEM_PROBLEM_TYPE_BASE"


#: ``IDEM_ERROR_FORMAT`` values: today's ``{"error": ...}`` bodies (ADR-0138), or RFC 9457.
ERROR_FORMATS: Final = ("json", "problem+json")


#: Default of every key; ``IDEM_DATABASE_URL`` falls back to ``DATABASE_URL`` (config, then env).
DEFAULTS: Final[Mapping[str, Any]] = {
    ConfigVars.DATABASE_URL: None,
    ConfigVars.POOL_MIN_SIZE: 1,
    ConfigVars.POOL_MAX_SIZE: 10,
    ConfigVars.POOL_TIMEOUT: 2.0,
    ConfigVars.POOL_RECONNECT_TIMEOUT: 5.0,
    ConfigVars.CONNECT_TIMEOUT: 3,
    ConfigVars.PREPARE_THRESHOLD: 5,
    ConfigVars.STATEMENT_TIMEOUT_MS: 5000,
    ConfigVars.MAX_BODY_BYTES: 1024 * 1024,
    ConfigVars.STALE_AFTER_SECONDS: 30,
    ConfigVars.WAIT_MS: 0,
    ConfigVars.CHECK_SCHEMA: True,
    ConfigVars.UNAVAILABLE_RETRY_AFTER_SECONDS: 1,
    ConfigVars.APPLICATION_NAME: "idem_shim",
    ConfigVars.RESPONSE_KEY: None,
    ConfigVars.RESPONSE_KEY_FALLBACK: None,
    # Headers replayed besides Location, Content-Location, ETag, Link, Content-Type (a list, or
    # one comma-separated string); never a credential header (refused at init_app).
    ConfigVars.REPLAY_HEADERS: (),
    ConfigVars.ERROR_FORMAT: "json",
    # Prefix of an RFC 9457 problem's "type" (a tag URI: stable, never dereferenced); an app may
    # point it at its own documentation, e.g. "https://api.example.com/problems/".
    ConfigVars.PROBLEM_TYPE_BASE: "tag:idem,2026:problem:",
}

#: Environment variable read on every request; "0" (or false/off/no) turns the decorator into a
#: passthrough without a restart.
KILL_SWITCH_ENV: Final = "FLAG_IDEMPOTENCY_MIDDLEWARE"
_OFF_VALUES: Final = frozenset({"0", "false", "off", "no"})


def middleware_enabled() -> bool:
    """Read the kill switch now (per request, so flipping it needs no restart)."""
    value = os.environ.get(KILL_SWITCH_ENV)
    return value is None or value.strip().lower() not in _OFF_VALUES


def _optional_int(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in {"", "none"}):
        return None
    return int(value)


@dataclass(frozen=True, slots=True)
class Settings:
    """The shim's configuration, resolved once at ``init_app``."""

    database_url: str
    pool_min_size: int
    pool_max_size: int
    pool_timeout: float
    pool_reconnect_timeout: float
    connect_timeout: int
    prepare_threshold: int | None
    statement_timeout_ms: int | None
    max_body_bytes: int
    stale_after_seconds: float
    wait_ms: int
    check_schema: bool
    unavailable_retry_after_seconds: int
    application_name: str
    replay_headers: tuple[str, ...] = DEFAULT_REPLAY_HEADERS
    error_format: str = "json"
    problem_type_base: str = "tag:idem,2026:problem:"
    # Secrets: never in a repr, a log line or an error message.
    response_key: str | None = field(default=None, repr=False)
    response_key_fallback: str | None = field(default=None, repr=False)

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> Settings:
        def get(name: str) -> Any:
            return config.get(name, DEFAULTS[name])

        url = get(ConfigVars.DATABASE_URL) or config.get("DATABASE_URL") or os.environ.get(
            "DATABASE_URL"
        )
        if not url:
            raise ConfigError(
                f"idem_shim: set {ConfigVars.DATABASE_URL} (or DATABASE_URL) to the database URL"
            )
        settings = cls(
            database_url=str(url),
            pool_min_size=int(get(ConfigVars.POOL_MIN_SIZE)),
            pool_max_size=int(get(ConfigVars.POOL_MAX_SIZE)),
            pool_timeout=float(get(ConfigVars.POOL_TIMEOUT)),
            pool_reconnect_timeout=float(get(ConfigVars.POOL_RECONNECT_TIMEOUT)),
            connect_timeout=int(get(ConfigVars.CONNECT_TIMEOUT)),
            prepare_threshold=_optional_int(get(ConfigVars.PREPARE_THRESHOLD)),
            statement_timeout_ms=_optional_int(get(ConfigVars.STATEMENT_TIMEOUT_MS)),
            max_body_bytes=int(get(ConfigVars.MAX_BODY_BYTES)),
            stale_after_seconds=float(get(ConfigVars.STALE_AFTER_SECONDS)),
            wait_ms=int(get(ConfigVars.WAIT_MS)),
            check_schema=_as_bool(get(ConfigVars.CHECK_SCHEMA)),
            unavailable_retry_after_seconds=int(get(ConfigVars.UNAVAILABLE_RETRY_AFTER_SECONDS)),
            application_name=str(get(ConfigVars.APPLICATION_NAME)),
            response_key=_optional_str(get(ConfigVars.RESPONSE_KEY)),
            response_key_fallback=_optional_str(get(ConfigVars.RESPONSE_KEY_FALLBACK)),
            replay_headers=replay_header_names(_names(get(ConfigVars.REPLAY_HEADERS))),
            error_format=str(get(ConfigVars.ERROR_FORMAT)).strip().lower(),
            problem_type_base=str(get(ConfigVars.PROBLEM_TYPE_BASE)),
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        for name, key in ((ConfigVars.RESPONSE_KEY, self.response_key),
                          (ConfigVars.RESPONSE_KEY_FALLBACK, self.response_key_fallback)):
            if key is not None and (len(key) < 32 or len(set(key)) < 12):
                raise ConfigError(
                    f"idem_shim: {name} must be a generated secret of at least 32 characters "
                    "(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
                )
        if self.error_format not in ERROR_FORMATS:
            raise ValueError(
                f"idem_shim: {ConfigVars.ERROR_FORMAT} must be one of {', '.join(ERROR_FORMATS)} "
                f"(got {self.error_format!r})"
            )
        if not 0 <= self.pool_min_size <= self.pool_max_size or self.pool_max_size < 1:
            raise ConfigError("idem_shim: need 0 <= IDEM_POOL_MIN_SIZE <= IDEM_POOL_MAX_SIZE, >= 1")
        if self.pool_timeout <= 0 or self.pool_reconnect_timeout <= 0 or self.connect_timeout < 1:
            raise ConfigError(
                "idem_shim: IDEM_POOL_TIMEOUT > 0, IDEM_POOL_RECONNECT_TIMEOUT > 0, IDEM_CONNECT_TIMEOUT >= 1"
            )
        if self.max_body_bytes < 0 or self.stale_after_seconds <= 0 or not 0 <= self.wait_ms <= 60_000:
            raise ConfigError(
                "idem_shim: IDEM_MAX_BODY_BYTES >= 0, IDEM_STALE_AFTER_SECONDS > 0, 0 <= IDEM_WAIT_MS <= 60000"
            )
        if self.statement_timeout_ms is not None and self.statement_timeout_ms <= self.wait_ms:
            raise ConfigError(
                "idem_shim: IDEM_STATEMENT_TIMEOUT_MS must exceed IDEM_WAIT_MS (a waiting claim "
                "would otherwise be cancelled)"
            )


def _names(value: Any) -> tuple[str, ...]:
    """Header names from a list/tuple, or from one comma-separated string (the environment)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return tuple(str(part) for part in value)


def _optional_str(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return str(value)


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in _OFF_VALUES | {""}
    return bool(value)
