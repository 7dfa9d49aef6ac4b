"""A client's bad input is a 400, never a store outage; a misplaced decorator never shares a scope
(contract §4). Over HTTP, through the test app, on both tiers.

- A NUL in the query string or a path parameter (which jsonb refuses: 22P05), or a path number
  beyond jsonb's range, is answered 400 ``invalid_request_fingerprint``: nothing is stored, the
  handler does not run, no store error is counted or logged (it used to be "store down": 503 on
  Tier 1, and on Tier 2 the same key executed again on every retry).
- The body already had that guard (its digest stands in): a NUL, a lone surrogate escape or a huge
  number there is claimed once and replayed.
- A route whose decorator runs before the session decorator set ``g.current_user_id`` is answered
  500 with one ERROR naming the order, on every request; ``service=True`` declares a service route.
- At most half the pool waits inside ``idem_claim`` (``wait_ms``); a waiter past that answers 409.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from flask import Flask, g

from idem_shim import idempotency_key
from tests.python.support import shim
from tests.python.support.races import wait_for_claim
from tests.python.support.shim import Order, post, scalar
from tests.python.support.sqlapi import new_key
from tests.python.support.waiting import wait_until

FINGERPRINT_ERROR = {"error": "invalid_request_fingerprint"}


def _executions(app: Flask) -> int:
    return int(app.extensions["shim_test_executions"].count)


def _add_text_routes(app: Flask) -> None:
    """A string path parameter on each tier (the test app's /items takes an int)."""

    @app.post("/t1/<name>", endpoint="t1_name")
    @shim.require_session
    @idempotency_key(fail_closed=True)
    def t1(name: str) -> Any:
        app.extensions["shim_test_executions"].bump()
        return {"name": name}, 201

    @app.post("/t2/<name>", endpoint="t2_name")
    @shim.require_session
    @idempotency_key(fail_closed=False)
    def t2(name: str) -> Any:
        app.extensions["shim_test_executions"].bump()
        return {"name": name}, 201


@pytest.mark.parametrize(
    "path",
    ["/orders?x=%00", "/billing?x=%00", "/orders?x%00y=1", "/t1/a%00b", "/t2/a%00b"],
)
def test_text_the_fingerprint_cannot_hold_is_a_400_on_both_tiers_and_never_a_store_error(
    make_app: shim.AppFactory, fresh_admin_url: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    _add_text_routes(app)
    client = app.test_client()
    key = new_key()
    with caplog.at_level(logging.INFO, logger="idem_shim"):
        for _ in range(3):  # the retries of a client: each one a 400, none executes
            response = post(client, path, key, {"item": "x"})
            assert response.status_code == 400, response.get_data(as_text=True)
            assert response.get_json() == FINGERPRINT_ERROR
    assert _executions(app) == 0
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys") == 0
    assert "store_unavailable" not in caplog.text
    text = (
        client.get("/metrics").get_data(as_text=True)
        if "/metrics" in [r.rule for r in app.url_map.iter_rules()]
        else ""
    )
    assert "idempotency_store_errors_total{" not in text


@pytest.mark.parametrize(
    "data",
    ['{"item": "a\\u0000b"}', '{"item": "\\ud800"}', '{"item": "x", "n": 1e999999}', "item=a%00b&x=\x00"],
)
def test_a_body_the_database_cannot_hold_is_fingerprinted_by_its_digest_and_runs_once(
    make_app: shim.AppFactory, data: str
) -> None:
    app = make_app()
    client = app.test_client()
    key = new_key()
    # /nodb's handler does not store the body itself (the business table would refuse a NUL too)
    first = post(client, "/nodb", key, data=data, Content_Type="application/json")
    again = post(client, "/nodb", key, data=data, Content_Type="application/json")
    assert first.status_code == 200, first.get_data(as_text=True)
    assert again.status_code == 200 and again.headers.get("Idempotent-Replayed") == "true"
    assert _executions(app) == 1


def test_a_path_number_beyond_jsonb_and_a_lone_surrogate_are_refused_before_the_claim() -> None:
    # werkzeug's URL decoding never yields these, a custom converter or a test client can
    from idem_shim.errors import InvalidFingerprintError
    from idem_shim.fingerprint import request_json

    for view_args, query in (
        ({"n": 10**5000}, {}),
        ({"s": "\ud800"}, {}),
        ({}, {"q": ["\udfff"]}),
        ({}, {"a\x00": ["1"]}),
    ):
        with pytest.raises(InvalidFingerprintError):
            request_json(b"{}", view_args, query, method=None, content_type="application/json")
    assert (
        request_json(
            b"{}", {"n": 10**900, "s": "\u00e9"}, {"q": ["\U0001f600"]}, method=None, content_type="application/json"
        )
        is not None
    )


def test_a_path_with_a_replacement_character_is_an_ordinary_request(make_app: shim.AppFactory) -> None:
    app = make_app()
    _add_text_routes(app)
    client = app.test_client()
    key = new_key()
    # werkzeug decodes invalid UTF-8 (a surrogate's bytes) to U+FFFD, which jsonb holds
    assert post(client, "/t1/%ED%A0%80", key, {"item": 1}).status_code == 201
    assert post(client, "/t1/%ED%A0%80", key, {"item": 1}).headers.get("Idempotent-Replayed") == "true"


def test_a_decorator_above_the_session_is_a_500_naming_the_order_never_a_shared_scope(
    make_app: shim.AppFactory, fresh_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()

    @app.post("/misordered")
    @idempotency_key()  # above the session: it runs before g.current_user_id is set
    @shim.require_session
    def misordered() -> Any:
        app.extensions["shim_test_executions"].bump()
        return {"balance": 100 * int(g.current_user_id)}, 201

    client = app.test_client()
    key = new_key()
    with caplog.at_level(logging.ERROR, logger="idem_shim"):
        one = post(client, "/misordered", key, {"x": 1}, user=1)
        two = post(client, "/misordered", key, {"x": 1}, user=2)
        bare = post(client, "/misordered", None, {"x": 1}, user=2)
    for response in (one, two, bare):
        assert response.status_code == 500
        assert response.get_json() == {"error": "idempotency_user_scope_unset"}
    assert _executions(app) == 0, "user 2 must never get user 1's stored answer, nor run unscoped"
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys") == 0
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "user_scope_unset" in r.getMessage()]
    assert len(errors) == 3 and "below @require_session" in errors[0].getMessage()


def test_a_declared_service_route_has_no_user_scope_and_dedupes(
    make_app: shim.AppFactory, fresh_admin_url: str
) -> None:
    app = make_app()

    @app.post("/svc")
    @idempotency_key(service=True)
    def service_call() -> Any:
        app.extensions["shim_test_executions"].bump()
        return {"ok": True}, 201

    client = app.test_client()
    key = new_key()
    assert post(client, "/svc", key, {"x": 1}, user=None).status_code == 201
    assert post(client, "/svc", key, {"x": 1}, user=None).headers.get("Idempotent-Replayed") == "true"
    assert _executions(app) == 1
    assert scalar(fresh_admin_url, "SELECT scope_user_id FROM idempotency_keys") is None


def test_at_most_half_the_pool_waits_inside_the_claim(make_app: shim.AppFactory, fresh_admin_url: str) -> None:
    release = threading.Event()

    def slow(order: Order) -> Any:
        release.wait(10)
        return shim.places_order(order)

    app = make_app(handler=slow, IDEM_POOL_MAX_SIZE=4)  # two waiters at most
    key = new_key()
    results: list[tuple[int, float]] = []
    lock = threading.Lock()

    def request() -> None:
        started = time.monotonic()
        response = post(app.test_client(), "/waiting", key, {"item": "w"})
        with lock:
            results.append((response.status_code, time.monotonic() - started))

    holder = threading.Thread(target=request)
    holder.start()
    wait_for_claim(fresh_admin_url, key)  # the holder has claimed and sits in its handler
    waiters = [threading.Thread(target=request) for _ in range(3)]
    for w in waiters:
        w.start()
    wait_until(lambda: results, what="the waiter the pool has no room for to be answered")
    with lock:
        early = list(results)
    release.set()
    for t in [holder, *waiters]:
        t.join(15)
    assert [status for status, _ in early] == [409], early  # the third waiter was not allowed to wait
    assert sorted(status for status, _ in results) == [201, 201, 201, 409]


def test_a_session_user_the_host_does_not_know_is_a_500_never_a_store_outage(
    make_app: shim.AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    client = app.test_client()
    with caplog.at_level(logging.INFO, logger="idem_shim"):
        response = post(client, "/orders", new_key(), {"item": "x"}, user=987654)
    assert response.status_code == 500  # the host's bug: its session names a user users(id) lacks
    assert _executions(app) == 0
    assert "store_unavailable" not in caplog.text
