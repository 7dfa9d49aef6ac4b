"""Contract §4b through Flask's test client, against a real database: ``on_failure="release"``,
``scope=`` (a rename mid-retry, a shared scope refused), ``IDEM_DOCS_URL`` and ``async def`` views
(the same contract as a sync view, the same round trips). The same behaviours over HTTP under
gunicorn are in tests/python/e2e/test_protocol.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import wraps
from typing import Any

import pytest
from flask import Flask, g, request

from idem_shim import ConfigError, Idem, connection, idempotency_key
from idem_shim.queries import RESET_SESSION
from tests.python.support.races import wait_for_claim
from tests.python.support.shim import PgProxy, post, scalar, server_address, settled, shim_db, state_of

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def require_session(view: Callable[..., Any]) -> Callable[..., Any]:
    """``X-User`` is the user id (as tests/support/shim.py's), with ``functools.wraps``."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        user = request.headers.get("X-User")
        g.current_user_id = int(user) if user else None
        return view(*args, **kwargs)

    return wrapper


def write_order(route: str) -> int:
    row = (
        connection()
        .execute("INSERT INTO shim_orders (user_id, route) VALUES (%s, %s) RETURNING id", (g.current_user_id, route))
        .fetchone()
    )
    assert row is not None
    return int(row[0])


def behave(route: str) -> Any:
    """Write an order, then do what ``X-Fail`` says: raise, answer that 5xx, or answer 201."""
    order_id = write_order(route)
    fail = request.headers.get("X-Fail")
    if fail == "raise":
        raise RuntimeError("the handler broke after its writes")
    if fail:
        return {"error": "upstream", "order_id": order_id}, int(fail)
    return {"order_id": order_id}, 201


def protocol_app(
    url: str, *, orders_rule: str = "/v1/orders", orders_scope: str | None = "orders.place", **config: Any
) -> Flask:
    app = Flask("protocol_app")
    app.config.update({"IDEM_DATABASE_URL": url, "IDEM_POOL_MIN_SIZE": 1, "IDEM_POOL_MAX_SIZE": 4, **config})

    @app.post("/release")
    @require_session
    @idempotency_key(on_failure="release")
    def release() -> Any:
        return behave("release")

    @app.post("/release-wait")
    @require_session
    @idempotency_key(on_failure="release", wait_ms=5000)
    def release_wait() -> Any:
        if request.headers.get("X-Slow"):
            time.sleep(float(request.headers["X-Slow"]))
        return behave("release-wait")

    @app.post("/keep")
    @require_session
    @idempotency_key()
    def keep() -> Any:
        return behave("keep")

    @require_session
    @idempotency_key(scope=orders_scope)
    def orders() -> Any:
        return behave("orders")

    app.add_url_rule(orders_rule, "orders", orders, methods=["POST"])

    @app.post("/async")
    @require_session
    @idempotency_key()
    async def async_orders() -> Any:
        await asyncio.sleep(0)
        return behave("async")

    @app.post("/async-release")
    @require_session
    @idempotency_key(on_failure="release")
    async def async_release() -> Any:
        await asyncio.sleep(0)
        return behave("async-release")

    Idem(app)
    return app


@pytest.fixture
def apps(shim_web_url: str) -> Iterator[Callable[..., Flask]]:
    made: list[Flask] = []

    def make(**kwargs: Any) -> Flask:
        app = protocol_app(kwargs.pop("url", shim_web_url), **kwargs)
        made.append(app)
        return app

    yield make
    for app in made:
        state_of(app).store.close()


def orders_of(url: str, route: str) -> int:
    return int(scalar(url, "SELECT count(*) FROM shim_orders WHERE route = %s", (route,)))


# -- on_failure="release" ----------------------------------------------------------------------


@pytest.mark.parametrize("fail", ["raise", "502"])
def test_release_frees_the_key_so_the_retry_runs(
    apps: Callable[..., Flask], fresh_admin_url: str, shim_web_url: str, fail: str
) -> None:
    client = apps().test_client()
    key = str(uuid.uuid4())
    first = post(client, "/release", key, {"n": 1}, X_Fail=fail)
    assert first.status_code == (500 if fail == "raise" else 502)
    assert orders_of(fresh_admin_url, "release") == 0, "the failed attempt's writes rolled back"
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys WHERE idem_key = %s", (key,)) == 0
    assert scalar(fresh_admin_url, "SELECT event FROM idempotency_events WHERE scope_endpoint = 'POST /release'") == (
        "released"
    )

    retry = post(client, "/release", key, {"n": 1})
    assert retry.status_code == 201 and "idempotency_replayed" not in retry.get_json()
    again = post(client, "/release", key, {"n": 1})
    assert (
        again.headers["Idempotent-Replayed"] == "true" and again.get_json()["order_id"] == retry.get_json()["order_id"]
    )
    assert orders_of(fresh_admin_url, "release") == 1, "exactly one execution committed"


def test_keep_is_the_default_previous_failed(apps: Callable[..., Flask], fresh_admin_url: str) -> None:
    client = apps().test_client()
    key = str(uuid.uuid4())
    assert post(client, "/keep", key, {"n": 1}, X_Fail="503").status_code == 503
    retry = post(client, "/keep", key, {"n": 1})
    assert (retry.status_code, retry.get_json()) == (409, {"error": "idempotency_previous_failed"})
    assert orders_of(fresh_admin_url, "keep") == 0


def test_release_is_counted_and_logged(apps: Callable[..., Flask], caplog: pytest.LogCaptureFixture) -> None:
    app = apps()
    client = app.test_client()
    with caplog.at_level("INFO", logger="idem_shim"):
        post(client, "/release", str(uuid.uuid4()), {"n": 1}, X_Fail="500")
        post(client, "/keep", str(uuid.uuid4()), {"n": 1}, X_Fail="500")
    metrics = state_of(app).metrics
    assert metrics.registry.get_sample_value("idempotency_released_total", {"endpoint": "POST /release"}) == 1
    assert metrics.registry.get_sample_value("idempotency_released_total", {"endpoint": "POST /keep"}) is None
    events = [r.idem_event for r in caplog.records if hasattr(r, "idem_event")]
    assert "released" in events and "failed" in events


def test_a_released_holder_cannot_complete_after_another_request_took_the_key(
    apps: Callable[..., Flask], fresh_admin_url: str
) -> None:
    """Release composes with fencing: the next claim is the new holder's, the old token is dead."""
    client = apps().test_client()
    key = str(uuid.uuid4())
    post(client, "/release", key, {"n": 1}, X_Fail="500")
    post(client, "/release", key, {"n": 1})  # the retry runs and completes under a new token
    tokens = scalar(fresh_admin_url, "SELECT array_agg(key_id) FROM idempotency_events WHERE event = 'released'")
    import psycopg

    with psycopg.connect(fresh_admin_url, autocommit=True) as conn, pytest.raises(psycopg.Error) as lost:
        conn.execute("SELECT idem_complete(%s, 201, '{}')", (tokens[0],))
    assert lost.value.sqlstate == "IDM01" and "released after a failure" in str(lost.value)


def test_a_duplicate_waiting_on_a_released_key_claims_it_and_runs(
    apps: Callable[..., Flask], fresh_admin_url: str
) -> None:
    """Release composes with wait-then-replay: the waiter finds the key free and runs once."""
    app = apps()
    key = str(uuid.uuid4())
    first: list[Any] = []
    holder = threading.Thread(
        target=lambda: first.append(post(app.test_client(), "/release-wait", key, {"n": 1}, X_Slow="0.5", X_Fail="500"))
    )
    holder.start()
    wait_for_claim(fresh_admin_url, key)  # the holder has claimed the key and sleeps before failing
    waiter = post(app.test_client(), "/release-wait", key, {"n": 1})
    holder.join()
    assert first[0].status_code == 500
    assert waiter.status_code == 201 and "Idempotent-Replayed" not in waiter.headers
    assert orders_of(fresh_admin_url, "release-wait") == 1


def test_on_failure_and_scope_are_checked_at_declaration() -> None:
    with pytest.raises(ValueError, match="on_failure must be 'keep', 'release' or 'replay'"):
        idempotency_key(on_failure="retry")  # the declaration-time check
    for bad in ("", "  ", " padded", "x" * 201, "tab\there"):
        with pytest.raises(ValueError, match="scope must be"):
            idempotency_key(scope=bad)


# -- scope= ----------------------------------------------------------------------------------------


def test_a_declared_scope_keeps_its_keys_when_the_route_is_renamed(
    apps: Callable[..., Flask], fresh_admin_url: str
) -> None:
    key = str(uuid.uuid4())
    before = post(apps(orders_rule="/v1/orders").test_client(), "/v1/orders", key, {"qty": 3})
    assert before.status_code == 201
    # The deploy moves the route; the client retries the same request at the new URL.
    after = post(apps(orders_rule="/v2/orders").test_client(), "/v2/orders", key, {"qty": 3})
    assert after.headers["Idempotent-Replayed"] == "true"
    assert after.get_json()["order_id"] == before.get_json()["order_id"]
    assert orders_of(fresh_admin_url, "orders") == 1
    assert scalar(fresh_admin_url, "SELECT scope_endpoint FROM idempotency_keys WHERE idem_key = %s", (key,)) == (
        "orders.place"
    )


def test_without_a_scope_a_rename_splits_the_key_space(apps: Callable[..., Flask], fresh_admin_url: str) -> None:
    """What scope= is for: the default scope is the URL rule, so the retry runs a second time."""
    key = str(uuid.uuid4())
    post(apps(orders_rule="/v1/orders", orders_scope=None).test_client(), "/v1/orders", key, {"qty": 3})
    again = post(apps(orders_rule="/v2/orders", orders_scope=None).test_client(), "/v2/orders", key, {"qty": 3})
    assert again.status_code == 201 and "Idempotent-Replayed" not in again.headers
    assert orders_of(fresh_admin_url, "orders") == 2


def test_the_scope_is_the_metric_label(apps: Callable[..., Flask]) -> None:
    app = apps()
    post(app.test_client(), "/v1/orders", str(uuid.uuid4()), {"qty": 1})
    registry = state_of(app).metrics.registry
    assert registry.get_sample_value("idempotency_miss_total", {"endpoint": "orders.place"}) == 1


def no_content() -> Any:
    return "", 204


def _two_routes(url: str, first: str | None, second: str | None) -> Flask:
    app = Flask("shared_scope")
    app.config.update(IDEM_DATABASE_URL=url, IDEM_POOL_MIN_SIZE=0)
    app.add_url_rule("/a", "a", require_session(idempotency_key(scope=first)(no_content)), methods=["POST"])
    app.add_url_rule("/b", "b", require_session(idempotency_key(scope=second)(no_content)), methods=["POST"])
    return app


def test_a_scope_shared_by_two_routes_is_refused_at_start_up_unless_both_declare_it(shim_web_url: str) -> None:
    with pytest.raises(ConfigError, match=r"POST /a, POST /b share the idempotency scope 'POST /b'"):
        Idem(_two_routes(shim_web_url, "POST /b", None))  # /a takes /b's default: a silent double booking
    shared = Idem(_two_routes(shim_web_url, "payments", "payments")).init_app  # both declare it: allowed
    assert shared is not None


def test_a_shared_scope_on_routes_added_after_init_app_is_refused_on_the_first_request(
    shim_web_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Flask("late_routes")
    app.config.update(IDEM_DATABASE_URL=shim_web_url, IDEM_POOL_MIN_SIZE=0)
    Idem(app)
    app.add_url_rule("/a", "a", require_session(idempotency_key(scope="POST /b")(no_content)), methods=["POST"])
    app.add_url_rule("/b", "b", require_session(idempotency_key()(no_content)), methods=["POST"])
    try:
        answer = app.test_client().post("/a", headers={"Idempotency-Key": str(uuid.uuid4())})
        assert answer.status_code == 500
        assert any(
            "share the idempotency scope 'POST /b'" in r.getMessage() or "share the idempotency" in str(r.exc_info)
            for r in caplog.records
        )
    finally:
        state_of(app).store.close()


# -- IDEM_DOCS_URL ---------------------------------------------------------------------------------


@pytest.mark.parametrize("error_format", ["json", "problem+json"])
def test_docs_url_links_every_error_answer(apps: Callable[..., Flask], error_format: str) -> None:
    docs = "https://api.example.test/docs/idempotency"
    client = apps(IDEM_DOCS_URL=docs, IDEM_ERROR_FORMAT=error_format).test_client()
    key = str(uuid.uuid4())
    malformed = post(client, "/keep", "not-a-uuid", {"n": 1})
    post(client, "/keep", key, {"n": 1})
    mismatch = post(client, "/keep", key, {"n": 2})
    ok = post(client, "/keep", str(uuid.uuid4()), {"n": 3})
    for answer in (malformed, mismatch):
        assert answer.headers["Link"] == f'<{docs}>; rel="describedby"'
    assert "Link" not in ok.headers, "only the shim's own error answers carry the link"
    if error_format == "problem+json":
        assert malformed.get_json()["type"] == f"{docs}#idempotency-key-malformed"
        assert mismatch.get_json()["type"] == f"{docs}#idempotency-key-body-mismatch"


def test_docs_url_must_be_http(shim_web_url: str) -> None:
    app = Flask("bad_docs")
    app.config.update(IDEM_DATABASE_URL=shim_web_url, IDEM_DOCS_URL="docs/idempotency.md")
    with pytest.raises(ConfigError, match="IDEM_DOCS_URL must be an http"):
        Idem(app)


# -- async def views ---------------------------------------------------------------------------------


def test_an_async_view_has_the_sync_contract(apps: Callable[..., Flask], fresh_admin_url: str) -> None:
    client = apps().test_client()
    key = str(uuid.uuid4())
    first = post(client, "/async", key, {"n": 1})
    assert first.status_code == 201
    replay = post(client, "/async", key, {"n": 1})
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.get_json() == {**first.get_json(), "idempotency_replayed": True}
    assert post(client, "/async", key, {"n": 2}).status_code == 422
    assert post(client, "/async", "nope", {"n": 1}).status_code == 400
    failed = str(uuid.uuid4())
    assert post(client, "/async", failed, {"n": 1}, X_Fail="raise").status_code == 500
    assert post(client, "/async", failed, {"n": 1}).get_json() == {"error": "idempotency_previous_failed"}
    released = str(uuid.uuid4())
    assert post(client, "/async-release", released, {"n": 1}, X_Fail="500").status_code == 500
    assert post(client, "/async-release", released, {"n": 1}).status_code == 201
    assert orders_of(fresh_admin_url, "async") == 1, "the failed execution's writes rolled back"
    assert orders_of(fresh_admin_url, "async-release") == 1


def kind(sql: str) -> str:
    return next((m for m in ("idem_claim", "idem_complete", "idem_fail") if m in sql), sql.split()[0].upper())


def test_an_async_view_takes_the_same_round_trips_on_the_same_connection(fresh_admin_url: str) -> None:
    proxy = PgProxy(server_address(fresh_admin_url)).start()
    app = protocol_app(proxy.url(shim_db(fresh_admin_url)), IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=None)
    try:
        client = app.test_client()
        post(client, "/keep", None, {"n": 0})  # pool connected, schema checked
        trips = {}
        for path in ("/keep", "/async"):
            settled(app)
            proxy.reset()
            assert post(client, path, str(uuid.uuid4()), {"n": 1}).status_code == 201
            settled(app)  # the connection given back is reset, after the request: not its round trips
            statements = [sql for sql in proxy.statements if sql != RESET_SESSION]
            resets = len(proxy.statements) - len(statements)
            trips[path] = (proxy.ready_for_query - resets, [kind(sql) for sql in statements])
        assert trips["/async"] == trips["/keep"]
        assert trips["/async"][1] == ["idem_claim", "BEGIN", "INSERT", "idem_complete", "COMMIT"]
        # one connection in the pool: the claim, the handler's writes and the completion shared it
        assert state_of(app).store.pool.get_stats()["pool_size"] == 1
    finally:
        state_of(app).store.close()
        proxy.stop()


# -- the published contract (the document against the running reference app: tests/e2e) ---------


def test_flask_idempotency_openapi_prints_a_valid_document_of_every_decorated_route(apps: Callable[..., Flask]) -> None:
    import json

    from openapi_spec_validator import validate

    app = apps(IDEM_DOCS_URL="https://api.example.test/idempotency/")
    from idem_shim.cli import idempotency_cli  # the entry point's group (test apps do not load entry points)

    result = app.test_cli_runner().invoke(idempotency_cli, ["openapi"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    validate(document)
    assert set(document["paths"]) == {"/release", "/release-wait", "/keep", "/v1/orders", "/async", "/async-release"}
    orders = document["paths"]["/v1/orders"]["post"]["x-idempotency"]
    assert (orders["scope"], orders["on_failure"]) == ("orders.place", "keep")
    release = document["paths"]["/release"]["post"]
    assert (release["x-idempotency"]["scope"], release["x-idempotency"]["on_failure"]) == ("POST /release", "release")
    errors = release["responses"]["409"]["content"]["application/json"]["schema"]["allOf"][1]
    assert errors["properties"]["error"]["enum"] == ["idempotency_in_flight"], "a released key never answers failed"
    assert document["externalDocs"]["url"] == "https://api.example.test/idempotency/"
