"""Races over real gunicorn workers: 16 clients send the same key at once, again and again.

Exactly one of them executes (one paper order, one business audit row); the others get 409
in-flight or the replay of that one answer; nobody gets a 5xx. Run directly against
PostgreSQL and through PgBouncer in transaction pooling mode.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.python.e2e.e2e_harness import Database, PgBouncer, Server, StartServer, User, new_key

CLIENTS = 16
ORDER = {"symbol": "AAPL", "side": "buy", "qty": 1}


def race_rounds(server: Server, db: Database, user: User, rounds: int) -> Counter[str]:
    """`rounds` rounds of CLIENTS simultaneous same-key POSTs; asserts each round, returns a
    tally of outcomes over all of them."""
    tally: Counter[str] = Counter()
    barrier = threading.Barrier(CLIENTS)
    local = threading.local()

    def one(key: str) -> requests.Response:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        barrier.wait(timeout=30)
        return server.order(user, key, ORDER, session=local.session)

    keys = []
    with ThreadPoolExecutor(CLIENTS) as pool:
        for _ in range(rounds):
            key = new_key()
            keys.append(key)
            responses = list(pool.map(one, [key] * CLIENTS))
            executed = [r for r in responses if r.status_code == 201 and "Idempotent-Replayed" not in r.headers]
            replayed = [r for r in responses if r.headers.get("Idempotent-Replayed") == "true"]
            statuses = Counter(r.status_code for r in responses)
            assert set(statuses) <= {201, 409}, f"unexpected statuses {statuses}"
            assert len(executed) == 1, f"{len(executed)} executions in one round: {statuses}"
            order_id = executed[0].json()["order_id"]
            assert all(r.json()["order_id"] == order_id for r in replayed)
            assert all(r.json()["error"] == "idempotency_in_flight" for r in responses if r.status_code == 409)
            tally.update(executed=1, replayed=len(replayed), in_flight=statuses[409])

    orders = db.query(
        "SELECT client_key, count(*) FROM raptor.paper_orders WHERE client_key = ANY(%s) GROUP BY client_key", (keys,)
    )
    assert len(orders) == rounds and all(n == 1 for _, n in orders), "one order per key"
    order_ids = [r[0] for r in db.query("SELECT id FROM raptor.paper_orders WHERE client_key = ANY(%s)", (keys,))]
    assert db.fill_audit_rows(order_ids) == rounds, "one business audit row per order"
    cash = db.scalar("SELECT cash_cents FROM raptor.accounts WHERE user_id = %s", (user.user_id,))
    price = db.scalar("SELECT price_cents FROM raptor.instruments WHERE symbol = 'AAPL'")
    assert cash == 1_000_000_000 - rounds * price, "cash moved exactly once per round"
    return tally


@pytest.mark.slow
def test_race_200_rounds_of_16_same_key_posts_fill_once_each(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, workers=4)
    user = db.seed_user()
    tally = race_rounds(server, db, user, rounds=200)
    assert tally["executed"] == 200
    # the layer was really exercised: duplicates met both a holder in flight and a stored answer
    assert tally["replayed"] > 0 and tally["in_flight"] > 0, tally
    # ...on every worker: the shim's log lines carry the pid of the worker that wrote them
    pids = set(re.findall(r"\[(\d+)\] INFO idem_shim: idempotency (?:replay|in_flight)", server.log()))
    assert len(pids) == 4, f"duplicates answered by workers {pids}"
    assert "Traceback" not in server.log()


@pytest.mark.slow
def test_race_through_pgbouncer_transaction_pooling(
    db: Database, start_server: StartServer, pgbouncer: PgBouncer
) -> None:
    url = db.app_url.replace(f":{db.cluster.port}/", f":{pgbouncer.port}/")
    server = start_server(url, workers=4, IDEM_PREPARE_THRESHOLD="none", IDEM_STATEMENT_TIMEOUT_MS="none")
    user = db.seed_user()
    tally = race_rounds(server, db, user, rounds=60)
    assert tally["executed"] == 60

    # replay and mismatch through the pooler too
    key = new_key()
    first = server.order(user, key, ORDER)
    again = server.order(user, key, ORDER)
    other = server.order(user, key, {**ORDER, "qty": 2})
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["order_id"] == first.json()["order_id"]
    assert other.status_code == 422
    assert other.json() == {"error": "idempotency_key_body_mismatch"}
    assert "raptor_web" in pgbouncer.log(), "the app's connections went through PgBouncer"
    assert "Traceback" not in server.log()
