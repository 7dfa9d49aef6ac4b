"""Races and leases through the decorator, with real threads and real sessions.

Each test declares its handler (``make_app(handler)``) and orders its race with events and
pg_stat_activity, never with sleeps. Cases: 16 threads with one key against a handler that holds
its claim until the 15 others were answered -> exactly one execution and one business audit row,
the others 409, never a 5xx (several rounds); the same with
``wait_ms`` -> everyone gets the one answer; a zombie whose lease was healed cannot commit (its
writes roll back, the healer's retry executes once); ``heartbeat()`` keeps a slow handler's lease;
a claim erased mid-flight makes ``heartbeat()`` raise and nothing commits; the accessors outside a
decorated route.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask import Flask

from idem_shim import connection, current_key_id, heartbeat
from idem_shim.errors import OutsideRequestError
from tests.python.support.races import wait_for_backends
from tests.python.support.shim import (
    AppFactory,
    Executions,
    Handler,
    Order,
    executions,
    places_order,
    post,
    running_app,
    scalar,
)
from tests.python.support.waiting import wait_until


def race(
    app: Flask, path: str, key: str, body: dict[str, Any], n: int = 16, on_answer: Callable[[], object] = lambda: None
) -> list[Any]:
    """n clients post the same key at once; ``on_answer`` runs as each gets its response."""
    barrier = threading.Barrier(n)

    def one(_: int) -> Any:
        client = app.test_client()
        barrier.wait()
        response = post(client, path, key, body)
        on_answer()
        return response

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, range(n)))


def business_rows(admin: str, key_hint: str) -> tuple[int, int]:
    orders = scalar(admin, "SELECT count(*) FROM shim_orders WHERE item = %s", (key_hint,))
    audits = scalar(
        admin,
        "SELECT count(*) FROM audit_log a JOIN shim_orders o "
        "ON (a.context->>'order_id')::bigint = o.id "
        "WHERE a.action = 'order_placed' AND o.item = %s",
        (key_hint,),
    )
    return int(orders), int(audits)


class Parked:
    """A handler that writes its order, then waits for the test at the points the test names.

    ``parked`` is set once the first execution has written (later executions do not stop);
    ``release`` lets it go on; ``beat`` (with ``heartbeats=True``) is set after it renewed its
    lease; ``finish`` lets it answer. The test orders the race with these, never with sleeps.
    """

    def __init__(self, heartbeats: bool = False) -> None:
        self.heartbeats = heartbeats
        self.parked, self.release = threading.Event(), threading.Event()
        self.beat, self.finish = threading.Event(), threading.Event()
        self._calls = 0
        self._lock = threading.Lock()

    def __call__(self, order: Order) -> Any:
        order_id = order.write()
        with self._lock:
            self._calls += 1
            first = self._calls == 1
        if first:
            self.parked.set()
            assert self.release.wait(10), "the test never released the handler"
            if self.heartbeats:
                heartbeat()  # raises ClaimLostError when the claim is gone
                self.beat.set()
                assert self.finish.wait(10), "the test never let the handler finish"
        return {"order_id": order_id, "item": order.item}, 201


def age_claims(admin_url: str, by: str = "1 minute") -> None:
    """The holders' leases ran out: as if the handler had been running for ``by``."""
    scalar(admin_url, "UPDATE idempotency_keys SET locked_at = locked_at - %s::interval RETURNING 1", (by,))


def holds_until_the_others_answered(answered: Executions, others: int) -> Handler:
    """The one execution keeps its claim until the ``others`` duplicates have had their answer."""

    def handler(order: Order) -> Any:
        wait_until(lambda: answered.count >= others, 10, 0.005, what=f"the {others} duplicates' answers")
        return places_order(order)

    return handler


@pytest.mark.slow
@pytest.mark.parametrize("round_no", range(5))
def test_sixteen_threads_same_key_execute_once(make_app: AppFactory, fresh_admin_url: str, round_no: int) -> None:
    answered = Executions()
    app = make_app(holds_until_the_others_answered(answered, 15), IDEM_POOL_MAX_SIZE=20)
    key = str(uuid.uuid4())
    item = f"race-{round_no}"
    responses = race(app, "/orders", key, {"item": item}, on_answer=answered.bump)
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] + [409] * 15, statuses
    for r in responses:
        if r.status_code == 409:
            assert r.get_json()["error"] == "idempotency_in_flight"
            assert 0 < r.get_json()["retry_after_ms"] <= 5000
            assert int(r.headers["Retry-After"]) >= 1
    assert executions(app) == 1
    assert business_rows(fresh_admin_url, item) == (1, 1)


@pytest.mark.slow
def test_sixteen_threads_with_wait_all_get_the_one_answer(make_app: AppFactory, fresh_admin_url: str) -> None:
    def answers_once_a_duplicate_waits(order: Order) -> Any:
        wait_for_backends(fresh_admin_url, "PgSleep")  # a duplicate polls inside its wait window
        return places_order(order)

    # 15 waiters at once: half the pool may wait (docs/shim.md, wait_ms), so the pool is 32
    app = make_app(answers_once_a_duplicate_waits, IDEM_POOL_MAX_SIZE=32)
    key = str(uuid.uuid4())
    responses = race(app, "/waiting", key, {"item": "waited"})
    assert [r.status_code for r in responses] == [201] * 16
    assert sum("Idempotent-Replayed" not in r.headers for r in responses) == 1
    assert len({r.get_json()["order_id"] for r in responses}) == 1
    assert executions(app) == 1
    assert business_rows(fresh_admin_url, "waited") == (1, 1)


