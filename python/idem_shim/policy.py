"""The options of a decorated route (``@idempotency_key``) and of a job (``idempotent()``): one
field each, declared here once.

Each field carries its default, its line in docs/shim.md's table (``reference_table``; a test
checks the page carries it) and whether a job takes it; ``__post_init__`` checks every value
when the route's module is imported (``ValueError`` / ``TypeError``, nothing claimed), so a bad
option never becomes a 500 per request. The decorator, ``idempotent()``, the OpenAPI document
(``published``) and the request path read the dataclass and repeat none of it: a new option is
a field here and the code that acts on it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Literal

from .config import KEY_FORMATS, MAX_TTL_HOURS, MAX_WAIT_MS, MIN_STALE_AFTER_SECONDS, validate_scope
from .fingerprint import ChosenFingerprint

if TYPE_CHECKING:
    from .config import Settings

#: ``on_stale`` values: free a dead holder's key, or keep answering in flight until expiry.
ON_STALE: Final = ("heal", "quarantine")
#: ``on_failure`` values (contract §4b): fail the key, free it for the retry, or store the failure's
#: answer for the retry to replay.
ON_FAILURE: Final = ("keep", "release", "replay")
#: ``claim`` values (contract §4e): the claim committed before the handler, or inside its transaction.
CLAIMS: Final = ("before", "in_transaction")


def _option(default: Any, doc: str, *, shown: str | None = None, job: bool = True, published: Any = None) -> Any:
    """Declare one option: its default, its line in the docs' table, whether ``idempotent()``
    takes it, and (``published``) how the OpenAPI document names it: ``value -> (name, value)``."""
    return field(default=default, metadata={"doc": doc, "shown": shown, "job": job, "published": published})


def _ttl_seconds(hours: float) -> tuple[str, int]:
    return "ttl_seconds", int(timedelta(hours=hours).total_seconds())


@dataclass(frozen=True, slots=True)
class Policy:
    """One route's or one job's idempotency options, checked once when it is declared."""

    ttl_hours: float = _option(
        24,
        "how long a completed answer (a job's result) replays; `0 < ttl_hours <= 168` (the database caps "
        "retention at 7 days). Tier 1: 24, Tier 2: 168; a job: its queue's redelivery horizon.",
        published=_ttl_seconds,
    )
    fail_closed: bool = _option(
        True,
        "store down: 503 without running the handler (Tier 1). `False`: run the handler without dedup, "
        "one WARNING line (Tier 2). A job always fails closed (`StoreUnavailableError`).",
        job=False,
    )
    required: bool = _option(False, "a request without the header gets 400 instead of passing through.", job=False)
    scope: str | None = _option(
        None,
        'the key\'s endpoint scope and metric label, e.g. `"orders.place"`: a route renamed or re-versioned '
        "keeps its keys. Why not the default: a rule is a URL, and URLs move. Why the default still: an app "
        "that never declares one keeps working as before. Required for a job (no URL to derive one from, "
        "and two jobs must not share keys by accident). At most 200 printable characters, no surrounding "
        "spaces; two routes share a scope only if both declare it.",
        shown='`None`: `"<METHOD> <url rule>"`',
    )
    on_stale: Literal["heal", "quarantine"] = _option(
        "heal",
        "a holder dead for `stale_after_seconds` is healed and the next request (a job: the same call) "
        'claims the key; `"quarantine"` keeps answering in flight until expiry, for work whose side '
        "effects leave the database.",
    )
    on_failure: Literal["keep", "release", "replay"] = _option(
        "keep",
        "an exception or a 5xx fails the key: retries get 409 `idempotency_previous_failed` (a job: "
        "`PreviousFailedError`; contract §4b: the failure may have left effects the database does not know "
        'of). `"release"`: the writes roll back and the same `idem_fail` round trip frees the key, so '
        "the retry with the same key runs again (what Stripe's and Powertools' users ask for). Only for "
        'work that stays in the database. `"replay"`: the writes roll back and the failure\'s answer (the '
        "5xx, or what the app renders for the exception) is stored: the retry gets it again with "
        "`Idempotent-Replayed: true`, never a second run nor `previous_failed` (the IETF draft's §2.6, "
        "Stripe); a 503 or 429 the handler answers and a serialization failure or deadlock (40001, 40P01) "
        "are not stored: the key is freed and the retry runs again. Routes only: a job's exception is not "
        "an answer (`ValueError`). See **Failures, for client authors**.",
    )
    store_response: bool = _option(
        True,
        "`False` completes with a NULL body (contract §3's PII rule): nothing replays, a later request with "
        "the same key runs again. The way out for an answer that carries a credential the screen cannot "
        "see (below).",
        job=False,
    )
    service: bool = _option(
        False,
        "`True` declares a service route: its keys have no user scope (`p_user_id` NULL), whoever "
        "calls. See **Scope**.",
        job=False,
    )
    wait_ms: int | None = _option(
        None,
        "a duplicate that finds the key in flight waits up to this long inside `idem_claim` and replays "
        "(a job: returns the result) if the holder completes in time (polling, PgBouncer-safe; at most "
        "60000). Keep it below `IDEM_STATEMENT_TIMEOUT_MS`. A waiter holds a pool connection inside "
        "`pg_sleep`, so at most half of `IDEM_POOL_MAX_SIZE` wait at once, per process; a duplicate past "
        "that is answered 409 at once (its client retries), and a retry storm on one key never starves "
        "other users' requests. A waiter also holds the thread it came on: under threaded workers "
        "(gunicorn's gthread, `--threads N`) keep `IDEM_POOL_MAX_SIZE` at most N, so waiters hold at most "
        "half the threads. A worker that serves one request at a time (gunicorn's default sync worker) "
        "would be held whole: there no duplicate waits (409 at once, one WARNING `wait_skipped` per "
        "worker; see **Waiting under gunicorn**). A job's default is 0: a consumer would rather nack than "
        "hold a connection.",
        shown="`IDEM_WAIT_MS` (a job: 0)",
    )
    stale_after_seconds: float | None = _option(
        None,
        "when an in-flight holder counts as dead: longer than the work takes, or heartbeat.",
        shown="`IDEM_STALE_AFTER_SECONDS` (a job: 30)",
    )
    key_format: Literal["uuid", "opaque"] | None = _option(
        None,
        'which `Idempotency-Key`s are keys: `"uuid"` (contract §4b\'s key rule) or `"opaque"`, 16 to 255 '
        "visible ASCII characters as sent but `,` `;` `\"` `\\` (Stripe's keys; one field, one key: a header "
        "sent twice is refused; a UUID is still lower-cased, so switching keeps keys). Anything else is the "
        '400 `Idempotency-Key must be a UUID string`, under `"opaque"` `Idempotency-Key must be one key of '
        "16 to 255 visible ASCII characters` (with a `detail` giving the whole rule); a job raises "
        "`ValueError`.",
        shown="`IDEM_KEY_FORMAT` (a job: from the environment)",
    )
    fingerprint_include: tuple[str, ...] | None = _option(
        None,
        'JSON pointers (RFC 6901, e.g. `["/amount", "/currency"]`) to the only members of a JSON body that '
        "make two requests the same (with the method, media type, path and query, as always): a retry that "
        "changes anything else replays. A request whose body is not JSON, or lacks one of them, is a 400 "
        "`invalid_request_fingerprint` with a `detail`. Not with `fingerprint_exclude`.",
        job=False,
    )
    fingerprint_exclude: tuple[str, ...] | None = _option(
        None,
        "JSON pointers to members of a JSON body that do not make a request another (a client timestamp, "
        'a trace id: `["/client_ts"]`): a retry that changes, adds or drops only them replays; anything '
        "else changed is a 422. A body that is not JSON is a 400 `invalid_request_fingerprint`. A malformed "
        'pointer, the root pointer `""`, an empty list or both options raise `ValueError` at declaration.',
        job=False,
    )
    uploads: bool = _option(
        False,
        "`True` declares a route that takes `multipart/*` uploads: a multipart body is fingerprinted by "
        "its parts (names, file names, types, bytes; not the boundary), so the same upload retried under "
        "a client's new random boundary replays; more parts than Flask's `MAX_FORM_PARTS` (1000) is a 413 "
        "`request_too_large`, nothing stored. `False`: a multipart body is fingerprinted by its bytes and "
        "its media type, boundary included, and no part is parsed, so a body of many tiny parts costs "
        "what hashing it costs.",
        job=False,
    )
    writes_elsewhere: bool = _option(
        False,
        "`True` declares a route whose work does not go through the request's connection on purpose (a "
        "broker's or Stripe's call under `downstream_key()`, nothing to write): a claimed request of it "
        "that answers 2xx having run nothing on `connection()` is not the one WARNING per route and "
        "process that says such writes do not commit with the key (see **ORMs**).",
        job=False,
    )
    claim: Literal["before", "in_transaction"] = _option(
        "before",
        '`"before"`: the claim commits on its own before the handler runs (two transactions), for work '
        'that leaves the database (a broker, Stripe, an e-mail). `"in_transaction"`: the claim is the first '
        "statement of the handler's own transaction, so the key's row commits with the writes or not at all "
        "(a killed worker leaves nothing; the retry runs fresh), for work that stays in this database; a "
        "duplicate waits on the holder's row up to `wait_ms`, then 409 in flight; `downstream_key()` and "
        "`heartbeat()` are refused there (contract §4e). See **Which claim**.",
    )
    #: the chosen fingerprint, parsed once (derived from the two options above, not an option)
    fingerprint: ChosenFingerprint | None = field(init=False, repr=False, compare=False)
    #: ``ttl_hours`` as the interval the claim sends (derived, not an option)
    ttl: timedelta = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("fail_closed", "required", "store_response", "service", "uploads", "writes_elsewhere"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.ttl_hours, bool) or not isinstance(self.ttl_hours, int | float):
            raise TypeError(f"ttl_hours must be a number, got {self.ttl_hours!r}")
        if not 0 < self.ttl_hours <= MAX_TTL_HOURS:
            raise ValueError(f"ttl_hours must be in (0, {MAX_TTL_HOURS}], got {self.ttl_hours!r}")
        if self.wait_ms is not None and not 0 <= self.wait_ms <= MAX_WAIT_MS:
            raise ValueError(f"wait_ms must be in [0, {MAX_WAIT_MS}], got {self.wait_ms!r}")
        if self.stale_after_seconds is not None and not self.stale_after_seconds >= MIN_STALE_AFTER_SECONDS:
            raise ValueError(
                f"stale_after_seconds must be at least {MIN_STALE_AFTER_SECONDS}, got {self.stale_after_seconds!r}"
            )
        if self.on_stale not in ON_STALE:
            raise ValueError(f"on_stale must be 'heal' or 'quarantine', got {self.on_stale!r}")
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure must be 'keep', 'release' or 'replay', got {self.on_failure!r}")
        if self.claim not in CLAIMS:
            raise ValueError(f"claim must be 'before' or 'in_transaction', got {self.claim!r}")
        if self.claim == "in_transaction" and self.writes_elsewhere:
            raise ValueError(
                "claim='in_transaction' is for work whose writes commit with the key on idem_shim.connection(); "
                "writes_elsewhere=True says they do not: use claim='before'"
            )
        if self.key_format is not None and self.key_format not in KEY_FORMATS:
            raise ValueError(f"key_format must be 'uuid' or 'opaque', got {self.key_format!r}")
        if self.scope is not None:
            validate_scope(self.scope)
        object.__setattr__(self, "ttl", timedelta(hours=self.ttl_hours))
        object.__setattr__(self, "fingerprint", self._chosen_fingerprint())

    def _chosen_fingerprint(self) -> ChosenFingerprint | None:
        include, exclude = self.fingerprint_include, self.fingerprint_exclude
        if include is not None and exclude is not None:
            raise ValueError(
                "fingerprint_include and fingerprint_exclude are two ways of saying one thing: give one of them"
            )
        chosen = include if include is not None else exclude
        if chosen is None:
            return None
        name = "fingerprint_include" if include is not None else "fingerprint_exclude"
        if isinstance(chosen, str) or not isinstance(chosen, list | tuple):
            raise TypeError(f'{name} must be a list of JSON pointers such as ["/client_ts"], got {chosen!r}')
        if not chosen:
            raise ValueError(f"{name} must name at least one JSON pointer (leave it out for the whole body)")
        pointers = tuple(dict.fromkeys(chosen))  # the order kept, a repeated pointer once
        object.__setattr__(self, name, pointers)
        try:
            return ChosenFingerprint(pointers, include=include is not None)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None

    @classmethod
    def of(cls, entry: str, options: Mapping[str, Any], *, job: bool = False) -> Policy:
        """The policy of ``entry(**options)`` (``"idempotency_key"`` or ``"idempotent"``);
        ``TypeError`` for an option it does not take."""
        known = {spec.name: spec for spec in _options()}
        for name in options:
            if name not in known or (job and not known[name].metadata["job"]):
                raise TypeError(f"{entry}() got an unexpected option {name!r}")
        if job and options.get("scope") is None:
            raise TypeError(f'{entry}() needs scope=, e.g. scope="fills.apply": there is no URL to derive one from')
        if job and options.get("on_failure") == "replay":
            raise ValueError(
                f"{entry}(): on_failure='replay' stores a route's failure answer, and an exception is not a "
                "value to return twice: use 'keep' (a duplicate raises PreviousFailedError) or 'release'"
            )
        return cls(**options)

    def key_format_for(self, settings: Settings) -> str:
        return settings.key_format if self.key_format is None else self.key_format

    def wait_ms_for(self, settings: Settings) -> int:
        return settings.wait_ms if self.wait_ms is None else self.wait_ms

    def stale_after_for(self, settings: Settings) -> timedelta:
        seconds = settings.stale_after_seconds if self.stale_after_seconds is None else self.stale_after_seconds
        return timedelta(seconds=seconds)

    def published(self, settings: Settings, scope: str) -> dict[str, Any]:
        """The ``x-idempotency`` object of the OpenAPI document: every option, as it applies
        (``scope``: the route's, its default resolved; defaults from ``settings``)."""
        effective = {"scope": scope, "wait_ms": self.wait_ms_for(settings), "key_format": self.key_format_for(settings)}
        effective["stale_after_seconds"] = self.stale_after_for(settings).total_seconds()
        published: dict[str, Any] = {}
        for spec in _options():
            value = effective.get(spec.name, getattr(self, spec.name))
            if isinstance(value, tuple):  # JSON pointers: a list, as the document is JSON
                value = list(value)
            name, value = spec.metadata["published"](value) if spec.metadata["published"] else (spec.name, value)
            published[name] = value
        return published


def _options() -> list[Any]:
    return [spec for spec in fields(Policy) if spec.init]


def signature(*, job: bool = False, before: tuple[inspect.Parameter, ...] = ()) -> inspect.Signature:
    """An entry point's signature as ``inspect`` and ``help()`` show it: ``before``, then the options."""
    options = [
        inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=spec.default, annotation=spec.type)
        for spec in _options()
        if spec.metadata["job"] or not job
    ]
    if job:  # a job's scope has no default
        options = [o.replace(default=inspect.Parameter.empty) if o.name == "scope" else o for o in options]
    return inspect.Signature([*before, *options])


def _shown(spec: Any) -> str:
    if spec.metadata["shown"] is not None:
        return str(spec.metadata["shown"])
    default = spec.default
    if isinstance(default, str):
        return f'`"{default}"`'
    if isinstance(default, bool) or default is None or default is MISSING:
        return f"`{default!r}`"
    return str(default)


def reference_table() -> str:
    """docs/shim.md's table of the options (a test checks the page carries exactly this)."""
    rows = ["| option | default | job | meaning |", "| --- | --- | --- | --- |"]
    rows += [
        f"| `{spec.name}` | {_shown(spec)} | {'yes' if spec.metadata['job'] else 'no'} | {spec.metadata['doc']} |"
        for spec in _options()
    ]
    return "\n".join(rows) + "\n"
