"""Contract §4e, rule by rule: ``@idempotency_key(claim="in_transaction")``.

Real sessions and threads throughout; races are ordered with events and pg_stat_activity, never
sleeps (a duplicate is "waiting" once its backend waits on the holder's transactionid lock). The
kill is a real one: a worker process SIGKILLed mid-handler (test_kill, below).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from flask import Flask, Response, abort, g, request
from psycopg import sql

from idem_shim import ConfigError, Idem, connection, idempotency_key, idempotent
from tests.python.support import in_transaction as helpers
from tests.python.support.shim import Executions, PgProxy, post, require_session, scalar, server_address, settled

ROOT = Path(__file__).resolve().parents[3]


class Gate:
    """A handler's stop: ``parked`` once the first execution has written, ``go`` lets it answer."""

    def __init__(self) -> None:
        self.parked, self.go = threading.Event(), threading.Event()
        self._first = True
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            first, self._first = self._first, False
        if first:
            self.parked.set()
            assert self.go.wait(15), "the test never let the holder go"


def write_order(item: str) -> int:
    conn = connection()
    row = conn.execute(
        "INSERT INTO shim_orders (user_id, route, item) VALUES (%s, 'intx', %s) RETURNING id",
        (g.current_user_id, item),
    ).fetchone()
    assert row is not None
    conn.execute(
        "INSERT INTO audit_log (user_id, action, context) VALUES (%s, 'order_placed', %s)",
        (g.current_user_id, json.dumps({"order_id": row[0], "route": "intx"})),
    )
    return int(row[0])


def build_app(url: str, gate: Callable[[], None] = lambda: None, **config: Any) -> Flask:
    """Routes under ``claim="in_transaction"``, one per on_failure and wait; ``/before`` is the default shape.

    A body ``{"fail": "raise"}`` makes the handler raise after writing, ``{"fail": 500}`` answer 500."""
    app = Flask("intx_test_app")
    app.config.update({"IDEM_POOL_MIN_SIZE": 1, "IDEM_POOL_MAX_SIZE": 20, "IDEM_POOL_TIMEOUT": 2.0, **config})
    app.config["IDEM_DATABASE_URL"] = url
    executions = Executions()
    app.extensions["intx_executions"] = executions

    def behaviour() -> Any:
        executions.bump()
        body = request.get_json(silent=True) or {}
        order_id = write_order(str(body.get("item")))
        gate()
        if body.get("fail") == "deferred":  # a deferred unique constraint: fails at COMMIT
            connection().execute("INSERT INTO shim_deferred VALUES (1), (1)")
        if body.get("fail") == "abort":  # abort(4xx): a refusal, completed with no write
            abort(403)
        if body.get("fail") == "stream":  # a streamed answer: sent once, its writes commit, the key failed
            return Response((part for part in ["streamed"]), status=200)
        if body.get("fail") == "raise":
            raise RuntimeError("the handler failed after writing")
        if body.get("fail") == 500:
            return {"error": "failed", "order_id": order_id}, 500
        return {"order_id": order_id, "item": body.get("item")}, 201

    routes: dict[str, dict[str, Any]] = {
        "/intx": {"wait_ms": 5000},
        "/intx-nowait": {"wait_ms": 0},
        "/intx-release": {"wait_ms": 5000, "on_failure": "release"},
        "/intx-replay": {"wait_ms": 5000, "on_failure": "replay"},
        "/before": {"wait_ms": 5000, "claim": "before"},
    }
    for path, options in routes.items():
        claim = options.pop("claim", "in_transaction")
        view = require_session(idempotency_key(claim=claim, scope=path, **options)(behaviour))
        app.add_url_rule(path, path, view, methods=["POST"])
    Idem(app)
    return app


def execution_count(app: Flask) -> int:
    counter = app.extensions["intx_executions"]
    assert isinstance(counter, Executions)
    return counter.count


@pytest.fixture
def app_and_gate(shim_web_url: str) -> Iterator[tuple[Flask, Gate]]:
    gate = Gate()
    app = build_app(shim_web_url, gate)
    yield app, gate
    gate.go.set()
    app.extensions["idem"].store.close()


