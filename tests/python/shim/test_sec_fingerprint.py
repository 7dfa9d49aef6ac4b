"""The fingerprint is injective over what the handler can see, and one request has one (contract §4b).

Found from outside after the fingerprint's second round:

- a JSON body POSTed under two JSON media types (``application/vnd.shop.v1+json`` and
  ``...v2+json``, or ``application/json`` and ``application/merge-patch+json``) is fingerprinted
  by its bytes alone (the plain shape, kept for rolling deploys, has no media type), though the
  handler sees, and versions its API by, ``request.mimetype``: the second request, with the same
  key, is answered with the first one's stored response instead of 422;
- Contract §4b: a multipart upload is fingerprinted by its parts' names, content types and bytes. The
  shim hashes the raw bytes and the Content-Type, both of which carry the boundary that a client
  makes up per request, so the same upload retried by a new client call (a new boundary) is a
  422 mismatch instead of its replay.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask, request

from idem_shim import idempotency_key
from tests.python.support import shim
from tests.python.support.sqlapi import new_key


def _add_routes(app: Flask) -> None:
    @app.route("/versioned", methods=["POST"], endpoint="versioned")
    @shim.require_session
    @idempotency_key()
    def versioned() -> Any:
        app.extensions["shim_test_executions"].bump()
        return {"mimetype": request.mimetype, "json": request.get_json()}, 201

    @app.route("/uploads", methods=["POST"], endpoint="uploads")
    @shim.require_session
    @idempotency_key(uploads=True)
    def uploads() -> Any:
        app.extensions["shim_test_executions"].bump()
        part = request.files["doc"]
        return {"name": part.filename, "size": len(part.read()), "note": request.form.get("note")}, 201


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("application/vnd.shop.v1+json", "application/vnd.shop.v2+json"),
        ("application/json", "application/merge-patch+json"),
    ],
)
def test_the_same_json_under_another_json_media_type_is_another_request(
    make_app: shim.AppFactory, first: str, second: str
) -> None:
    app = make_app()
    _add_routes(app)
    client, key = app.test_client(), new_key()
    sent = {"Idempotency-Key": key, "X-User": "1"}
    body = b'{"qty": 2, "note": null}'
    done = client.post("/versioned", data=body, headers={**sent, "Content-Type": first})
    assert done.status_code == 201 and done.get_json()["mimetype"] == first
    other = client.post("/versioned", data=body, headers={**sent, "Content-Type": second})
    assert other.status_code == 422, (
        f"a {second} request was answered with the {first} request's stored response: "
        f"{other.status_code} {other.headers.get('Idempotent-Replayed')} {other.get_data(as_text=True)}"
    )
    assert shim.executions(app) == 1


def _multipart(boundary: str) -> bytes:
    return (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="note"\r\n\r\n'
        "quarterly\r\n"
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="doc"; filename="report.csv"\r\n'
        "Content-Type: text/csv\r\n\r\n"
        "a,b\r\n1,2\r\n"
        f"--{boundary}--\r\n"
    ).encode()


def test_the_same_upload_with_another_boundary_is_the_same_request(make_app: shim.AppFactory) -> None:
    """What a client's retry sends: the same parts, a boundary made up for the new call."""
    app = make_app()
    _add_routes(app)
    client, key = app.test_client(), new_key()
    answers = []
    for boundary in ("----client-call-1-9f2c", "----client-call-2-41ad"):
        answers.append(
            client.post(
                "/uploads",
                data=_multipart(boundary),
                headers={
                    "Idempotency-Key": key,
                    "X-User": "1",
                    "Content-Type": f"multipart/form-data; boundary={boundary}",
                },
            )
        )
    first, retry = answers
    assert first.status_code == 201 and first.get_json() == {"name": "report.csv", "size": 8, "note": "quarterly"}
    assert retry.status_code == 201 and retry.headers.get("Idempotent-Replayed") == "true", (
        f"the same upload under a new boundary: {retry.status_code} {retry.get_data(as_text=True)}"
    )
    assert shim.executions(app) == 1


def _empty_parts(boundary: str, count: int) -> bytes:
    part = f'--{boundary}\r\nContent-Disposition: form-data; name="note"\r\n\r\n\r\n'
    return (part * count + f"--{boundary}--\r\n").encode()


def test_an_upload_of_more_parts_than_max_form_parts_is_the_413_and_stores_nothing(
    make_app: shim.AppFactory, fresh_admin_url: str
) -> None:
    """Issue 39's F6: Werkzeug's own parser stops at MAX_FORM_PARTS (1,000) with 413; the
    fingerprint parsed every part before it, and the handler's 413 was then stored."""
    app = make_app()
    _add_routes(app)
    boundary = "----bomb-1"
    sent = {"Idempotency-Key": new_key(), "X-User": "1", "Content-Type": f"multipart/form-data; boundary={boundary}"}
    answer = app.test_client().post("/uploads", data=_empty_parts(boundary, 2000), headers=sent)
    assert answer.status_code == 413 and answer.get_json() == {"error": "request_too_large"}
    assert shim.executions(app) == 0
    assert shim.scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys") == 0, "nothing stored"


def test_max_form_parts_is_the_apps(make_app: shim.AppFactory, fresh_admin_url: str) -> None:
    app = make_app(MAX_FORM_PARTS=10)
    _add_routes(app)
    boundary = "----few-1"
    sent = {"X-User": "1", "Content-Type": f"multipart/form-data; boundary={boundary}"}
    client = app.test_client()
    over = client.post("/uploads", data=_empty_parts(boundary, 11), headers={**sent, "Idempotency-Key": new_key()})
    assert over.status_code == 413
    assert shim.scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys") == 0
