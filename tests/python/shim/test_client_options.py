"""The options a client's library asks for (contract §4b), through Flask's test client on a real
database: opaque keys (``IDEM_KEY_FORMAT`` and a route's ``key_format``), a replay marked by the
header alone (``IDEM_REPLAY_BODY_MARKER = False``), a failure stored and replayed
(``on_failure="replay"``), and the declarations that are refused before a request comes.
Under gunicorn with retrying clients: tests/python/e2e/test_client_options.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask, Response, abort

from idem_shim import connection, idempotency_key, idempotent
from tests.python.support import shim
from tests.python.support.shim import post, scalar
from tests.python.support.sqlapi import new_key

MALFORMED = "Idempotency-Key must be a UUID string"


def _rows(url: str, key: str) -> Any:
    return scalar(url, "SELECT count(*) FROM idempotency_keys WHERE idem_key = %s", (key,))


# -- key formats --------------------------------------------------------------------------------


def test_an_opaque_key_is_a_key_as_sent(make_app: shim.AppFactory, fresh_admin_url: str) -> None:
    app = make_app(IDEM_KEY_FORMAT="opaque")
    client = app.test_client()
    key = "order-2026-12-01-0042"
    first = post(client, "/orders", key, {"item": "a"})
    assert first.status_code == 201
    again = post(client, "/orders", key, {"item": "a"})
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["order_id"] == first.get_json()["order_id"]
    assert _rows(fresh_admin_url, key) == 1, "stored as sent"
    upper = post(client, "/orders", key.upper(), {"item": "a"})
    assert upper.status_code == 201 and "Idempotent-Replayed" not in upper.headers, "case-sensitive"
    quoted = post(client, "/orders", f'"{key}"', {"item": "a"})
    assert quoted.headers.get("Idempotent-Replayed") == "true", "the IETF draft's quoted form is the same key"
    uuid_key = new_key()
    assert post(client, "/orders", uuid_key.upper(), {"item": "b"}).status_code == 201
    lower = post(client, "/orders", uuid_key, {"item": "b"})
    assert lower.headers.get("Idempotent-Replayed") == "true", "a UUID is still lower-cased"
    assert shim.executions(app) == 3


@pytest.mark.parametrize(
    "bad",
    [
        "order-000000042",
        "x" * 256,
        "order 2026-12-01 42",
        "order-2026-12-01-ü42",
        "00000000-0000-0000-0000-000000000000",
    ],
)
def test_an_opaque_key_outside_the_bound_is_the_400_and_changes_nothing(
    make_app: shim.AppFactory, fresh_admin_url: str, bad: str
) -> None:
    app = make_app(IDEM_KEY_FORMAT="opaque")
    answer = post(app.test_client(), "/orders", bad, {"item": "a"})
    assert answer.status_code == 400
    assert answer.get_json()["error"] == "Idempotency-Key must be one key of 16 to 255 visible ASCII characters"
    assert "UUID" not in answer.get_json()["error"]
    assert "16 to 255 visible ASCII characters" in answer.get_json()["detail"]
    assert shim.executions(app) == 0
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys") == 0


def test_the_default_format_refuses_an_opaque_key_and_a_route_may_choose(make_app: shim.AppFactory) -> None:
    app = make_app()

    @app.post("/stripe-style")
    @shim.require_session
    @idempotency_key(key_format="opaque")
    def stripe_style() -> Any:
        app.extensions["shim_test_executions"].bump()
        return {"ok": True}, 201

    client = app.test_client()
    refused = post(client, "/orders", "order-2026-12-01-0042", {"item": "a"})
    assert refused.status_code == 400 and refused.get_json() == {"error": MALFORMED}
    assert post(client, "/stripe-style", "order-2026-12-01-0042", {}).status_code == 201
    assert post(client, "/stripe-style", "order-2026-12-01-0042", {}).headers["Idempotent-Replayed"] == "true"
    assert shim.executions(app) == 1


def test_an_unknown_key_format_stops_the_app_or_the_declaration(shim_web_url: str) -> None:
    with pytest.raises(ValueError, match="IDEM_KEY_FORMAT must be one of uuid, opaque"):
        shim.make_app(shim_web_url, IDEM_KEY_FORMAT="stripe")
    with pytest.raises(ValueError, match="key_format must be 'uuid' or 'opaque'"):
        idempotency_key(key_format="any")


# -- the replay marker --------------------------------------------------------------------------

# Member order, white space and a float's digits as the handler wrote them: a byte-for-byte
# replay keeps all three, a JSON re-serialisation would not.
ANSWER = b'{"z_last": 1,  "amount": 12.50, "a_first": [1,2]}\n'


def _add_exact_route(app: Flask) -> None:
    @app.post("/exact")
    @shim.require_session
    @idempotency_key()
    def exact() -> Any:
        app.extensions["shim_test_executions"].bump()
        return Response(ANSWER, 201, mimetype="application/json", headers={"Location": "/exact/1"})


def _sent_twice(app: Flask, path: str) -> tuple[Any, Any]:
    """The first answer and the retry's, one key, the same body."""
    client, key = app.test_client(), new_key()
    return post(client, path, key, {}), post(client, path, key, {})