def key_rows(admin_url: str, key: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        return conn.execute(
            "SELECT status, response_code, response_body FROM idempotency_keys WHERE idem_key = %s", (key,)
        ).fetchall()


def orders(admin_url: str, item: str) -> int:
    return int(scalar(admin_url, "SELECT count(*) FROM shim_orders WHERE item = %s", (item,)))


def in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


# -- nothing commits before the handler; the key's row commits with the writes ------------------


def test_nothing_commits_before_the_handler(app_and_gate: tuple[Flask, Gate], fresh_admin_url: str) -> None:
    app, gate = app_and_gate
    key, item = str(uuid.uuid4()), f"a-{uuid.uuid4().hex[:8]}"
    thread, out = in_background(lambda: post(app.test_client(), "/intx", key, {"item": item}))
    assert gate.parked.wait(10)
    # the handler has claimed and written: a DBA sees neither the key nor the order yet
    assert key_rows(fresh_admin_url, key) == []
    assert orders(fresh_admin_url, item) == 0
    gate.go.set()
    thread.join(10)
    assert out[0].status_code == 201
    # and both at once after the one COMMIT
    assert [r[:2] for r in key_rows(fresh_admin_url, key)] == [("completed", 201)]
    assert orders(fresh_admin_url, item) == 1


@pytest.mark.parametrize(
    ("path", "fail", "status", "key_status"),
    [
        ("/intx", "raise", 500, "failed"),
        ("/intx", 500, 500, "failed"),
        ("/intx-release", "raise", 500, None),
        ("/intx-release", 500, 500, None),
    ],
)
def test_a_failure_keeps_no_write_and_on_failure_its_meaning(
    app_and_gate: tuple[Flask, Gate], fresh_admin_url: str, path: str, fail: Any, status: int, key_status: str | None
) -> None:
    app, gate = app_and_gate
    gate.go.set()
    key, item = str(uuid.uuid4()), f"f-{uuid.uuid4().hex[:8]}"
    client = app.test_client()
    assert post(client, path, key, {"item": item, "fail": fail}).status_code == status
    assert orders(fresh_admin_url, item) == 0  # the writes rolled back
    rows = key_rows(fresh_admin_url, key)
    if key_status is None:  # release: nothing stays, the retry runs again
        assert rows == []
        assert post(client, path, key, {"item": item}).status_code == 201
        assert orders(fresh_admin_url, item) == 1
    else:  # keep: previous_failed, recorded with no write of the handler's
        assert [r[0] for r in rows] == [key_status]
        again = post(client, path, key, {"item": item, "fail": fail})
        assert again.status_code == 409
        assert again.get_json()["error"] == "idempotency_previous_failed"
    assert execution_count(app) == (2 if key_status is None else 1)


@pytest.mark.parametrize(("path", "key_status"), [("/intx", "failed"), ("/intx-release", None)])
def test_a_failure_at_commit_keeps_its_on_failure_meaning(
    app_and_gate: tuple[Flask, Gate], fresh_admin_url: str, path: str, key_status: str | None
) -> None:
    """The COMMIT itself fails (a deferred constraint): the claim's transaction is gone with the
    writes, and keep's previous_failed is recorded afresh, in a transaction of its own."""
    app, gate = app_and_gate
    gate.go.set()
    key, item = str(uuid.uuid4()), f"d-{uuid.uuid4().hex[:8]}"
    client = app.test_client()
    assert post(client, path, key, {"item": item, "fail": "deferred"}).status_code == 500
    assert orders(fresh_admin_url, item) == 0
    assert [r[0] for r in key_rows(fresh_admin_url, key)] == ([key_status] if key_status else [])
    again = post(client, path, key, {"item": item, "fail": "deferred"})
    if key_status:
        assert (again.status_code, again.get_json()["error"]) == (409, "idempotency_previous_failed")
        assert execution_count(app) == 1
    else:
        assert again.status_code == 500 and execution_count(app) == 2


def test_an_abort_4xx_completes_with_no_write_and_a_stream_commits_once(
    app_and_gate: tuple[Flask, Gate], fresh_admin_url: str
) -> None:
    """abort(4xx) rolls back to the claim and completes the refusal (it replays); a streamed
    answer commits its writes with the key failed, in the claim's transaction (never run twice)."""
    app, gate = app_and_gate
    gate.go.set()
    client = app.test_client()
    refused, streamed = str(uuid.uuid4()), str(uuid.uuid4())
    assert post(client, "/intx", refused, {"item": "refused", "fail": "abort"}).status_code == 403
    assert orders(fresh_admin_url, "refused") == 0
    again = post(client, "/intx", refused, {"item": "refused", "fail": "abort"})
    assert again.status_code == 403 and again.headers.get("Idempotent-Replayed") == "true"
    assert post(client, "/intx", streamed, {"item": "streamed", "fail": "stream"}).get_data() == b"streamed"
    assert orders(fresh_admin_url, "streamed") == 1
    assert [r[0] for r in key_rows(fresh_admin_url, streamed)] == ["failed"]
    assert post(client, "/intx", streamed, {"item": "streamed", "fail": "stream"}).status_code == 409
    assert execution_count(app) == 2


def test_replay_stores_the_failure_answer_with_no_write(app_and_gate: tuple[Flask, Gate], fresh_admin_url: str) -> None:
    app, gate = app_and_gate
    gate.go.set()
    key, item = str(uuid.uuid4()), f"r-{uuid.uuid4().hex[:8]}"
    client = app.test_client()
    first = post(client, "/intx-replay", key, {"item": item, "fail": 500})
    assert first.status_code == 500
    assert orders(fresh_admin_url, item) == 0
    again = post(client, "/intx-replay", key, {"item": item, "fail": 500})
    assert again.status_code == 500 and again.headers.get("Idempotent-Replayed") == "true"
    assert execution_count(app) == 1


# -- duplicates: in flight wait and replay, else 409; after, replay ---------------------------------


def waiting_backends(admin_url: str) -> int:
    return int(
        scalar(
            admin_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND wait_event = 'transactionid'",
        )
    )


def test_a_duplicate_in_flight_waits_on_the_holder_and_replays(
    app_and_gate: tuple[Flask, Gate], fresh_admin_url: str
) -> None:
    app, gate = app_and_gate
    key, item = str(uuid.uuid4()), f"w-{uuid.uuid4().hex[:8]}"
    holder, held = in_background(lambda: post(app.test_client(), "/intx", key, {"item": item}))
    assert gate.parked.wait(10)
    dup, duplicate = in_background(lambda: post(app.test_client(), "/intx", key, {"item": item}))
    helpers.wait_until(lambda: waiting_backends(fresh_admin_url) == 1)  # blocked on the holder's row
    gate.go.set()
    holder.join(10)
    dup.join(10)
    assert held[0].status_code == 201
    assert duplicate[0].status_code == 201
    assert duplicate[0].headers.get("Idempotent-Replayed") == "true"
    assert duplicate[0].get_json()["order_id"] == held[0].get_json()["order_id"]
    assert execution_count(app) == 1
    assert orders(fresh_admin_url, item) == 1


def test_a_duplicate_past_wait_ms_gets_409_in_flight(app_and_gate: tuple[Flask, Gate], fresh_admin_url: str) -> None:
    app, gate = app_and_gate
    key, item = str(uuid.uuid4()), f"n-{uuid.uuid4().hex[:8]}"
    holder, held = in_background(lambda: post(app.test_client(), "/intx-nowait", key, {"item": item}))
    assert gate.parked.wait(10)
    duplicate = post(app.test_client(), "/intx-nowait", key, {"item": item})
    assert duplicate.status_code == 409
    assert duplicate.get_json()["error"] == "idempotency_in_flight"
    assert int(duplicate.headers["Retry-After"]) >= 1
    gate.go.set()
    holder.join(10)
    assert held[0].status_code == 201
    # one that arrives after gets the replay
    after = post(app.test_client(), "/intx-nowait", key, {"item": item})
    assert after.status_code == 201 and after.headers.get("Idempotent-Replayed") == "true"
    assert after.get_json()["order_id"] == held[0].get_json()["order_id"]
    assert execution_count(app) == 1
    assert waiting_backends(fresh_admin_url) == 0


@pytest.mark.parametrize("round_no", range(3))
def test_sixteen_same_key_requests_one_execution_one_answer(
    shim_web_url: str, fresh_admin_url: str, round_no: int
) -> None:
    """A handler's answer never reaches a client when the key holds one: every 2xx is the one answer."""
    app = build_app(shim_web_url)
    try:
        key, item = str(uuid.uuid4()), f"s-{round_no}-{uuid.uuid4().hex[:6]}"
        barrier = threading.Barrier(16)

        def one(_: int) -> Any:
            client = app.test_client()
            barrier.wait()
            return post(client, "/intx", key, {"item": item})

        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(one, range(16)))
        assert {a.status_code for a in answers} <= {201, 409}, [a.status_code for a in answers]
        ids = {a.get_json()["order_id"] for a in answers if a.status_code == 201}
        assert len(ids) == 1
        assert execution_count(app) == 1
        assert orders(fresh_admin_url, item) == 1
    finally:
        app.extensions["idem"].store.close()


