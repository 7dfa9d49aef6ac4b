"""
idem_complete refuses to store a response that carries a credential, at any depth, and
changes nothing when it does (contract §3: no credentials in response_body); ordinary order
and billing bodies, including ones with look-alike keys, are stored.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.python.support.roles import as_app_role
from tests.python.support.sqlapi import claim, complete, connect, new_key

REFUSED = [
    {"password": "x"},
    {"user": {"Access_Token": "t"}},
    {"items": [{"meta": {"client_secret": "cs"}}]},
    {"api_key": "k"},
    {"headers": {"Authorization": "Bearer x"}},
    {"set-cookie": "sid=1"},
    # camelCase, suffixed and bare session names
    {"user": {"accessToken": "t"}},
    {"clientSecret": "s"},
    {"profile": {"password_hash": "$2b$12$..."}},
    {"session_id": "web-session-1"},
    {"X-Api-Key": "k"},
    # raw bodies: form fields, and bytes (base64) read as text
    {"idem_raw": "text", "data": "access_token=abc&token_type=bearer"},
    {"idem_raw": "base64", "data": "eyJwYXNzd29yZCI6ICJcdTAwZTkiLCAiXHhmZiI6IDF9/w=="},
    # a name holding an escaped quote or a run of separators, at any depth
    {'password"x': 1},
    {"a": {'clientSecret"': "s"}},
    {"a": [{"api--key": "k"}]},
    {"api\tkey": "k"},
    # form bodies: a valueless field, a ; separator, a space before =, a percent-encoded name
    {"idem_raw": "text", "data": "access_token=s3cr3t&x"},
    {"idem_raw": "text", "data": "a=1;access_token=s3cr3t"},
    {"idem_raw": "text", "data": "access_token =s3cr3t"},
    {"idem_raw": "text", "data": "access%5Ftoken=s3cr3t&x=1"},
    {"idem_raw": "text", "data": "x=1&%70assword=hunter2"},
    {"idem_raw": "text", "data": "user=alice\naccess_token=s3cr3t\n"},
]
STORED = [
    {"order_id": 1, "fill_price": "97250.00"},
    {"checkout_session_id": "cs_test_1", "tokens_used": 3, "secretary": "no", "token_count": 2},
    {"idem_raw": "text", "data": "order=1&qty=2"},
    {"idem_raw": "text", "data": 'name,"token": x\n'},
    [1, 2, 3],
    "plain",
    # prose that names a credential is no form field
    {"idem_raw": "text", "data": "Your password was changed."},
    {"idem_raw": "text", "data": "token expired; please sign in again"},
    {"idem_raw": "text", "data": "token_count=3&order=1"},
    {"idem_raw": "text", "data": "your token\nhas expired = sign in again\n"},
    {"note": 'a value with "token": inside'},
]


@pytest.mark.parametrize("body", REFUSED)
def test_a_body_with_a_credential_is_refused_and_the_claim_stays_in_flight(fresh_admin_url: str, body: Any) -> None:
    with connect(as_app_role(fresh_admin_url)) as conn:
        key = new_key()
        token = claim(conn, key)
        with pytest.raises(psycopg.Error, match="must not contain credentials") as err:
            complete(conn, token, body=body)
        assert err.value.sqlstate == "IDM04"  # its own code: the shim tells it from any other refusal
        assert claim(conn, key)["outcome"] == "in_flight"


@pytest.mark.parametrize("body", STORED)
def test_ordinary_bodies_are_stored_and_replayed(fresh_admin_url: str, body: Any) -> None:
    with connect(as_app_role(fresh_admin_url)) as conn:
        key = new_key()
        complete(conn, claim(conn, key), body=body)
        assert claim(conn, key)["response_body"] == body


@pytest.mark.parametrize(
    "headers",
    [
        {"Location": "/cb?access_token=abc"},
        {"Link": "</x?foo=1&clientSecret=s>; rel=next"},
        # percent-encoded names, a space before =
        {"Location": "/cb?access%5Ftoken=abc"},
        {"Location": "/cb?x=1&%74%6F%6B%65%6E=abc"},
        {"Location": "/cb?x=1;access_token =abc"},
    ],
)
def test_a_header_value_carrying_a_credential_parameter_is_refused(fresh_admin_url: str, headers: Any) -> None:
    with connect(as_app_role(fresh_admin_url)) as conn:
        key = new_key()
        token = claim(conn, key)
        with pytest.raises(psycopg.Error, match="carries a credential-named parameter") as err:
            conn.execute(
                "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{}',"
                " p_response_headers => %s, p_claim_token => %s)",
                (token["key_id"], Jsonb(headers), token["claim_token"]),
            )
        assert err.value.sqlstate == "IDM04"
        assert claim(conn, key)["outcome"] == "in_flight"
