"""Issue 39 F5: an endpoint text the shim would never send is refused before anything is written.

A member of ``idem_app`` (contract §3a's attacker: SQL injection in a handler) called
``idem_claim(p_endpoint => 'POST /api/x' || g)`` over ``generate_series`` and every made-up
endpoint became rows, metric series and alerts. Endpoint scopes are names from code: a route's
``"METHOD /rule"`` or a declared ``scope=``, at most 200 printable characters
(``policy.MAX_SCOPE_LENGTH``). So ``idem_claim``, ``idem_downstream_key`` and
``idem_record_lost_claim`` refuse a longer one, or one with a control character (C0, DEL, C1,
U+2028/U+2029, the bidirectional overrides) with IDM00, a bad argument as an empty endpoint is
(22023 is the contract's malformed key and nothing else: the shim answers it as the client's mistake),
and nothing is stored.

Cases: 10,000 characters and 201 characters refused, 200 accepted; each control character
refused; the refusal stores no row; idem_downstream_key refuses the same texts.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.python.support.sqlapi import claim, connect, new_key

MAX = 200
CONTROLS = ["\x01", "\t", "\n", "\x1b", "\x1f", "\x7f", "\x80", "\x85", "\x9f", "\u2028", "\u2029", "\u202e", "\u2066"]


def stored_rows(admin_url: str) -> int:
    with psycopg.connect(admin_url) as conn:
        row = conn.execute("SELECT count(*) FROM public.idempotency_keys").fetchone()
    assert row is not None
    return int(row[0])


def refused(url: str, endpoint: str) -> psycopg.errors.Diagnostic:
    with connect(url) as conn, pytest.raises(psycopg.Error) as caught:
        claim(conn, new_key(), endpoint=endpoint)
    assert caught.value.sqlstate == "IDM00", caught.value
    return caught.value.diag


@pytest.mark.parametrize("length", [10_000, MAX + 1])
def test_an_endpoint_over_the_maximum_length_is_refused(
    fresh_app_role_url: str, fresh_admin_url: str, length: int
) -> None:
    diag = refused(fresh_app_role_url, "POST /" + "x" * (length - 6))
    assert diag.message_primary == f"idem_claim: p_endpoint must be at most {MAX} characters (got {length})"
    assert stored_rows(fresh_admin_url) == 0


def test_an_endpoint_of_the_maximum_length_is_claimed(fresh_app_role_url: str, fresh_admin_url: str) -> None:
    with connect(fresh_app_role_url) as conn:
        assert claim(conn, new_key(), endpoint="POST /" + "x" * (MAX - 6))["outcome"] == "claimed"
    assert stored_rows(fresh_admin_url) == 1


@pytest.mark.parametrize("char", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_an_endpoint_with_a_control_character_is_refused(
    fresh_app_role_url: str, fresh_admin_url: str, char: str
) -> None:
    diag = refused(fresh_app_role_url, f"POST /api/x{char}y")
    assert diag.message_primary == "idem_claim: p_endpoint must not contain control characters"
    assert diag.message_detail is not None and f"U+{ord(char):04X}" in diag.message_detail
    assert stored_rows(fresh_admin_url) == 0


def test_the_downstream_key_refuses_the_same_endpoints(fresh_app_role_url: str) -> None:
    query = "SELECT public.idem_downstream_key(p_key => %s, p_user_id => 1, p_endpoint => %s, p_namespace => 'broker')"
    with connect(fresh_app_role_url) as conn:
        for endpoint in ("POST /" + "x" * 10_000, "POST /a\u2028b"):
            with conn.transaction(), pytest.raises(psycopg.Error) as caught:
                conn.execute(query, (new_key(), endpoint))
            assert caught.value.sqlstate == "IDM00", caught.value
        assert conn.execute(query, (new_key(), "POST /" + "x" * (MAX - 6))).fetchone() is not None
