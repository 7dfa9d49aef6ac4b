"""A replay is the same answer (contract §4): status, allow-listed headers, content type, bytes.

Cases: a 201 with Location replays the same Location (and the row holds it); text/plain with
unicode, CSV, a JSON array, a JSON scalar, an empty 204 and non-UTF-8 bytes replay byte for byte
with their Content-Type, and only a JSON object gains the flag; a repeated Link is combined;
Set-Cookie, Authorization, WWW-Authenticate, Proxy-Authenticate and X-Auth-Token reach the first
client but never the table nor the replay; the allow-list extends per app and never to a
credential (init fails); a header value over 8 KiB and a header set over IDEM_MAX_BODY_BYTES are
refused at completion (500, ERROR response_refused, writes rolled back, key failed); a stored
Content-Type the replay cannot honour is left out, never a 5xx; rows completed the SQL API 2 way
(no headers, body plain JSON) replay as they did; with IDEM_RESPONSE_KEY the headers are
ciphertext at rest, replayed and exported in clear.
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from flask import Flask, Response
from flask.testing import FlaskClient
from psycopg.rows import dict_row

from idem_shim import connection, idempotency_key
from tests.python.support.shim import dsr_url, executions, make_app, post, require_session, scalar, state_of

KEY = secrets.token_urlsafe(32)


def add_routes(app: Flask) -> None:
    """Views as a route author writes them, each answering one kind of response."""

    def tracked(path: str, view: Any) -> None:
        def run() -> Any:
            app.extensions["shim_test_executions"].bump()
            return view()

        run.__name__ = "replay_" + path.strip("/").replace("/", "_").replace("-", "_")
        app.post(path)(require_session(idempotency_key()(run)))

    def create_order() -> Any:
        row = (
            connection()
            .execute("INSERT INTO shim_orders (user_id, route) VALUES (1, 'created') RETURNING id")
            .fetchone()
        )
        assert row is not None
        return {"order_id": row[0]}, 201, {"Location": f"/orders/{row[0]}", "ETag": f'"v{row[0]}"'}

    tracked("/created", create_order)
    tracked("/unicode", lambda: ("plain ünïcode answer\n", 200, {"Content-Type": "text/plain; charset=utf-8"}))
    tracked("/csv", lambda: Response('id,name\r\n1,Zoë\r\n2,"a, b"\r\n', 200, mimetype="text/csv"))
    tracked("/array", lambda: Response('[1,  2, {"b": 1, "a": 2.50}]', 200, mimetype="application/json"))
    tracked("/scalar", lambda: Response("42", 200, mimetype="application/json"))
    tracked("/no-content", lambda: ("", 204))
    tracked("/binary", lambda: Response(b"\xff\xfe\x00\x01not utf-8\x80", 200, mimetype="application/octet-stream"))
    tracked(
        "/problem", lambda: Response('{"type": "about:blank", "status": 402}', 402, mimetype="application/problem+json")
    )
    tracked(
        "/links",
        lambda: Response(
            "{}", 200, mimetype="application/json", headers=[("Link", "</a>; rel=next"), ("Link", "</b>; rel=prev")]
        ),
    )
    tracked("/custom", lambda: ({"ok": True}, 200, {"X-Order-Version": "7", "X-Not-Listed": "no"}))

    def with_credentials() -> Any:
        connection().execute("INSERT INTO shim_orders (user_id, route) VALUES (1, 'cookie')")
        response = Response('{"signed_in": true}', 201, mimetype="application/json")
        response.set_cookie("sess", "s3cr3t-cookie-value")
        response.headers["Authorization"] = "Bearer tok_live_abc"
        response.headers["WWW-Authenticate"] = 'Bearer realm="api"'
        response.headers["Proxy-Authenticate"] = 'Basic realm="proxy"'
        response.headers["X-Auth-Token"] = "tok_xyz"
        response.headers["Location"] = "/sessions/1"
        return response

    tracked("/cookie", with_credentials)

    def huge_header() -> Any:
        connection().execute("INSERT INTO shim_orders (user_id, route) VALUES (1, 'huge')")
        return {"ok": True}, 201, {"Link": "<" + "x" * 9000 + ">; rel=next"}

    tracked("/huge-header", huge_header)

    def big_header_set() -> Any:
        connection().execute("INSERT INTO shim_orders (user_id, route) VALUES (1, 'big')")
        return {"ok": True}, 201, {"Link": "<" + "y" * 5000 + ">; rel=next"}  # < 8 KiB, > the 4 KiB limit

    tracked("/big-header-set", big_header_set)


def build(shim_web_url: str, **config: Any) -> Flask:
    app = make_app(shim_web_url, IDEM_MAX_BODY_BYTES=4096, **config)
    add_routes(app)
    app.testing = False  # a refused completion is a 500 answer, as in production
    return app


@pytest.fixture
def app(shim_web_url: str) -> Iterator[Flask]:
    app = build(shim_web_url, IDEM_REPLAY_HEADERS="X-Order-Version")
    yield app
    state_of(app).store.close()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def new_key() -> str:
    return str(uuid.uuid4())


def rows(admin: str) -> list[dict[str, Any]]:
    with psycopg.connect(admin, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute("SELECT * FROM idempotency_keys ORDER BY id").fetchall()


def twice(client: FlaskClient, path: str) -> tuple[Any, Any]:
    key = new_key()
    return post(client, path, key), post(client, path, key)


# -- headers -------------------------------------------------------------------------------------


def test_a_201_with_location_replays_the_same_location(client: FlaskClient, app: Flask, fresh_admin_url: str) -> None:
    first, replay = twice(client, "/created")
    assert first.status_code == replay.status_code == 201
    assert first.headers["Location"] == replay.headers["Location"] == "/orders/1"
    assert first.headers["ETag"] == replay.headers["ETag"] == '"v1"'
    assert replay.headers["Content-Type"] == "application/json"
    assert replay.get_json() == {"order_id": 1, "idempotency_replayed": True}
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert executions(app) == 1
    [row] = rows(fresh_admin_url)
    assert row["response_headers"] == {"Location": "/orders/1", "ETag": '"v1"', "Content-Type": "application/json"}


def test_a_repeated_link_header_is_combined(client: FlaskClient) -> None:
    _, replay = twice(client, "/links")
    assert replay.headers["Link"] == "</a>; rel=next, </b>; rel=prev"


def test_the_allow_list_extends_per_app_and_nothing_else_is_stored(client: FlaskClient, fresh_admin_url: str) -> None:
    first, replay = twice(client, "/custom")
    assert first.headers["X-Not-Listed"] == "no"
    assert replay.headers["X-Order-Version"] == "7"
    assert "X-Not-Listed" not in replay.headers
    [row] = rows(fresh_admin_url)
    assert set(row["response_headers"]) == {"X-Order-Version", "Content-Type"}


def test_credential_headers_reach_the_client_but_never_the_table(
    client: FlaskClient, app: Flask, fresh_admin_url: str
) -> None:
    first, replay = twice(client, "/cookie")
    assert first.status_code == 201
    assert "sess=s3cr3t-cookie-value" in first.headers["Set-Cookie"]
    assert first.headers["Authorization"] == "Bearer tok_live_abc"
    assert first.headers["WWW-Authenticate"] == 'Bearer realm="api"'
    assert first.headers["X-Auth-Token"] == "tok_xyz"
    for name in ("Set-Cookie", "Authorization", "WWW-Authenticate", "Proxy-Authenticate", "X-Auth-Token"):
        assert name not in replay.headers
    assert replay.headers["Location"] == "/sessions/1" and replay.status_code == 201
    [row] = rows(fresh_admin_url)
    assert row["response_headers"] == {"Location": "/sessions/1", "Content-Type": "application/json"}
    leaked = scalar(
        fresh_admin_url,
        """SELECT count(*) FROM idempotency_keys
                                  WHERE response_headers::text ~* '(cookie|authori|authenticate|token|s3cr3t|tok_)'
                                     OR response_body::text ~* '(s3cr3t|tok_)'""",
    )
    assert leaked == 0
    assert scalar(fresh_admin_url, "SELECT count(*) FROM shim_orders WHERE route = 'cookie'") == 1


def test_a_credential_allow_list_stops_the_app_at_init(shim_web_url: str) -> None:
    with pytest.raises(ValueError, match="Set-Cookie"):
        make_app(shim_web_url, IDEM_REPLAY_HEADERS=["Set-Cookie"])


# -- bodies --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "content_type"),
    [
        ("/unicode", "plain ünïcode answer\n".encode(), "text/plain; charset=utf-8"),
        ("/csv", 'id,name\r\n1,Zoë\r\n2,"a, b"\r\n'.encode(), "text/csv; charset=utf-8"),
        ("/array", b'[1,  2, {"b": 1, "a": 2.50}]', "application/json"),
        ("/scalar", b"42", "application/json"),
        ("/binary", b"\xff\xfe\x00\x01not utf-8\x80", "application/octet-stream"),
    ],
)
def test_non_object_bodies_replay_byte_for_byte_with_their_content_type(
    client: FlaskClient, app: Flask, path: str, body: bytes, content_type: str
) -> None:
    first, replay = twice(client, path)
    assert first.get_data() == body and first.headers["Content-Type"] == content_type
    assert replay.status_code == first.status_code == 200
    assert replay.get_data() == body
    assert replay.headers["Content-Type"] == content_type
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert executions(app) == 1


def test_a_204_replays_empty_with_its_content_type(client: FlaskClient, fresh_admin_url: str) -> None:
    first, replay = twice(client, "/no-content")
    assert (replay.status_code, replay.get_data()) == (204, b"")
    assert replay.headers["Content-Type"] == first.headers["Content-Type"]
    assert rows(fresh_admin_url)[0]["response_body"] == {"idem_raw": "text", "data": ""}


def test_how_bodies_are_stored(client: FlaskClient, fresh_admin_url: str) -> None:
    for path in ("/created", "/unicode", "/binary"):
        twice(client, path)
    created, unicode, binary = (row["response_body"] for row in rows(fresh_admin_url))
    assert created == {"order_id": 1}
    assert unicode == {"idem_raw": "text", "data": "plain ünïcode answer\n"}
    assert binary["idem_raw"] == "base64"


def test_a_json_object_of_another_json_type_keeps_it_and_gains_the_flag(client: FlaskClient) -> None:
    _, replay = twice(client, "/problem")
    assert replay.status_code == 402
    assert replay.headers["Content-Type"] == "application/problem+json"
    assert json.loads(replay.get_data()) == {"type": "about:blank", "status": 402, "idempotency_replayed": True}


# -- refused completions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "route", "reason"),
    [
        ("/huge-header", "huge", "over the 8192"),
        ("/big-header-set", "big", "over IDEM_MAX_BODY_BYTES"),
    ],
)
def test_oversized_headers_are_refused_at_completion(
    client: FlaskClient, fresh_admin_url: str, path: str, route: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = new_key()
    with caplog.at_level(logging.ERROR, logger="idem_shim"):
        assert post(client, path, key).status_code == 500
    [line] = [r.getMessage() for r in caplog.records if "response_refused" in r.getMessage()]
    assert reason in line
    assert scalar(fresh_admin_url, "SELECT count(*) FROM shim_orders WHERE route = %s", (route,)) == 0
    [row] = rows(fresh_admin_url)
    assert (row["status"], row["response_headers"], row["response_body"]) == ("failed", None, None)
    assert post(client, path, key).status_code == 409  # previous_failed, as for a refused body


# -- replays the database holds from elsewhere -----------------------------------------------------


def complete_directly(admin: str, key: str, body: str | None, headers: str | None, code: int = 200) -> None:
    """Claim as the app would for POST /orders {"item": "x"} by user 1, complete as given."""
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT key_id FROM idem_claim(p_key => %s, p_user_id => 1, p_endpoint => 'POST /orders',"
            ' p_request => \'{"item": "x"}\')',
            (key,),
        ).fetchone()
        assert row is not None
        conn.execute(
            "SELECT idem_complete(p_key_id => %s, p_response_code => %s, p_response_body => %s::jsonb,"
            " p_response_headers => %s::jsonb)",
            (row[0], code, body, headers),
        )


@pytest.mark.parametrize(
    ("body", "headers", "content_type", "data"),
    [
        ('{"a": 1}', '{"Content-Type": "text/csv"}', "application/json", b'{"a":1,"idempotency_replayed":true}'),
        (
            '{"idem_raw": "text", "data": "x"}',
            '{"Content-Type": "text/plain; charset=\u20ac"}',
            "application/octet-stream",
            b"x",
        ),
        ('{"idem_raw": "text", "data": "x"}', '{"Content-Type": ""}', "application/octet-stream", b"x"),
    ],
)
def test_a_content_type_the_replay_cannot_honour_is_never_a_5xx(
    client: FlaskClient, fresh_admin_url: str, body: str, headers: str, content_type: str, data: bytes
) -> None:
    key = new_key()
    complete_directly(fresh_admin_url, key, body, headers)
    replay = post(client, "/orders", key, {"item": "x"})
    assert replay.status_code == 200
    assert replay.headers["Content-Type"] == content_type
    assert replay.get_data().replace(b" ", b"").replace(b"\n", b"") == data


def test_a_stored_base64_body_that_does_not_decode_replays_as_json(client: FlaskClient, fresh_admin_url: str) -> None:
    """idem_complete refuses a base64 body that does not decode (IDM00: it screens the decoded
    bytes for credentials); a row holding one anyway (written by hand, or before that check)
    replays as the JSON it is, never a 5xx."""
    bad = '{"idem_raw": "base64", "data": "***"}'
    key = new_key()
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT key_id FROM idem_claim(p_key => %s, p_user_id => 1, p_endpoint => 'POST /orders',"
            ' p_request => \'{"item": "x"}\')',
            (key,),
        ).fetchone()
        assert row is not None
        with pytest.raises(psycopg.Error, match="must hold base64 data") as refused:
            conn.execute(
                "SELECT idem_complete(p_key_id => %s, p_response_code => 200, p_response_body => %s::jsonb)",
                (row[0], bad),
            )
        assert refused.value.sqlstate == "IDM00"
        conn.execute(
            "UPDATE idempotency_keys SET status = 'completed', response_code = 200, response_body = %s::jsonb,"
            ' response_headers = \'{"Content-Type": "text/plain"}\' WHERE id = %s',
            (bad, row[0]),
        )
    replay = post(client, "/orders", key, {"item": "x"})
    assert replay.status_code == 200
    assert replay.headers["Content-Type"] == "application/json"
    assert replay.get_data().replace(b" ", b"").replace(b"\n", b"") == (
        b'{"data":"***","idem_raw":"base64","idempotency_replayed":true}'
    )


@pytest.mark.parametrize(
    ("body", "replayed", "content_type"),
    [
        ('{"order_id": 7}', {"idempotency_replayed": True, "order_id": 7}, "application/json"),
        ('"plain words"', "plain words", "application/json"),
        ("[1, 2]", [1, 2], "application/json"),
        ("null", None, "text/html; charset=utf-8"),
    ],
)
def test_rows_completed_the_sql_api_2_way_replay_as_they_did(
    client: FlaskClient, fresh_admin_url: str, body: str, replayed: Any, content_type: str
) -> None:
    key = new_key()
    complete_directly(fresh_admin_url, key, body, None)
    replay = post(client, "/orders", key, {"item": "x"})
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    data = replay.get_data()
    assert (json.loads(data) if data else None) == replayed
    assert replay.headers["Content-Type"] == content_type
    assert "Location" not in replay.headers


# -- encryption --------------------------------------------------------------------------------------


def test_headers_are_encrypted_at_rest_and_replayed_and_exported_in_clear(
    shim_web_url: str, fresh_admin_url: str
) -> None:
    app = build(shim_web_url, IDEM_RESPONSE_KEY=KEY)
    try:
        client = app.test_client()
        first, replay = twice(client, "/created")
        _, text_replay = twice(client, "/unicode")
        assert replay.headers["Location"] == first.headers["Location"] == "/orders/1"
        assert text_replay.get_data() == "plain ünïcode answer\n".encode()
        for row in rows(fresh_admin_url):
            assert set(row["response_headers"]) == {"idem_enc", "kid", "data"}
            assert set(row["response_body"]) == {"idem_enc", "kid", "data"}
        assert (
            scalar(
                fresh_admin_url,
                "SELECT count(*) FROM idempotency_keys WHERE response_headers::text LIKE '%orders%'"
                " OR response_body::text LIKE '%plain%'",
            )
            == 0
        )
        with app.app_context(), psycopg.connect(dsr_url(fresh_admin_url), autocommit=True) as conn:
            exported = list(state_of(app).store.export_user(conn, 1))  # the GDPR job's role: idem_dsr
        assert exported[0]["response_headers"]["Location"] == "/orders/1"
        assert exported[1]["response_body"] == {"idem_raw": "text", "data": "plain ünïcode answer\n"}
    finally:
        state_of(app).store.close()
