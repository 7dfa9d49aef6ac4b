"""One rule decides what a credential name is, wherever the name stands in an answer.

A table of names, credentials and innocent look-alikes, each put in every place idem_complete
screens: a body key, a nested key, a key of a JSON text inside a string value, a field of a form,
of a ``.env`` file with a comment, of YAML, of JSON lines, of a base64 body's bytes, a header
name and a header value's query parameter. A credential is refused (IDM04) in every place and an
innocent name stored in every one; the shim's own reading of header names
(``idem_shim.credentials``) agrees with ``idem_credential_name`` on every name.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from idem_shim.credentials import credential_name
from tests.python.support.roles import as_app_role
from tests.python.support.sqlapi import claim, connect, new_key

CREDENTIALS = [
    "access_tokens", "refresh_token", "apiKeys", "password2", "password_hash", "client_secret_v2", "cookies",
    "X-Access-Key", "X-Signing-Key", "X-Passphrase", "X-Pwd", "access%5Ftoken", "session_id", "X-Session-Id",
    "WWW-Authenticate", "Authorization", "private_key", "aws_access_key_id",
]  # fmt: skip
INNOCENT = [
    "token_count", "tokens_used", "total_tokens", "max_tokens", "prompt_tokens", "secretary",
    "checkout_session_id", "order_id", "author", "keyboard", "X-Request-Id", "idempotency_key",
]  # fmt: skip


def places(name: str) -> dict[str, tuple[Any, Any]]:
    """Where a name can stand in an answer: place -> (body, headers)."""
    raw = {
        "form": f"order=1&{name}=v",
        ".env": f"# written by the API\nORDER=1\n{name}=v\n",
        "YAML": f"order: 1\n{name}: v\n",
        "JSON lines": f'{{"order": 1}}\n{{"{name}": "v"}}\n',
    }
    found: dict[str, tuple[Any, Any]] = {
        "body key": ({name: "v"}, None),
        "nested key": ({"order": {"items": [{name: "v"}]}}, None),
        "JSON text in a string": ({"payload": json.dumps({name: "v"})}, None),
        "base64 form": ({"idem_raw": "base64", "data": base64.b64encode(raw["form"].encode()).decode()}, None),
        "header name": ({"order": 1}, {name: "v"}),
        "header value parameter": ({"order": 1}, {"Location": f"/cb?x=1&{name}=v"}),
    }
    found.update({place: ({"idem_raw": "text", "data": text}, None) for place, text in raw.items()})
    return found


def outcomes(url: str, name: str) -> dict[str, str]:
    """place -> "refused" (IDM04, nothing stored) or "stored", for one name."""
    seen = {}
    with connect(as_app_role(url)) as conn:
        held = claim(conn, new_key())
        for place, (body, headers) in places(name).items():
            try:
                with conn.transaction(force_rollback=True):  # the claim stays in flight for the next place
                    conn.execute(
                        "SELECT idem_complete(p_key_id => %s, p_response_code => 200, p_response_body => %s,"
                        " p_response_headers => %s, p_claim_token => %s)",
                        (held["key_id"], Jsonb(body), None if headers is None else Jsonb(headers), held["claim_token"]),
                    )
                seen[place] = "stored"
            except psycopg.Error as exc:
                seen[place] = "refused" if exc.sqlstate == "IDM04" else f"{exc.sqlstate}: {exc}"
    return seen


@pytest.mark.parametrize("name", CREDENTIALS)
def test_a_credential_name_is_refused_wherever_it_stands(fresh_admin_url: str, name: str) -> None:
    seen = outcomes(fresh_admin_url, name)
    assert seen == dict.fromkeys(seen, "refused"), seen


@pytest.mark.parametrize("name", INNOCENT)
def test_an_innocent_name_is_stored_wherever_it_stands(fresh_admin_url: str, name: str) -> None:
    seen = outcomes(fresh_admin_url, name)
    assert seen == dict.fromkeys(seen, "stored"), seen


def test_the_shim_reads_names_by_the_databases_rule(fresh_admin_url: str) -> None:
    names = CREDENTIALS + INNOCENT + ["Set-Cookie", "X-Auth-Token", "secret_v2", "tokens", "passwords", "X-Auth"]
    with connect(fresh_admin_url) as conn:
        rows = conn.execute("SELECT n, idem_credential_name(n) AS c FROM unnest(%s::text[]) n", (names,)).fetchall()
    database = {r["n"]: r["c"] for r in rows}
    assert {n: credential_name(n) for n in names} == database
    assert [n for n in names if database[n]] == [n for n in names if n in CREDENTIALS or n not in INNOCENT]
