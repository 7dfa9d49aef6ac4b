"""
idem_complete refuses to store a response that carries a credential, at any depth, and
changes nothing when it does (ADR-0138: no credentials in response_body); ordinary order
and billing bodies, including ones with look-alike keys, are stored.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.python.support.roles import as_app_role
from tests.python.support.sqlapi import claim, complete, connect, new_key

REFUSED = [
    {"password": "x"},
    {"user": {"Access_Token": "t"}},
    {"items": [{"meta": {"client_secret": "cs"}}]},
    {"api_key": "k"},
    {"headers": {"Authorization": "Bearer x"}},
    {"set-cookie": "sid=1"},
]
STORED = [
    {"order_id": 1, "fill_price": "97250.00"},
    {"checkout_session_id": "cs_test_1", "tokens_used": 3, "secretary": "no"},
    [1, 2, 3],
    "plain",
]


@pytest.mark.parametrize("body", REFUSED)
def test_a_body_with_a_credential_is_refused_and_the_claim_stays_in_flight(fresh_admin_url: str, body: Any) -> None:
    with connect(as_app_role(fresh_admin_url)) as conn:
        key = new_key()
        token = claim(conn, key)["key_id"]
        with pytest.raises(psycopg.Error, match="must not contain credentials") as err:
            complete(conn, token, body=body)
        assert err.value.sqlstate == "IDM04"  # its own code: the shim tells it from any other refusal
        assert claim(conn, key)["outcome"] == "in_flight"


@pytest.mark.parametrize("body", STORED)
def test_ordinary_bodies_are_stored_and_replayed(fresh_admin_url: str, body: Any) -> None:
    with connect(as_app_role(fresh_admin_url)) as conn:
        key = new_key()
        complete(conn, claim(conn, key)["key_id"], body=body)
        assert claim(conn, key)["response_body"] == body
