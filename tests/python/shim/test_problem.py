"""The shim's own error answers as RFC 9457 problem details (IDEM_ERROR_FORMAT = "problem+json").

Cases: each of 400 (header required, malformed key), 413, 409 (in flight, previous failed), 422
and 503 answers application/problem+json whose members validate against RFC 9457 (type a URI
string, title and detail strings, status the integer status code) and carry the same `error`
(and `retry_after_ms`) as the default form; the default format is unchanged ({"error": ...},
application/json). (Each error's own stable type and an unknown format: tests/python/unit/test_http_mapping.py.)
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from flask import Flask
from flask.testing import FlaskClient

from idem_shim.http import PROBLEMS
from tests.python.support.shim import closed_port, post, running_app, with_host_port

TYPE_BASE = "tag:idem,2026:problem:"


@pytest.fixture
def app(shim_web_url: str) -> Iterator[Flask]:
    with running_app(shim_web_url, IDEM_MAX_BODY_BYTES=64, IDEM_ERROR_FORMAT="problem+json") as app:
        yield app


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def new_key() -> str:
    return str(uuid.uuid4())


def claim_elsewhere(admin: str, key: str, body: Any, age: timedelta = timedelta(0)) -> int:
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT key_id FROM idem_claim(p_key => %s, p_user_id => 1, p_endpoint => 'POST /orders',"
            " p_request => %s::jsonb, p_now => now() - %s::interval)",
            (key, json.dumps(body), age),
        ).fetchone()
    assert row is not None
    return int(row[0])


def assert_problem(response: Any, status: int, error: str, **members: Any) -> dict[str, Any]:
    """RFC 9457 §3.1: type (a URI reference, string), title (string), status (number equal to the
    response's status), detail (string); plus the shim's own members."""
    assert response.status_code == status
    assert response.mimetype == "application/problem+json"
    body: dict[str, Any] = response.get_json(force=True)
    assert isinstance(body["type"], str) and urlsplit(body["type"]).scheme, body
    assert body["type"] == TYPE_BASE + PROBLEMS[error].slug
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["status"], int) and not isinstance(body["status"], bool) and body["status"] == status
    assert isinstance(body["detail"], str) and body["detail"]
    assert body["error"] == error
    for name, value in members.items():
        assert body[name] == value
    assert set(body) == {"type", "title", "status", "detail", "error", *members}
    return body


def test_400_header_required(client: FlaskClient) -> None:
    assert_problem(post(client, "/required", None, {"item": "a"}), 400, "Idempotency-Key header is required")


def test_400_malformed_key(client: FlaskClient) -> None:
    assert_problem(post(client, "/orders", "not-a-uuid", {"item": "a"}), 400, "Idempotency-Key must be a UUID string")


def test_413_request_too_large(client: FlaskClient) -> None:
    assert_problem(post(client, "/orders", new_key(), {"item": "x" * 100}), 413, "request_too_large")


def test_409_in_flight_keeps_retry_after(client: FlaskClient, fresh_admin_url: str) -> None:
    key = new_key()
    claim_elsewhere(fresh_admin_url, key, {"item": "a"})
    response = post(client, "/orders", key, {"item": "a"})
    body = assert_problem(response, 409, "idempotency_in_flight", retry_after_ms=response.get_json()["retry_after_ms"])
    assert 0 < body["retry_after_ms"] <= 5000 and response.headers["Retry-After"]


def test_409_previous_failed(client: FlaskClient, fresh_admin_url: str) -> None:
    key = new_key()
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        conn.execute(
            "SELECT idem_fail(p_key_id => %s, p_response_code => 500)",
            (claim_elsewhere(fresh_admin_url, key, {"item": "a"}),),
        )
    assert_problem(post(client, "/orders", key, {"item": "a"}), 409, "idempotency_previous_failed")


def test_422_mismatch(client: FlaskClient) -> None:
    key = new_key()
    assert post(client, "/orders", key, {"item": "a"}).status_code == 201
    assert_problem(post(client, "/orders", key, {"item": "b"}), 422, "idempotency_key_body_mismatch")


def test_503_store_unavailable(shim_web_url: str) -> None:
    down = with_host_port(shim_web_url, "127.0.0.1", closed_port())
    with running_app(down, IDEM_ERROR_FORMAT="problem+json", IDEM_POOL_TIMEOUT=0.5) as app:
        response = post(app.test_client(), "/orders", new_key(), {"item": "a"})
    assert_problem(response, 503, "idempotency_store_unavailable")
    assert response.headers["Retry-After"]


def test_the_default_format_is_unchanged(shim_web_url: str) -> None:
    with running_app(shim_web_url) as app:
        response = post(app.test_client(), "/orders", "not-a-uuid", {"item": "a"})
    assert response.mimetype == "application/json"
    assert response.get_json() == {"error": "Idempotency-Key must be a UUID string"}


def test_a_replay_is_never_a_problem(client: FlaskClient) -> None:
    key = new_key()
    post(client, "/orders", key, {"item": "a"})
    replay = post(client, "/orders", key, {"item": "a"})
    assert replay.mimetype == "application/json" and replay.get_json()["idempotency_replayed"] is True
