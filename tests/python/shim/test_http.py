"""Contract §4, row by row, through a real Flask app on a real database.

Cases: no header (passthrough, and required=True); malformed key; quoted and upper-case keys;
body over the limit (declared and streamed), nothing stored; claimed; replay (status, body, flag,
header, no second business row, one replay audit row); replayed 4xx (returned and abort());
in flight (exact body, Retry-After); stale holder healed then the retry executes; quarantine;
previous failed (handler raising, handler answering 5xx); mismatch; empty, null, non-JSON and
reordered JSON bodies; path parameters in the fingerprint; non-object, text and empty responses
(more in test_replay.py);
store_response=False; the kill switch flipped between two requests.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from flask import Flask, abort
from flask.testing import FlaskClient

from idem_shim.config import KILL_SWITCH_ENV
from tests.python.support.shim import AppFactory, Order, answers, executions, post, running_app, scalar


@pytest.fixture
def app(shim_web_url: str) -> Iterator[Flask]:
    with running_app(shim_web_url, IDEM_MAX_BODY_BYTES=4096) as app:
        yield app


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def new_key() -> str:
    return str(uuid.uuid4())


def orders(admin: str, route: str = "orders") -> int:
    return int(scalar(admin, "SELECT count(*) FROM shim_orders WHERE route = %s", (route,)))


def key_rows(admin: str) -> list[dict[str, Any]]:
    with psycopg.connect(admin, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute("SELECT * FROM idempotency_keys ORDER BY id").fetchall()


def direct_claim(
    admin: str,
    key: str,
    body: Any,
    *,
    user: int | None = 1,
    endpoint: str = "POST /orders",
    age: timedelta = timedelta(0),
) -> int:
    """Claim a key from outside the app, as another worker would (``age`` back-dates it)."""
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT outcome, key_id FROM idem_claim(p_key => %s, p_user_id => %s, p_endpoint => %s,"
            " p_request => %s::jsonb, p_now => now() - %s::interval)",
            (key, user, endpoint, None if body is None else json.dumps(body), age),
        ).fetchone()
    assert row is not None and row[0] == "claimed"
    return int(row[1])


# -- no header, malformed header ------------------------------------------------------------


def test_no_header_runs_the_handler_untracked_and_commits_its_writes(
    client: FlaskClient, fresh_admin_url: str, app: Flask
) -> None:
    first = post(client, "/orders", None, {"item": "a"})
    second = post(client, "/orders", None, {"item": "a"})
    assert (first.status_code, second.status_code) == (201, 201)
    assert "Idempotent-Replayed" not in second.headers
    assert orders(fresh_admin_url) == 2 and executions(app) == 2
    assert key_rows(fresh_admin_url) == []


def test_required_key_missing_is_400_with_the_spec_body(client: FlaskClient, fresh_admin_url: str) -> None:
    response = post(client, "/required", None, {"item": "a"})
    assert response.status_code == 400
    assert response.get_json() == {"error": "Idempotency-Key header is required"}
    assert orders(fresh_admin_url, "required") == 0


@pytest.mark.parametrize(
    "bad",
    [
        "abc",
        "all",
        "",
        "{12345678-1234-1234-1234-123456789abc}",
        "12345678123412341234123456789abc",
        "'12345678-1234-1234-1234-123456789abc'",
        "12345678-1234-1234-1234-123456789abz",
        '"12345678-1234-1234-1234-123456789abc',
        "12345678-1234-1234-1234-123456789abc, 12345678-1234-1234-1234-123456789abc",
    ],
)
def test_malformed_key_is_400_with_the_spec_body_and_nothing_runs(
    client: FlaskClient, fresh_admin_url: str, app: Flask, bad: str
) -> None:
    response = post(client, "/orders", bad, {"item": "a"})
    assert response.status_code == 400
    assert response.get_json() == {"error": "Idempotency-Key must be a UUID string"}
    assert executions(app) == 0 and key_rows(fresh_admin_url) == []


def test_quoted_and_upper_case_forms_are_the_same_key(client: FlaskClient, fresh_admin_url: str) -> None:
    key = new_key()
    first = post(client, "/orders", f'"{key.upper()}"', {"item": "q"})
    assert first.status_code == 201
    again = post(client, "/orders", key, {"item": "q"})
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert [row["idem_key"] for row in key_rows(fresh_admin_url)] == [key]
    assert orders(fresh_admin_url) == 1


# -- body size ----------------------------------------------------------------------------------


def test_body_over_the_limit_is_413_and_nothing_is_stored(
    client: FlaskClient, fresh_admin_url: str, app: Flask
) -> None:
    big = {"item": "x" * 5000}
    response = post(client, "/orders", new_key(), big)
    assert response.status_code == 413
    assert response.get_json() == {"error": "request_too_large"}
    assert executions(app) == 0 and key_rows(fresh_admin_url) == []


def test_streamed_body_without_length_over_the_limit_is_413(
    client: FlaskClient, fresh_admin_url: str, app: Flask
) -> None:
    """A chunked body declares no length: the stream itself is capped."""
    response = client.post(
        "/orders",
        input_stream=io.BytesIO(b'{"item": "' + b"x" * 10000 + b'"}'),
        headers={
            "Idempotency-Key": new_key(),
            "X-User": "1",
            "Content-Type": "application/json",
            "Transfer-Encoding": "chunked",
        },
        environ_overrides={"wsgi.input_terminated": True},  # what gunicorn sets for chunked bodies
    )
    assert response.status_code == 413
    assert response.get_json() == {"error": "request_too_large"}
    assert executions(app) == 0 and key_rows(fresh_admin_url) == []


def test_body_at_the_limit_is_accepted(client: FlaskClient) -> None:
    body = json.dumps({"item": "y" * 100}).encode()
    padded = body + b" " * (4096 - len(body))
    response = post(client, "/orders", new_key(), data=padded, Content_Type="application/json")
    assert response.status_code == 201


# -- claimed and replay ---------------------------------------------------------------------------


def test_claimed_then_replay_returns_the_stored_answer_with_flag_and_header(
    client: FlaskClient, fresh_admin_url: str, app: Flask
) -> None:
    key = new_key()
    first = post(client, "/orders", key, {"item": "apple"})
    assert first.status_code == 201
    assert first.get_json() == {"order_id": 1, "item": "apple"}
    assert "Idempotent-Replayed" not in first.headers

    replay = post(client, "/orders", key, {"item": "apple"})
    assert replay.status_code == 201
    assert replay.get_json() == {"order_id": 1, "item": "apple", "idempotency_replayed": True}
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.mimetype == "application/json"

    assert executions(app) == 1 and orders(fresh_admin_url) == 1
    assert scalar(fresh_admin_url, "SELECT count(*) FROM audit_log WHERE action = 'order_placed'") == 1
    assert scalar(fresh_admin_url, "SELECT count(*) FROM audit_log WHERE action = 'idempotency_replay'") == 1
    [row] = key_rows(fresh_admin_url)
    assert (row["status"], row["response_code"], row["scope_user_id"], row["scope_endpoint"]) == (
        "completed",
        201,
        1,
        "POST /orders",
    )
    assert row["expires_at"] - row["created_at"] == timedelta(hours=24)


def test_keys_are_scoped_by_user_and_endpoint(client: FlaskClient, fresh_admin_url: str) -> None:
    key = new_key()
    assert post(client, "/orders", key, {"item": "a"}, user=1).status_code == 201
    other_user = post(client, "/orders", key, {"item": "a"}, user=2)
    service = post(client, "/orders", key, {"item": "a"}, user=None)
    other_route = post(client, "/private", key, {"item": "a"}, user=1)
    for response in (other_user, service, other_route):
        assert response.status_code == 201 and "Idempotent-Replayed" not in response.headers
    service_again = post(client, "/orders", key, {"item": "a"}, user=None)
    assert service_again.headers.get("Idempotent-Replayed") == "true"  # NULL user dedupes too
    assert orders(fresh_admin_url) == 3


def test_ttl_of_a_seven_day_route_is_stored(client: FlaskClient, fresh_admin_url: str) -> None:
    assert post(client, "/billing", new_key()).status_code == 201
    [row] = key_rows(fresh_admin_url)
    assert row["expires_at"] - row["created_at"] == timedelta(days=7)


def test_replayed_4xx_keeps_its_status_and_body(make_app: AppFactory, fresh_admin_url: str) -> None:
    app = make_app(answers(400, "insufficient_cash"))
    client = app.test_client()
    key = new_key()
    body = {"item": "gold"}
    first = post(client, "/orders", key, body)
    assert first.status_code == 400
    assert first.get_json() == {"error": "insufficient_cash", "order_id": 1}
    replay = post(client, "/orders", key, body)
    assert replay.status_code == 400
    assert replay.get_json() == {"error": "insufficient_cash", "order_id": 1, "idempotency_replayed": True}
    assert replay.headers["Idempotent-Replayed"] == "true"
    # a returned 4xx commits the handler's writes with the completion, like any answer < 500
    assert executions(app) == 1 and orders(fresh_admin_url) == 1


def test_abort_4xx_rolls_back_the_writes_and_replays_the_refusal(make_app: AppFactory, fresh_admin_url: str) -> None:
    def writes_then_aborts(order: Order) -> Any:
        order.write()
        abort(404)

    app = make_app(writes_then_aborts)
    client = app.test_client()
    key = new_key()
    first = post(client, "/orders", key, {"item": "z"})
    assert first.status_code == 404
    replay = post(client, "/orders", key, {"item": "z"})
    assert replay.status_code == 404 and replay.headers["Idempotent-Replayed"] == "true"
    assert executions(app) == 1 and orders(fresh_admin_url) == 0
    assert [row["status"] for row in key_rows(fresh_admin_url)] == ["completed"]


# -- in flight, stale, quarantine ------------------------------------------------------------------


def test_in_flight_is_409_with_the_spec_body_and_retry_after(
    client: FlaskClient, fresh_admin_url: str, app: Flask
) -> None:
    key = new_key()
    direct_claim(fresh_admin_url, key, {"item": "b"})
    response = post(client, "/orders", key, {"item": "b"})
    assert response.status_code == 409
    body = response.get_json()
    assert body == {"error": "idempotency_in_flight", "retry_after_ms": body["retry_after_ms"]}
    assert 0 < body["retry_after_ms"] <= 5000  # the holder's likely time left (test_retry_after.py)
    assert response.headers["Retry-After"] == str(-(-body["retry_after_ms"] // 1000))
    assert executions(app) == 0


def test_in_flight_retry_after_follows_the_holders_lease(client: FlaskClient, fresh_admin_url: str) -> None:
    key = new_key()
    direct_claim(fresh_admin_url, key, {"item": "b"}, age=timedelta(seconds=28))
    response = post(client, "/orders", key, {"item": "b"})
    assert response.status_code == 409
    retry_ms = response.get_json()["retry_after_ms"]
    assert 0 < retry_ms <= 2000
    assert response.headers["Retry-After"] == str(-(-retry_ms // 1000))


def test_a_new_scopes_first_duplicate_is_told_to_retry_within_a_second(
    client: FlaskClient, fresh_admin_url: str
) -> None:
    """A scope this worker has not run yet (a new route, a fresh gunicorn worker): the holder's
    2.5 s so far say nothing of its end, so the duplicate polls soon (Retry-After: 1), not
    "as long again" (2.5 s, Retry-After: 3, when the holder may finish the next moment)."""
    key = new_key()
    direct_claim(fresh_admin_url, key, {"item": "n"}, age=timedelta(seconds=2.5))
    response = post(client, "/orders", key, {"item": "n"})
    assert response.status_code == 409
    assert 50 <= response.get_json()["retry_after_ms"] <= 1000, response.get_json()
    assert response.headers["Retry-After"] == "1"


def test_stale_holder_is_healed_with_409_and_the_next_retry_executes(
    client: FlaskClient, fresh_admin_url: str, app: Flask
) -> None:
    key = new_key()
    direct_claim(fresh_admin_url, key, {"item": "c"}, age=timedelta(seconds=45))
    healed = post(client, "/orders", key, {"item": "c"})
    assert healed.status_code == 409
    assert healed.get_json() == {"error": "idempotency_in_flight", "retry_after_ms": 100}
    assert healed.headers["Retry-After"] == "1"
    assert executions(app) == 0
    retry = post(client, "/orders", key, {"item": "c"})
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry.headers
    assert executions(app) == 1 and orders(fresh_admin_url) == 1
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_events WHERE event = 'stale_heal'") == 1


def test_quarantine_route_keeps_a_stale_holder_in_flight(client: FlaskClient, fresh_admin_url: str, app: Flask) -> None:
    key = new_key()
    direct_claim(fresh_admin_url, key, {"item": "q"}, endpoint="POST /quarantine", age=timedelta(seconds=45))
    for _ in range(2):
        response = post(client, "/quarantine", key, {"item": "q"})
        assert response.status_code == 409
        assert response.get_json()["error"] == "idempotency_in_flight"
    assert executions(app) == 0


# -- failures ----------------------------------------------------------------------------------


def test_handler_raising_rolls_back_fails_the_key_and_the_retry_gets_previous_failed(
    make_app: AppFactory, fresh_admin_url: str
) -> None:
    def writes_then_raises(order: Order) -> Any:
        order.write()
        raise RuntimeError("handler blew up")

    app = make_app(writes_then_raises)
    client = app.test_client()
    key = new_key()
    app.testing = False  # let Flask turn the exception into its 500, as in production
    first = post(client, "/orders", key, {"item": "boom"})
    assert first.status_code == 500
    assert orders(fresh_admin_url) == 0  # the handler's insert rolled back
    retry = post(client, "/orders", key, {"item": "boom"})
    assert retry.status_code == 409
    assert retry.get_json() == {"error": "idempotency_previous_failed"}
    assert executions(app) == 1
    [row] = key_rows(fresh_admin_url)
    assert row["status"] == "failed"


def test_handler_answering_5xx_fails_the_key(make_app: AppFactory, fresh_admin_url: str) -> None:
    client = make_app(answers(502, "upstream")).test_client()
    key = new_key()
    first = post(client, "/orders", key, {"item": "x"})
    assert first.status_code == 502
    retry = post(client, "/orders", key, {"item": "x"})
    assert retry.status_code == 409 and retry.get_json() == {"error": "idempotency_previous_failed"}
    assert orders(fresh_admin_url) == 0
    [row] = key_rows(fresh_admin_url)
    assert (row["status"], row["response_code"]) == ("failed", 502)


def test_commit_failing_after_the_completion_fails_the_key(
    client: FlaskClient, fresh_admin_url: str, app: Flask
) -> None:
    """idem_complete and COMMIT travel in one pipeline; a COMMIT that fails undoes both."""
    app.testing = False
    key = new_key()
    assert post(client, "/deferred", key).status_code == 500
    assert orders(fresh_admin_url, "deferred") == 0
    assert scalar(fresh_admin_url, "SELECT count(*) FROM shim_deferred") == 0
    [row] = key_rows(fresh_admin_url)
    assert (row["status"], row["response_code"]) == ("failed", 500)
    assert post(client, "/deferred", key).get_json() == {"error": "idempotency_previous_failed"}
    assert executions(app) == 1


def test_previous_failed_from_another_worker(client: FlaskClient, fresh_admin_url: str) -> None:
    key = new_key()
    key_id = direct_claim(fresh_admin_url, key, {"item": "f"})
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        conn.execute("SELECT idem_fail(p_key_id => %s)", (key_id,))
    response = post(client, "/orders", key, {"item": "f"})
    assert response.status_code == 409
    assert response.get_json() == {"error": "idempotency_previous_failed"}


# -- bodies and the fingerprint -----------------------------------------------------------------


def test_same_key_different_body_is_422(client: FlaskClient, fresh_admin_url: str, app: Flask) -> None:
    key = new_key()
    assert post(client, "/orders", key, {"item": "a"}).status_code == 201
    response = post(client, "/orders", key, {"item": "b"})
    assert response.status_code == 422
    assert response.get_json() == {"error": "idempotency_key_body_mismatch"}
    assert executions(app) == 1


def test_json_key_order_and_white_space_do_not_matter(client: FlaskClient) -> None:
    key = new_key()
    first = post(client, "/orders", key, data='{"item": "k", "qty": 2}', Content_Type="application/json")
    assert first.status_code == 201
    again = post(client, "/orders", key, data='{ "qty":2,"item":"k" }', Content_Type="application/json")
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"


def test_empty_body_hashes_as_json_null(client: FlaskClient, fresh_admin_url: str) -> None:
    """As earlier versions did (a rolling deploy replays it); a JSON null body, which the handler
    can tell from none, is another request (tests/python/shim/test_fingerprint.py)."""
    key = new_key()
    assert post(client, "/orders", key).status_code == 201
    assert post(client, "/orders", key).headers["Idempotent-Replayed"] == "true"
    null_body = post(client, "/orders", key, data="null", Content_Type="application/json")
    assert null_body.status_code == 422
    assert post(client, "/orders", key, {"item": None}).status_code == 422
    expected = scalar(fresh_admin_url, "SELECT encode(sha256(convert_to('null'::jsonb::text, 'UTF8')), 'hex')")
    assert key_rows(fresh_admin_url)[0]["request_hash"] == expected


def test_non_json_bodies_replay_when_equal_and_mismatch_when_not(
    client: FlaskClient, fresh_admin_url: str, app: Flask
) -> None:
    key = new_key()
    form = "item=a&qty=1"
    first = post(client, "/orders", key, data=form, Content_Type="application/x-www-form-urlencoded")
    assert first.status_code == 201
    again = post(client, "/orders", key, data=form, Content_Type="application/x-www-form-urlencoded")
    assert again.headers["Idempotent-Replayed"] == "true"
    other = post(client, "/orders", key, data="item=a&qty=2", Content_Type="application/x-www-form-urlencoded")
    assert other.status_code == 422
    binary = new_key()
    assert (
        post(client, "/orders", binary, data=b"\xff\xfe\x00raw", Content_Type="application/octet-stream").status_code
        == 201
    )
    assert (
        post(client, "/orders", binary, data=b"\xff\xfe\x00raw2", Content_Type="application/octet-stream").status_code
        == 422
    )
    # JSON that jsonb refuses (NaN, \u0000) is hashed as raw bytes, never an error
    for weird in ('{"x": NaN}', '{"x": "\\u0000"}'):
        response = post(client, "/orders", new_key(), data=weird, Content_Type="application/json")
        assert response.status_code == 201, weird
    assert executions(app) == 4


def test_path_parameters_are_part_of_the_request(client: FlaskClient, fresh_admin_url: str) -> None:
    key = new_key()
    assert post(client, "/items/1", key, {"a": 1}).status_code == 200
    assert post(client, "/items/1", key, {"a": 1}).headers["Idempotent-Replayed"] == "true"
    assert post(client, "/items/2", key, {"a": 1}).status_code == 422
    assert post(client, "/items/1?x=1", key, {"a": 1}).status_code == 422
    assert [row["scope_endpoint"] for row in key_rows(fresh_admin_url)] == ["POST /items/<int:item_id>"]


# -- what is stored and replayed ---------------------------------------------------------------


def test_non_object_json_replays_unchanged_with_the_header(client: FlaskClient) -> None:
    key = new_key()
    assert post(client, "/list", key).get_json() == [1, 2, {"three": 3}]
    replay = post(client, "/list", key)
    assert replay.get_json() == [1, 2, {"three": 3}]
    assert replay.headers["Idempotent-Replayed"] == "true"


def test_text_response_replays_byte_for_byte_with_its_content_type(client: FlaskClient) -> None:
    key = new_key()
    first = post(client, "/text", key)
    assert (first.status_code, first.get_data(as_text=True)) == (200, "plain words")
    replay = post(client, "/text", key)
    assert replay.status_code == 200 and replay.get_data() == b"plain words"
    assert replay.headers["Content-Type"] == first.headers["Content-Type"] == "text/plain"
    assert replay.headers["Idempotent-Replayed"] == "true"


def test_empty_response_replays_empty(client: FlaskClient, app: Flask) -> None:
    key = new_key()
    assert post(client, "/empty", key).status_code == 204
    replay = post(client, "/empty", key)
    assert replay.status_code == 204 and replay.get_data() == b""
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert executions(app) == 1


def test_handler_without_database_work_still_completes(client: FlaskClient, fresh_admin_url: str, app: Flask) -> None:
    key = new_key()
    assert post(client, "/nodb", key).get_json() == {"ok": True, "n": 1}
    assert post(client, "/nodb", key).get_json() == {"ok": True, "n": 1, "idempotency_replayed": True}
    assert executions(app) == 1
    assert [row["status"] for row in key_rows(fresh_admin_url)] == ["completed"]


def test_store_response_false_stores_no_body_and_runs_again(
    client: FlaskClient, fresh_admin_url: str, app: Flask
) -> None:
    key = new_key()
    first = post(client, "/private", key, {"item": "pii"})
    assert first.status_code == 201
    [row] = key_rows(fresh_admin_url)
    assert (row["status"], row["response_body"]) == ("completed", None)
    second = post(client, "/private", key, {"item": "pii"})
    assert second.status_code == 201 and "Idempotent-Replayed" not in second.headers
    assert executions(app) == 2 and orders(fresh_admin_url, "private") == 2


# -- kill switch -------------------------------------------------------------------------------


def test_kill_switch_flipped_between_two_requests(
    client: FlaskClient, fresh_admin_url: str, app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = new_key()
    monkeypatch.setenv(KILL_SWITCH_ENV, "0")
    off_1 = post(client, "/orders", key, {"item": "k"})
    off_2 = post(client, "/orders", key, {"item": "k"})
    assert (off_1.status_code, off_2.status_code) == (201, 201)
    assert "Idempotent-Replayed" not in off_2.headers
    assert key_rows(fresh_admin_url) == [] and orders(fresh_admin_url) == 2  # passthrough still commits

    monkeypatch.setenv(KILL_SWITCH_ENV, "1")
    on_1 = post(client, "/orders", key, {"item": "k"})
    on_2 = post(client, "/orders", key, {"item": "k"})
    assert on_1.status_code == 201 and on_2.headers["Idempotent-Replayed"] == "true"
    assert orders(fresh_admin_url) == 3 and len(key_rows(fresh_admin_url)) == 1

    monkeypatch.delenv(KILL_SWITCH_ENV)
    assert post(client, "/orders", key, {"item": "k"}).headers["Idempotent-Replayed"] == "true"


def test_malformed_key_is_not_checked_when_the_switch_is_off(
    client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KILL_SWITCH_ENV, "0")
    assert post(client, "/orders", "not-a-uuid", {"item": "k"}).status_code == 201


# -- decorator arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs", [{"ttl_hours": 0}, {"ttl_hours": 169}, {"on_stale": "ignore"}, {"wait_ms": -1}, {"wait_ms": 60_001}]
)
def test_bad_decorator_arguments_fail_at_import(kwargs: dict[str, Any]) -> None:
    from idem_shim import idempotency_key

    with pytest.raises(ValueError):
        idempotency_key(**kwargs)