def test_keep_failure_reaches_the_waiting_duplicate_as_previous_failed(
    app_and_gate: tuple[Flask, Gate], fresh_admin_url: str
) -> None:
    """The holder fails while a duplicate waits on its row: the duplicate never finds the key
    free (the failure commits in the claim's transaction, after a rollback to its savepoint)."""
    app, gate = app_and_gate
    key, item = str(uuid.uuid4()), f"k-{uuid.uuid4().hex[:8]}"
    holder, held = in_background(lambda: post(app.test_client(), "/intx", key, {"item": item, "fail": "raise"}))
    assert gate.parked.wait(10)
    dup, duplicate = in_background(lambda: post(app.test_client(), "/intx", key, {"item": item, "fail": "raise"}))
    helpers.wait_until(lambda: waiting_backends(fresh_admin_url) == 1)
    gate.go.set()
    holder.join(10)
    dup.join(10)
    assert held[0].status_code == 500
    assert duplicate[0].status_code == 409
    assert duplicate[0].get_json()["error"] == "idempotency_previous_failed"
    assert execution_count(app) == 1
    assert orders(fresh_admin_url, item) == 0


def test_release_failure_lets_the_waiting_duplicate_run_once(
    app_and_gate: tuple[Flask, Gate], fresh_admin_url: str
) -> None:
    app, gate = app_and_gate
    key, item = str(uuid.uuid4()), f"l-{uuid.uuid4().hex[:8]}"
    holder, held = in_background(lambda: post(app.test_client(), "/intx-release", key, {"item": item, "fail": "raise"}))
    assert gate.parked.wait(10)
    dup, duplicate = in_background(lambda: post(app.test_client(), "/intx-release", key, {"item": item}))
    helpers.wait_until(lambda: waiting_backends(fresh_admin_url) == 1)
    gate.go.set()
    holder.join(10)
    dup.join(10)
    assert held[0].status_code == 500
    assert duplicate[0].status_code == 201  # the key was freed: it ran, once
    assert execution_count(app) == 2
    assert orders(fresh_admin_url, item) == 1
    assert [r[0] for r in key_rows(fresh_admin_url, key)] == ["completed"]


