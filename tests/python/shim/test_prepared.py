"""The claim below psycopg's cursor (idem_shim/prepared.py) keeps psycopg's rules for
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

import logging
import re
import uuid
from typing import Any

import psycopg
import psycopg.sql
import pytest
from flask import Flask
from psycopg.pq import TransactionStatus

from idem_shim import connection, prepared
from tests.python.support.shim import AppFactory, Order, executions, post, state_of


def prepared_names(app: Flask) -> list[str]:
    with state_of(app).store.pool.connection() as conn:
        rows = conn.execute("SELECT name FROM pg_prepared_statements ORDER BY name")
        return [re.sub(r"_[0-9a-f]{16}$", "", r[0]) for r in rows]  # each name's random suffix


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


def test_libpq_path_off_takes_psycopgs_own_statements_never_prepared(make_app: AppFactory) -> None:
    """psycopg prepares the handler's statements (``_pg3_*``), never the shim's: the handler shares
    the session and could replace one of those under its name (store.py, ``prepare=False``)."""
    app = make_app(IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=0, IDEM_LIBPQ_PATH=False)
    claim_new_key(app)
    names = prepared_names(app)
    assert "idem_shim_claim" not in names and "idem_shim_complete" not in names
    assert any(name.startswith("_pg3_") for name in names), names  # the handler's INSERTs
    with state_of(app).store.pool.connection() as conn:
        texts = [r[0] for r in conn.execute("SELECT statement FROM pg_prepared_statements")]
    assert not [t for t in texts if "idem_" in t], texts


# -- the fence: psycopg's private names, probed before the pipelined COMMIT is taken ----------


def _commit_without_the_hook(self: Any) -> Any:
    """A psycopg whose Transaction builds its COMMIT without asking ``_get_commit_commands``
    (what a minor release that renamed or inlined it would do)."""
    ex = self._pop_savepoint("commit")
    self.status = self.Status.COMMITTED
    if ex:
        raise ex
    if self._outer_transaction:
        yield from self._conn._exec_command(b"COMMIT")
    else:
        yield from self._conn._exec_command(
            psycopg.sql.SQL("RELEASE {}").format(psycopg.sql.Identifier(self._savepoint_name)).as_bytes(self._conn)
        )


def test_the_probe_finds_psycopgs_private_hooks_on_the_pinned_psycopg(make_app: AppFactory, shim_web_url: str) -> None:
    """Fails when a psycopg upgrade loses the names prepared.py relies on: CI then says so,
    where an app would only log one line and take psycopg's slower pipeline."""
    with psycopg.connect(shim_web_url, autocommit=True) as conn:
        assert prepared.probe(conn) is None
        assert conn.info.transaction_status == TransactionStatus.IDLE
    app = make_app(IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1)
    claim_new_key(app)
    assert state_of(app).store.pipelined_commit is True


@pytest.mark.parametrize(
    "lost",
    [
        "the commit hook is gone",  # psycopg.Transaction._get_commit_commands renamed
        "the commit hook is not asked",  # still there, but the block's exit no longer calls it
        "the block count is gone",  # Connection._num_transactions renamed
    ],
)
def test_without_psycopgs_private_hooks_the_store_takes_the_public_pipeline(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, lost: str
) -> None:
    if lost != "the block count is gone":
        monkeypatch.setattr(psycopg.Transaction, "_commit_gen", _commit_without_the_hook)
    if lost == "the commit hook is gone":
        owner = next(c for c in psycopg.Transaction.__mro__ if "_get_commit_commands" in vars(c))
        monkeypatch.delattr(owner, "_get_commit_commands")
    if lost == "the block count is gone":
        monkeypatch.setattr(prepared, "BLOCK_COUNT", "_num_transactions_renamed")
    caplog.set_level(logging.WARNING, logger="idem_shim")
    app = make_app(IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=0)
    key = str(uuid.uuid4())
    first = post(app.test_client(), "/orders", key, {"item": "p"})
    assert first.status_code == 201, first.get_data(as_text=True)
    again = post(app.test_client(), "/orders", key, {"item": "p"})
    assert again.status_code == 201 and again.headers.get("Idempotent-Replayed") == "true"
    assert again.get_json()["order_id"] == first.get_json()["order_id"]
    assert state_of(app).store.pipelined_commit is False
    fence = [r.getMessage() for r in caplog.records if "psycopg's pipeline, not libpq's" in r.getMessage()]
    assert len(fence) == 1, fence
    assert "idem_shim_complete" not in prepared_names(app), "the completion went through psycopg's own statement"


@pytest.mark.parametrize("threshold", [None, 0, 5], ids=["unnamed", "prepared-and-checked", "before-the-threshold"])
def test_a_claim_whose_commit_fails_is_a_lost_store_never_a_claim(
    make_app: AppFactory, fresh_admin_url: str, threshold: int | None
) -> None:
    """The claim runs alone, so its transaction commits at the pipeline's Sync; a commit refused
    there (a Citus coordinator cut from a worker at that moment; here a deferred trigger) arrives as
    one more result after the claim's row. That row never committed: the answer is a 503, the
    handler does not run, no key is left. (The Citus soak found it as a 500: three results expected.)"""
    app = make_app(IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=threshold)
    claim_new_key(app)  # prepared at threshold 0: the next claim takes the checked pipeline
    key = str(uuid.uuid4())
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION public.refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN RAISE EXCEPTION 'the commit did not happen' USING ERRCODE = '08006'; END $$"
        )
        conn.execute(
            psycopg.sql.SQL(
                "CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON public.idempotency_keys"
                " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.idem_key = {})"
                " EXECUTE FUNCTION public.refuse_at_commit()"
            ).format(psycopg.sql.Literal(key))
        )
    before = executions(app)
    response = post(app.test_client(), "/orders", key, {"item": "x"})
    assert response.status_code == 503, response.get_data(as_text=True)
    assert executions(app) == before
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM idempotency_keys WHERE idem_key = %s", (key,)).fetchone() == (0,)
    claim_new_key(app)  # the pool's connection (or its replacement) still answers