def test_without_the_body_marker_a_replay_is_the_first_answer_byte_for_byte(make_app: shim.AppFactory) -> None:
    app = make_app(IDEM_REPLAY_BODY_MARKER="false")  # a string, as from the environment
    _add_exact_route(app)
    first, replay = _sent_twice(app, "/exact")
    assert first.get_data() == ANSWER and "Idempotent-Replayed" not in first.headers
    assert replay.status_code == 201 and replay.get_data() == ANSWER
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.headers["Content-Type"] == first.headers["Content-Type"] == "application/json"
    assert replay.headers["Location"] == "/exact/1"
    assert shim.executions(app) == 1


def test_the_body_marker_stays_the_default(make_app: shim.AppFactory) -> None:
    app = make_app()
    _add_exact_route(app)
    _, replay = _sent_twice(app, "/exact")
    assert replay.get_json() == {"z_last": 1, "amount": 12.5, "a_first": [1, 2], "idempotency_replayed": True}


# -- a failure replayed -------------------------------------------------------------------------


def _add_failing_routes(app: Flask) -> None:
    def ran() -> None:
        app.extensions["shim_test_executions"].bump()
        shim.Order("failing", {}).write()  # rolled back with the failure

    @app.post("/returns-500")
    @shim.require_session
    @idempotency_key(on_failure="replay")
    def returns_500() -> Any:
        ran()
        return {"error": "ledger_inconsistent"}, 500, {"Retry-After": "30", "Location": "/ledger"}

    @app.post("/aborts")
    @shim.require_session
    @idempotency_key(on_failure="replay")
    def aborts() -> Any:
        ran()
        abort(502)

    @app.post("/raises")
    @shim.require_session
    @idempotency_key(on_failure="replay")
    def raises() -> Any:
        ran()
        raise LookupError("no such account")

    @app.errorhandler(LookupError)
    def lookup_failed(exc: LookupError) -> Any:
        return {"error": "account_unknown", "detail": str(exc)}, 500


@pytest.mark.parametrize(
    ("path", "status"),
    [("/returns-500", 500), ("/aborts", 502), ("/raises", 500)],
)
def test_a_failure_is_stored_and_the_retry_replays_it(
    make_app: shim.AppFactory, fresh_admin_url: str, path: str, status: int
) -> None:
    app = make_app()
    _add_failing_routes(app)
    client, key = app.test_client(), new_key()
    first = post(client, path, key, {})
    assert first.status_code == status and "Idempotent-Replayed" not in first.headers
    retry = post(client, path, key, {})
    assert retry.status_code == status and retry.headers["Idempotent-Replayed"] == "true"
    assert retry.headers["Content-Type"] == first.headers["Content-Type"]
    if first.is_json:
        assert retry.get_json() == {**first.get_json(), "idempotency_replayed": True}
    else:
        assert retry.get_data() == first.get_data()
    assert shim.executions(app) == 1, "never a second run"
    assert scalar(fresh_admin_url, "SELECT count(*) FROM shim_orders WHERE route = 'failing'") == 0, (
        "writes rolled back"
    )
    row = scalar(
        fresh_admin_url, "SELECT status || ' ' || response_code FROM idempotency_keys WHERE idem_key = %s", (key,)
    )
    assert row == f"completed {status}"
    other = post(client, path, key, {"another": "body"})
    assert other.status_code == 422, "the stored failure is the first request's answer, not every request's"


def test_a_replayed_failure_keeps_only_the_allowed_headers(make_app: shim.AppFactory) -> None:
    app = make_app()
    _add_failing_routes(app)
    _, retry = _sent_twice(app, "/returns-500")
    assert retry.headers["Location"] == "/ledger"
    assert "Retry-After" not in retry.headers, "not on the replay allow-list"


#: A statement of the handler's that the server fails as a serialization failure or a deadlock.
_RAISES = {
    "serialization failure": "DO $$ BEGIN RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'; END $$",
    "deadlock": "DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$",
}


