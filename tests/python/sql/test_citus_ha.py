"""
The store on Citus when nodes change (contract §8), on the local cluster of scripts/citus.sh
(`make test-citus`): what a worker's promotion or a node joining does to the calls of a request,
reproduced on one database without the formation (tests/python/e2e/test_citus_ha.py runs them
for real, under load).

- After citus_update_node (a worker's promotion by pg_auto_failover) Citus marks every worker's
  copy of the metadata stale until its maintenance daemon has sent it again (tens of seconds on a
  busy machine), and meanwhile delegates no function call. The completion after a handler's own
  writes then cannot run on the claim's worker: it must answer a retryable "store unavailable"
  (57P03, the shim's 503 with the claim left in flight), never the error that reads as the
  handler's own failure (a 500).
- Key ids are made on the coordinator alone: a worker's copy of idempotency_keys_id_seq repeats
  the coordinator's values, so a claim delegated to a worker (create_distributed_function on
  idem_claim) would hand out key_ids that another claim of the same scope already holds. Such a
  claim fails at once, naming the reason, and writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from flask import g
from psycopg import sql

from idem_shim import connection
from tests.python.sql.test_citus import (
    add_users,
    idem,
    node_of,
    orders_url,  # noqa: F401  (the fixture app_orders_url builds on)
    worker_url,
)
from tests.python.support.roles import login_role
from tests.python.support.shim import Order, make_app, state_of
from tests.python.support.sqlapi import claim, connect, new_key, one

import testdb  # isort: skip  (scripts/testdb.py, on sys.path through tests.support)

pytestmark = pytest.mark.skipif(
    not os.environ.get("IDEM_CITUS"), reason="needs the local Citus cluster: make test-citus"
)


@pytest.fixture
def app_orders_url(request: pytest.FixtureRequest) -> str:
    """test_citus's database with its colocated orders table, which the app's role may write."""
    url = str(request.getfixturevalue("orders_url"))
    with connect(url) as conn:
        conn.execute("GRANT INSERT ON orders TO idem_app")
    return url


def metadata_synced(conn: psycopg.Connection[Any], node: str, synced: bool) -> None:
    """What citus_update_node leaves behind until the maintenance daemon resends the metadata."""
    host, port = node.split(":")
    conn.execute(
        "UPDATE pg_dist_node SET metadatasynced = %s WHERE nodename = %s AND nodeport = %s",
        (synced, host, int(port)),
    )


def test_a_completion_the_coordinator_cannot_delegate_is_store_unavailable_and_leaves_the_claim(
    app_orders_url: str,
) -> None:
    with connect(app_orders_url) as admin:
        worker = node_of(admin, 3)
    with login_role(app_orders_url, "idem_app") as (_, app_url), connect(app_url) as conn:
        got = claim(conn, new_key(), user_id=3)
        key_id, token = got["key_id"], got["claim_token"]

        def handler_then_complete() -> None:
            with conn.transaction():
                conn.execute("INSERT INTO orders VALUES (3, %s, 1)", (key_id,))
                conn.execute(
                    "SELECT idem_complete_in_scope(%s, %s, 201, '{\"ok\": 1}', p_claim_token => %s)",
                    (key_id >> 31, key_id, token),
                )

        with connect(app_orders_url) as admin:
            metadata_synced(admin, worker, False)
        try:
            with pytest.raises(psycopg.Error) as stale:
                handler_then_complete()
        finally:
            with connect(app_orders_url) as admin:
                metadata_synced(admin, worker, True)
        assert stale.value.sqlstate == "57P03", (stale.value.sqlstate, str(stale.value))
        assert "cannot hand this completion to the claim's worker" in str(stale.value)
        with connect(app_orders_url) as admin:
            assert one(admin, "SELECT status FROM idempotency_keys WHERE id = %s", (key_id,)) == {
                "status": "in_flight"
            }, "the claim is left in flight: its retry replays or (after the stale window) runs once"
            assert one(admin, "SELECT count(*) AS n FROM orders WHERE key_id = %s", (key_id,)) == {"n": 0}
        handler_then_complete()  # the metadata current again: delegated, completed on the worker
    with connect(app_orders_url) as admin:
        assert one(admin, "SELECT status FROM idempotency_keys WHERE id = %s", (key_id,)) == {"status": "completed"}


def test_a_completion_that_needs_no_delegation_still_completes_on_the_coordinator(app_orders_url: str) -> None:
    """Without writes of the app's role in its transaction the coordinator may complete the key
    itself: the stale metadata costs nothing there."""
    with connect(app_orders_url) as admin:
        worker = node_of(admin, 4)
    with login_role(app_orders_url, "idem_app") as (_, app_url), connect(app_url) as conn:
        got = claim(conn, new_key(), user_id=4)
        with connect(app_orders_url) as admin:
            metadata_synced(admin, worker, False)
        try:
            conn.execute(
                "SELECT idem_complete_in_scope(%s, %s, 200, '{}', p_claim_token => %s)",
                (got["key_id"] >> 31, got["key_id"], got["claim_token"]),
            )
        finally:
            with connect(app_orders_url) as admin:
                metadata_synced(admin, worker, True)
    with connect(app_orders_url) as admin:
        assert one(admin, "SELECT status FROM idempotency_keys WHERE id = %s", (got["key_id"],)) == {
            "status": "completed"
        }


def test_key_ids_come_from_the_coordinator_only(app_orders_url: str) -> None:
    with connect(app_orders_url) as admin:
        made = admin.execute(
            "SELECT success, result FROM run_command_on_workers('SELECT public.idem_new_key_id(5)')"
        ).fetchall()
        assert made and all(not r["success"] for r in made), made
        assert all("key_ids are made on the coordinator only" in r["result"] for r in made), made
        assert one(admin, "SELECT public.idem_new_key_id(5) >> 31 AS scope") == {"scope": 5}


def test_a_claim_delegated_to_a_worker_fails_at_once_and_writes_nothing(app_orders_url: str) -> None:
    with connect(app_orders_url) as admin:
        first = claim(admin, new_key(), user_id=2)  # a key_id the coordinator made in scope 2
        admin.execute(
            "SELECT create_distributed_function('public.idem_claim'::regproc::regprocedure, 'p_user_id',"
            " colocate_with => 'idempotency_keys')"
        )
        key = new_key()
        with pytest.raises(psycopg.Error) as delegated:
            claim(admin, key, user_id=2)
        assert "key_ids are made on the coordinator only" in str(delegated.value), str(delegated.value)
        assert delegated.value.sqlstate == "IDM00"
        assert one(admin, "SELECT count(*) AS n FROM idempotency_keys WHERE idem_key = %s", (key,)) == {"n": 0}
        assert one(admin, "SELECT count(*) AS n FROM idempotency_keys WHERE id = %s", (first["key_id"],)) == {"n": 1}


def test_a_delegated_completion_of_a_healed_claim_is_claim_lost_with_what_became_of_the_key(
    app_orders_url: str,
) -> None:
    """A zombie's completion on Citus runs on the claim's worker (delegated): its IDM01 message,
    which says what became of the key, must be read there too, on the key's own shard (a query
    across shards from inside a delegated call is refused: it was a 500, not the 409 of a lost claim)."""
    key = new_key()
    with connect(app_orders_url) as admin:
        two_minutes_ago = (datetime.now(UTC) - timedelta(minutes=2)).isoformat()
        zombie = claim(admin, key, user_id=3, now=two_minutes_ago)  # its worker died since
        assert claim(admin, key, user_id=3)["outcome"] == "stale", "a duplicate healed it"
    with login_role(app_orders_url, "idem_app") as (_, app_url), connect(app_url) as conn:
        with pytest.raises(psycopg.Error) as lost:
            with conn.transaction():
                conn.execute("INSERT INTO orders VALUES (3, %s, 1)", (zombie["key_id"],))
                conn.execute(
                    "SELECT idem_complete_in_scope(%s, %s, 201, '{}', p_claim_token => %s)",
                    (zombie["key_id"] >> 31, zombie["key_id"], zombie["claim_token"]),
                )
    assert lost.value.sqlstate == "IDM01", (lost.value.sqlstate, str(lost.value))
    assert "it was healed as stale and the key has no row now" in str(lost.value), str(lost.value)


def test_status_says_what_stands_in_the_way_of_the_calls_and_how_the_last_rebalance_went(
    app_orders_url: str,
) -> None:
    """`idem status` on a distributed store: a worker without the extension (with the statement to
    run), a worker's stale metadata (the 503s it explains), and the newest rebalance."""
    with connect(app_orders_url) as admin:
        worker = node_of(admin, 3)
    status = idem("status", "--database-url", app_orders_url)
    assert status.returncode == 0, status.stderr
    store = [ln for ln in status.stdout.splitlines() if ln.startswith("store:")]
    assert len(store) == 1 and "shards on 2 workers" in store[0], store
    with connect(app_orders_url) as admin:
        metadata_synced(admin, worker, False)
    try:
        stale = idem("status", "--database-url", app_orders_url).stdout
    finally:
        with connect(app_orders_url) as admin:
            metadata_synced(admin, worker, True)
    assert f"store: the Citus metadata on {worker} is being sent again" in stale, stale
    assert "answer 503 (57P03)" in stale
    with psycopg.connect(worker_url(app_orders_url, 2), autocommit=True) as conn:
        conn.execute("DROP EXTENSION citus CASCADE")
    missing = idem("status", "--database-url", app_orders_url).stdout
    assert "has no citus extension in database" in missing and "run CREATE EXTENSION citus; there" in missing, missing


