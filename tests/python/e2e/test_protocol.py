"""Contract §4b over real HTTP against Raptor under gunicorn: the checkout's failed key released for
its retry, the order route renamed during a retry (two deploys side by side on one database),
and the published OpenAPI document checked against the answers the running app gives."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
from typing import Any

import requests
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from tests.python.e2e.e2e_harness import ROOT, Database, StartServer, free_port, new_key
from tests.python.support.waiting import wait_until

CHECKOUT = "/api/billing/checkout-session"
ORDERS = "/api/trading/orders"
ORDER: dict[str, Any] = {"symbol": "AAPL", "side": "buy", "qty": 1}
DOCS = "https://raptor.example.test/docs/idempotency"


def test_a_failed_checkout_releases_its_key_and_the_retry_runs_once(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, workers=2, RAPTOR_TEST_HOOKS=1)
    user = db.seed_user()
    key = new_key()
    failed = server.post(CHECKOUT, user, {"plan": "pro"}, key, headers={"X-Raptor-Test-Fail": "after-writes"})
    assert failed.status_code == 502
    sessions = "SELECT count(*) FROM raptor.checkout_sessions WHERE client_key = %s"
    assert db.scalar(sessions, (key,)) == 0, "the failed attempt's session rolled back"
    assert db.key_rows(key) == [], "the key was freed"
    assert db.scalar(
        "SELECT event FROM public.idempotency_events WHERE scope_endpoint = %s", (f"POST {CHECKOUT}",)
    ) == ("released")

    retry = server.post(CHECKOUT, user, {"plan": "pro"}, key)
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry.headers
    again = server.post(CHECKOUT, user, {"plan": "pro"}, key)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["checkout_session_id"] == retry.json()["checkout_session_id"]
    assert db.scalar(sessions, (key,)) == 1
    metrics = requests.get(server.base + "/metrics", timeout=5).text
    assert f'idempotency_released_total{{endpoint="POST {CHECKOUT}"}} 1.0' in metrics


def test_the_order_route_renamed_mid_retry_keeps_its_key(db: Database, start_server: StartServer) -> None:
    """Blue/green: the old deploy still serves /api/trading/orders (and holds the key, its
    order slow) while the new one serves /api/v2/trading/orders; the client's retry reaches the
    new URL. Same scope, so it waits for and replays the first order instead of placing a second."""
    old = start_server(db.app_url, workers=2, RAPTOR_TEST_HOOKS=1)
    new = start_server(db.app_url, workers=2, RAPTOR_ORDERS_RULE="/api/v2/trading/orders")
    user = db.seed_user()
    key = new_key()
    first: list[requests.Response] = []
    slow = threading.Thread(
        target=lambda: first.append(old.order(user, key, ORDER, headers={"X-Raptor-Test-Delay-Ms": "1500"}))
    )
    slow.start()
    wait_until(lambda: db.key_rows(key) or None, 10, what="the first order's claim")
    during = new.post("/api/v2/trading/orders", user, ORDER, key)
    assert during.status_code == 409 and during.json()["error"] == "idempotency_in_flight"
    slow.join()
    assert first[0].status_code == 201
    after = new.post("/api/v2/trading/orders", user, ORDER, key)
    assert after.status_code == 201 and after.headers["Idempotent-Replayed"] == "true"
    assert after.json()["order_id"] == first[0].json()["order_id"]
    assert len(db.orders_for_key(key)) == 1
    assert new.post(ORDERS, user, ORDER, new_key()).status_code == 404, "the old URL is gone from the new deploy"


# -- the published contract --------------------------------------------------------------------


def published_document(db: Database, **env: str) -> dict[str, Any]:
    idem = ROOT / ".venv/bin/idem"
    out = subprocess.run(
        [str(idem) if idem.exists() else "idem", "openapi", "--app", "examples.raptor:create_app()"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "DATABASE_URL": db.app_url, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    document: dict[str, Any] = json.loads(out.stdout)
    return document


def check(document: dict[str, Any], path: str, answer: requests.Response) -> None:
    """``answer`` is one the document declares for POST ``path``: status, media type, schema, headers."""
    declared = document["paths"][path]["post"]["responses"]
    if str(answer.status_code) not in declared:  # the handler's own answer: only the replay marker is ours
        marker = answer.headers.get("Idempotent-Replayed")
        assert marker is None or marker in declared["default"]["headers"]["Idempotent-Replayed"]["schema"]["enum"]
        return
    response = declared[str(answer.status_code)]
    media = answer.headers["Content-Type"].split(";")[0]
    schema = response["content"][media]["schema"]
    OAS31Validator({**schema, "components": document["components"]}).validate(answer.json())
    for header, spec in response.get("headers", {}).items():
        assert header in answer.headers or not spec.get("required"), (path, answer.status_code, header)


def test_the_published_document_validates_and_declares_the_answers_the_app_gives(
    db: Database, start_server: StartServer
) -> None:
    env = {"IDEM_DOCS_URL": DOCS, "IDEM_ERROR_FORMAT": "problem+json", "IDEM_MAX_BODY_BYTES": "4096"}
    document = published_document(db, **env)
    validate(document)  # openapi-spec-validator: a valid OpenAPI 3.1 document
    assert set(document["paths"]) == {
        ORDERS,
        "/api/trading/lcc/roll",
        "/api/trading/orm/orders",
        CHECKOUT,
        "/api/trading/live/orders",
    }
    live = document["paths"]["/api/trading/live/orders"]["post"]
    assert next(p for p in live["parameters"] if p["name"] == "Idempotency-Key")["required"] is True
    orders = document["paths"][ORDERS]["post"]
    assert orders["x-idempotency"]["scope"] == "POST /api/trading/orders"
    assert orders["x-idempotency"]["ttl_seconds"] == 86400 and orders["x-idempotency"]["on_failure"] == "keep"
    checkout = document["paths"][CHECKOUT]["post"]["x-idempotency"]
    assert (checkout["ttl_seconds"], checkout["fail_closed"], checkout["on_failure"]) == (604800, False, "release")
    key_parameter = next(p for p in orders["parameters"] if p["name"] == "Idempotency-Key")
    assert key_parameter["schema"] == {"type": "string", "format": "uuid"} and key_parameter["required"] is False

    server = start_server(db.app_url, workers=2, RAPTOR_TEST_HOOKS=1, **env)
    user = db.seed_user()
    seen: dict[int, requests.Response] = {}

    def answer(response: requests.Response, path: str = ORDERS) -> requests.Response:
        check(document, path, response)
        seen[response.status_code] = response
        return response

    key = new_key()
    answer(server.order(user, key, ORDER))  # 201, the handler's
    replay = answer(server.order(user, key, ORDER))
    assert replay.headers["Idempotent-Replayed"] == "true"
    answer(server.order(user, "not-a-uuid", ORDER))  # 400
    answer(server.order(user, key, {**ORDER, "qty": 2}))  # 422
    answer(server.order(user, new_key(), {**ORDER, "note": "x" * 5000}))  # 413
    busy = new_key()
    slow = threading.Thread(
        target=server.order, args=(user, busy, ORDER), kwargs={"headers": {"X-Raptor-Test-Delay-Ms": "1500"}}
    )
    slow.start()
    wait_until(lambda: db.key_rows(busy) or None, 10, what="the slow order's claim")
    in_flight = answer(server.order(user, busy, ORDER))  # 409 in flight
    slow.join()
    assert in_flight.json()["error"] == "idempotency_in_flight" and "Retry-After" in in_flight.headers
    failed = new_key()  # a key failed earlier: the same claim the shim makes, then idem_fail
    request_hash = db.scalar(
        "SELECT request_hash FROM public.idem_claim(p_key => %s, p_user_id => %s, p_endpoint => %s, "
        "p_request => %s::jsonb)",
        (failed, user.user_id, f"POST {ORDERS}", json.dumps(ORDER)),
    )
    assert (
        request_hash == hashlib.sha256(db.scalar("SELECT %s::jsonb::text", (json.dumps(ORDER),)).encode()).hexdigest()
    )
    db.query("SELECT public.idem_fail(k.id, 500) FROM public.idempotency_keys k WHERE k.idem_key = %s", (failed,))
    previous = answer(server.order(user, failed, ORDER))  # 409 previous failed
    assert previous.json()["error"] == "idempotency_previous_failed"
    answer(server.post(CHECKOUT, user, {"plan": "team"}, "nope"), CHECKOUT)

    # 503 from a deploy whose idempotency store is unreachable (the order route fails closed); that
    # deploy answers in the default JSON error format, the document's other media type
    dead_store = f"postgresql://raptor_web@127.0.0.1:{free_port()}/x"
    down = start_server(db.app_url, workers=1, **{**env, "IDEM_ERROR_FORMAT": "json", "IDEM_DATABASE_URL": dead_store})
    unavailable = answer(down.order(user, new_key(), ORDER))
    assert unavailable.json() == {"error": "idempotency_store_unavailable"}
    assert unavailable.headers["Content-Type"].startswith("application/json")

    assert set(seen) == {201, 400, 409, 413, 422, 503}
    for status in (400, 409, 413, 422, 503):
        assert seen[status].headers["Link"] == f'<{DOCS}>; rel="describedby"', status
    for status in (400, 409, 413, 422):
        assert seen[status].headers["Content-Type"].startswith("application/problem+json")
        assert seen[status].json()["type"].startswith(DOCS + "#")
    assert set(document["paths"][ORDERS]["post"]["responses"]) == {"default", "400", "409", "413", "422", "503"}


def test_openapi_on_an_app_without_decorated_routes_and_on_a_module_that_does_not_import(tmp_path: Any) -> None:
    (tmp_path / "bare_app.py").write_text("from flask import Flask\napp = Flask('bare')\n")
    idem = str(ROOT / ".venv/bin/idem")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    empty = subprocess.run(
        [idem, "openapi", "--app", "bare_app:app"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert empty.returncode == 0 and json.loads(empty.stdout)["paths"] == {}
    assert "no route decorated with @idempotency_key" in empty.stderr
    broken = subprocess.run(
        [idem, "openapi", "--app", "no_such_module:app"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert broken.returncode == 1 and broken.stdout == ""
    assert len(broken.stderr.strip().splitlines()) == 1 and "cannot load the app" in broken.stderr
