"""The request fingerprint tells apart every two requests the app can tell apart (contract §4b).

With the same key, a request that differs from the first in what the handler can see is a
422 mismatch, never the first one's replay: the same bytes under another media type
(``text/plain`` and ``application/json``), a body shaped like the fingerprint's own wrapper and a
query string, an empty body and a JSON ``null``, another method under one declared scope. And
the requests the shim fingerprinted before keep their fingerprint (a key claimed by the
previous version replays on this one during a rolling deploy): a POST of JSON, with or without
path parameters and a query, and an empty POST.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Flask, request

from idem_shim import idempotency_key
from tests.python.support import shim
from tests.python.support.shim import post
from tests.python.support.sqlapi import new_key

MISMATCH = {"error": "idempotency_key_body_mismatch"}


def _add_routes(app: Flask) -> None:
    @app.route("/notes", methods=["POST", "PUT"], endpoint="notes")
    @shim.require_session
    @idempotency_key(scope="notes.write")
    def notes() -> Any:
        app.extensions["shim_test_executions"].bump()
        text = request.get_data(as_text=True)
        return {"method": request.method, "json": request.is_json, "text": text, "query": request.args}, 201


def _send(
    client: Any, key: str, *, method: str = "POST", path: str = "/notes", data: bytes = b"", **headers: str
) -> Any:
    sent = {"Idempotency-Key": key, "X-User": "1", **{k.replace("_", "-"): v for k, v in headers.items()}}
    return client.open(path, method=method, data=data, headers=sent)


def test_the_same_bytes_as_text_and_as_json_are_two_requests(make_app: shim.AppFactory) -> None:
    app = make_app()
    _add_routes(app)
    client, key = app.test_client(), new_key()
    first = _send(client, key, data=b'{"note": 1}', Content_Type="text/plain")
    assert first.status_code == 201 and first.get_json()["json"] is False
    again = _send(client, key, data=b'{"note": 1}', Content_Type="application/json")
    assert again.status_code == 422 and again.get_json() == MISMATCH, again.get_data(as_text=True)
    retry = _send(client, key, data=b'{"note": 1}', Content_Type="text/plain")
    assert retry.status_code == 201 and retry.headers.get("Idempotent-Replayed") == "true"
    assert shim.executions(app) == 1


def test_a_body_shaped_like_the_wrapper_is_not_a_query_string(make_app: shim.AppFactory) -> None:
    app = make_app()
    _add_routes(app)
    client, key = app.test_client(), new_key()
    body = {"text": "B"}
    first = _send(client, key, path="/notes?note=1", data=json.dumps(body).encode(), Content_Type="application/json")
    assert first.status_code == 201
    wrapper = json.dumps({"body": body, "path": {}, "query": {"note": ["1"]}}).encode()
    forged = _send(client, key, data=wrapper, Content_Type="application/json")
    assert forged.status_code == 422 and forged.get_json() == MISMATCH, forged.get_data(as_text=True)
    # and the other way round
    key = new_key()
    assert _send(client, key, data=wrapper, Content_Type="application/json").status_code == 201
    other = _send(client, key, path="/notes?note=1", data=json.dumps(body).encode(), Content_Type="application/json")
    assert other.status_code == 422, other.get_data(as_text=True)


def test_an_empty_body_is_not_a_json_null(make_app: shim.AppFactory) -> None:
    app = make_app()
    _add_routes(app)
    client, key = app.test_client(), new_key()
    assert _send(client, key).status_code == 201
    null = _send(client, key, data=b"null", Content_Type="application/json")
    assert null.status_code == 422, null.get_data(as_text=True)


def test_another_method_under_one_declared_scope_is_another_request(make_app: shim.AppFactory) -> None:
    app = make_app()
    _add_routes(app)
    client, key = app.test_client(), new_key()
    assert _send(client, key, data=b'{"n": 1}', Content_Type="application/json").status_code == 201
    put = _send(client, key, method="PUT", data=b'{"n": 1}', Content_Type="application/json")
    assert put.status_code == 422, put.get_data(as_text=True)


def test_the_same_request_still_replays_across_media_type_parameters_of_json(make_app: shim.AppFactory) -> None:
    app = make_app()
    client, key = app.test_client(), new_key()
    assert post(client, "/orders", key, {"item": "x"}).status_code == 201
    again = client.post(
        "/orders",
        data=b'{"item":  "x"}',
        headers={"Idempotency-Key": key, "X-User": "1", "Content-Type": "application/json; charset=utf-8"},
    )
    assert again.status_code == 201 and again.headers.get("Idempotent-Replayed") == "true"
    assert shim.executions(app) == 1
