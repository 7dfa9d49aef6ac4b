"""A handler's session state leaves with its request: the shim's pool hands the next request a
connection as it was opened.

``connection()`` is the shim's pooled connection, and a ``SET`` (not ``SET LOCAL``) that commits
stays with the session. A handler's SQL injection (SPEC §3a's threat model) that runs
``SET client_encoding = 'SQL_ASCII'`` made every later request on that connection, any user's,
a 500 (psycopg decodes nothing as text any more: the claim's row is bytes) until the connection
was recycled, an hour later; one such request per pooled connection and every decorated route
was down. A ``SET statement_timeout`` of a few milliseconds stayed for the next users' claims,
a ``search_path`` and a temp table for their handlers' unqualified names (their orders went to
the attacker's table, dropped with the session).
"""

from __future__ import annotations

import uuid
from typing import Any

import idem_shim
from tests.python.support import shim

POISON = (
    "SET client_encoding = 'SQL_ASCII'",
    "SET statement_timeout = 3",
    "SET search_path = pg_temp, public",
    "SET application_name = 'injected'",
    # pg_temp is searched first for relations: the next handlers' orders would land here.
    "CREATE TEMP TABLE shim_orders (LIKE public.shim_orders INCLUDING ALL)",
)


def _injected(order: shim.Order) -> Any:
    """A handler whose query an attacker controls, once (``inject`` in the body)."""
    if order.body.get("inject"):
        for statement in POISON:
            idem_shim.connection().execute(statement)
    return shim.places_order(order)


def _session(app: Any) -> tuple[Any, ...]:
    with shim.state_of(app).store.pool.connection() as conn:
        row = conn.execute(
            "SELECT pg_catalog.current_setting('client_encoding'), pg_catalog.current_setting('statement_timeout'),"
            " pg_catalog.current_setting('search_path'), pg_catalog.current_setting('application_name')"
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_the_next_request_gets_the_session_as_it_was_opened(make_app: shim.AppFactory, shim_web_url: str) -> None:
    app = make_app(_injected, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_STATEMENT_TIMEOUT_MS=5000)
    client = app.test_client()
    assert shim.post(client, "/orders", str(uuid.uuid4()), {"item": "warm-up"}, user=2).status_code == 201
    opened = _session(app)
    shim.post(client, "/orders", str(uuid.uuid4()), {"item": "x", "inject": True}, user=1)  # the attacker's
    answers = [shim.post(client, "/orders", str(uuid.uuid4()), {"item": f"v{i}"}, user=2) for i in range(3)]
    assert [a.status_code for a in answers] == [201] * 3, "another user's requests ran under the handler's SET"
    assert _session(app) == opened
    stored = shim.scalar(
        shim_web_url, "SELECT pg_catalog.count(*) FROM public.shim_orders WHERE user_id OPERATOR(pg_catalog.=) 2"
    )
    assert stored == 4, "another user's orders went to the handler's temp table"
