"""The claim below psycopg's cursor (idem_shim/prepared.py, issue 22) keeps psycopg's rules for
prepared statements, on the app's one pool connection:

- ``IDEM_PREPARE_THRESHOLD = N``: sent unnamed N times, prepared (``idem_shim_claim``) at the next;
- ``None`` (PgBouncer in transaction mode): never prepared, every claim still answered;
- a session that lost the name (``DEALLOCATE ALL``, a pooler that moved it) answers 26000 once:
  the claim is prepared again and sent again, and the request is answered as if nothing happened;
- the SQL API's refusals keep their SQLSTATE through it (a users row missing: 500);
- the completion leaves with the handler's COMMIT in libpq's pipeline, and the block is still
  psycopg's: a handler's savepoint nests, its own ``commit()`` is refused (500, nothing
  committed), and psycopg's bookkeeping ends with the block.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from flask import Flask
from psycopg.pq import TransactionStatus

from idem_shim import connection
from tests.python.support.shim import AppFactory, Order, executions, post, state_of


def prepared_names(app: Flask) -> list[str]:
    with state_of(app).store.pool.connection() as conn:
        return [r[0] for r in conn.execute("SELECT name FROM pg_prepared_statements ORDER BY name")]


def claim_new_key(app: Flask) -> None:
    response = post(app.test_client(), "/orders", str(uuid.uuid4()), {"item": "x"})
    assert response.status_code == 201, response.get_data(as_text=True)


def test_prepared_after_the_threshold_and_again_after_the_server_lost_it(make_app: AppFactory) -> None:
    app = make_app(IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=2)
    claim_new_key(app)
    claim_new_key(app)
    assert "idem_shim_claim" not in prepared_names(app)
    claim_new_key(app)
    assert "idem_shim_claim" in prepared_names(app)

    with state_of(app).store.pool.connection() as conn:
        conn.execute("DEALLOCATE ALL")
    assert "idem_shim_claim" not in prepared_names(app)
    before = executions(app)
    claim_new_key(app)
    assert executions(app) == before + 1
    assert "idem_shim_claim" in prepared_names(app)

    key = str(uuid.uuid4())
    first = post(app.test_client(), "/orders", key, {"item": "y"})
    again = post(app.test_client(), "/orders", key, {"item": "y"})
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert executions(app) == before + 2


def test_never_prepared_without_a_threshold(make_app: AppFactory) -> None:
    app = make_app(IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=None)
    for _ in range(7):
        claim_new_key(app)
    assert "idem_shim_claim" not in prepared_names(app)


def test_a_refusal_keeps_its_sqlstate_through_the_prepared_call(make_app: AppFactory) -> None:
    app = make_app(IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=0)
    claim_new_key(app)
    assert "idem_shim_claim" in prepared_names(app)
    # a key the shim accepts and the user scope of no users row: 23503 -> InvalidArgumentError, a 500
    response = post(app.test_client(), "/orders", str(uuid.uuid4()), {"item": "z"}, user=987654321)
    assert response.status_code == 500
    claim_new_key(app)  # the connection is still good


# -- the completion and the COMMIT in libpq's pipeline ------------------------------------------


def nested_savepoint(order: Order) -> Any:
    """The handler's own ``conn.transaction()`` nests inside the scope's block as a savepoint;
    its rolled-back inner write is gone, the outer ones commit with the completion."""
    conn = connection()
    order_id = order.write()
    try:
        with conn.transaction():
            conn.execute("INSERT INTO audit_log (user_id, action, context) VALUES (1, 'inner', '{}')")
            raise LookupError("rolled back to the savepoint")
    except LookupError:
        pass
    return {"order_id": order_id}, 201


def commits_itself(order: Order) -> Any:
    order.write()
    connection().commit()  # psycopg refuses this inside the scope's block: the writes stay atomic
    return {"unreachable": True}, 201


def test_the_pipelined_commit_keeps_savepoints_and_psycopg_coherent(make_app: AppFactory, shim_web_url: str) -> None:
    app = make_app(nested_savepoint, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=0)
    key = str(uuid.uuid4())
    first = post(app.test_client(), "/orders", key, {"item": "s"})
    assert first.status_code == 201, first.get_data(as_text=True)
    order_id = first.get_json()["order_id"]
    assert post(app.test_client(), "/orders", key, {"item": "s"}).get_json()["order_id"] == order_id
    with psycopg.connect(shim_web_url) as other:
        actions = [
            r[0]
            for r in other.execute(
                "SELECT action FROM audit_log WHERE context->>'order_id' = %s OR action = 'inner'", (str(order_id),)
            )
        ]
    assert actions == ["order_placed"]
    # psycopg's own bookkeeping of the block ended with it: the pool connection opens, commits
    # and refuses nothing as any fresh connection would.
    with state_of(app).store.pool.connection() as conn:
        assert conn.info.transaction_status == TransactionStatus.IDLE
        with conn.transaction():
            conn.execute("SELECT 1")
        conn.commit()
        assert conn.info.transaction_status == TransactionStatus.IDLE


def test_a_handler_that_commits_itself_is_refused_and_nothing_commits(make_app: AppFactory, shim_web_url: str) -> None:
    app = make_app(commits_itself, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=0)
    app.testing = False
    key = str(uuid.uuid4())
    assert post(app.test_client(), "/orders", key, {"item": "c"}).status_code == 500
    with psycopg.connect(shim_web_url) as other:
        assert other.execute("SELECT count(*) FROM shim_orders WHERE item = 'c'").fetchone() == (0,)
    assert post(app.test_client(), "/orders", key, {"item": "c"}).get_json() == {"error": "idempotency_previous_failed"}


def test_libpq_path_off_takes_psycopgs_own_statements(make_app: AppFactory) -> None:
    app = make_app(IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=0, IDEM_LIBPQ_PATH=False)
    claim_new_key(app)
    names = prepared_names(app)
    assert "idem_shim_claim" not in names and "idem_shim_complete" not in names
    assert any(name.startswith("_pg3_") for name in names), names