def _add_transient_route(app: Flask, fails_with: str) -> None:
    """A replay route whose first run writes, then fails as ``fails_with`` says, and whose later
    runs succeed: 503 or 429 returned or aborted, a real 40001 or 40P01 of its own statement."""

    @app.post("/transient")
    @shim.require_session
    @idempotency_key(on_failure="replay")
    def transient() -> Any:
        run = app.extensions["shim_test_executions"].bump()
        order_id = shim.Order("transient", {}).write()
        if run == 1:
            if fails_with in ("returns 503", "returns 429"):
                status = int(fails_with.split()[1])
                return {"error": "try_later"}, status, {"Retry-After": "2"}
            if fails_with in ("aborts 503", "aborts 429"):
                abort(int(fails_with.split()[1]))
            connection().execute(_RAISES[fails_with])  # psycopg raises SerializationFailure / DeadlockDetected
        return {"order_id": order_id}, 201


@pytest.mark.parametrize(
    ("fails_with", "status"),
    [
        ("returns 503", 503),
        ("aborts 503", 503),
        ("returns 429", 429),
        ("aborts 429", 429),
        ("serialization failure", 500),
        ("deadlock", 500),
    ],
)
def test_a_transient_failure_is_not_stored_and_the_retry_runs_again(
    make_app: shim.AppFactory, fresh_admin_url: str, fails_with: str, status: int
) -> None:
    """Under replay, an answer that says "not done, retry later" (503, 429) or a transaction the
    server rolled back as a serialization failure or a deadlock is not stored for the TTL: the
    writes roll back, the key is freed, and the retry runs again; its answer is stored."""
    app = make_app()
    _add_transient_route(app, fails_with)
    client, key = app.test_client(), new_key()
    first = post(client, "/transient", key, {})
    assert first.status_code == status and "Idempotent-Replayed" not in first.headers
    retry = post(client, "/transient", key, {})
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry.headers, "the retry ran again"
    assert shim.executions(app) == 2
    again = post(client, "/transient", key, {})
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["order_id"] == retry.get_json()["order_id"]
    assert scalar(fresh_admin_url, "SELECT count(*) FROM shim_orders WHERE route = 'transient'") == 1, (
        "the failed run's writes rolled back"
    )


def test_a_job_cannot_replay_an_exception() -> None:
    with pytest.raises(ValueError, match="on_failure='replay' stores a route's failure answer"):
        idempotent(db=None, key="key", scope="fills.apply", on_failure="replay")  # type: ignore[arg-type]


# -- a chosen fingerprint, declared ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"fingerprint_include": ["/a"], "fingerprint_exclude": ["/b"]}, "give one of them"),
        ({"fingerprint_exclude": []}, "at least one JSON pointer"),
        ({"fingerprint_exclude": "/client_ts"}, "must be a list of JSON pointers"),
        ({"fingerprint_exclude": ["client_ts"]}, "fingerprint_exclude"),
        ({"fingerprint_include": [""]}, "fingerprint_include"),
        ({"fingerprint_exclude": ["/a~2b"]}, "fingerprint_exclude"),
    ],
)
def test_a_fingerprint_option_that_names_nothing_is_refused_at_declaration(options: dict[str, Any], error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        idempotency_key(**options)


# -- the published contract ---------------------------------------------------------------------


def test_the_openapi_document_shows_the_options(make_app: shim.AppFactory) -> None:
    from openapi_spec_validator import validate

    from idem_shim.openapi import document

    app = make_app(IDEM_KEY_FORMAT="opaque", IDEM_REPLAY_BODY_MARKER=False)

    @app.post("/refunds")
    @idempotency_key(on_failure="replay", service=True)
    def refunds() -> Any:
        return {}, 201

    @app.post("/payments")
    @idempotency_key(fingerprint_exclude=["/client_ts"], key_format="uuid", service=True)
    def payments() -> Any:
        return {}, 201

    spec = document(app)
    validate(spec)
    refund = spec["paths"]["/refunds"]["post"]
    policy = refund["x-idempotency"]
    assert (policy["on_failure"], policy["key_format"]) == ("replay", "opaque")
    assert policy["replay_marker"] == {
        "header": "Idempotent-Replayed",
        "headers": ["Idempotent-Replayed"],
        "body_member": None,
    }
    key = next(p for p in refund["parameters"] if p["name"] == "Idempotency-Key")
    assert "format" not in key["schema"] and "16 to 255" in key["description"]
    assert "byte for byte" in refund["responses"]["default"]["description"]
    bad_key = refund["responses"]["400"]["content"]["application/json"]["schema"]["allOf"][1]
    assert "Idempotency-Key must be one key of 16 to 255 visible ASCII characters" in str(bad_key), bad_key
    assert "Idempotency-Key must be a UUID string" not in str(bad_key), bad_key
    payments_policy = spec["paths"]["/payments"]["post"]["x-idempotency"]
    assert payments_policy["fingerprint_exclude"] == ["/client_ts"] and payments_policy["key_format"] == "uuid"
    uuid_key = next(p for p in spec["paths"]["/payments"]["post"]["parameters"] if p["name"] == "Idempotency-Key")
    assert uuid_key["schema"] == {"type": "string", "format": "uuid"}
