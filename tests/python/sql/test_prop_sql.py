"""Property-based tests of the SQL API, on the real database.

1. Arbitrary arguments: text for keys and endpoints, JSON for bodies (deep, wide, unicode with
   U+0000 that jsonb refuses, huge numbers), intervals from tiny to out of any calendar, waits
   in and out of range -> every error carries a documented SQLSTATE (sql/README.md "Errors"), and a
   call that raises writes nothing.
2. A stateful model (`IdemModel`): idem_claim / idem_complete / idem_fail / idem_heartbeat /
   CALL idem_cleanup / idem_cleanup_batch / idem_erase_user, with time moved through p_now,
   against a small Python model of contract §3: every outcome, retry_after_ms, fencing error
   (IDM01) and the whole table after every step must match the model.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from hypothesis import event, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.python.support.prop import scaled

#: SQLSTATEs sql/README.md documents for the SQL API, plus the two PostgreSQL's own input
#: functions raise before any of ours runs: 22P05 (jsonb refuses \u0000), 23503 (a user id
#: that is not in users: the key's FK to the host's table).
DOCUMENTED = {"22023", "IDM00", "IDM01", "IDM02", "IDM03", "IDM04", "22P05", "23503"}

USERS = (1, 2)


# --- strategies ------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),  # unbounded: huge numbers too
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),  # includes U+0000, which jsonb refuses
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=8), st.dictionaries(st.text(max_size=12), inner, max_size=8)),
    max_leaves=40,
)
deep_json = st.integers(1, 300).map(lambda n: _nest(n))
wide_json = st.integers(1, 3000).map(lambda n: {f"k{i}": i for i in range(n)})


def _nest(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"d": value}
    return value


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    if isinstance(value, dict):
        return any("\x00" in k or _has_nul(v) for k, v in value.items())
    return False


def _key_text() -> st.SearchStrategy[str]:
    """Keys: arbitrary text (no NUL: the client library cannot send it), and real UUIDs in the
    forms a client may send them."""
    no_nul = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"))
    ids = st.uuids().map(str)
    return st.one_of(
        no_nul,
        ids,
        ids.map(str.upper),
        ids.map(lambda u: f'"{u}"'),
        ids.map(lambda u: f" {u} "),
        ids.map(lambda u: u.replace("-", "")),
    )


@dataclass(frozen=True)
class Interval:
    """An interval as PostgreSQL builds it: make_interval(months, days, secs), or NULL."""

    months: int
    days: int
    secs: float

    @property
    def params(self) -> tuple[int, int, float]:
        return self.months, self.days, self.secs


int32 = st.integers(-(2**31) + 1, 2**31 - 1)
intervals = st.one_of(
    st.none(),
    st.builds(Interval, st.integers(-2, 2), st.integers(-40, 40), st.floats(-100_000, 1_000_000, allow_nan=False)),
    st.builds(Interval, int32, int32, st.floats(-9e12, 9e12, allow_nan=False)),  # far out
    # months and days against each other: a month is 30 days in a comparison, a year 365.25
    # days in an epoch
    st.builds(
        Interval,
        st.sampled_from([-24, -12, -1, 1, 12, 24]),
        st.integers(-740, 740),
        st.floats(-86400, 86400, allow_nan=False),
    ),
    st.builds(Interval, st.just(0), st.just(0), st.sampled_from([1e-6, 0.001, 1.0, 30.0, 604800.0])),
)
waits = st.one_of(st.integers(0, 30), int32, st.sampled_from([-1, 60_000, 60_001]))


def _interval_params(name: str, value: Interval | None) -> dict[str, Any]:
    months, days, secs = value.params if value is not None else (None, None, None)
    return {f"{name}_m": months, f"{name}_d": days, f"{name}_s": secs}


# make_interval is strict: NULL parameters give a NULL interval
CLAIM_ANY = """SELECT * FROM idem_claim(p_key => %(key)s::text, p_user_id => %(user)s::integer,
    p_endpoint => %(endpoint)s::text, p_request => %(request)s,
    p_ttl => make_interval(months => %(ttl_m)s::integer, days => %(ttl_d)s::integer,
                           secs => %(ttl_s)s::float8),
    p_stale_after => make_interval(months => %(stale_m)s::integer, days => %(stale_d)s::integer,
                                   secs => %(stale_s)s::float8),
    p_wait_ms => %(wait)s::integer, p_on_stale => %(on_stale)s::text)"""


# --- helpers ---------------------------------------------------------------------------------


def _one(cursor: Any) -> Any:
    """The one row a statement returns (it always returns one)."""
    row = cursor.fetchone()
    assert row is not None
    return row


def _state(admin: psycopg.Connection[Any]) -> tuple[Any, ...]:
    """Everything the API may write, in one comparable value."""
    return tuple(
        _one(
            admin.execute(
                "SELECT (SELECT md5(COALESCE(string_agg(k::text, ',' ORDER BY id), '')) "
                "          FROM idempotency_keys k),"
                "       (SELECT count(*) FROM idempotency_events),"
                "       (SELECT count(*) FROM audit_log)"
            )
        )
    )


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None)


@pytest.fixture
def conns(fresh_admin_url: str) -> Any:
    with (
        psycopg.connect(fresh_admin_url, autocommit=True) as admin,
        # as the owner: the arbitrary-argument calls name claims by key_id alone, as a DBA may
        psycopg.connect(fresh_admin_url, autocommit=True, row_factory=dict_row) as app,
    ):
        admin.execute("INSERT INTO users (id) VALUES (1), (2) ON CONFLICT DO NOTHING")
        yield admin, app


# --- 1. arbitrary arguments ------------------------------------------------------------------

CLAIM_ARGS = st.fixed_dictionaries(
    {
        "key": _key_text(),
        "user": st.one_of(st.none(), st.sampled_from(USERS), int32),
        "endpoint": st.one_of(
            st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00")),
            st.sampled_from(["POST /api/trading/orders", ""]),
        ),
        "request": st.one_of(json_values, deep_json, wide_json),
        "ttl": intervals,
        "stale": intervals,
        "wait": waits,
        "on_stale": st.one_of(
            st.sampled_from(["heal", "quarantine"]),
            st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=10),
        ),
        # with a holder first: the same (key, user, endpoint, body) claimed with defaults just before,
        # so the lookup path (lease, heal, quarantine, wait) meets the arbitrary arguments
        "holder": st.sampled_from([None, "in_flight", "completed", "failed"]),
    }
)


@settings(max_examples=scaled(500))
@given(args=CLAIM_ARGS)
@example(
    args={  # regression: a TTL whose calendar form passes the 7-day check but whose
        # elapsed form is longer (12 months - 353 days: 7 days as an interval, where a month is 30
        # days; 12.25 days in seconds, where a year is 365.25): 23514 from the retention CHECK
        "key": "00000000-0000-4000-8000-000000000001",
        "user": 1,
        "endpoint": "POST /api/trading/orders",
        "request": {},
        "ttl": Interval(12, -353, 0),
        "stale": None,
        "wait": 0,
        "on_stale": "heal",
        "holder": None,
    }
)
@example(
    args={  # regression: a TTL positive as an interval but negative in elapsed time
        "key": "00000000-0000-4000-8000-000000000002",
        "user": 1,
        "endpoint": "POST /api/trading/orders",
        "request": {},
        "ttl": Interval(-12, 361, 0),
        "stale": None,
        "wait": 0,
        "on_stale": "heal",
        "holder": None,
    }
)
@example(
    args={  # regression: a stale window beyond the calendar, with a holder to compare to:
        # locked_at + p_stale_after overflowed (22008 timestamp out of range)
        "key": "00000000-0000-4000-8000-000000000003",
        "user": 1,
        "endpoint": "POST /api/trading/orders",
        "request": {},
        "ttl": Interval(0, 1, 0),
        "stale": Interval(2**31 - 1, 0, 0.0),
        "wait": 0,
        "on_stale": "heal",
        "holder": "in_flight",
    }
)
def test_claim_with_arbitrary_arguments_raises_only_documented_errors_and_writes_nothing(
    conns: Any, args: dict[str, Any]
) -> None:
    admin, app = conns
    admin.execute("TRUNCATE idempotency_keys, idempotency_events, audit_log")
    key, user, endpoint, request = args["key"], args["user"], args["endpoint"], args["request"]
    ttl = args["ttl"] if args["ttl"] is not None or args["holder"] else Interval(0, 1, 0)
    if args["holder"] and not _has_nul(request):
        try:
            row = app.execute(
                "SELECT * FROM idem_claim(p_key => %s::text, p_user_id => %s::integer, "
                "p_endpoint => %s::text, p_request => %s)",
                (key, user, endpoint, Jsonb(request)),
            ).fetchone()
            if args["holder"] == "completed":
                app.execute("SELECT idem_complete(%s, 201, %s)", (row["key_id"], Jsonb({"ok": 1})))
            elif args["holder"] == "failed":
                app.execute("SELECT idem_fail(%s)", (row["key_id"],))
        except psycopg.Error as exc:
            assert _sqlstate(exc) in DOCUMENTED, exc
    params = {
        "key": key,
        "user": user,
        "endpoint": endpoint,
        "request": Jsonb(request),
        "wait": args["wait"],
        "on_stale": args["on_stale"],
        **_interval_params("ttl", ttl),
        **_interval_params("stale", args["stale"]),
    }
    before = _state(admin)
    try:
        row = app.execute(CLAIM_ANY, params).fetchone()
    except psycopg.Error as exc:
        note(f"raised {_sqlstate(exc)}: {exc}")
        assert _sqlstate(exc) in DOCUMENTED, f"undocumented SQLSTATE {_sqlstate(exc)}: {exc}"
        if _has_nul(request):
            assert _sqlstate(exc) == "22P05"
        assert _state(admin) == before, "a call that raised changed the database"
        return
    assert not _has_nul(request), "jsonb accepted U+0000"
    assert row["outcome"] in ("claimed", "mismatch", "replay", "in_flight", "stale", "previous_failed")
    if row["retry_after_ms"] is not None:
        assert 1 <= row["retry_after_ms"] <= 5000
    canonical = str(uuid.UUID(key.strip().strip('"')))
    stored = admin.execute(
        "SELECT idem_key, expires_at - created_at FROM idempotency_keys WHERE id = %s", (row["key_id"],)
    ).fetchone()
    if row["outcome"] == "claimed":
        assert stored is not None and stored[0] == canonical
        assert dt.timedelta(0) < stored[1] <= dt.timedelta(days=7)


TOKENS = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, -1]), st.none(), st.just("valid"))
CODES = st.one_of(st.none(), int32, st.sampled_from([99, 100, 200, 201, 422, 499, 500, 599, 600]))
BODIES = st.one_of(
    json_values,
    st.none(),
    st.dictionaries(
        st.sampled_from(["password", "api_key", "x_token", "Cookie", "order_id", "tokens", "secretary"]),
        json_scalars,
        min_size=1,
        max_size=3,
    ),
)


@settings(max_examples=scaled(300))
@given(call=st.sampled_from(["complete", "fail", "heartbeat"]), token=TOKENS, code=CODES, body=BODIES)
def test_complete_fail_heartbeat_with_arbitrary_arguments(
    conns: Any, call: str, token: Any, code: int | None, body: Any
) -> None:
    admin, app = conns
    admin.execute("TRUNCATE idempotency_keys, idempotency_events, audit_log")
    held = app.execute("SELECT key_id FROM idem_claim(%s, 1, 'POST /x', '{}')", (str(uuid.uuid4()),)).fetchone()[
        "key_id"
    ]
    if token == "valid":
        token = held
    before = _state(admin)
    queries = {
        "complete": (
            "SELECT idem_complete(p_key_id => %s::bigint, p_response_code => %s::integer, p_response_body => %s)",
            (token, code, Jsonb(body)),
        ),
        "fail": ("SELECT idem_fail(p_key_id => %s::bigint, p_response_code => %s::integer)", (token, code)),
        "heartbeat": ("SELECT idem_heartbeat(p_key_id => %s::bigint)", (token,)),
    }
    try:
        app.execute(*queries[call])
    except psycopg.Error as exc:
        note(f"raised {_sqlstate(exc)}: {exc}")
        assert _sqlstate(exc) in DOCUMENTED, f"undocumented SQLSTATE {_sqlstate(exc)}: {exc}"
        assert _state(admin) == before, "a call that raised changed the database"
        if token != held:
            assert _sqlstate(exc) in ("IDM01", "IDM00", "IDM04", "22P05")
        return
    assert token == held, "a token that holds nothing was accepted"


@settings(max_examples=scaled(60))
@given(
    user=st.one_of(st.none(), int32),
    batch=st.one_of(st.none(), int32),
    pause=st.one_of(st.none(), st.integers(-5, 5), int32),
)
def test_erase_export_cleanup_with_arbitrary_arguments(
    conns: Any, user: int | None, batch: int | None, pause: int | None
) -> None:
    admin, _ = conns
    for query, params in (
        ("SELECT idem_erase_user(p_user_id => %s::integer)", (user,)),
        ("SELECT idem_export_user(p_user_id => %s::integer)", (user,)),
        ("SELECT idem_cleanup_batch(p_batch_size => %s::integer)", (batch,)),
    ):
        before = _state(admin)
        try:
            admin.execute(query, params)
        except psycopg.Error as exc:
            assert _sqlstate(exc) in DOCUMENTED, f"{query}: {_sqlstate(exc)} {exc}"
            assert _state(admin) == before
    if pause is not None and pause > 100:
        pause = pause % 100  # a valid pause sleeps between batches: keep the test short
    try:
        admin.execute("CALL idem_cleanup(p_batch_size => %s::integer, p_pause_ms => %s::integer)", (batch, pause))
    except psycopg.Error as exc:
        assert _sqlstate(exc) in DOCUMENTED, f"idem_cleanup: {_sqlstate(exc)} {exc}"


# --- 2. the stateful model -------------------------------------------------------------------

KEYS = (
    "aaaaaaaa-0000-4000-8000-000000000001",
    "AAAAAAAA-0000-4000-8000-000000000001",
    "bbbbbbbb-0000-4000-8000-000000000002",
)
ENDPOINTS = ("POST /a", "POST /b")
BODIES_MODEL = ({"qty": 1}, {"qty": 2})
# Durations never land on each other: time moves in steps of 500 ms and every TTL and stale
# window ends in 250 ms, so no comparison is decided by the time a call itself takes (a few
# milliseconds, tens on a loaded machine).
TTLS = (1.25, 30.25, 3600.25, 604799.75)
STALES = (1.25, 30.25)
STEPS = (0.5, 1.0, 1.5, 2.0, 29.5, 30.0, 30.5, 3600.0, 86400.0, 604800.0)
SEEN: set[str] = set()  # outcomes and errors the model test met: it must meet them all
HORIZON = dt.timedelta(days=20)  # virtual time stays behind the real clock (see IdemModel)


@dataclass
class Row:
    id: int
    user: int | None
    endpoint: str
    hash: str
    status: str
    created: dt.datetime
    locked: dt.datetime
    expires: dt.datetime
    code: int | None = None
    body: Any = None
    has_body: bool = False


@dataclass
class Model:
    rows: dict[tuple[str, int | None, str], Row] = field(default_factory=dict)
    heals: dict[int | None, int] = field(default_factory=dict)  # stale_heal events per user scope
    erasures: int = 0
    replays: int = 0

    def by_id(self, key_id: int) -> Row | None:
        return next((r for r in self.rows.values() if r.id == key_id), None)


def _ms(delta: dt.timedelta) -> float:
    return delta.total_seconds() * 1000


class IdemModel(RuleBasedStateMachine):
    """Contract §3 as a Python model, driven side by side with the database.

    Virtual time starts 30 days behind the real clock and moves forward through p_now (at most
    20 days). Two functions read the real clock instead: idem_heartbeat renews a lease to
    clock_timestamp() (so a renewed lease outlives the test's horizon), and CALL idem_cleanup
    deletes what expired by the real clock (so every row); idem_cleanup_batch takes p_now and is
    modelled in virtual time.
    """

    url: str = ""
    tokens = Bundle("tokens")

    def __init__(self) -> None:
        super().__init__()
        # Any: every row here is a dict_row, and a state machine's rules read them by name.
        self.admin: Any = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
        # The model moves time through p_now, which only the store's owner may pass, and
        # names claims by key_id alone, as a DBA may: it drives the state machine as the owner. The
        # app role's own path (tokens, refusals) is tested in test_sec_boundary.py and 990_privileges.
        self.app: Any = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
        self.admin.execute("TRUNCATE idempotency_keys, idempotency_events, audit_log")
        real = _one(self.admin.execute("SELECT date_trunc('second', now()) AS t"))["t"]
        self.start = self.now = real - dt.timedelta(days=30)
        self.model = Model()
        self.hashes = {
            i: _one(
                self.admin.execute(
                    "SELECT encode(sha256(convert_to(%s::jsonb::text, 'UTF8')), 'hex') AS h", (Jsonb(b),)
                )
            )["h"]
            for i, b in enumerate(BODIES_MODEL)
        }

    def teardown(self) -> None:
        self.admin.close()
        self.app.close()

    @initialize()
    def users(self) -> None:
        self.admin.execute("INSERT INTO users (id) VALUES (1), (2) ON CONFLICT DO NOTHING")

    # -- time ---------------------------------------------------------------------------------

    @rule(step=st.sampled_from(STEPS))
    def advance(self, step: float) -> None:
        if self.now + dt.timedelta(seconds=step) - self.start < HORIZON:
            self.now += dt.timedelta(seconds=step)

    # -- idem_claim ---------------------------------------------------------------------------

    @rule(
        target=tokens,
        key=st.sampled_from(KEYS),
        user=st.sampled_from((None, *USERS)),
        endpoint=st.sampled_from(ENDPOINTS),
        body=st.sampled_from((0, 1)),
        ttl=st.sampled_from(TTLS),
        stale=st.sampled_from(STALES),
        on_stale=st.sampled_from(("heal", "heal", "quarantine")),
    )
    def claim(
        self, key: str, user: int | None, endpoint: str, body: int, ttl: float, stale: float, on_stale: str
    ) -> int:
        got = self.app.execute(
            "SELECT * FROM idem_claim(p_key => %s, p_user_id => %s, p_endpoint => %s, "
            "p_request => %s, p_ttl => make_interval(secs => %s), "
            "p_stale_after => make_interval(secs => %s), p_on_stale => %s, p_now => %s)",
            (key, user, endpoint, Jsonb(BODIES_MODEL[body]), ttl, stale, on_stale, self.now),
        ).fetchone()
        want = self._expected_claim(
            key.lower(),
            user,
            endpoint,
            self.hashes[body],
            dt.timedelta(seconds=ttl),
            dt.timedelta(seconds=stale),
            on_stale,
        )
        event(f"claim -> {got['outcome']}")
        SEEN.add(got["outcome"])
        note(
            f"claim {key[:8]} u{user} {endpoint} b{body} ttl={ttl} stale={stale} {on_stale} "
            f"@+{(self.now - self.start).total_seconds()}s -> {dict(got)}; model {want}"
        )
        assert got["outcome"] == want["outcome"]
        assert got["request_hash"] == self.hashes[body]
        if want["outcome"] == "claimed":
            # the model keeps the stored times: they carry the time the call took
            row = self.model.rows[(key.lower(), user, endpoint)]
            stored = self.admin.execute(
                "SELECT created_at, locked_at, expires_at FROM idempotency_keys WHERE id = %s", (got["key_id"],)
            ).fetchone()
            row.id = got["key_id"]
            row.created, row.locked, row.expires = (stored["created_at"], stored["locked_at"], stored["expires_at"])
        else:
            assert got["key_id"] == want["key_id"]
        assert got["response_code"] == want.get("response_code")
        if want["outcome"] == "replay":
            assert got["response_body"] == want["response_body"]
        expected_retry = want.get("retry_after_ms")
        if expected_retry is None:
            assert got["retry_after_ms"] is None
        else:
            assert got["retry_after_ms"] is not None and 1 <= got["retry_after_ms"] <= 5000
            if want["outcome"] == "stale":
                assert got["retry_after_ms"] == expected_retry
            else:  # exact at p_now; the call's own duration can only shorten what is left
                assert expected_retry - 250 <= got["retry_after_ms"] <= expected_retry, (got, want)
        return int(got["key_id"])

    @precondition(lambda self: bool(self.model.rows))
    @rule(
        target=tokens,
        data=st.data(),
        ttl=st.sampled_from(TTLS),
        stale=st.sampled_from(STALES),
        on_stale=st.sampled_from(("heal", "heal", "quarantine")),
        same_body=st.booleans(),
    )
    def claim_again(self, data: st.DataObject, ttl: float, stale: float, on_stale: str, same_body: bool) -> Any:
        """A retry (or a reuse with another body) of a key that has a row: the common case."""
        scope = data.draw(st.sampled_from(sorted(self.model.rows, key=str)))
        body = next(i for i, h in self.hashes.items() if h == self.model.rows[scope].hash)
        key = data.draw(st.sampled_from([k for k in KEYS if k.lower() == scope[0]]))
        return self.claim(key, scope[1], scope[2], body if same_body else 1 - body, ttl, stale, on_stale)

    @precondition(lambda self: any(r.status != "in_flight" for r in self.model.rows.values()))
    @rule(target=tokens, data=st.data())
    def retry_finished(self, data: st.DataObject) -> Any:
        """A client's retry of a key that completed or failed: replay, or previous_failed."""
        scope = data.draw(
            st.sampled_from(sorted((s for s, r in self.model.rows.items() if r.status != "in_flight"), key=str))
        )
        body = next(i for i, h in self.hashes.items() if h == self.model.rows[scope].hash)
        return self.claim(scope[0], scope[1], scope[2], body, TTLS[1], STALES[1], "heal")

    @precondition(lambda self: any(r.status == "in_flight" for r in self.model.rows.values()))
    @rule(
        target=tokens, data=st.data(), stale=st.sampled_from(STALES), on_stale=st.sampled_from(("heal", "quarantine"))
    )
    def retry_after_the_stale_window(self, data: st.DataObject, stale: float, on_stale: str) -> Any:
        """The holder went quiet: wait out the stale window, then retry (heal or quarantine)."""
        scope = data.draw(
            st.sampled_from(sorted((s for s, r in self.model.rows.items() if r.status == "in_flight"), key=str))
        )
        self.advance(stale + 0.5)
        body = (
            next(i for i, h in self.hashes.items() if h == self.model.rows[scope].hash)
            if scope in self.model.rows
            else 0
        )
        return self.claim(scope[0], scope[1], scope[2], body, TTLS[2], stale, on_stale)

    def _expected_claim(
        self,
        key: str,
        user: int | None,
        endpoint: str,
        hash_: str,
        ttl: dt.timedelta,
        stale: dt.timedelta,
        on_stale: str,
    ) -> dict[str, Any]:
        m, t, scope = self.model, self.now, (key, user, endpoint)
        row = m.rows.get(scope)
        if row is not None and row.expires <= t:  # expired: absent at once
            del m.rows[scope]
            row = None
        if row is not None and row.hash == hash_ and row.status == "completed" and not row.has_body:
            del m.rows[scope]  # completed without a body: not replayable, runs again
            row = None
        if row is None:
            m.rows[scope] = Row(-1, user, endpoint, hash_, "in_flight", t, t, t + ttl)
            return {"outcome": "claimed"}
        if row.hash != hash_:
            return {"outcome": "mismatch", "key_id": row.id}
        if row.status == "completed":
            m.replays += 1
            return {"outcome": "replay", "key_id": row.id, "response_code": row.code, "response_body": row.body}
        if row.status == "failed":
            return {"outcome": "previous_failed", "key_id": row.id, "response_code": row.code}
        lease = row.locked + stale - t
        if lease > dt.timedelta(0):
            return {"outcome": "in_flight", "key_id": row.id, "retry_after_ms": min(5000, math.ceil(_ms(lease)))}
        if on_stale == "quarantine":
            return {
                "outcome": "in_flight",
                "key_id": row.id,
                "retry_after_ms": max(1, min(5000, math.ceil(_ms(row.expires - t)))),
            }
        del m.rows[scope]
        m.heals[row.user] = m.heals.get(row.user, 0) + 1
        return {"outcome": "stale", "key_id": row.id, "retry_after_ms": 100}

    # -- fencing: complete, fail, heartbeat ---------------------------------------------------

    def _fenced(self, query: str, params: tuple[Any, ...], token: int) -> dict[str, Any] | None:
        row = self.model.by_id(token)
        holds = row is not None and row.status == "in_flight"
        try:
            got = self.app.execute(query, params).fetchone()
        except psycopg.Error as exc:
            assert not holds, f"the holder of {token} was refused: {exc}"
            assert exc.sqlstate == "IDM01", exc
            SEEN.add("IDM01")
            return None
        assert holds, f"token {token} holds nothing, yet {query.split('(')[0]} succeeded"
        return dict(got) if got else {}

    @rule(
        token=tokens,
        code=st.sampled_from((200, 201, 422)),
        body=st.sampled_from((None, {"order_id": 7}, ["a", 1], "text", 0)),
    )
    def complete(self, token: int, code: int, body: Any) -> None:
        if (
            self._fenced(
                "SELECT idem_complete(p_key_id => %s, p_response_code => %s, p_response_body => %s)",
                (token, code, None if body is None else Jsonb(body)),
                token,
            )
            is not None
        ):
            row = self.model.by_id(token)
            assert row is not None
            row.status, row.code, row.body, row.has_body = "completed", code, body, body is not None

    @rule(token=tokens, code=st.sampled_from((None, 500, 503)))
    def fail(self, token: int, code: int | None) -> None:
        if self._fenced("SELECT idem_fail(p_key_id => %s, p_response_code => %s)", (token, code), token) is not None:
            row = self.model.by_id(token)
            assert row is not None
            row.status, row.code = "failed", code

    @rule(token=tokens)
    def heartbeat(self, token: int) -> None:
        got = self._fenced("SELECT idem_heartbeat(p_key_id => %s) AS locked", (token,), token)
        if got is not None:
            row = self.model.by_id(token)
            assert row is not None
            assert got["locked"] >= row.locked
            row.locked = got["locked"]

    @precondition(lambda self: any(r.status == "in_flight" for r in self.model.rows.values()))
    @rule(data=st.data(), how=st.sampled_from(("complete", "complete", "fail", "heartbeat")))
    def live_holder_finishes(self, data: st.DataObject, how: str) -> None:
        """The handler holding a key finishes (the common case the fencing must not refuse)."""
        token = data.draw(st.sampled_from(sorted(r.id for r in self.model.rows.values() if r.status == "in_flight")))
        if how == "complete":
            self.complete(
                token, data.draw(st.sampled_from((201, 422))), data.draw(st.sampled_from((None, {"order_id": token})))
            )
        elif how == "fail":
            self.fail(token, None)
        else:
            self.heartbeat(token)

    @rule(token=st.integers(-5, 10**6))
    def unknown_token(self, token: int) -> None:
        if self.model.by_id(token) is None:
            for query in ("SELECT idem_complete(%s, 201, '{}')", "SELECT idem_fail(%s)", "SELECT idem_heartbeat(%s)"):
                with pytest.raises(psycopg.Error) as raised:
                    self.app.execute(query, (token,))
                assert raised.value.sqlstate == "IDM01"

    # -- erasure and cleanup ------------------------------------------------------------------

    @rule(user=st.sampled_from(USERS))
    def erase_user(self, user: int) -> None:
        got = self.app.execute("SELECT idem_erase_user(p_user_id => %s) AS n", (user,)).fetchone()
        gone = [s for s, r in self.model.rows.items() if r.user == user]
        assert got["n"] == len(gone)
        for scope in gone:
            del self.model.rows[scope]
        self.model.heals.pop(user, None)  # the user's events go with their keys
        if gone:  # an erasure of nothing logs no event (idem_health counts real ones)
            self.model.erasures += 1

    @rule()
    def cleanup_by_the_real_clock(self) -> None:
        got = self.admin.execute("CALL idem_cleanup(p_batch_size => 2, p_deleted => NULL)").fetchone()
        # virtual time trails the real clock by at least 10 days, and no row lives 7: all expired
        assert got["p_deleted"] == len(self.model.rows)
        self.model.rows.clear()

    @precondition(lambda self: bool(self.model.rows))
    @rule(batch=st.sampled_from((1, 2, 5000)))
    def cleanup_batch_in_virtual_time(self, batch: int) -> None:
        t = self.now
        finished = [r for r in self.model.rows.values() if r.status in ("completed", "failed") and r.expires <= t]
        orphans = [r for r in self.model.rows.values() if r.status == "in_flight" and r.locked <= t and r.expires <= t]
        got = self.admin.execute(
            "SELECT idem_cleanup_batch(p_batch_size => %s, p_now => %s) AS n", (batch, t)
        ).fetchone()["n"]
        first = min(batch, len(finished))
        want = first + (min(batch - first, len(orphans)) if first < batch else 0)
        if os.environ.get("IDEM_CITUS"):
            # a distributed store cleans each shard in its own batch (docs/scaling.md): at least the
            # single-node batch, at most a batch per shard, never more than the candidates
            assert want <= got <= len(finished) + len(orphans), (got, finished, orphans)
        else:
            assert got == want, (got, finished, orphans)
        # which of equal candidates went is the database's choice: take it, within the candidates
        left = {r["id"] for r in self.admin.execute("SELECT id FROM idempotency_keys").fetchall()}
        deleted = {r.id for r in self.model.rows.values()} - left
        assert deleted <= {r.id for r in finished + orphans}
        self.model.rows = {s: r for s, r in self.model.rows.items() if r.id in left}

    # -- the whole table, after every step ----------------------------------------------------

    @invariant()
    def table_matches_the_model(self) -> None:
        rows = self.admin.execute(
            # NULLIF: on a distributed store a service call's scope is the reserved user 0
            # (docs/scaling.md); the model's users are 1 and 2, so 0 is nobody else here.
            "SELECT id, idem_key, NULLIF(scope_user_id, 0) AS scope_user_id, scope_endpoint, request_hash, status, "
            "response_code, response_body, expires_at - created_at AS ttl "
            "FROM idempotency_keys ORDER BY id"
        ).fetchall()
        got = {
            (r["idem_key"], r["scope_user_id"], r["scope_endpoint"]): (
                r["id"],
                r["request_hash"],
                r["status"],
                r["response_code"],
                r["response_body"],
            )
            for r in rows
        }
        want = {s: (r.id, r.hash, r.status, r.code, r.body) for s, r in self.model.rows.items()}
        assert got == want
        events = {
            r["event"]: r["n"]
            for r in self.admin.execute("SELECT event, count(*) AS n FROM idempotency_events GROUP BY event").fetchall()
        }
        assert events.get("stale_heal", 0) == sum(self.model.heals.values())
        assert events.get("erasure", 0) == self.model.erasures
        replays = self.admin.execute(
            "SELECT count(*) AS n FROM audit_log WHERE action = 'idempotency_replay'"
        ).fetchone()["n"]
        assert replays == self.model.replays


def test_sql_api_matches_its_model(fresh_admin_url: str) -> None:
    IdemModel.url = fresh_admin_url
    SEEN.clear()
    run_state_machine_as_test(IdemModel, settings=settings(max_examples=scaled(150)))
    # a model test that never reached a branch proves nothing about it
    # every outcome reached: asserted on a single node; make test-citus runs a tenth of the examples
    if not os.environ.get("IDEM_CITUS"):
        assert SEEN >= {"claimed", "mismatch", "replay", "in_flight", "stale", "previous_failed", "IDM01"}, SEEN
