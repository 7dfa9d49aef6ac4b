"""The interoperability options (contract §4b, issue 41), through Flask's test client on a real
database: the opaque key's minimum (``IDEM_OPAQUE_KEY_MIN_LENGTH``), the replay marker's header
names (``IDEM_REPLAYED_HEADERS``) and the stored-answer cap (``IDEM_MAX_STORED_RESPONSE_BYTES``
with ``IDEM_OVERSIZED_RESPONSE``). Under a real server with anyonce's vectors:
tests/conformance/test_anyonce.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from flask import Flask

from idem_shim import ConfigError, idempotency_key
from idem_shim.errors import OPAQUE_MALFORMED_KEY_MESSAGE
from tests.python.support import shim
from tests.python.support.shim import Order, post, scalar
from tests.python.support.sqlapi import new_key


def _count(url: str, sql: str, *args: Any) -> Any:
    return scalar(url, sql, args)


def _large_route(app: Flask, size: int) -> None:
    """POST /large: writes an order, then answers ``size`` bytes of ``x`` as octet-stream."""

    @app.post("/large")
    @shim.require_session
    @idempotency_key()
    def large() -> Any:
        app.extensions["shim_test_executions"].bump()
        order_id = Order("large", {}).write()
        return b"x" * size, 200, {"Content-Type": "application/octet-stream", "X-Order": str(order_id)}


# -- the opaque key's minimum ------------------------------------------------------------------


def test_a_lowered_minimum_admits_short_keys_and_stores_them_as_sent(
    make_app: shim.AppFactory, fresh_admin_url: str
) -> None:
    app = make_app(IDEM_KEY_FORMAT="opaque", IDEM_OPAQUE_KEY_MIN_LENGTH=1)
    client = app.test_client()
    for key in ("k", "k-post-once-1", '"quoted-key-1"'):
        first = post(client, "/orders", key, {"item": key})
        assert first.status_code == 201, first.get_data(as_text=True)
        again = post(client, "/orders", key, {"item": key})
        assert again.headers.get("Idempotent-Replayed") == "true"
        assert again.get_json()["order_id"] == first.get_json()["order_id"]
    assert shim.executions(app) == 3
    assert _count(fresh_admin_url, "SELECT count(*) FROM idempotency_keys WHERE idem_key = %s", "quoted-key-1") == 1


def test_the_minimum_is_the_apps_and_its_400_says_it(make_app: shim.AppFactory, fresh_admin_url: str) -> None:
    app = make_app(IDEM_KEY_FORMAT="opaque", IDEM_OPAQUE_KEY_MIN_LENGTH=4)
    client = app.test_client()
    short = post(client, "/orders", "abc", {"item": "a"})
    assert short.status_code == 400 and short.get_json()["error"] == OPAQUE_MALFORMED_KEY_MESSAGE, "a fixed code"
    assert "4 to 255 visible ASCII characters" in short.get_json()["detail"], "the minimum in force"
    assert post(client, "/orders", "abcd", {"item": "a"}).status_code == 201
    assert post(client, "/orders", "a,b,c,d", {"item": "a"}).status_code == 400, "still one key"
    assert shim.executions(app) == 1
    assert _count(fresh_admin_url, "SELECT count(*) FROM idempotency_keys") == 1


def test_the_default_minimum_stays_16(make_app: shim.AppFactory) -> None:
    app = make_app(IDEM_KEY_FORMAT="opaque")
    answer = post(app.test_client(), "/orders", "k-post-once-1", {"item": "a"})
    assert answer.status_code == 400
    assert "16 to 255" in answer.get_json()["detail"]
    assert shim.executions(app) == 0


@pytest.mark.parametrize("bad", [0, 256, "many"])
def test_a_minimum_outside_1_to_255_is_refused_at_init_app(make_app: shim.AppFactory, bad: Any) -> None:
    with pytest.raises(ConfigError, match="IDEM_OPAQUE_KEY_MIN_LENGTH"):
        make_app(IDEM_KEY_FORMAT="opaque", IDEM_OPAQUE_KEY_MIN_LENGTH=bad)


# -- the replay marker's names -----------------------------------------------------------------


def test_the_marker_takes_the_chosen_names_and_both_at_once(make_app: shim.AppFactory) -> None:
    one = make_app(IDEM_REPLAYED_HEADERS="Idempotency-Replayed").test_client()
    both = make_app(IDEM_REPLAYED_HEADERS=["Idempotent-Replayed", "Idempotency-Replayed"]).test_client()
    key = new_key()
    first = post(one, "/orders", key, {"item": "a"})
    assert "Idempotency-Replayed" not in first.headers and "Idempotent-Replayed" not in first.headers
    again = post(one, "/orders", key, {"item": "a"})
    assert again.headers.get("Idempotency-Replayed") == "true"
    assert "Idempotent-Replayed" not in again.headers
    key = new_key()
    post(both, "/orders", key, {"item": "b"})
    again = post(both, "/orders", key, {"item": "b"})
    assert again.headers.get("Idempotency-Replayed") == again.headers.get("Idempotent-Replayed") == "true"


@pytest.mark.parametrize("bad", ["", "Bad Name", "X-Auth-Token", "Idempotency-Replay"])
def test_a_marker_name_that_is_no_header_or_a_credential_is_refused(make_app: shim.AppFactory, bad: str) -> None:
    with pytest.raises(ConfigError, match="IDEM_REPLAYED_HEADERS"):
        make_app(IDEM_REPLAYED_HEADERS=[bad])


# -- the stored-answer cap ---------------------------------------------------------------------


def test_an_answer_over_the_cap_replays_its_status_and_headers_without_its_body(
    make_app: shim.AppFactory, fresh_admin_url: str
) -> None:
    app = make_app(IDEM_MAX_STORED_RESPONSE_BYTES=1024, IDEM_REPLAY_HEADERS="X-Order")
    _large_route(app, 1025)
    client = app.test_client()
    key = new_key()
    first = post(client, "/large", key)
    assert first.status_code == 200 and len(first.get_data()) == 1025, "the first answer goes out whole"
    assert "Idempotency-Replay" not in first.headers
    again = post(client, "/large", key)
    assert (again.status_code, again.get_data()) == (200, b"")
    assert again.headers["Idempotency-Replay"] == "omitted"
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["X-Order"] == first.headers["X-Order"]
    assert again.headers["Content-Type"] == "application/octet-stream"
    assert shim.executions(app) == 1, "never a second execution"
    assert _count(fresh_admin_url, "SELECT count(*) FROM shim_orders WHERE route = 'large'") == 1
    stored = _count(fresh_admin_url, "SELECT pg_catalog.length(response_body::text) FROM idempotency_keys")
    assert stored < 100, "the body is not stored"


def test_an_answer_at_the_cap_is_stored_whole(make_app: shim.AppFactory) -> None:
    app = make_app(IDEM_MAX_STORED_RESPONSE_BYTES=1024)
    _large_route(app, 1024)
    client = app.test_client()
    key = new_key()
    post(client, "/large", key)
    again = post(client, "/large", key)
    assert len(again.get_data()) == 1024 and "Idempotency-Replay" not in again.headers


def test_a_route_may_refuse_an_answer_over_the_cap_instead(
    make_app: shim.AppFactory, fresh_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(IDEM_MAX_STORED_RESPONSE_BYTES=1024, IDEM_OVERSIZED_RESPONSE="refuse")
    _large_route(app, 1025)
    client = app.test_client()
    key = new_key()
    with caplog.at_level(logging.ERROR, logger="idem_shim"):
        assert post(client, "/large", key).status_code == 500
    [line] = [r.getMessage() for r in caplog.records if "response_refused" in r.getMessage()]
    assert "over IDEM_MAX_STORED_RESPONSE_BYTES (1024)" in line
    assert _count(fresh_admin_url, "SELECT count(*) FROM shim_orders WHERE route = 'large'") == 0, "rolled back"
    assert post(client, "/large", key).status_code == 409, "previous_failed: never a second execution"
    assert shim.executions(app) == 1


def test_an_oversized_mode_that_is_neither_is_refused_at_init_app(make_app: shim.AppFactory) -> None:
    with pytest.raises(ConfigError, match="IDEM_OVERSIZED_RESPONSE"):
        make_app(IDEM_OVERSIZED_RESPONSE="truncate")


# -- safe methods ------------------------------------------------------------------------------


def test_a_key_on_a_safe_method_is_ignored(make_app: shim.AppFactory, fresh_admin_url: str) -> None:
    """The IETF draft's §1: the header makes a non-idempotent method fault-tolerant; a GET is
    idempotent already. A decorated route that also answers GET runs each GET, stores nothing."""
    app = make_app()

    @app.route("/tally", methods=["GET", "HEAD", "POST"])
    @shim.require_session
    @idempotency_key()
    def tally() -> Any:
        return {"count": app.extensions["shim_test_executions"].bump()}

    client = app.test_client()
    key = new_key()
    first = client.get("/tally", headers={"Idempotency-Key": key})
    again = client.get("/tally", headers={"Idempotency-Key": key})
    assert (first.get_json(), again.get_json()) == ({"count": 1}, {"count": 2})
    assert "Idempotent-Replayed" not in again.headers
    assert client.head("/tally", headers={"Idempotency-Key": key}).status_code == 200
    assert _count(fresh_admin_url, "SELECT count(*) FROM idempotency_keys") == 0
    posted = post(client, "/tally", key)
    replayed = post(client, "/tally", key)
    assert replayed.get_json()["count"] == posted.get_json()["count"], "a POST with the key still replays"
    assert replayed.headers["Idempotent-Replayed"] == "true"


def test_an_uncorrected_retry_after_a_422_is_the_422_again(make_app: shim.AppFactory) -> None:
    """The IETF draft's §2.7: a client MUST correct the request before retrying, or the resource
    MUST fail it again with the same error; the corrected one still replays (never a second run)."""
    app = make_app(IDEM_ERROR_FORMAT="problem+json")
    client = app.test_client()
    key = new_key()
    first = post(client, "/orders", key, {"item": "a"})
    for _ in range(2):
        again = post(client, "/orders", key, {"item": "b"})
        assert again.status_code == 422 and again.mimetype == "application/problem+json"
    corrected = post(client, "/orders", key, {"item": "a"})
    assert corrected.get_json()["order_id"] == first.get_json()["order_id"]
    assert shim.executions(app) == 1


def test_the_openapi_document_publishes_the_chosen_marker_and_minimum(make_app: shim.AppFactory) -> None:
    from idem_shim.openapi import document

    app = make_app(
        IDEM_KEY_FORMAT="opaque",
        IDEM_OPAQUE_KEY_MIN_LENGTH=1,
        IDEM_REPLAYED_HEADERS=["Idempotent-Replayed", "Idempotency-Replayed"],
    )
    operation = document(app)["paths"]["/orders"]["post"]
    marker = operation["x-idempotency"]["replay_marker"]
    assert marker["headers"] == ["Idempotent-Replayed", "Idempotency-Replayed"]
    assert set(operation["responses"]["default"]["headers"]) == {"Idempotent-Replayed", "Idempotency-Replayed"}
    [key] = [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
    assert "{1,255}" in key["schema"]["pattern"] and "1 to 255" in key["description"]
