"""A handler that replaces the shim's prepared claim or completion (issue 39, finding C).

The shim's named statements live in the session it shares with the handler. A handler's SQL
injection reads the name from pg_prepared_statements (its own session's), DEALLOCATEs it and
PREPAREs its own SQL under it. Before the fix the shim still believed its statement prepared, so
every later request of every user on that pooled connection ran the attacker's claim: a forged
replay, the handler never run, the raw keys and the response key passed to the attacker's SQL.
Now each named EXECUTE follows, in its pipeline, a check that fails when the name holds another
statement: the server skips the EXECUTE (it never runs), the connection is closed, and the claim
is sent once more on a fresh one (the completion: 503, nothing of the block committed).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

import idem_shim
from tests.python.support import shim

#: Counts its own runs: nextval is not undone by a rollback, so a run of it shows even when its
#: transaction was aborted.
FORGED = (
    "SELECT 'replay'::text, pg_catalog.nextval('public.forged_runs'), 'forged'::text, 201::smallint, "
    """'{"order_id": 1, "notice": "log in again at https://evil.example"}'::jsonb, NULL::integer, """
    """'{"Location": "https://evil.example/phish"}'::jsonb, NULL::text, NULL::text, 1, 0"""
)


def _injector(statement: str, arity: int) -> shim.Handler:
    def handler(order: shim.Order) -> Any:
        if order.body.get("inject"):
            conn = idem_shim.connection()
            pattern = f"{statement}%"
            found = conn.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE %s", (pattern,)).fetchall()
            assert found, f"no {statement} prepared on this session"
            for (name,) in found:
                conn.execute(sql.SQL("DEALLOCATE {}").format(sql.Identifier(name)))
                types = sql.SQL(", ").join([sql.SQL("text")] * arity)
                conn.execute(sql.SQL("PREPARE {} ({}) AS ").format(sql.Identifier(name), types) + sql.SQL(FORGED))
        return shim.places_order(order)

    return handler


@pytest.fixture
def forged_runs(fresh_admin_url: str, shim_web_url: str) -> Any:
    with psycopg.connect(fresh_admin_url, autocommit=True) as admin:
        admin.execute("CREATE SEQUENCE public.forged_runs")
        admin.execute(f"GRANT USAGE ON SEQUENCE public.forged_runs TO {shim.APP_ROLE}")

    def runs() -> int:
        with psycopg.connect(fresh_admin_url) as admin:
            row = admin.execute("SELECT last_value, is_called FROM public.forged_runs").fetchone()
            assert row is not None
            return int(row[0]) if row[1] else 0

    return runs


def _backend(app: Any) -> int:
    with shim.state_of(app).store.pool.connection() as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])


def test_a_claim_a_handler_replaced_is_never_run(
    make_app: shim.AppFactory, forged_runs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    handler = _injector("idem_shim_claim", 11)
    app = make_app(handler, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=1)
    client = app.test_client()
    for i in range(3):  # the claim is prepared on the pool's one connection
        assert shim.post(client, "/orders", str(uuid.uuid4()), {"item": f"w{i}"}, user=2).status_code == 201
    assert shim.post(client, "/orders", str(uuid.uuid4()), {"item": "x", "inject": True}, user=1).status_code == 201
    tampered = _backend(app)
    with caplog.at_level(logging.WARNING, logger="idem_shim"):
        answers = [shim.post(client, "/orders", str(uuid.uuid4()), {"item": f"v{i}"}, user=2) for i in range(3)]
    replayed = [a.get_json() for a in answers if a.headers.get("Idempotent-Replayed")]
    assert replayed == [], f"another user's new requests got the handler's forged claim: {replayed[:1]}"
    assert [a.status_code for a in answers] == [201, 201, 201]  # claimed again on a fresh connection
    assert forged_runs() == 0, "the handler's statement ran (and saw the keys)"
    assert _backend(app) != tampered, "the tampered session is still in the pool"
    assert any("not the one the shim prepared" in r.getMessage() for r in caplog.records)


def test_a_completion_a_handler_replaced_is_never_run_and_nothing_commits(
    make_app: shim.AppFactory, forged_runs: Any, shim_web_url: str
) -> None:
    app = make_app(
        _injector("idem_shim_complete", 6), IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=1
    )
    client = app.test_client()
    for i in range(3):  # the completion is prepared on the pool's one connection
        assert shim.post(client, "/orders", str(uuid.uuid4()), {"item": f"w{i}"}, user=2).status_code == 201
    injected = shim.post(client, "/orders", str(uuid.uuid4()), {"item": "x", "inject": True}, user=1)
    assert injected.status_code == 503, injected.get_data(as_text=True)
    assert forged_runs() == 0, "the handler's statement ran in place of the completion"
    with psycopg.connect(shim_web_url) as other:
        assert other.execute("SELECT count(*) FROM shim_orders WHERE item = 'x'").fetchone() == (0,)
    after = [shim.post(client, "/orders", str(uuid.uuid4()), {"item": f"v{i}"}, user=2) for i in range(3)]
    assert [a.status_code for a in after] == [201, 201, 201]
    assert not [a for a in after if a.headers.get("Idempotent-Replayed")]
