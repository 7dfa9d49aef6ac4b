"""
Through the Flask shim, an app whose users are ``app.customers(id uuid)`` (issue 40 item 4):

- installed with ``idem migrate --users-table app.customers``, a route whose session sets
  ``g.current_user_id`` to the customer's UUID (a ``uuid.UUID`` or its text) deduplicates: one
  execution, one order, the retry replayed;
- a session whose customer is not in app.customers is answered 500 ``idempotency_user_unknown``
  (problem+json), nothing stored or run, and one ERROR line names the table and the fix: never a
  bare foreign-key traceback;
- a user id of no user type (a float) is the host's bug, a TypeError naming it.
"""

from __future__ import annotations

import logging
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from flask import Flask, g, request

import testdb
from idem_shim import Idem, connection, idempotency_key
from tests.python.support.roles import as_app_role

CUSTOMER = uuid.UUID("0b9a5c1e-7d2f-4c3a-8e61-5f4d3c2b1a00")
NOBODY = uuid.UUID("0b9a5c1e-7d2f-4c3a-8e61-5f4d3c2b1aff")


@pytest.fixture
def uuid_store(admin_url: str) -> Iterator[str]:
    name = f"idem_hus_{uuid.uuid4().hex[:10]}"
    url = testdb.create(admin_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA app; CREATE TABLE app.customers (id uuid PRIMARY KEY)")
        conn.execute("INSERT INTO app.customers (id) VALUES (%s)", (CUSTOMER,))
    done = subprocess.run(
        [testdb.idem_command(), "migrate", "-q", "--database-url", url, "--users-table", "app.customers"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE app.orders (id bigserial PRIMARY KEY, customer_id uuid NOT NULL, item text)")
        conn.execute("GRANT USAGE ON SCHEMA app TO idem_app")
        conn.execute("GRANT SELECT, INSERT ON app.orders TO idem_app")
        conn.execute("GRANT USAGE ON SEQUENCE app.orders_id_seq TO idem_app")
    yield url
    testdb.drop(admin_url, name)


def make_app(url: str, runs: list[Any]) -> Flask:
    app = Flask("host_users_app")
    app.config.update(IDEM_DATABASE_URL=as_app_role(url), IDEM_POOL_MIN_SIZE=1, IDEM_ERROR_FORMAT="problem+json")

    @app.post("/orders")
    @idempotency_key()
    def place_order() -> Any:
        runs.append(g.current_user_id)
        row = (
            connection()
            .execute(
                "INSERT INTO app.orders (customer_id, item) VALUES (%s, %s) RETURNING id",
                (g.current_user_id, (request.get_json() or {}).get("item")),
            )
            .fetchone()
        )
        assert row is not None
        return {"order_id": row[0]}, 201

    @app.before_request
    def session() -> None:  # the host's session: the customer's id as its users table has it
        given = request.headers.get("X-Customer")
        g.current_user_id = uuid.UUID(given) if request.headers.get("X-As-Uuid") else given
        if request.headers.get("X-Float"):
            g.current_user_id = 1.5

    Idem(app)
    return app


def orders(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM app.orders").fetchone()
    return int(row[0]) if row else -1


def test_a_uuid_customer_deduplicates_through_the_shim(uuid_store: str) -> None:
    runs: list[Any] = []
    app = make_app(uuid_store, runs)
    key = str(uuid.uuid4())
    with app.test_client() as client:
        first = client.post(
            "/orders",
            json={"item": "x"},
            headers={"Idempotency-Key": key, "X-Customer": str(CUSTOMER), "X-As-Uuid": "1"},
        )
        retry = client.post(
            "/orders", json={"item": "x"}, headers={"Idempotency-Key": key, "X-Customer": str(CUSTOMER)}
        )
    assert first.status_code == 201, first.get_data(as_text=True)
    assert retry.status_code == 201, retry.get_data(as_text=True)
    assert retry.get_json() == {**first.get_json(), "idempotency_replayed": True}, "the retry is the first's answer"
    assert len(runs) == 1 and orders(uuid_store) == 1, "one execution, one order"


def test_a_customer_missing_from_the_users_table_is_a_clear_answer(
    uuid_store: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[Any] = []
    app = make_app(uuid_store, runs)
    with caplog.at_level(logging.ERROR, logger="idem_shim"), app.test_client() as client:
        answer = client.post(
            "/orders", json={"item": "x"}, headers={"Idempotency-Key": str(uuid.uuid4()), "X-Customer": str(NOBODY)}
        )
    assert answer.status_code == 500
    assert answer.mimetype == "application/problem+json"
    body = answer.get_json()
    assert body["error"] == "idempotency_user_unknown" and body["type"].endswith("idempotency-user-unknown")
    assert "users table" in body["detail"]
    assert runs == [] and orders(uuid_store) == 0, "nothing run"
    lines = [r.getMessage() for r in caplog.records if "user_unknown" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert 'table \\"customers' in lines[0] and str(NOBODY) in lines[0] and "users table" in lines[0], lines[0]


def test_a_user_id_of_no_user_type_is_the_hosts_bug(uuid_store: str) -> None:
    app = make_app(uuid_store, [])
    app.testing = True  # the exception reaches the test
    with app.test_client() as client, pytest.raises(TypeError, match=r"g\.current_user_id must be an int, a UUID"):
        client.post("/orders", json={}, headers={"Idempotency-Key": str(uuid.uuid4()), "X-Float": "1"})
