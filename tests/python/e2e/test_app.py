"""Raptor's routes over real HTTP: the gates that a replay can never bypass, each tier's
behaviour, the routes that are not instrumented, the app's role, and the undecorated mode the
benchmark compares against."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import requests

from tests.python.e2e.e2e_harness import Database, StartServer, new_key

ORDER: dict[str, Any] = {"symbol": "MSFT", "side": "buy", "qty": 2}


# --- gates before the idempotency layer -----------------------------------------------------


def test_user_switched_to_live_gets_the_gate_on_retry_never_the_stored_201(
    db: Database, start_server: StartServer
) -> None:
    server = start_server(db.app_url, workers=2)
    user = db.seed_user()
    key = new_key()
    first = server.order(user, key, ORDER)
    assert first.status_code == 201

    db.query("UPDATE raptor.accounts SET trading_mode = 'live' WHERE user_id = %s", (user.user_id,))
    retry = server.order(user, key, ORDER)
    assert retry.status_code == 403
    assert retry.json()["error"] == "live_trading_not_enabled"
    assert "Idempotent-Replayed" not in retry.headers
    roll = server.post(
        "/api/trading/lcc/roll",
        user,
        {"leg_id": user.leg_id, "new_expiry": "2099-01-15", "new_strike_cents": 21000},
        new_key(),
    )
    assert roll.status_code == 403

    db.query("UPDATE raptor.accounts SET trading_mode = 'paper' WHERE user_id = %s", (user.user_id,))
    back = server.order(user, key, ORDER)
    assert back.status_code == 201 and back.headers["Idempotent-Replayed"] == "true"
    assert back.json()["order_id"] == first.json()["order_id"]
    assert len(db.orders_for_key(key)) == 1
    # the refused retries never reached the store: one replay audit row, for the last retry
    assert (
        db.scalar(
            "SELECT count(*) FROM public.audit_log WHERE user_id = %s AND action = 'idempotency_replay'",
            (user.user_id,),
        )
        == 1
    )


def test_new_orders_disabled_refuses_retries_too_never_the_stored_201(db: Database, start_server: StartServer) -> None:
    user = db.seed_user()
    key = new_key()
    normal = start_server(db.app_url, workers=1)
    first = normal.order(user, key, ORDER)
    assert first.status_code == 201

    # the same database served by an instance with the kill switch on
    disabled = start_server(db.app_url, workers=1, MBT_NEW_ORDERS_DISABLED="1")
    retry = disabled.order(user, key, ORDER)
    assert retry.status_code == 503
    assert retry.json()["error"] == "new_orders_disabled"
    assert "Idempotent-Replayed" not in retry.headers
    fresh_key = new_key()
    assert disabled.order(user, fresh_key, ORDER).status_code == 503
    assert db.orders_for_key(fresh_key) == []
    assert db.key_rows(fresh_key) == [], "refused before any claim"
    # billing is not an order path: it still works
    assert disabled.post("/api/billing/checkout-session", user, {"plan": "pro"}, new_key()).status_code == 201
    assert normal.order(user, key, ORDER).headers["Idempotent-Replayed"] == "true"


# --- routes and tiers -------------------------------------------------------------------------


def test_refused_business_writes_are_4xx_and_replay_as_such(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, workers=2)
    user = db.seed_user(cash_cents=10_000)
    for body, error in [
        ({"symbol": "NOPE", "side": "buy", "qty": 1}, "unknown_symbol"),
        ({"symbol": "SPY", "side": "buy", "qty": 1}, "insufficient_cash"),
        ({"symbol": "SPY", "side": "sell", "qty": 1}, "insufficient_position"),
        ({"symbol": "SPY", "side": "hold", "qty": 1}, "invalid_request"),
    ]:
        key = new_key()
        first = server.order(user, key, body)
        again = server.order(user, key, body)
        assert first.status_code in (400, 422) and first.json()["error"] == error
        assert again.status_code == first.status_code
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.json()["error"] == error
    assert db.scalar("SELECT count(*) FROM raptor.paper_orders") == 0
    assert db.scalar("SELECT cash_cents FROM raptor.accounts WHERE user_id = %s", (user.user_id,)) == 10_000


def test_lcc_roll_is_atomic_and_idempotent(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, workers=2)
    user = db.seed_user()
    key = new_key()
    body = {"leg_id": user.leg_id, "new_expiry": "2099-01-15", "new_strike_cents": 21000}
    first = server.post("/api/trading/lcc/roll", user, body, key)
    again = server.post("/api/trading/lcc/roll", user, body, key)
    assert first.status_code == 201, first.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["opened_leg_id"] == first.json()["opened_leg_id"]
    legs = db.query(
        "SELECT id, status, rolled_from FROM raptor.lcc_legs WHERE user_id = %s ORDER BY id", (user.user_id,)
    )
    assert legs == [(user.leg_id, "closed", None), (first.json()["opened_leg_id"], "open", user.leg_id)]
    # a second roll of the closed leg, with a new key, is a business refusal
    other = server.post("/api/trading/lcc/roll", user, body, new_key())
    assert other.status_code == 422 and other.json()["error"] == "leg_not_open"


def test_billing_is_tier2_with_a_7_day_key(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, workers=2)
    user = db.seed_user()
    key = new_key()
    first = server.post("/api/billing/checkout-session", user, {"plan": "starter"}, key)
    again = server.post("/api/billing/checkout-session", user, {"plan": "starter"}, key)
    assert first.status_code == 201
    assert again.json()["checkout_session_id"] == first.json()["checkout_session_id"]
    assert db.scalar("SELECT count(*) FROM raptor.checkout_sessions WHERE user_id = %s", (user.user_id,)) == 1
    ttl = db.scalar("SELECT expires_at - created_at FROM public.idempotency_keys WHERE idem_key = %s", (key,))
    assert ttl.days == 7
    order_key = new_key()
    server.order(user, order_key, ORDER)
    ttl = db.scalar("SELECT expires_at - created_at FROM public.idempotency_keys WHERE idem_key = %s", (order_key,))
    assert ttl.total_seconds() == 24 * 3600


def test_cancel_is_not_instrumented_and_already_idempotent(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, workers=2)
    user = db.seed_user()
    resting = server.order(
        user, new_key(), {"symbol": "TSLA", "side": "buy", "qty": 1, "type": "limit", "limit_price_cents": 100}
    )
    assert resting.status_code == 201 and resting.json()["status"] == "open"
    order_id = resting.json()["order_id"]
    url = f"{server.base}/api/trading/orders/{order_id}"
    key = new_key()
    first = requests.delete(url, headers={**user.auth, "Idempotency-Key": key}, timeout=10)
    second = requests.delete(url, headers={**user.auth, "Idempotency-Key": key}, timeout=10)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json() == {"order_id": order_id, "status": "cancelled"}
    assert "Idempotent-Replayed" not in second.headers
    assert db.key_rows(key) == [], "DELETE never touches the idempotency store"
    filled = server.order(user, new_key(), ORDER).json()["order_id"]
    refused = requests.delete(f"{server.base}/api/trading/orders/{filled}", headers=user.auth, timeout=10)
    assert refused.status_code == 409 and refused.json()["error"] == "order_not_cancellable"


def test_sessions_health_and_metrics(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, workers=2)
    user = db.seed_user()
    no_token = requests.post(server.base + "/api/trading/orders", json=ORDER, timeout=10)
    assert no_token.status_code == 401 and no_token.headers["WWW-Authenticate"] == "Bearer"
    bad = requests.post(
        server.base + "/api/trading/orders", json=ORDER, timeout=10, headers={"Authorization": "Bearer nope"}
    )
    assert bad.status_code == 401
    malformed = server.order(user, "not-a-uuid", ORDER)
    assert malformed.status_code == 400
    assert malformed.json() == {"error": "Idempotency-Key must be a UUID string"}

    health = requests.get(server.base + "/healthz", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    key = new_key()
    for _ in range(3):
        server.order(user, key, ORDER)
    text = requests.get(server.base + "/metrics", timeout=10).text
    # summed over the gunicorn workers (prometheus multiprocess mode)
    assert 'idempotency_miss_total{endpoint="POST /api/trading/orders"} 1.0' in text
    assert 'idempotency_replay_total{endpoint="POST /api/trading/orders"} 2.0' in text


def test_app_role_cannot_read_the_idempotency_table(db: Database) -> None:
    with psycopg.connect(db.app_url) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT * FROM public.idempotency_keys")
    with psycopg.connect(db.app_url) as conn:
        assert conn.execute("SELECT pg_has_role('raptor_web', 'idem_app', 'member')").fetchone() == (True,)
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (False,)


def test_undecorated_mode_serves_the_same_handler_without_the_layer(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, workers=1, RAPTOR_IDEMPOTENCY="off")
    user = db.seed_user()
    key = new_key()
    first = server.order(user, key, ORDER)
    second = server.order(user, key, ORDER)
    assert first.status_code == second.status_code == 201
    assert first.json()["order_id"] != second.json()["order_id"], "no dedup without the layer"
    assert db.key_rows(key) == []
    assert requests.get(server.base + "/healthz", timeout=10).json()["idempotency"] == "off"


# --- a replay is the same answer; the shim's errors in either format ----------------------------


def test_a_retried_create_replays_its_location(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, workers=2)
    user = db.seed_user()
    key = new_key()
    first = server.order(user, key, ORDER)
    retry = server.order(user, key, ORDER)
    assert first.status_code == retry.status_code == 201
    order_id = first.json()["order_id"]
    assert first.headers["Location"] == retry.headers["Location"] == f"/api/trading/orders/{order_id}"
    assert retry.headers["Content-Type"] == "application/json"
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert (
        db.scalar("SELECT response_headers ->> 'Location' FROM public.idempotency_keys WHERE idem_key = %s", (key,))
        == f"/api/trading/orders/{order_id}"
    )


@pytest.mark.parametrize("error_format", ["json", "problem+json"])
def test_the_shims_errors_in_the_configured_format(db: Database, start_server: StartServer, error_format: str) -> None:
    """IDEM_ERROR_FORMAT switches the shim's own answers to RFC 9457 problem details; the default
    stays contract §4's {"error": ...}. The same `error` member either way."""
    server = start_server(db.app_url, workers=1, IDEM_ERROR_FORMAT=error_format)
    user = db.seed_user()
    key = new_key()
    assert server.order(user, key, ORDER).status_code == 201
    answers = {
        422: server.order(user, key, {**ORDER, "qty": 3}),
        400: server.order(user, "not-a-uuid", ORDER),
    }
    errors = {422: "idempotency_key_body_mismatch", 400: "Idempotency-Key must be a UUID string"}
    for status, answer in answers.items():
        body = answer.json()
        assert answer.status_code == status and body["error"] == errors[status]
        if error_format == "json":
            assert body == {"error": errors[status]}
            assert answer.headers["Content-Type"] == "application/json"
        else:
            assert answer.headers["Content-Type"] == "application/problem+json"
            assert isinstance(body["type"], str) and ":" in body["type"]
            assert isinstance(body["title"], str) and body["title"]
            assert isinstance(body["detail"], str) and body["detail"]
            assert body["status"] == status and isinstance(body["status"], int)