def test_a_healed_zombie_cannot_commit(make_app: AppFactory, fresh_admin_url: str) -> None:
    zombie_handler = Parked()
    app = make_app(zombie_handler)
    key = str(uuid.uuid4())
    body = {"item": "zombie"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        zombie = pool.submit(post, app.test_client(), "/orders", key, body)
        assert zombie_handler.parked.wait(10)
        age_claims(fresh_admin_url)  # the zombie's lease has run out; it is still running
        client = app.test_client()
        healed = post(client, "/orders", key, body)
        assert healed.status_code == 409
        assert healed.get_json() == {"error": "idempotency_in_flight", "retry_after_ms": 100}
        healer_response = post(app.test_client(), "/orders", key, body)
        zombie_handler.release.set()
        zombie_response = zombie.result(timeout=10)
    # the zombie's completion found its claim gone: its writes rolled back, 409 to retry
    assert zombie_response.status_code == 409
    assert zombie_response.get_json()["error"] == "idempotency_in_flight"
    assert healer_response.status_code == 201
    assert executions(app) == 2
    assert business_rows(fresh_admin_url, "zombie") == (1, 1)
    replay = post(client, "/orders", key, body)
    assert replay.get_json()["order_id"] == healer_response.get_json()["order_id"]
    # the shim reported its lost claim for the DBA, with the database's own reason
    assert (
        scalar(fresh_admin_url, "SELECT detail->>'reason' FROM idempotency_events WHERE event = 'lost_claim'")
        == "healed_as_stale"
    )


def test_heartbeat_keeps_a_slow_handler_alive(make_app: AppFactory, fresh_admin_url: str) -> None:
    slow_handler = Parked(heartbeats=True)
    app = make_app(slow_handler)
    key = str(uuid.uuid4())
    body = {"item": "slow"}
    with ThreadPoolExecutor(max_workers=1) as pool:
        slow = pool.submit(post, app.test_client(), "/orders", key, body)
        assert slow_handler.parked.wait(10)
        age_claims(fresh_admin_url)  # past the stale threshold...
        slow_handler.release.set()
        assert slow_handler.beat.wait(10)  # ...but the handler renewed its lease
        duplicate = post(app.test_client(), "/orders", key, body)
        assert duplicate.status_code == 409
        assert duplicate.get_json()["error"] == "idempotency_in_flight"
        assert 0 < duplicate.get_json()["retry_after_ms"] <= 5000
        slow_handler.finish.set()
        assert slow.result(timeout=10).status_code == 201
    assert executions(app) == 1
    assert business_rows(fresh_admin_url, "slow") == (1, 1)
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_events WHERE event = 'stale_heal'") == 0


def test_claim_erased_mid_flight_stops_the_handler_and_nothing_commits(
    make_app: AppFactory, fresh_admin_url: str
) -> None:
    erased_handler = Parked(heartbeats=True)
    app = make_app(erased_handler)
    app.testing = False
    key = str(uuid.uuid4())
    with ThreadPoolExecutor(max_workers=1) as pool:
        slow = pool.submit(post, app.test_client(), "/orders", key, {"item": "erased"})
        assert erased_handler.parked.wait(10)
        assert scalar(fresh_admin_url, "SELECT idem_erase_user(p_user_id => 1)") == 1
        erased_handler.release.set()
        response = slow.result(timeout=10)
    assert not erased_handler.beat.is_set()
    assert response.status_code == 500  # heartbeat() raised ClaimLostError in the handler
    assert business_rows(fresh_admin_url, "erased") == (0, 0)
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys") == 0
    assert (
        scalar(fresh_admin_url, "SELECT detail->>'reason' FROM idempotency_events WHERE event = 'lost_claim'") == "gone"
    )


def test_accessors_outside_a_decorated_route(shim_web_url: str) -> None:
    with running_app(shim_web_url) as app:
        with app.test_request_context("/"):
            with pytest.raises(OutsideRequestError):
                connection()
            with pytest.raises(OutsideRequestError):
                heartbeat()
        with pytest.raises(OutsideRequestError):
            connection()  # not even an app context


def test_accessors_in_passthrough(shim_web_url: str, fresh_admin_url: str) -> None:
    seen: dict[str, Any] = {}
    with running_app(shim_web_url) as app:

        @app.post("/probe")
        def probe() -> Any:
            from idem_shim import idempotency_key

            @idempotency_key(service=True)  # no session decorator here: a declared service route
            def inner() -> Any:
                seen["key_id"] = current_key_id()
                seen["heartbeat"] = heartbeat()
                seen["one"] = connection().execute("SELECT 1").fetchone()
                return {"ok": True}

            return inner()

        client = app.test_client()
        assert client.post("/probe").status_code == 200
        assert seen == {"key_id": None, "heartbeat": None, "one": (1,)}
        assert client.post("/probe", headers={"Idempotency-Key": str(uuid.uuid4())}).status_code == 200
        assert isinstance(seen["key_id"], int)
        assert seen["heartbeat"] is not None
