"""Races and leases through the decorator, with real threads and real sessions.

Cases: 16 threads with one key against a sleeping handler -> exactly one execution and one
business audit row, the others 409 or a replay, never a 5xx (several rounds); the same with
``wait_ms`` -> everyone gets the one answer; a zombie whose lease was healed cannot commit (its
writes roll back, the healer's retry executes once); ``heartbeat()`` keeps a slow handler's lease;
a claim erased mid-flight makes ``heartbeat()`` raise and nothing commits; the accessors outside a
decorated route.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask import Flask
from test_shim_support import executions, post, running_app, scalar, shim_db

from idem_shim import connection, current_key_id, heartbeat
from idem_shim.errors import OutsideRequestError


@pytest.fixture
def db(fresh_db: str) -> str:
    return shim_db(fresh_db)


def race(app: Flask, path: str, key: str, body: dict[str, Any], n: int = 16) -> list[Any]:
    barrier = threading.Barrier(n)

    def one(_: int) -> Any:
        client = app.test_client()
        barrier.wait()
        return post(client, path, key, body)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, range(n)))


def business_rows(admin: str, key_hint: str) -> tuple[int, int]:
    orders = scalar(admin, "SELECT count(*) FROM shim_orders WHERE item = %s", (key_hint,))
    audits = scalar(admin, "SELECT count(*) FROM audit_log a JOIN shim_orders o "
                           "ON (a.context->>'order_id')::bigint = o.id "
                           "WHERE a.action = 'order_placed' AND o.item = %s", (key_hint,))
    return int(orders), int(audits)


@pytest.mark.slow
def test_sixteen_threads_same_key_execute_once(db: str, fresh_db: str) -> None:
    with running_app(db, IDEM_POOL_MAX_SIZE=20) as app:
        for round_no in range(5):
            key = str(uuid.uuid4())
            item = f"race-{round_no}"
            before = executions(app)
            responses = race(app, "/orders", key, {"item": item, "sleep": 0.4})
            statuses = sorted(r.status_code for r in responses)
            assert all(s in (201, 409) for s in statuses), statuses
            fresh = [r for r in responses if r.status_code == 201 and "Idempotent-Replayed" not in r.headers]
            assert len(fresh) == 1
            for r in responses:
                if r.status_code == 409:
                    assert r.get_json()["error"] == "idempotency_in_flight"
                    assert 0 < r.get_json()["retry_after_ms"] <= 5000
                    assert int(r.headers["Retry-After"]) >= 1
            assert executions(app) - before == 1
            assert business_rows(fresh_db, item) == (1, 1)


@pytest.mark.slow
def test_sixteen_threads_with_wait_all_get_the_one_answer(db: str, fresh_db: str) -> None:
    with running_app(db, IDEM_POOL_MAX_SIZE=20) as app:
        key = str(uuid.uuid4())
        responses = race(app, "/waiting", key, {"item": "waited", "sleep": 0.3})
        assert [r.status_code for r in responses] == [201] * 16
        assert sum("Idempotent-Replayed" not in r.headers for r in responses) == 1
        assert len({r.get_json()["order_id"] for r in responses}) == 1
        assert executions(app) == 1
        assert business_rows(fresh_db, "waited") == (1, 1)


@pytest.mark.slow
def test_a_healed_zombie_cannot_commit(db: str, fresh_db: str) -> None:
    with running_app(db, IDEM_STALE_AFTER_SECONDS=1) as app:
        key = str(uuid.uuid4())
        body = {"item": "zombie", "sleep": 2}
        with ThreadPoolExecutor(max_workers=2) as pool:
            zombie = pool.submit(post, app.test_client(), "/orders", key, body)
            time.sleep(1.3)  # the zombie's lease (1 s) has run out; it is still sleeping
            client = app.test_client()
            healed = post(client, "/orders", key, body)
            assert healed.status_code == 409
            assert healed.get_json() == {"error": "idempotency_in_flight", "retry_after_ms": 100}
            healer = pool.submit(post, app.test_client(), "/orders", key, body)
            zombie_response = zombie.result(timeout=10)
            healer_response = healer.result(timeout=10)
        # the zombie's completion found its claim gone: its writes rolled back, 409 to retry
        assert zombie_response.status_code == 409
        assert zombie_response.get_json()["error"] == "idempotency_in_flight"
        assert healer_response.status_code == 201
        assert executions(app) == 2
        assert business_rows(fresh_db, "zombie") == (1, 1)
        replay = post(client, "/orders", key, body)
        assert replay.get_json()["order_id"] == healer_response.get_json()["order_id"]
        # the shim reported its lost claim for the DBA, with the database's own reason
        assert scalar(fresh_db, "SELECT detail->>'reason' FROM idempotency_events "
                                "WHERE event = 'lost_claim'") == "healed_as_stale"


@pytest.mark.slow
def test_heartbeat_keeps_a_slow_handler_alive(db: str, fresh_db: str) -> None:
    with running_app(db, IDEM_STALE_AFTER_SECONDS=1) as app:
        key = str(uuid.uuid4())
        body = {"item": "slow", "sleep": 2.5, "heartbeat": True}
        with ThreadPoolExecutor(max_workers=1) as pool:
            slow = pool.submit(post, app.test_client(), "/orders", key, body)
            time.sleep(1.6)  # past the stale threshold, but the lease was renewed
            duplicate = post(app.test_client(), "/orders", key, body)
            assert duplicate.status_code == 409
            assert duplicate.get_json()["error"] == "idempotency_in_flight"
            assert 0 < duplicate.get_json()["retry_after_ms"] <= 1000  # from the renewed lease
            assert slow.result(timeout=10).status_code == 201
        assert executions(app) == 1
        assert business_rows(fresh_db, "slow") == (1, 1)
        assert scalar(fresh_db, "SELECT count(*) FROM idempotency_events WHERE event = 'stale_heal'") == 0


@pytest.mark.slow
def test_claim_erased_mid_flight_stops_the_handler_and_nothing_commits(db: str, fresh_db: str) -> None:
    with running_app(db) as app:
        app.testing = False
        key = str(uuid.uuid4())
        body = {"item": "erased", "sleep": 2, "heartbeat": True}
        with ThreadPoolExecutor(max_workers=1) as pool:
            slow = pool.submit(post, app.test_client(), "/orders", key, body)
            time.sleep(0.5)
            assert scalar(fresh_db, "SELECT idem_erase_user(p_user_id => 1)") == 1
            response = slow.result(timeout=10)
        assert response.status_code == 500  # heartbeat() raised ClaimLostError in the handler
        assert business_rows(fresh_db, "erased") == (0, 0)
        assert scalar(fresh_db, "SELECT count(*) FROM idempotency_keys") == 0
        assert scalar(fresh_db, "SELECT detail->>'reason' FROM idempotency_events "
                                "WHERE event = 'lost_claim'") == "gone"


def test_accessors_outside_a_decorated_route(db: str) -> None:
    with running_app(db) as app:
        with app.test_request_context("/"):
            with pytest.raises(OutsideRequestError):
                connection()
            with pytest.raises(OutsideRequestError):
                heartbeat()
        with pytest.raises(OutsideRequestError):
            connection()  # not even an app context


def test_accessors_in_passthrough(db: str, fresh_db: str) -> None:
    seen: dict[str, Any] = {}
    with running_app(db) as app:

        @app.post("/probe")
        def probe() -> Any:
            from idem_shim import idempotency_key

            @idempotency_key()
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
