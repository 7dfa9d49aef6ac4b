"""Property-based tests of the HTTP contract through the decorator, on the real
database: arbitrary Idempotency-Key header values, body bytes and content types ->

  - never a 5xx;
  - a refused request (400 malformed key, 413 too large) stores nothing and runs nothing;
  - a request without the header runs untracked and stores no key;
  - a retry of any accepted request with the same bytes replays: same status, same body plus
    "idempotency_replayed", header Idempotent-Replayed, and the handler does not run again.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from flask import Flask, g, request
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from idem_shim import Idem, connection, idempotency_key
from tests.python.support.prop import scaled
from tests.python.support.shim import require_session, shim_db

LIMIT = 2048  # IDEM_MAX_BODY_BYTES: small, so 413 is part of the search

header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=60
)
uuids = st.uuids().map(str)
key_headers = st.one_of(
    st.none(),
    header_text,
    uuids,
    uuids.map(str.upper),
    uuids.map(lambda u: f'"{u}"'),
    uuids.map(lambda u: f"  {u}\t"),
    uuids.map(lambda u: "{" + u + "}"),
    uuids.map(lambda u: u.replace("-", "")),
    uuids.map(lambda u: u + "x"),
)
# JSON texts at the edges of what jsonb takes: huge and tiny numbers, \u0000, lone surrogates,
# deep nesting, and plain JSON
json_texts = st.one_of(
    st.builds(lambda m, e: f"{m}e{e}", st.integers(-9, 9), st.integers(-200_000, 200_000)),
    st.builds(lambda n: f'{{"qty": {n}}}', st.integers(-(10**60), 10**60)),
    st.sampled_from(
        [
            '"\\u0000"',
            '{"a\\u0000": 1}',
            '"\\ud800"',
            "NaN",
            "[Infinity]",
            "-0",
            "1" * 5000,
            "0." + "0" * 20000 + "1",
            "[" * 5000 + "]" * 5000,
            "[" * 900 + "]" * 900,
            "{}",
            "[]",
            "null",
            " ",
            "\ufeff{}",
        ]
    ),
    st.recursive(
        st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.none()),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=20,
    ).map(lambda v: __import__("json").dumps(v)),
).map(lambda t: t.encode("utf-8", "surrogatepass"))
bodies = st.one_of(st.binary(max_size=LIMIT + 200), json_texts, st.binary(min_size=LIMIT - 2, max_size=LIMIT + 2))
content_types = st.one_of(
    st.none(),
    header_text,
    st.sampled_from(
        [
            "application/json",
            "text/plain; charset=utf-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/json; charset=latin-1",
        ]
    ),
)


@pytest.fixture
def http(fresh_admin_url: str) -> Iterator[tuple[Any, psycopg.Connection[Any]]]:
    app = Flask("prop_http")
    app.config.update(
        IDEM_DATABASE_URL=shim_db(fresh_admin_url),
        IDEM_MAX_BODY_BYTES=LIMIT,
        IDEM_POOL_MIN_SIZE=1,
        IDEM_POOL_MAX_SIZE=4,
    )
    runs = {"n": 0}
    Idem(app)

    @app.post("/orders")
    @require_session
    @idempotency_key(ttl_hours=1)
    def place() -> Any:
        runs["n"] += 1
        data = request.get_data()
        row = (
            connection()
            .execute(
                "INSERT INTO shim_orders (user_id, route, item) VALUES (%s, 'prop', %s) RETURNING id",
                (g.current_user_id, str(len(data))),
            )
            .fetchone()
        )
        assert row is not None
        (order_id,) = row
        return {"order_id": order_id, "bytes": len(data), "content_type": request.content_type}, 201

    app.extensions["prop_runs"] = runs
    with psycopg.connect(fresh_admin_url, autocommit=True) as admin:
        try:
            yield app, admin
        finally:
            app.extensions["idem"].store.close()


def _counts(admin: psycopg.Connection[Any]) -> tuple[int, int]:
    row = admin.execute("SELECT (SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM shim_orders)").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@settings(max_examples=scaled(400))
@given(key=key_headers, body=bodies, content_type=content_types)
@example(key=str(uuid.UUID(int=1)), body=b"1e200000", content_type="application/json")
@example(key=str(uuid.UUID(int=2)), body=b"0." + b"0" * 20000 + b"1", content_type=None)
@example(key=str(uuid.UUID(int=3)), body=b"", content_type="multipart/form-data")  # the test's own
# bug, found by the deep profile: the client used to make up a new multipart body per request
def test_any_header_body_and_content_type(http: Any, key: str | None, body: bytes, content_type: str | None) -> None:
    app, admin = http
    admin.execute("TRUNCATE idempotency_keys, shim_orders")
    runs = app.extensions["prop_runs"]
    runs["n"] = 0
    headers = {"X-User": "1"}
    if key is not None:
        headers["Idempotency-Key"] = key
    if content_type is not None:
        headers["Content-Type"] = content_type
    client = app.test_client()

    def send() -> Any:
        # the raw bytes as a stream: given `data`, the test client would build a multipart
        # body of its own (with a fresh boundary each time) for a multipart content type
        return client.post("/orders", input_stream=io.BytesIO(body), content_length=len(body), headers=headers)

    first = send()
    note(f"first: {first.status_code} {first.get_data()[:200]!r}")
    assert first.status_code < 500, first.get_data()
    keys, orders = _counts(admin)
    if key is None:
        assert first.status_code == 201 and (keys, orders, runs["n"]) == (0, 1, 1)
        return
    if first.status_code in (400, 413):  # refused: nothing stored, nothing ran
        assert first.get_json()["error"] in ("Idempotency-Key must be a UUID string", "request_too_large")
        assert (keys, orders, runs["n"]) == (0, 0, 0)
        return
    assert first.status_code == 201, first.get_data()
    assert (keys, orders, runs["n"]) == (1, 1, 1)

    retry = send()
    assert retry.status_code == 201, retry.get_data()
    assert retry.headers.get("Idempotent-Replayed") == "true"
    assert retry.get_json() == {**first.get_json(), "idempotency_replayed": True}
    assert _counts(admin) == (1, 1) and runs["n"] == 1