def add_node(conn: psycopg.Connection[Any], port: int) -> None:
    """citus_add_node under the lock idem migrate takes (docs/scaling.md): it copies every role to
    the node it adds, and beside another test's install one of the two failed (tuple concurrently updated)."""
    with conn.transaction():
        conn.execute(
            "SELECT 1 FROM pg_catalog.pg_authid WHERE oid = 10 FOR UPDATE"
        )  # the install's cluster lock (migrate_lock.sql)
        conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (port,))


@pytest.fixture
def one_worker_store(admin_url: str) -> Iterator[str]:
    """A migrated store on worker 1 alone; worker 2 has the database but not the extension."""
    name = f"idem_c_{os.urandom(5).hex()}"
    nodes = [worker_url(testdb.url_for(admin_url, "postgres"), n) for n in (0, 1, 2)]
    for n, url in enumerate(nodes):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        if n < 2:
            with psycopg.connect(testdb.url_for(url, name), autocommit=True) as conn:
                conn.execute("SET client_min_messages = warning")
                conn.execute("CREATE EXTENSION citus")
    url = testdb.url_for(admin_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (urlsplit(url).port,))
        add_node(conn, (urlsplit(url).port or 5432) + 1)
    testdb.migrate(url)
    add_users(url, [7])
    yield url
    testdb.drop(admin_url, name)