# -- downstream_key() and heartbeat() are refused ---------------------------------------------------


@pytest.mark.parametrize("name", sorted(helpers.LEASE_VIEWS))
def test_downstream_key_and_heartbeat_are_refused_at_decoration(name: str, shim_web_url: str) -> None:
    # the view names the accessor through a global (the usual import) and through the module
    with psycopg.connect(shim_web_url, autocommit=True) as conn:
        for view in helpers.LEASE_VIEWS[name]:
            with pytest.raises(ConfigError, match=f"{name}.*claim='before'"):
                idempotency_key(claim="in_transaction")(view)
            with pytest.raises(ConfigError, match=name):  # and a job's work, when idempotent() wraps it
                idempotent(db=conn, scope="jobs.lease", claim="in_transaction")(view)
            idempotency_key(claim="before")(view)  # the default shape takes it
            idempotent(db=conn, scope="jobs.lease")(view)


def test_a_lease_call_through_a_helper_is_refused_at_the_call(shim_web_url: str, fresh_admin_url: str) -> None:
    app = Flask("intx_helper_app")
    app.config.update(IDEM_DATABASE_URL=shim_web_url, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=4)

    @app.post("/helper")
    @require_session
    @idempotency_key(claim="in_transaction", scope="helper")
    def via_helper() -> Any:
        write_order("helper")
        return {"key": helpers.forward_to_broker()}, 201  # downstream_key() in another module

    Idem(app)
    try:
        key = str(uuid.uuid4())
        response = post(app.test_client(), "/helper", key, {})
        assert response.status_code == 500
        assert orders(fresh_admin_url, "helper") == 0
        assert [r[0] for r in key_rows(fresh_admin_url, key)] == ["failed"]
    finally:
        app.extensions["idem"].store.close()


