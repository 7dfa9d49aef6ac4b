"""Contract §4e against its own handler: SQL a handler runs under ``claim="in_transaction"`` (an
injection in it is the app role's session) that ends, shadows or reconfigures the claim's
transaction. Whatever it ran, the key must end as on_failure says (keep: ``failed``, a retry's
409 previous_failed; release: free, a retry runs) or completed: never ``in_flight`` with nobody
holding it, which a retry could not get past before stale_after."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.sql
import pytest
from flask import Flask, g, request

from idem_shim import Idem, connection, idempotency_key
from tests.python.support.shim import post, require_session, scalar

#: What each handler runs after its write (each statement's error swallowed, as a handler that
#: catches the driver's error does), by the lever it pulls.
LEVERS = {
    "commit": ["COMMIT"],
    "commit_then_begin": ["COMMIT", "BEGIN"],
    "commit_and_chain": ["COMMIT AND CHAIN"],
    "commit_then_shadow": ["COMMIT", "SAVEPOINT idem_work"],
    "commit_begin_shadow": ["COMMIT", "BEGIN", "SAVEPOINT idem_work"],  # passes a savepoint check
    "release_then_shadow": ["RELEASE SAVEPOINT idem_work", "SAVEPOINT idem_work"],
    "rollback": ["ROLLBACK"],
    "release_savepoint": ["RELEASE SAVEPOINT idem_work"],
    "rollback_to_savepoint": ["ROLLBACK TO SAVEPOINT idem_work"],
    # a savepoint of its own under the name: its writes before it survive the failure (as they
    # would its own COMMIT), but the key still ends as on_failure says
    "shadow_savepoint": ["SAVEPOINT idem_work"],
    "read_only": ["SET transaction_read_only = on"],
    "statement_timeout": ["SET statement_timeout = 1"],
    "lock_timeout": ["SET lock_timeout = 1"],
    "idle_timeout": ["SET idle_in_transaction_session_timeout = 0"],
    "isolation_default": ["SET default_transaction_isolation = 'serializable'"],
    "set_role": ["SET ROLE idem_app"],
    "search_path": ["CREATE TEMP TABLE idempotency_keys (x int)", "SET search_path = pg_temp, public"],
    "deallocate_all": ["DEALLOCATE ALL"],
    "discard_all": ["DISCARD ALL"],
}


def build(url: str, control: dict[str, Any]) -> Flask:
    """``/keep`` and ``/release``: the handler writes an order, runs ``control["sql"]``, then
    raises when ``control["fail"]`` is set, else answers 201 (the body stays the same: a retry
    is the same request)."""
    app = Flask("intx_sec_app")
    app.config.update({"IDEM_POOL_MIN_SIZE": 1, "IDEM_POOL_MAX_SIZE": 4, "IDEM_DATABASE_URL": url})

    def handler() -> Any:
        body = request.get_json(silent=True) or {}
        conn = connection()
        conn.execute(
            "INSERT INTO shim_orders (user_id, route, item) VALUES (%s, 'intx', %s)",
            (g.current_user_id, str(body.get("item"))),
        )
        for statement in control["sql"]:
            try:
                conn.execute(statement)
            except psycopg.Error:
                pass
        if control["fail"]:
            raise RuntimeError("the handler failed after its SQL")
        return {"ok": True}, 201

    for path in ("/keep", "/release"):
        decorate = idempotency_key(claim="in_transaction", scope=path, wait_ms=2000, on_failure=path[1:])
        app.add_url_rule(path, path, require_session(decorate(handler)), methods=["POST"])
    Idem(app)
    return app


def statuses(admin_url: str, key: str) -> list[str]:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT status FROM idempotency_keys WHERE idem_key = %s", (key,))]


@pytest.fixture
def control() -> dict[str, Any]:
    return {"sql": [], "fail": False}


@pytest.fixture
def app(shim_web_url: str, control: dict[str, Any]) -> Iterator[Flask]:
    made = build(shim_web_url, control)
    yield made
    made.extensions["idem"].store.close()


@pytest.mark.parametrize("path", ["/keep", "/release"])
@pytest.mark.parametrize("lever", sorted(LEVERS))
def test_a_failing_handlers_lever_leaves_the_key_as_on_failure_says(
    app: Flask, control: dict[str, Any], fresh_admin_url: str, lever: str, path: str
) -> None:
    key, body = str(uuid.uuid4()), {"item": f"x-{uuid.uuid4().hex[:8]}"}
    client = app.test_client()
    control.update(sql=LEVERS[lever], fail=True)
    assert post(client, path, key, body).status_code == 500
    control.update(sql=[], fail=False)
    again = post(client, path, key, body)
    if path == "/keep":
        assert statuses(fresh_admin_url, key) == ["failed"]
        assert again.status_code == 409
        assert again.get_json()["error"] == "idempotency_previous_failed"
    else:  # the key was freed: the retry ran and completed
        assert again.status_code == 201
        assert statuses(fresh_admin_url, key) == ["completed"]


@pytest.mark.parametrize("lever", sorted(LEVERS))
def test_a_succeeding_handlers_lever_leaves_no_key_in_flight(
    app: Flask, control: dict[str, Any], fresh_admin_url: str, lever: str
) -> None:
    key, body = str(uuid.uuid4()), {"item": f"s-{uuid.uuid4().hex[:8]}"}
    client = app.test_client()
    control.update(sql=LEVERS[lever], fail=False)
    first = post(client, "/keep", key, body)
    # completed (its answer replays), or nothing stays (a 503, a lost claim: the retry runs)
    assert statuses(fresh_admin_url, key) in (["completed"], [])
    control.update(sql=[])
    again = post(client, "/keep", key, body)
    assert again.status_code == 201
    if first.status_code == 201:
        assert again.headers.get("Idempotent-Replayed") == "true"
    assert int(scalar(fresh_admin_url, "SELECT count(*) FROM shim_orders WHERE item = %s", (body["item"],))) <= 1 + (
        first.status_code != 201
    )


@pytest.mark.parametrize("shadow", [False, True], ids=["prepared", "prepared_then_shadowed"])
@pytest.mark.parametrize("fail", [False, True])
def test_a_handler_that_prepares_the_claims_transaction_leaves_no_key_stuck(
    app: Flask, control: dict[str, Any], fresh_admin_url: str, fail: bool, shadow: bool
) -> None:
    """``PREPARE TRANSACTION`` (where max_prepared_transactions > 0: Citus needs it) detaches the
    claim's transaction, its uncommitted row with it, from the session: no COMMIT, no kill, no
    idle timeout and no stale heal ends it, and every retry's INSERT would wait on that row to its
    bound and get 409 in flight: the shim rolls it back, found by the claim's transaction id."""
    gid = f"idem-sec-'{uuid.uuid4().hex[:8]}"  # a quote in it: the shim's ROLLBACK PREPARED quotes the gid
    key, body = str(uuid.uuid4()), {"item": f"p-{uuid.uuid4().hex[:8]}"}
    client = app.test_client()
    try:
        quoted = gid.replace("'", "''")
        after = ["BEGIN", "SAVEPOINT idem_work"] if shadow else []  # a savepoint of the name again
        control.update(sql=[f"PREPARE TRANSACTION '{quoted}'", *after], fail=fail)
        post(client, "/release", key, body)
        assert scalar(fresh_admin_url, "SELECT count(*) FROM pg_prepared_xacts WHERE gid = %s", (gid,)) == 0
        control.update(sql=[], fail=False)
        again = post(client, "/release", key, body)
        # the first request is over: its key is answered (a replay) or free (the retry runs)
        assert again.status_code == 201
    finally:
        with psycopg.connect(fresh_admin_url, autocommit=True) as admin:
            if admin.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,)).fetchone():
                admin.execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid)))
