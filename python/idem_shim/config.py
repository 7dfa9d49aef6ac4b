"""Configuration keys of the shim: every ``IDEM_*`` key is declared here, once.

Each field of ``Settings`` is one key, ``IDEM_`` + its name in capitals: its raw default (what
``app.config`` would hold), its parser (strings from the environment included) and its line in
docs/shim.md's table are declared together in the field. ``ConfigVars``, ``DEFAULTS``,
``Settings.from_mapping`` and ``reference_table()`` are derived from those declarations.

A Flask app sets the keys in ``app.config`` before ``Idem.init_app(app)``, or in the environment:
``Settings.from_mapping`` reads each key from the config, else from the environment, else its
default, into one immutable object kept in ``app.extensions["idem"]``. The secrets
(``IDEM_RESPONSE_KEY``, its fallback) are never in a repr, a log line or an error message.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import SimpleNamespace
from typing import Any, Final

from .errors import ConfigError, describe
from .health_gauges import OTHER_SCOPE
from .logs import log_event
from .replay import replay_header_name_ok, replay_header_names

PREFIX: Final = "IDEM_"

#: ``IDEM_PROBLEM_TYPE_BASE``'s default: a tag URI, replaced by ``IDEM_DOCS_URL`` when that is set.
DEFAULT_PROBLEM_TYPE_BASE: Final = "tag:idem,2026:problem:"

#: ``IDEM_ERROR_FORMAT`` values: today's ``{"error": ...}`` bodies (contract §4), or RFC 9457.
ERROR_FORMATS: Final = ("json", "problem+json")

#: ``IDEM_OVERSIZED_RESPONSE`` values: replay an oversized answer without its body, or refuse it.
OVERSIZED_RESPONSES: Final = ("omit", "refuse")

#: ``IDEM_KEY_FORMAT`` values (the SQL API's ``p_key_format``): a UUID (contract §4b's key rule),
#: or an opaque key of 16 to 255 visible ASCII characters (Stripe's bound) that is one key (no ``,``, ``;``,
#: ``"`` nor ``\\``: fingerprint.OPAQUE_KEY_PATTERN).
KEY_FORMATS: Final = ("uuid", "opaque")

# The bounds of the SQL API the shim checks itself, each written once: a route's
# ``ttl_hours`` and ``wait_ms`` are checked when its module is imported and ``IDEM_WAIT_MS`` at
# init_app, because idem_claim would refuse them (IDM00) only when a request comes, turning every
# tracked request of that route into a 500. tests/python/unit/test_config.py reads them back
# from 010_idem_claim.sql, so the copies cannot drift.
#: idem_claim's largest ``p_ttl``: retention is capped at 7 days (contract §2).
MAX_TTL_HOURS: Final = 7 * 24
#: idem_claim's largest ``p_wait_ms``.
MAX_WAIT_MS: Final = 60_000
#: idem_claim's shortest ``p_stale_after`` from the app's role (shorter is the owner's and a DBA's).
MIN_STALE_AFTER_SECONDS: Final = 1

#: Environment variable read on every request; "0" (or false/off/no) turns the decorator into a
#: passthrough without a restart.
KILL_SWITCH_ENV: Final = "FLAG_IDEMPOTENCY_MIDDLEWARE"
_OFF_VALUES: Final = frozenset({"0", "false", "off", "no"})


class _KillSwitch:
    """The kill switch as this process last saw it: one log line when it turns on, one when it
    turns off, never one per request."""

    def __init__(self) -> None:
        self.on = False
        self._lock = threading.Lock()

    def seen(self, on: bool) -> None:
        if on == self.on:
            return
        with self._lock:
            if on == self.on:
                return
            self.on = on
        if on:
            log_event(
                logging.WARNING,
                "kill_switch_on",
                variable=KILL_SWITCH_ENV,
                effect="every decorated route runs without idempotency (no claim, no dedup)",
            )
        else:
            log_event(
                logging.WARNING, "kill_switch_off", variable=KILL_SWITCH_ENV, effect="decorated routes dedupe again"
            )


_KILL_SWITCH: Final = _KillSwitch()


def middleware_enabled() -> bool:
    """Read the kill switch now (per request, so flipping it needs no restart)."""
    value = os.environ.get(KILL_SWITCH_ENV)
    enabled = value is None or value.strip().lower() not in _OFF_VALUES
    _KILL_SWITCH.seen(not enabled)
    return enabled


# -- parsers: a value from app.config (or a string from the environment) -> the setting --------


def _optional_int(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in {"", "none"}):
        return None
    return int(value)


def _optional_str(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return str(value)


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in _OFF_VALUES | {""}
    return bool(value)


def _names(value: Any) -> tuple[str, ...]:
    """Header names from a list/tuple, or from one comma-separated string (the environment)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return tuple(str(part) for part in value)