# -- the SQL API names the same outcomes --------------------------------------------------------------


def test_a_dba_sees_the_same_rows_as_under_the_default(app_and_gate: tuple[Flask, Gate], fresh_admin_url: str) -> None:
    app, gate = app_and_gate
    gate.go.set()
    client = app.test_client()
    seen: dict[str, list[tuple[Any, ...]]] = {}
    for path in ("/intx", "/before"):
        ok, failed = str(uuid.uuid4()), str(uuid.uuid4())
        assert post(client, path, ok, {"item": "dba"}).status_code == 201
        assert post(client, path, failed, {"item": "dba", "fail": 500}).status_code == 500
        with psycopg.connect(fresh_admin_url, autocommit=True) as conn:
            seen[path] = conn.execute(
                "SELECT k.status, k.response_code, k.response_body - 'order_id', k.request_hash IS NOT NULL,"
                " k.expires_at > now(), (SELECT count(*) FROM public.idem_inspect(k.idem_key))"
                " FROM idempotency_keys k WHERE k.idem_key IN (%s, %s) ORDER BY k.status",
                (ok, failed),
            ).fetchall()
    assert seen["/intx"] == seen["/before"]
    assert [r[0] for r in seen["/intx"]] == ["completed", "failed"]


# -- round trips -------------------------------------------------------------------------------------


def test_a_claimed_request_pays_two_round_trips_and_one_transaction(fresh_admin_url: str) -> None:
    """BEGIN, the claim and the savepoint leave together; the completion leaves with the COMMIT."""
    from tests.python.support.shim import shim_db

    proxy = PgProxy(server_address(fresh_admin_url)).start()
    try:
        url = proxy.url(shim_db(fresh_admin_url))
        app = build_app(url, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=None)
        try:
            client = app.test_client()
            post(client, "/intx", str(uuid.uuid4()), {"item": "warm"})
            settled(app)
            trips = {}
            for path in ("/intx", "/before"):
                settled(app)
                proxy.reset()
                assert post(client, path, str(uuid.uuid4()), {"item": "rt"}).status_code == 201
                settled(app)
                resets = sum(1 for s in proxy.statements if s.startswith("RESET SESSION"))
                trips[path] = proxy.ready_for_query - resets
                statements = [s for s in proxy.statements if not s.startswith("RESET SESSION")]
                if path == "/intx":
                    assert statements[0] == "BEGIN" and "idem_claim" in statements[1], statements
                    assert statements[2] == "SAVEPOINT idem_work"
                    assert sum(1 for s in statements if s == "COMMIT") == 1
            # the handler's two INSERTs, then: in_transaction 1 + 1, before 1 + 1 + 1
            assert trips["/intx"] == 2 + 2, trips
            assert trips["/before"] == 3 + 2, trips
        finally:
            app.extensions["idem"].store.close()
    finally:
        proxy.stop()


# -- a real kill: nothing is left, the retry runs fresh and once ---------------------------------------

#: A worker process serving one in_transaction route: the handler writes its order, says so on
#: stdout, then hangs mid-handler (its transaction open) until the test kills or stops it.
_WORKER = """
import sys, time
from flask import Flask
from werkzeug.serving import make_server
from idem_shim import Idem, idempotency_key
from tests.python.support.shim import require_session
from tests.python.shim.test_claim_in_transaction import write_order

url = sys.argv[1]
app = Flask("intx_worker")
app.config.update(IDEM_DATABASE_URL=url, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=2, IDEM_STALE_AFTER_SECONDS=1)

@app.post("/intx")
@require_session
@idempotency_key(claim="in_transaction", scope="/intx")
def hangs():
    write_order("killed")
    print("parked", flush=True)
    time.sleep(120)
    return {"never": True}, 201

Idem(app)
server = make_server("127.0.0.1", 0, app, threaded=True)
print(server.server_port, flush=True)
server.serve_forever()
"""


