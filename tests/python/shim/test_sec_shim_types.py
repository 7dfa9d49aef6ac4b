"""The shim's request path resolves no name through the app's session path: not a type either.

``queries.CLAIM`` and ``queries.COMPLETE`` name idem's functions as ``public.idem_*``, but cast
their parameters to ``text`` and ``jsonb`` and call ``set_config``/``current_setting``
unqualified. ``pg_catalog`` is searched first only while the path does not name it: a path of
``public, pg_catalog`` puts ``public``'s objects first, and the app's role sets its sessions'
path itself (``ALTER ROLE ... SET``, for itself; the database's owner ``ALTER DATABASE ... SET``;
a handler's ``SET`` that stays with a pooled connection, or with PgBouncer's server connection
for the next client). Then a domain ``public.text`` over ``pg_catalog.text`` is what every
``$n::text`` of the shim makes, and its CHECK runs the owner's function on each value: every
client's raw key, endpoint, request and claim token, every stored answer and the response
encryption key. Contract §3a: an ``idem_app`` member "can neither read another user's raw keys nor
replace an answer stored for another request"; with the token it does both.

The set-up is contract §3a's (``CREATE DATABASE app OWNER web``, a superuser migrates, web is the app's
login role and a member of idem_app). The test asserts the safe outcome: the planted function saw
nothing of another user's request.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import sql

from tests.python.support import shim
from tests.python.support.owned import migrated_by_the_dba, owned_database, pinned

RESPONSE_KEY = "Zq3vX9pLm2Rt8sWb4Ky7Hn1Jd6Fc5Ga0"

SPY = [
    "CREATE TABLE public.seen (v pg_catalog.text)",
    "GRANT INSERT ON public.seen TO PUBLIC",
    """CREATE FUNCTION public.spy(v pg_catalog.text) RETURNS pg_catalog.bool LANGUAGE plpgsql AS $f$
       BEGIN INSERT INTO public.seen (v) VALUES (v); RETURN true; END $f$""",
    "CREATE DOMAIN public.text AS pg_catalog.text CHECK (public.spy(VALUE))",
    "CREATE DOMAIN public.jsonb AS pg_catalog.jsonb CHECK (public.spy(VALUE::pg_catalog.text))",
]


@pytest.fixture
def shadowed(admin_url: str) -> Iterator[dict[str, str]]:
    """Contract §3a's store, its owner's types planted in public and first on its own sessions' path."""
    with owned_database(admin_url) as owned:
        migrated_by_the_dba(owned)
        with pinned(owned["url"]) as dba:
            dba.execute("INSERT INTO public.users (id) VALUES (7) ON CONFLICT DO NOTHING")
        with pinned(owned["attacker_url"]) as web:
            for statement in SPY:
                web.execute(statement)
            # An ordinary role sets its own sessions' defaults (no privilege needed).
            web.execute(
                sql.SQL("ALTER ROLE {} IN DATABASE {} SET search_path = public, pg_catalog").format(
                    sql.Identifier(owned["role"]), sql.Identifier(owned["db"])
                )
            )
        try:
            yield owned
        finally:
            with pinned(owned["url"]) as dba:
                dba.execute(
                    sql.SQL("ALTER ROLE {} IN DATABASE {} RESET ALL").format(
                        sql.Identifier(owned["role"]), sql.Identifier(owned["db"])
                    )
                )


def _secret_answer(order: shim.Order) -> Any:
    return {"card_last4": "4242", "for": "user 7"}, 201


def test_the_shims_statements_cast_through_no_planted_type(shadowed: dict[str, str]) -> None:
    app = shim.make_app(shadowed["attacker_url"], handler=_secret_answer, IDEM_RESPONSE_KEY=RESPONSE_KEY)
    try:
        key = str(uuid.uuid4())
        headers = {"Idempotency-Key": key, "X-User": "7"}
        first = app.test_client().post("/orders", json={"item": "for user 7"}, headers=headers)
        assert first.status_code == 201, first.get_data(as_text=True)
        again = app.test_client().post("/orders", json={"item": "for user 7"}, headers=headers)
        assert again.headers.get("Idempotent-Replayed") == "true"
    finally:
        shim.state_of(app).store.close()
    with pinned(shadowed["url"]) as dba:
        seen = [row[0] for row in dba.execute("SELECT v FROM public.seen")]
    leaked = [v for v in seen if v is not None and (key in v or "4242" in v or RESPONSE_KEY in v or "for user 7" in v)]
    assert leaked == [], "the owner's type saw another user's request: " + json.dumps(seen)[:600]