#: A scope is stored in ``scope_endpoint`` and used as a metric label: keep it a short name.
#: idem_claim refuses a longer one, or one with a control character (idem_refuse_endpoint).
MAX_SCOPE_LENGTH: Final = 200


def validate_scope(scope: object) -> str:
    """A declared scope: a non-empty string of printable characters, at most 200 of them, not
    the gauges' ``other``."""
    if not isinstance(scope, str) or not scope.strip() or scope != scope.strip():
        raise ValueError(f"scope must be a non-empty name without surrounding spaces, got {scope!r}")
    if len(scope) > MAX_SCOPE_LENGTH or not scope.isprintable():
        raise ValueError(f"scope must be at most {MAX_SCOPE_LENGTH} printable characters, got {scope[:40]!r}")
    if scope == OTHER_SCOPE:
        raise ValueError(f"scope {OTHER_SCOPE!r} is reserved: the store gauges' series of every undeclared endpoint")
    return scope


def _scopes(value: Any) -> tuple[str, ...]:
    return tuple(validate_scope(scope) for scope in _names(value))


def _replay_headers(value: Any) -> tuple[str, ...]:
    return replay_header_names(_names(value))


def _lowered(value: Any) -> str:
    return str(value).strip().lower()


def _key(default: Any, parse: Callable[[Any], Any], doc: str, *, shown: str | None = None, secret: bool = False) -> Any:
    """Declare one key: its raw default, its parser and its line in the docs' table."""
    return field(
        default=parse(default),
        repr=not secret,  # secrets: never in a repr, a log line or an error message
        metadata={"default": default, "parse": parse, "doc": doc, "shown": shown},
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """The shim's configuration, resolved once at ``init_app``: one field per ``IDEM_*`` key."""

    database_url: str = _key(
        None,
        _optional_str,
        "the database with the SQL API; the role should be a member of `idem_app`",
        shown="`DATABASE_URL` (config, then environment)",
    )
    admin_database_url: str = _key(
        None,
        _optional_str,
        "the URL of the CLI's admin verbs (`flask idempotency cleanup`, `stats`, `rotate-response-key`): "
        "a role that is a member of `idem_admin`, such as a DBA's (the app's role may not run them)",
        shown="the app's URL",
    )
    dsr_database_url: str = _key(
        None,
        _optional_str,
        "the URL of the CLI's data-subject verbs (`flask idempotency erase-user`, `export-user`): a role that is "
        "a member of `idem_dsr` (the GDPR job's) or `idem_admin`; the app's role may not run them, since they "
        "read and free any user's keys",
        shown="`IDEM_ADMIN_DATABASE_URL`'s",
    )
    pool_min_size: int = _key(1, int, "psycopg_pool's minimum size, per process (gunicorn: per worker)")
    pool_max_size: int = _key(10, int, "psycopg_pool's maximum size, per process (gunicorn: per worker)")
    pool_timeout: float = _key(
        2.0,
        float,
        "seconds to wait for a pool connection before the store counts as unavailable (bounds a 503's latency)",
    )
    pool_reconnect_timeout: float = _key(
        5.0,
        float,
        "seconds after which the pool gives up a failing connection attempt, so the next request retries at once",
    )
    store_probe_interval: float = _key(
        0.5,
        float,
        "seconds between two probes of a store found down (a connection that broke or a pool that timed out, "
        "and a probe the store did not answer: a server that refuses the connection with an error of its own "
        "is up, see **Busy is not down**): until a probe is answered, decorated requests are answered at once "
        "(Tier 1: 503; Tier 2: the handler runs without dedup) instead of each waiting `IDEM_POOL_TIMEOUT`. "
        "One probe at a time per process, started by a request, which waits for it up to this long; "
        "one log line per change of state (`store_down`, `store_back`)",
    )
    connect_timeout: int = _key(3, int, "libpq `connect_timeout`, in seconds")
    prepare_threshold: int | None = _key(
        5,
        _optional_int,
        "psycopg's `prepare_threshold`; `None` disables prepared statements "
        "(PgBouncer in transaction mode before 1.21)",
    )
    libpq_path: bool = _key(
        True,
        _as_bool,
        "send the claim, and the completion with the handler's COMMIT, through libpq's own calls "
        "(`prepared.py`, the same SQL and round trips, less worker CPU); `false` takes psycopg's "
        "cursor and pipeline instead, the path before it",
    )
    statement_timeout_ms: int | None = _key(
        5000,
        _optional_int,
        "`statement_timeout` of the shim's connections, set as a startup option "
        "(appended to any `options` in the URL). It applies to the handler's statements too, since "
        "they share the connection. `None` leaves the server's setting (use it if your pooler refuses "
        "the `options` startup parameter, and set the timeout on the role instead). Must exceed "
        "`IDEM_WAIT_MS`.",
    )
    max_body_bytes: int = _key(1024 * 1024, int, "larger tracked bodies get 413")
    stale_after_seconds: float = _key(
        30, float, "an in-flight holder older than this is dead (match gunicorn's worker timeout)"
    )
    wait_ms: int = _key(0, int, f"default of the decorator's `wait_ms` (at most {MAX_WAIT_MS})")
    check_schema: bool = _key(True, _as_bool, "check `public.idem_schema_version()` at `init_app`")
    unavailable_retry_after_seconds: int = _key(1, int, "`Retry-After` of a 503")
    application_name: str = _key(
        "idem_shim", str, "`application_name` of the shim's connections (see them in `pg_stat_activity`)"
    )
    response_key: str | None = _key(
        None,
        _optional_str,
        "store response bodies encrypted under this generated secret (>= 32 characters)",
        secret=True,
    )
    response_key_fallback: str | None = _key(
        None, _optional_str, "the previous key during a rotation: bodies stored under it still replay", secret=True
    )
    replay_headers: tuple[str, ...] = _key(
        (),
        _replay_headers,
        "headers replayed besides `Location`, `Content-Location`, `ETag`, `Link`, "
        "`Content-Type` (a list, or one comma-separated string); never a credential header "
        "(`ValueError` at `init_app`)",
    )
    error_format: str = _key(
        "json",
        _lowered,
        '`"problem+json"`: the shim\'s own errors as RFC 9457 problem details (`application/problem+json`)',
    )
    problem_type_base: str = _key(
        DEFAULT_PROBLEM_TYPE_BASE,
        str,
        "prefix of a problem's `type` URI (a tag URI: stable, never "
        "dereferenced; an app may point it at its own documentation). With `IDEM_DOCS_URL` set and "
        "this key left at its default, the types are built under the docs URL instead",
    )
    key_format: str = _key(
        "uuid",
        _lowered,
        '`"opaque"`: an `Idempotency-Key` may be any 16 to 255 visible ASCII characters (0x21-0x7E, '
        "Stripe's bound; kept as sent, case-sensitive) but `,` `;` `\"` `\\` (so one field is one key) "
        'besides a UUID (still lower-cased, so switching formats keeps keys); `"uuid"`: a UUID only '
        "(contract §4b: keys like `all` cannot enumerate the key space). A route's `key_format=` overrides it",
    )
    opaque_key_min_length: int = _key(
        16,
        int,
        "the shortest opaque `Idempotency-Key` (1 to 255): the IETF draft sets no minimum, so an app whose "
        "clients send short keys (`k-1`) may lower it; 16 by default, so two clients' trivial keys "
        "(`1`, `order`) do not meet under one user (docs/shim.md, **Conformance**)",
    )
    replayed_headers: tuple[str, ...] = _key(
        ("Idempotent-Replayed",),
        _names,
        "the response headers that mark a replay with `true` (a list, or one comma-separated string): "
        "Stripe's `Idempotent-Replayed` by default, `Idempotency-Replayed` (hono-idempotency's, anyonce's), "
        "or both at once",
        shown='`("Idempotent-Replayed",)`',
    )
    max_stored_response_bytes: int | None = _key(
        None,
        _optional_int,
        "the largest answer body stored for replay; a larger one goes to the client whole and is stored "
        "as its status and replayed headers only: its replay has an empty body and `Idempotency-Replay: "
        "omitted` (never a second run). `None`: no cap",
    )
    oversized_response: str = _key(
        "omit",
        _lowered,
        '`"omit"`: an answer over `IDEM_MAX_STORED_RESPONSE_BYTES` replays without its body; '
        '`"refuse"`: the route refuses it instead (its writes roll back, 500, one `response_refused` '
        "ERROR line; a retry gets 409 `idempotency_previous_failed`)",
    )
    replay_body_marker: bool = _key(
        True,
        _as_bool,
        'a replayed JSON object gains `"idempotency_replayed": true` (contract §4); `False`: every replayed '
        "body comes back byte for byte (JSON objects are then stored as their bytes) and the "
        "`Idempotent-Replayed: true` header alone marks a replay",
    )
    docs_url: str | None = _key(
        None,
        _optional_str,
        "the page that documents this API's idempotency (the IETF draft's published specification): "
        'every error answer of the shim carries `Link: <URL>; rel="describedby"`, and problem `type` '
        "URIs are `URL#<slug>` (or `URL<slug>` when it ends with `/`)",
    )

    @property
    def problem_types(self) -> str:
        """The prefix a problem's ``type`` is built on: IDEM_PROBLEM_TYPE_BASE, or under IDEM_DOCS_URL."""
        if self.docs_url is not None and self.problem_type_base == DEFAULT_PROBLEM_TYPE_BASE:
            return self.docs_url if self.docs_url.endswith("/") else self.docs_url + "#"
        return self.problem_type_base

    health_gauge_interval: float = _key(
        60,
        float,
        "seconds a scrape of `/metrics` reuses the last reading of the `idem_health` view for the "
        "`idempotency_store_*` gauges (one table scan per reading); 0 leaves the gauges out",
    )
    gauge_scopes: tuple[str, ...] = _key(
        (),
        _scopes,
        "scopes the store gauges name besides the decorated routes' (the app's `idempotent()` jobs' "
        "`scope=`; a list, or one comma-separated string); every other endpoint in the store is the one "
        '`endpoint="other"` series',
    )

    @classmethod
    def from_mapping(
        cls, config: Mapping[str, Any], environ: Mapping[str, str] | None = None, *, require_url: bool = True
    ) -> Settings:
        """Every key from ``config`` (``app.config``), else from the environment, else its default.

        An environment variable set to an empty string counts as unset. A value that does not
        parse is one ``ConfigError`` line naming the key and where the value came from (a
        secret's value is never in it). ``require_url=False``: no URL is no error (the URL is
        then ``""``), for a command that loads the app and never connects (``idem openapi``)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for spec in fields(cls):
            name = PREFIX + spec.name.upper()
            if name in config:
                raw, source = config[name], ""
            elif env.get(name, "").strip():
                raw, source = env[name], " (from the environment)"
            else:
                raw, source = spec.metadata["default"], ""
            try:
                values[spec.name] = spec.metadata["parse"](raw)
            except ConfigError:
                raise
            except (TypeError, ValueError) as exc:  # every IDEM_* mistake is one ConfigError line
                reason = "not a valid value" if not spec.repr else describe(exc)
                raise ConfigError(
                    reason if reason.startswith("idem_shim:") else f"idem_shim: {name}{source}: {reason}"
                ) from exc
        url = values["database_url"] or config.get("DATABASE_URL") or env.get("DATABASE_URL")
        if not url and require_url:
            raise ConfigError(f"idem_shim: set {ConfigVars.DATABASE_URL} (or DATABASE_URL) to the database URL")
        values["database_url"] = str(url or "")
        # The admin verbs' URL, else the app's own (whose role then needs idem_admin for them);
        # the data-subject verbs' URL, else the admin verbs' (idem_admin holds them too).
        values["admin_database_url"] = values["admin_database_url"] or values["database_url"]
        values["dsr_database_url"] = values["dsr_database_url"] or values["admin_database_url"]
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        for name, key in (
            (ConfigVars.RESPONSE_KEY, self.response_key),
            (ConfigVars.RESPONSE_KEY_FALLBACK, self.response_key_fallback),
        ):
            if key is not None and (len(key) < 32 or len(set(key)) < 12):
                raise ConfigError(
                    f"idem_shim: {name} must be a generated secret of at least 32 characters "
                    "(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
                )
        if self.docs_url is not None and not self.docs_url.startswith(("https://", "http://")):
            raise ConfigError(f"idem_shim: {ConfigVars.DOCS_URL} must be an http(s) URL (got {self.docs_url!r})")
        if self.key_format not in KEY_FORMATS:
            raise ConfigError(
                f"idem_shim: {ConfigVars.KEY_FORMAT} must be one of {', '.join(KEY_FORMATS)} (got {self.key_format!r})"
            )
        if not 1 <= self.opaque_key_min_length <= 255:
            raise ConfigError(
                f"idem_shim: {ConfigVars.OPAQUE_KEY_MIN_LENGTH} must be in 1..255 (got {self.opaque_key_min_length})"
            )
        if not self.replayed_headers or any(not replay_header_name_ok(name) for name in self.replayed_headers):
            raise ConfigError(
                f"idem_shim: {ConfigVars.REPLAYED_HEADERS} must name one or more HTTP headers "
                f"(got {self.replayed_headers!r})"
            )
        if self.max_stored_response_bytes is not None and self.max_stored_response_bytes < 0:
            raise ConfigError(f"idem_shim: {ConfigVars.MAX_STORED_RESPONSE_BYTES} must be >= 0 or None")
        if self.oversized_response not in OVERSIZED_RESPONSES:
            raise ConfigError(
                f"idem_shim: {ConfigVars.OVERSIZED_RESPONSE} must be one of {', '.join(OVERSIZED_RESPONSES)} "
                f"(got {self.oversized_response!r})"
            )
        if self.error_format not in ERROR_FORMATS:
            raise ConfigError(
                f"idem_shim: {ConfigVars.ERROR_FORMAT} must be one of {', '.join(ERROR_FORMATS)} "
                f"(got {self.error_format!r})"
            )
        if not 0 <= self.pool_min_size <= self.pool_max_size or self.pool_max_size < 1:
            raise ConfigError("idem_shim: need 0 <= IDEM_POOL_MIN_SIZE <= IDEM_POOL_MAX_SIZE, >= 1")
        if (
            self.pool_timeout <= 0
            or self.pool_reconnect_timeout <= 0
            or self.store_probe_interval <= 0
            or self.connect_timeout < 1
        ):
            raise ConfigError(
                "idem_shim: IDEM_POOL_TIMEOUT > 0, IDEM_POOL_RECONNECT_TIMEOUT > 0, IDEM_STORE_PROBE_INTERVAL > 0, "
                "IDEM_CONNECT_TIMEOUT >= 1"
            )
        if (
            self.max_body_bytes < 0
            or self.stale_after_seconds < MIN_STALE_AFTER_SECONDS
            or not 0 <= self.wait_ms <= MAX_WAIT_MS
        ):
            raise ConfigError(
                f"idem_shim: IDEM_MAX_BODY_BYTES >= 0, IDEM_STALE_AFTER_SECONDS >= {MIN_STALE_AFTER_SECONDS}, "
                f"0 <= IDEM_WAIT_MS <= {MAX_WAIT_MS}"
            )
        if self.health_gauge_interval < 0:
            raise ConfigError("idem_shim: IDEM_HEALTH_GAUGE_INTERVAL must be >= 0 (0 leaves the store gauges out)")
        if self.statement_timeout_ms is not None and self.statement_timeout_ms <= self.wait_ms:
            raise ConfigError(
                "idem_shim: IDEM_STATEMENT_TIMEOUT_MS must exceed IDEM_WAIT_MS (a waiting claim "
                "would otherwise be cancelled)"
            )


#: The keys' names by attribute, derived from ``Settings``: ``ConfigVars.WAIT_MS == "IDEM_WAIT_MS"``
#: (flask-limiter's ``ConfigVars``, without writing each name a second time).
ConfigVars: Final[Any] = SimpleNamespace(**{spec.name.upper(): PREFIX + spec.name.upper() for spec in fields(Settings)})

#: The raw default of every key; ``IDEM_DATABASE_URL`` falls back to ``DATABASE_URL`` (config, then env).
DEFAULTS: Final[Mapping[str, Any]] = {PREFIX + spec.name.upper(): spec.metadata["default"] for spec in fields(Settings)}


def _shown(spec: Any) -> str:
    if spec.metadata["shown"] is not None:
        return str(spec.metadata["shown"])
    default = spec.metadata["default"]
    if isinstance(default, str):
        return f'`"{default}"`'
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return str(default)
    return f"`{default!r}`"


def reference_table() -> str:
    """docs/shim.md's table of the keys (a test checks the page carries exactly this)."""
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    rows += [
        f"| `{PREFIX}{spec.name.upper()}` | {_shown(spec)} | {spec.metadata['doc']} |" for spec in fields(Settings)
    ]
    return "\n".join(rows) + "\n"