def app_backends(admin_url: str) -> int:
    return int(
        scalar(
            admin_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND usename = 'idem_shim_web'"
            " AND state LIKE 'idle in transaction%%'",
        )
    )


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP])
def test_a_worker_killed_or_stopped_mid_handler_leaves_nothing(
    shim_web_url: str, fresh_admin_url: str, how: signal.Signals
) -> None:
    """SIGKILL: the server sees the socket close and rolls the claim back with the writes.
    SIGSTOP: the socket stays open, the holder idle in its transaction past stale_after, and the
    server ends the session (idle_in_transaction_session_timeout, set with the claim): the same.
    Either way no row stays, and the retry runs at once, fresh and once (no stale heal)."""
    key = str(uuid.uuid4())
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, shim_web_url], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert worker.stdout is not None
        port = int(worker.stdout.readline())
        request_thread, _ = in_background(lambda: helpers.http_post(port, "/intx", key, {"item": "killed"}))
        assert worker.stdout.readline().strip() == "parked"
        assert app_backends(fresh_admin_url) == 1  # the holder, its claim and order uncommitted
        worker.send_signal(how)
        helpers.wait_until(lambda: app_backends(fresh_admin_url) == 0, what="the holder's session ended")
        assert key_rows(fresh_admin_url, key) == []
        assert orders(fresh_admin_url, "killed") == 0
        retry_app = build_app(shim_web_url)
        try:
            client = retry_app.test_client()
            retry = post(client, "/intx", key, {"item": "killed"})
            assert retry.status_code == 201, retry.get_json()
            assert post(client, "/intx", key, {"item": "killed"}).headers.get("Idempotent-Replayed") == "true"
            assert execution_count(retry_app) == 1
            assert orders(fresh_admin_url, "killed") == 1
            assert [r[0] for r in key_rows(fresh_admin_url, key)] == ["completed"]
        finally:
            retry_app.extensions["idem"].store.close()
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        request_thread.join(10)


# -- the ORM adapter of contract §4d ------------------------------------------------------------------


def test_the_orm_session_commits_with_the_key_or_not_at_all(shim_web_url: str, fresh_admin_url: str) -> None:
    """``idem_shim.sqlalchemy.session()`` under in_transaction: its commit() is a savepoint of the
    claim's transaction; an exception after it rolls the ORM's rows back with everything else."""
    from sqlalchemy import text

    from idem_shim.sqlalchemy import session

    app = Flask("intx_orm_app")
    app.config.update(IDEM_DATABASE_URL=shim_web_url, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=4)

    @app.post("/orm")
    @require_session
    @idempotency_key(claim="in_transaction", scope="orm", wait_ms=0)
    def orm_route() -> Any:
        orm = session()
        orm.execute(text("INSERT INTO shim_orders (route, item) VALUES ('orm', :item)"), {"item": request.json["item"]})
        orm.commit()  # a savepoint's end: nothing commits before the decorator's COMMIT
        assert key_rows(fresh_admin_url, request.headers["Idempotency-Key"]) == []
        if request.json.get("fail"):
            raise RuntimeError("after the ORM's commit")
        return {"ok": True}, 201

    Idem(app)
    try:
        client = app.test_client()
        good, bad = str(uuid.uuid4()), str(uuid.uuid4())
        assert post(client, "/orm", good, {"item": "orm-good"}).status_code == 201
        assert orders(fresh_admin_url, "orm-good") == 1
        assert [r[0] for r in key_rows(fresh_admin_url, good)] == ["completed"]
        assert post(client, "/orm", bad, {"item": "orm-bad", "fail": True}).status_code == 500
        assert orders(fresh_admin_url, "orm-bad") == 0
        assert [r[0] for r in key_rows(fresh_admin_url, bad)] == ["failed"]
    finally:
        app.extensions["idem"].store.close()


# -- attacks: an idem_app member that owns the database (contract §3a) ---------------------------------


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_a_database_default_isolation_does_not_turn_the_wait_into_a_second_run(
    shim_web_url: str, fresh_admin_url: str, isolation: str
) -> None:
    """The app role owns the database and sets its default isolation: a duplicate that waited on
    the holder's row then meets a commit its snapshot cannot see (40001). It must neither run nor
    fail: the claim is sent again in a new transaction, which replays."""
    with psycopg.connect(fresh_admin_url, autocommit=True) as conn:  # what the database's owner may do
        dbname = conn.info.dbname
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
                sql.Identifier(dbname), sql.Literal(isolation)
            )
        )
    gate = Gate()
    app = build_app(shim_web_url, gate)
    try:
        key, item = str(uuid.uuid4()), f"iso-{uuid.uuid4().hex[:8]}"
        holder, held = in_background(lambda: post(app.test_client(), "/intx", key, {"item": item}))
        assert gate.parked.wait(10)
        dup, duplicate = in_background(lambda: post(app.test_client(), "/intx", key, {"item": item}))
        helpers.wait_until(lambda: waiting_backends(fresh_admin_url) == 1)
        gate.go.set()
        holder.join(10)
        dup.join(10)
        assert held[0].status_code == 201
        assert duplicate[0].status_code == 201, duplicate[0].get_json()
        assert duplicate[0].headers.get("Idempotent-Replayed") == "true"
        assert execution_count(app) == 1
        assert orders(fresh_admin_url, item) == 1
    finally:
        gate.go.set()
        app.extensions["idem"].store.close()


