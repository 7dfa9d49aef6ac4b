"""One request carries one key (contract §3a, §4b; issue 39's F4), through Flask's test client on a
real database.

Found from outside: under ``key_format="opaque"`` a comma was a key character, and a WSGI
server joins two ``Idempotency-Key`` field lines into one value with ``,`` (RFC 9110 §5.3;
gunicorn and Werkzeug's server without a space, Werkzeug's test client with one). A retry that
carried the header twice (a retry layer that appends, a proxy that adds it again) was the key
``K,K``: a new key, and the handler ran a second time. Two structured-field strings
(``"K","K"``), a string with parameters (``"K";a=1``) and a stray quote (``K"``) were keys
too. The IETF draft makes the field an sf-Item String (RFC 8941): a list is not one. Under
gunicorn, with two real field lines: tests/python/e2e/test_client_options.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.python.support import shim
from tests.python.support.shim import post, scalar

MALFORMED = "Idempotency-Key must be a UUID string"
#: The same 400 under key_format="opaque": its text names the rule in force (contract §4b).
OPAQUE_MALFORMED = "Idempotency-Key must be one key of 16 to 255 visible ASCII characters"
KEY = "order-2026-12-01-0042"


def _rows(url: str) -> Any:
    return scalar(url, "SELECT count(*) FROM idempotency_keys")


@pytest.mark.parametrize(
    "doubled",
    [
        f"{KEY},{KEY}",  # two field lines as gunicorn and Werkzeug's server join them
        f"{KEY}, {KEY}",  # as Werkzeug's test client joins them
        f'"{KEY}","{KEY}"',  # two sf-Strings
        f'"{KEY}", "{KEY}"',
        f'"{KEY}";a=1',  # an sf-String with a parameter
        f"{KEY};a=1",
        f'{KEY}"',  # a stray quote
        f'"{KEY}',
        f'"{KEY}\\"x"',  # an escaped quote: the key would hold a quote
        f"{KEY}\\x",  # a backslash
    ],
)
def test_a_header_that_is_not_one_key_is_the_400_and_runs_nothing(
    make_app: shim.AppFactory, fresh_admin_url: str, doubled: str
) -> None:
    app = make_app(IDEM_KEY_FORMAT="opaque")
    client = app.test_client()
    assert post(client, "/orders", KEY, {"item": "a"}).status_code == 201
    answer = post(client, "/orders", doubled, {"item": "a"})
    assert answer.status_code == 400, f"{doubled!r} was taken for a key: {answer.status_code} {answer.get_json()}"
    body = answer.get_json()
    assert body["error"] == OPAQUE_MALFORMED
    assert "one key" in body["detail"], body
    assert shim.executions(app) == 1, "the handler ran a second time"
    assert _rows(fresh_admin_url) == 1, "a second key was stored"


def test_two_field_lines_are_the_400(make_app: shim.AppFactory, fresh_admin_url: str) -> None:
    """The header sent twice, as two field lines (the test client joins them as a server does)."""
    app = make_app(IDEM_KEY_FORMAT="opaque")
    client = app.test_client()
    assert post(client, "/orders", KEY, {"item": "a"}).status_code == 201
    answer = client.post(
        "/orders", json={"item": "a"}, headers=[("X-User", "1"), ("Idempotency-Key", KEY), ("Idempotency-Key", KEY)]
    )
    assert answer.status_code == 400 and answer.get_json()["error"] == OPAQUE_MALFORMED
    assert shim.executions(app) == 1 and _rows(fresh_admin_url) == 1


def test_a_uuid_header_sent_twice_is_the_400(make_app: shim.AppFactory, fresh_admin_url: str) -> None:
    app = make_app()
    key = "0b6f2b1e-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
    client = app.test_client()
    for doubled in (f"{key},{key}", f'"{key}","{key}"', f'"{key}";a=1'):
        answer = post(client, "/orders", doubled, {"item": "a"})
        assert answer.status_code == 400 and answer.get_json() == {"error": MALFORMED}, doubled
    assert shim.executions(app) == 0 and _rows(fresh_admin_url) == 0


@pytest.mark.parametrize(
    "sent",
    [
        KEY,
        f'"{KEY}"',  # the IETF draft's sf-String
        "sk_live-1234/abcd:efgh=",  # Stripe-style: digits, '/', ':', '=' (wider than an sf-Token)
        "(order)-2026-12-01",  # parentheses mean nothing outside the start of an inner list
    ],
)
def test_one_key_bare_or_quoted_is_still_a_key(make_app: shim.AppFactory, sent: str) -> None:
    app = make_app(IDEM_KEY_FORMAT="opaque")
    client = app.test_client()
    assert post(client, "/orders", sent, {"item": "a"}).status_code == 201
    again = post(client, "/orders", sent, {"item": "a"})
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert shim.executions(app) == 1


def test_the_opaque_400_states_the_rule_in_force(make_app: shim.AppFactory) -> None:
    """Contract §4b: the 400's text names the rule in force; under opaque that is not "a UUID": the
    error, the problem's title and its detail state the opaque rule, under a type of its own."""
    app = make_app(IDEM_KEY_FORMAT="opaque", IDEM_ERROR_FORMAT="problem+json")
    answer = post(app.test_client(), "/orders", f"{KEY},{KEY}", {"item": "a"})
    assert answer.status_code == 400
    body = answer.get_json()
    assert body["error"] == OPAQUE_MALFORMED and body["title"] == OPAQUE_MALFORMED, body
    assert body["type"].endswith("idempotency-key-malformed-opaque"), body
    assert "16 to 255" in body["detail"] and "one key" in body["detail"], body