def test_a_server_added_without_the_extension_is_refused_and_the_store_serves_on(one_worker_store: str) -> None:
    """docs/operations.md's by-hand join: citus_add_node of a server whose database has no citus
    extension is refused by Citus itself, nothing is registered, claims go on; with the extension
    created there (the runbook's fix) the same call adds it."""
    worker2 = (urlsplit(one_worker_store).port or 5432) + 2
    with connect(one_worker_store) as admin:
        before = admin.execute("SELECT nodeid, nodeport FROM pg_dist_node ORDER BY nodeid").fetchall()
        done = claim(admin, new_key(), user_id=7)
        with pytest.raises(psycopg.Error) as refused:
            add_node(admin, worker2)
        assert "failure on connection marked as essential" in str(refused.value), str(refused.value)
        assert admin.execute("SELECT nodeid, nodeport FROM pg_dist_node ORDER BY nodeid").fetchall() == before
        assert claim(admin, new_key(), user_id=7)["outcome"] == "claimed"
        assert one(admin, "SELECT status FROM idempotency_keys WHERE id = %s", (done["key_id"],)) == {
            "status": "in_flight"
        }
    status = idem("status", "--database-url", one_worker_store)
    assert status.returncode == 0 and "shards on 1 workers" in status.stdout, status.stdout
    with psycopg.connect(worker_url(one_worker_store, 2), autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        conn.execute("CREATE EXTENSION citus")
    with connect(one_worker_store) as admin:
        add_node(admin, worker2)
    status = idem("status", "--database-url", one_worker_store)
    assert "on 2 workers" in status.stdout and "has no citus extension" not in status.stdout, status.stdout


def test_a_worker_failing_the_completions_commit_is_the_store_unavailable_not_a_500(app_orders_url: str) -> None:
    """When a worker fails the COMMIT of the handler's transaction (its primary lost mid-commit,
    found by the chaos soak) Citus answers `could not commit transaction for shard N on at least
    one active node`, an internal error: the outcome on the worker is unknown, as with a lost
    connection, so the shim answers 503 and leaves the claim in flight (its retry replays, or runs
    once after the stale window), never 500. Reproduced with the one COMMIT failure a worker can be
    made to give at will: a deferred constraint, which Citus reports the same way."""
    with connect(app_orders_url) as admin:
        admin.execute(
            "CREATE TABLE deferred_orders (user_id integer NOT NULL, n integer,"
            " CONSTRAINT deferred_once UNIQUE (user_id, n) DEFERRABLE INITIALLY DEFERRED)"
        )
        admin.execute("SELECT create_distributed_table('deferred_orders', 'user_id', colocate_with => 'users')")
        admin.execute("GRANT INSERT ON deferred_orders TO idem_app")

    def handler(order: Order) -> Any:
        connection().execute("INSERT INTO deferred_orders VALUES (%s, 1), (%s, 1)", (g.current_user_id,) * 2)
        return {"ok": True}, 201

    key = new_key()
    with login_role(app_orders_url, "idem_app") as (_, app_url):
        app = make_app(app_url, handler=handler)
        try:
            answer = app.test_client().post("/orders", json={"n": 1}, headers={"Idempotency-Key": key, "X-User": "3"})
        finally:
            state_of(app).store.close()
    assert answer.status_code == 503, (answer.status_code, answer.get_data(as_text=True))
    assert answer.get_json() == {"error": "idempotency_store_unavailable"}
    with connect(app_orders_url) as admin:
        assert one(admin, "SELECT status FROM idempotency_keys WHERE idem_key = %s", (key,)) == {"status": "in_flight"}