# --- the paper order on Flask-SQLAlchemy (examples/raptor/orm.py) ----------------------------


def test_the_orm_order_fills_once_with_the_sql_routes_rows_and_replays(db: Database, start_server: StartServer) -> None:
    """The same rows as the SQL route's fill (order, cash, position, audit row), committed with
    the key: a retry replays the order, a refused one replays its 422."""
    server = start_server(db.app_url, workers=2)
    user = db.seed_user(cash_cents=1_000_000)
    key = new_key()
    first = server.post("/api/trading/orm/orders", user, ORDER, key)
    assert first.status_code == 201, first.text
    again = server.post("/api/trading/orm/orders", user, ORDER, key)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["order_id"] == first.json()["order_id"]
    orders = db.orders_for_key(key)
    assert orders == [(first.json()["order_id"], "filled")]
    assert db.fill_audit_rows([orders[0][0]]) == 1
    price = db.scalar("SELECT price_cents FROM raptor.instruments WHERE symbol = 'MSFT'")
    assert (
        db.scalar("SELECT cash_cents FROM raptor.accounts WHERE user_id = %s", (user.user_id,)) == 1_000_000 - 2 * price
    )
    assert first.json()["cash_after_cents"] == 1_000_000 - 2 * price
    assert db.scalar("SELECT qty FROM raptor.positions WHERE user_id = %s AND symbol = 'MSFT'", (user.user_id,)) == 2

    refused = new_key()
    unknown = {"symbol": "ZZZZ", "side": "buy", "qty": 1}
    assert server.post("/api/trading/orm/orders", user, unknown, refused).json()["error"] == "unknown_symbol"
    replayed = server.post("/api/trading/orm/orders", user, unknown, refused)
    assert (replayed.status_code, replayed.headers["Idempotent-Replayed"]) == (422, "true")


def test_the_orm_order_timed_out_on_a_locked_account_is_the_503_never_a_500(
    db: Database, start_server: StartServer
) -> None:
    """SQLAlchemy wraps psycopg's QueryCanceled in its own OperationalError: the app answers it
    as the SQL route's, a retryable 503 with Retry-After."""
    db.query(f"ALTER ROLE raptor_web IN DATABASE {db.name} SET statement_timeout = 300")
    server = start_server(db.app_url, workers=1)
    user = db.seed_user()
    with psycopg.connect(db.admin_url) as locker:
        locker.execute("SELECT 1 FROM raptor.accounts WHERE user_id = %s FOR UPDATE", (user.user_id,))
        answer = server.post("/api/trading/orm/orders", user, ORDER, new_key())
        locker.rollback()
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == "service_unavailable" and answer.headers["Retry-After"]