def test_another_user_with_the_same_key_runs_fresh_and_waits_on_nobody(
    app_and_gate: tuple[Flask, Gate], fresh_admin_url: str
) -> None:
    """A client reusing another user's key (seen in flight) neither waits on that user's holder
    nor gets its answer: the key's row is per (key, user, scope), under either claim."""
    app, gate = app_and_gate
    key = str(uuid.uuid4())
    holder, held = in_background(lambda: post(app.test_client(), "/intx", key, {"item": "u1"}, user=1))
    assert gate.parked.wait(10)
    other = post(app.test_client(), "/intx", key, {"item": "u2"}, user=2)  # not blocked: the holder is parked
    assert other.status_code == 201 and other.headers.get("Idempotent-Replayed") is None
    gate.go.set()
    holder.join(10)
    assert held[0].get_json()["order_id"] != other.get_json()["order_id"]
    assert execution_count(app) == 2


def test_the_claims_wait_bound_does_not_reach_the_handlers_statements(shim_web_url: str) -> None:
    """The lock_timeout that bounds a duplicate's wait is the claim's alone: the handler's own
    statements wait on their locks as the session says (the database's default here)."""
    app = Flask("intx_settings_app")
    app.config.update(IDEM_DATABASE_URL=shim_web_url, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=2)

    @app.post("/settings")
    @require_session
    @idempotency_key(claim="in_transaction", scope="settings", wait_ms=250)
    def settings() -> Any:
        row = connection().execute("SELECT current_setting('lock_timeout')").fetchone()
        assert row is not None
        return {"lock_timeout": row[0]}, 200

    Idem(app)
    try:
        answer = post(app.test_client(), "/settings", str(uuid.uuid4()), {})
        assert answer.get_json() == {"lock_timeout": "0"}
    finally:
        app.extensions["idem"].store.close()


@pytest.mark.parametrize("path", ["/intx-nowait", "/intx"])
def test_a_locked_store_is_a_503_never_a_409_in_flight(shim_web_url: str, fresh_admin_url: str, path: str) -> None:
    """A DBA's ACCESS EXCLUSIVE lock on idempotency_keys (a migration, a VACUUM FULL) makes the
    claim's wait bound fire on the table, not on a holder: that is the store unavailable (503,
    as under the default shape), never a 409 telling the client its key is in flight."""
    app = build_app(shim_web_url, IDEM_STATEMENT_TIMEOUT_MS=2000)
    try:
        with psycopg.connect(fresh_admin_url) as locker:
            locker.execute("LOCK TABLE public.idempotency_keys IN ACCESS EXCLUSIVE MODE")
            answer = post(app.test_client(), path, str(uuid.uuid4()), {"item": "locked"})
            locker.rollback()
        assert answer.status_code == 503, answer.get_json()
        assert answer.get_json()["error"] == "idempotency_store_unavailable"
        assert execution_count(app) == 0
        assert post(app.test_client(), path, str(uuid.uuid4()), {"item": "locked"}).status_code == 201
    finally:
        app.extensions["idem"].store.close()


def test_a_store_down_is_the_503_of_the_default_shape(shim_web_url: str) -> None:
    """No server at the store's address: the claim never ran, nothing ran, 503 with Retry-After."""
    from tests.python.support.shim import closed_port, with_host_port

    app = build_app(with_host_port(shim_web_url, "127.0.0.1", closed_port()), IDEM_CONNECT_TIMEOUT=1)
    try:
        answer = post(app.test_client(), "/intx", str(uuid.uuid4()), {"item": "down"})
        assert answer.status_code == 503 and answer.get_json()["error"] == "idempotency_store_unavailable"
        assert "Retry-After" in answer.headers
        assert execution_count(app) == 0
    finally:
        app.extensions["idem"].store.close()


