"""Credentials that a URL carries by its syntax, stored for replay by idem_complete's screen.

docs/security.md: no credentials in a stored answer; the screen refuses a credential-named query
parameter in a header value (``Location: /cb?access%5Ftoken=…``). The same URL is stored when it
is a body's string value (``{"next": "/cb?access_token=…"}``, an OAuth redirect a route hands
back), and a URL's user information (``https://user:password@host/``, a DSN
``postgresql://app:secret@db/app``) is a password by position, under any name, in a header or a
body. Each case asserts the refusal (IDM04), and that the claim stays in flight (nothing stored),
so it fails while the screen stores it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.python.support.roles import as_app_role
from tests.python.support.sqlapi import claim, connect, new_key

CASES = [
    # (body, headers)
    ({"id": 1}, {"Location": "https://alice:p4ssw0rd@files.example/report"}),
    ({"id": 1}, {"Content-Location": "ftp://deploy:s3cr3t@ftp.example/"}),
    ({"callback": "https://alice:p4ssw0rd@files.example/report"}, None),
    ({"dsn": "postgresql://app:s3cr3t@db.internal:5432/app"}, None),
    ({"next": "https://app.example/cb?access_token=s3cr3t&state=1"}, None),
    ({"links": [{"href": "/download?x=1&api_key=k3y"}]}, None),
]


@pytest.mark.parametrize(("body", "headers"), CASES)
def test_a_credential_in_a_url_is_refused(fresh_admin_url: str, body: Any, headers: Any) -> None:
    with connect(as_app_role(fresh_admin_url)) as conn:
        key = new_key()
        held = claim(conn, key)
        try:
            conn.execute(
                "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => %s,"
                " p_response_headers => %s, p_claim_token => %s)",
                (held["key_id"], Jsonb(body), None if headers is None else Jsonb(headers), held["claim_token"]),
            )
            sqlstate = None
        except psycopg.Error as exc:
            sqlstate = exc.sqlstate
        outcome = claim(conn, key)["outcome"]
    assert sqlstate == "IDM04" and outcome == "in_flight", (
        f"stored for replay (outcome {outcome!r}, sqlstate {sqlstate}): body {body}, headers {headers}"
    )
