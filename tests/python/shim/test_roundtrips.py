"""A counted proof of contract §6's first target: the claim is one round trip, the completion one
statement inside the handler's own transaction.

The app talks to PostgreSQL through ``PgProxy``, which counts the server's ReadyForQuery messages
(one per round trip) and records the SQL text of every statement the client sends. The same
handler (two INSERTs) is measured untracked (no key) and claimed: the claimed request sends
exactly two more statements, ``idem_claim`` first and ``idem_complete`` between the handler's
last write and its COMMIT, and costs exactly one more round trip (``idem_complete`` is pipelined
with the COMMIT). A replay is one round trip; a handler that never touches the database two.
Prepared, each named statement follows an unnamed check in its own round trip (prepared.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from idem_shim.queries import RESET_SESSION
from tests.python.support.shim import PgProxy, answers, post, running_app, server_address, settled, shim_db


@pytest.fixture
def proxied(fresh_admin_url: str) -> Iterator[tuple[PgProxy, str]]:
    proxy = PgProxy(server_address(fresh_admin_url)).start()
    try:
        yield proxy, proxy.url(shim_db(fresh_admin_url))
    finally:
        proxy.stop()


def measure(proxy: PgProxy, app: Flask, path: str, key: str | None, body: Any) -> tuple[int, list[str], Any]:
    """The request's round trips and statements; the reset of the connection it gave back is
    counted apart (once, off the request's path) and left out."""
    settled(app)
    proxy.reset()
    response = post(app.test_client(), path, key, body)
    settled(app)
    statements = list(proxy.statements)
    resets = [s for s in statements if s == RESET_SESSION]
    assert len(resets) == 1, statements
    return proxy.ready_for_query - len(resets), [s for s in statements if s != RESET_SESSION], response


def kinds(statements: list[str]) -> list[str]:
    def kind(sql: str) -> str:
        for marker in ("idem_claim", "idem_complete", "idem_fail"):
            if marker in sql:
                return marker
        return sql.split()[0].upper() + (" " + sql.split()[2] if sql.upper().startswith("INSERT") else "")

    return [kind(s) for s in statements]


def test_claim_is_one_round_trip_and_completion_one_statement_in_the_transaction(proxied: tuple[PgProxy, str]) -> None:
    proxy, url = proxied
    with (
        running_app(url, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=None) as app,
        running_app(
            url, handler=answers(500, "failed"), IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=None
        ) as failing,
    ):
        post(app.test_client(), "/orders", None, {"item": "warm-up"})  # pool connected, schema checked
        post(failing.test_client(), "/orders", None, {"item": "warm-up"})
        settled(failing)  # its connection's reset done: measured, each app's requests alone

        plain_trips, plain_sql, plain = measure(proxy, app, "/orders", None, {"item": "p"})
        assert plain.status_code == 201
        assert kinds(plain_sql) == ["BEGIN", "INSERT shim_orders", "INSERT audit_log", "COMMIT"]
        assert plain_trips == 4

        key = str(uuid.uuid4())
        claimed_trips, claimed_sql, claimed = measure(proxy, app, "/orders", key, {"item": "c"})
        assert claimed.status_code == 201
        assert kinds(claimed_sql) == [
            "idem_claim",
            "BEGIN",
            "INSERT shim_orders",
            "INSERT audit_log",
            "idem_complete",
            "COMMIT",
        ]
        # the claim is one round trip; idem_complete travels with the COMMIT (one pipeline)
        assert claimed_trips == plain_trips + 1

        replay_trips, replay_sql, replay = measure(proxy, app, "/orders", key, {"item": "c"})
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert (replay_trips, kinds(replay_sql)) == (1, ["idem_claim"])

        nodb_trips, nodb_sql, nodb = measure(proxy, app, "/nodb", str(uuid.uuid4()), None)
        assert nodb.status_code == 200
        assert (nodb_trips, kinds(nodb_sql)) == (2, ["idem_claim", "idem_complete"])  # autocommit, no BEGIN

        failed_trips, failed_sql, failed = measure(proxy, failing, "/orders", str(uuid.uuid4()), {"item": "f"})
        assert failed.status_code == 500
        assert kinds(failed_sql) == [
            "idem_claim",
            "BEGIN",
            "INSERT shim_orders",
            "INSERT audit_log",
            "ROLLBACK",
            "idem_fail",
        ]
        assert failed_trips == 6


def test_prepared_statements_keep_the_claim_at_one_round_trip(proxied: tuple[PgProxy, str]) -> None:
    """With psycopg's default prepare threshold, after warm-up the statements run prepared."""
    proxy, url = proxied
    with running_app(url, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1) as app:
        for n in range(8):  # past the threshold (5): idem_claim and idem_complete are prepared now
            post(app.test_client(), "/orders", str(uuid.uuid4()), {"item": f"w{n}"})
        plain_trips, _, _ = measure(proxy, app, "/orders", None, {"item": "p"})
        claimed_trips, claimed_sql, claimed = measure(proxy, app, "/orders", str(uuid.uuid4()), {"item": "c"})
        assert claimed.status_code == 201
        assert claimed_trips == plain_trips + 1
        # each named EXECUTE rides behind its check that the name is still the shim's (prepared.py):
        # one unnamed statement more in the claim's round trip and in the COMMIT's, none more
        checks = [s for s in claimed_sql if "pg_prepared_statements" in s]
        assert len(checks) == 2, claimed_sql