def test_psycopgs_own_pipeline_path_keeps_the_rules(shim_web_url: str, fresh_admin_url: str) -> None:
    """``IDEM_LIBPQ_PATH=false``: BEGIN, the claim and the savepoint through psycopg's pipeline
    (the path a psycopg without the block's hooks takes): the same answers."""
    gate = Gate()
    app = build_app(shim_web_url, gate, IDEM_LIBPQ_PATH=False)
    try:
        key, item = str(uuid.uuid4()), f"pg3-{uuid.uuid4().hex[:8]}"
        holder, held = in_background(lambda: post(app.test_client(), "/intx", key, {"item": item}))
        assert gate.parked.wait(10)
        assert post(app.test_client(), "/intx-nowait", str(uuid.uuid4()), {"item": item}).status_code == 201
        dup, duplicate = in_background(lambda: post(app.test_client(), "/intx", key, {"item": item}))
        helpers.wait_until(lambda: waiting_backends(fresh_admin_url) == 1)
        gate.go.set()
        holder.join(10)
        dup.join(10)
        assert held[0].status_code == 201
        assert duplicate[0].headers.get("Idempotent-Replayed") == "true"
        failed = str(uuid.uuid4())
        assert post(app.test_client(), "/intx", failed, {"item": item, "fail": "raise"}).status_code == 500
        assert [r[0] for r in key_rows(fresh_admin_url, failed)] == ["failed"]
        assert orders(fresh_admin_url, item) == 2
    finally:
        gate.go.set()
        app.extensions["idem"].store.close()


def test_a_session_that_lost_the_shims_statements_still_completes(shim_web_url: str, fresh_admin_url: str) -> None:
    """psycopg deallocates every statement of the session (DEALLOCATE ALL) when it rolls back a
    block after preparing a handler's statements: the completion the shim had prepared is gone.
    The default shape's claim finds that out; the in_transaction claim asks in its pipeline, so
    the next completion prepares again instead of failing (it was a 503, found by the e2e race
    under RAPTOR_ORDER_CLAIM=in_transaction)."""
    app = Flask("intx_deallocated_app")
    app.config.update(
        IDEM_DATABASE_URL=shim_web_url, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1, IDEM_PREPARE_THRESHOLD=1
    )

    @app.post("/prepared")
    @require_session
    @idempotency_key(claim="in_transaction", scope="prepared", on_failure="release")
    def prepared_route() -> Any:
        conn = connection()
        for _ in range(3):  # psycopg prepares it (threshold 1): the session now has psycopg's names
            conn.execute("SELECT %s::int", (1,))
        if request.json.get("fail"):
            raise RuntimeError("release: the whole block rolls back, psycopg deallocates all")
        return {"ok": True}, 201

    Idem(app)
    try:
        client = app.test_client()
        for _ in range(3):  # the completion is prepared under the shim's name
            assert post(client, "/prepared", str(uuid.uuid4()), {}).status_code == 201
        assert post(client, "/prepared", str(uuid.uuid4()), {"fail": True}).status_code == 500
        for _ in range(3):
            answer = post(client, "/prepared", str(uuid.uuid4()), {})
            assert answer.status_code == 201, answer.get_json()
    finally:
        app.extensions["idem"].store.close()


def test_a_connection_the_server_closed_in_the_pool_is_claimed_again(shim_web_url: str, fresh_admin_url: str) -> None:
    """A pooled connection whose backend was ended while idle (a restart, a failover): the claim
    is sent once more on a fresh connection, as the default shape's is (nothing of it committed),
    never a 503 (found by tests/python/e2e/test_faults.py's stopped database under in_transaction)."""
    app = build_app(shim_web_url, IDEM_POOL_MIN_SIZE=1, IDEM_POOL_MAX_SIZE=1)
    try:
        client = app.test_client()
        assert post(client, "/intx", str(uuid.uuid4()), {"item": "before-kill"}).status_code == 201
        settled(app)
        ended = scalar(
            fresh_admin_url,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND usename = 'idem_shim_web'",
        )
        assert ended == 1
        answer = post(client, "/intx", str(uuid.uuid4()), {"item": "after-kill"})
        assert answer.status_code == 201, answer.get_json()
        assert orders(fresh_admin_url, "after-kill") == 1
    finally:
        app.extensions["idem"].store.close()
