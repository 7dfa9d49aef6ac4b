"""The SQL rule of an opaque key matches the shim's (issue 39's F4): a key the shim refuses as
not one key (a comma, a quote, a semicolon, a backslash: what makes an ``Idempotency-Key``
field a list, a string or parameters, RFC 8941) is refused by ``idem_claim`` as the app's role,
22023 with a DETAIL naming the rule; white space and control characters stay refused; rows
stored under the earlier, wider rule stay valid (the table's CHECK is unchanged).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from idem_shim.fingerprint import parse_key

OPAQUE_CLAIM = """SELECT outcome FROM public.idem_claim(p_key => %s, p_user_id => NULL,
    p_endpoint => 'POST /api/x', p_request => %s, p_key_format => 'opaque')"""
KEY = "order-2026-12-01-0042"


def _claim(conn: psycopg.Connection[Any], key: str) -> str:
    row = conn.execute(OPAQUE_CLAIM, (key, Jsonb({"qty": 1}))).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize(
    "key",
    [
        f"{KEY},{KEY}",
        f'"{KEY}"',
        f"{KEY};a=1",
        f"{KEY}\\x",
        f"{KEY} x",
        f"{KEY}\tx",
        f"{KEY}\x01",
        f"{KEY}\x7f",
    ],
)
def test_a_key_the_shim_refuses_is_refused_by_the_claim(fresh_app_role_url: str, key: str) -> None:
    assert parse_key(key, "opaque") is None or parse_key(key, "opaque") != key, "the shim takes it as sent"
    with psycopg.connect(fresh_app_role_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            _claim(conn, key)
    diag = refused.value.diag
    assert diag.message_primary == "Idempotency-Key must be a UUID string"
    assert diag.message_detail is not None and "no comma" in diag.message_detail, diag.message_detail


def test_a_key_that_is_one_key_is_claimed_as_sent(fresh_app_role_url: str) -> None:
    with psycopg.connect(fresh_app_role_url, autocommit=True) as conn:
        for key in (KEY, "sk_live-1234/abcd:efgh=", "!#$%&'()*+-./:<=>?@[]^_`{|}~" + "x" * 4):
            assert parse_key(key, "opaque") == key
            assert _claim(conn, key) == "claimed", key


def test_a_row_stored_under_the_earlier_rule_stays_valid(fresh_admin_url: str) -> None:
    """A key with a comma, claimed before this rule: its row keeps the table's CHECK and is read,
    completed, exported and cleaned up as before; only a new claim of it is refused."""
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status,"
            " expires_at) VALUES (%s, NULL, 'POST /api/x', repeat('0', 64), 'in_flight', now() + interval '1 hour')",
            (f"{KEY},{KEY}",),
        )
        assert conn.execute("SELECT count(*) FROM public.idempotency_keys").fetchone() == (1,)
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            _claim(conn, f"{KEY},{KEY}")
