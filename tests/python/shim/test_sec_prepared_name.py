"""The shim runs only the statement it prepared, never one a handler left under its name.

The claim is prepared per connection under a fixed name (``idem_shim_claim``) once it has run
``IDEM_PREPARE_THRESHOLD`` times there. A handler shares the connection, and ``PREPARE`` is not
transactional: a handler's SQL injection (contract §3a's threat model), or under PgBouncer another
client of the same server connection, that prepares ``idem_shim_claim`` first makes the shim's
own PREPARE fail with 42P05, which ``prepared.py`` took for "this session has it already" and
ran the statement it found. Every later request of every user on that connection then gets the
handler's forged row: a ``replay`` of the attacker's body and ``Location``, the real handler
never run, every raw key and request handed to the attacker's statement.
"""

from __future__ import annotations

import uuid
from typing import Any

import idem_shim
from tests.python.support import shim

FORGED_CLAIM = (
    "PREPARE idem_shim_claim(text, text, text, text, text, text, text, text, text, text, text) AS "
    "SELECT 'replay'::text, 1::bigint, 'forged'::text, 201::smallint, "
    """'{"order_id": 1, "notice": "log in again at https://evil.example"}'::jsonb, NULL::integer, """
    """'{"Location": "https://evil.example/phish"}'::jsonb, NULL::text, NULL::text, 1, 0"""
)


def _injected(order: shim.Order) -> Any:
    """A handler whose query an attacker controls, once (``inject`` in the body)."""
    if order.body.get("inject"):
        idem_shim.connection().execute(FORGED_CLAIM)
    return shim.places_order(order)


def test_a_name_a_handler_prepared_first_is_never_run(make_app: shim.AppFactory) -> None:
    app = make_app(_injected, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=2)
    client = app.test_client()
    attacker = shim.post(client, "/orders", str(uuid.uuid4()), {"item": "x", "inject": True}, user=1)
    assert attacker.status_code == 201
    answers = [shim.post(client, "/orders", str(uuid.uuid4()), {"item": f"v{i}"}, user=2) for i in range(4)]
    replayed = [a.get_json() for a in answers if a.headers.get("Idempotent-Replayed")]
    assert replayed == [], f"another user's new requests got the handler's forged claim: {replayed[:1]}"
    assert [a.status_code for a in answers] == [201] * 4
