"""The soak's closing retries, on a real Raptor, broker and cluster: a client that gave up on a
live order whose worker was SIGKILLed after the broker filled it leaves an orphan fill (the
live checker then fails the run); the retry at the end, sent as the client would send it later,
heals the dead worker's key, adopts that fill, and the checkers pass. A paper order given up
the same way is re-driven too."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from examples.simulators.process import Simulator
from tests.python.chaos.checker import check
from tests.python.chaos.live_checker import check_live
from tests.python.chaos.soak import (
    LIVE,
    ORDERS,
    SERVER_ENV,
    START_CASH,
    Env,
    Records,
    completed_live_keys,
    place,
    retry_unanswered,
    snapshot,
)
from tests.python.e2e.e2e_harness import PG_BIN, Cluster, Database, Server, prepare_template, wait_until
from tests.python.support.races import delayed_worker_pid

LIVE_ORDER = {"symbol": "AAPL", "side": "buy", "qty": 2}
PAPER_ORDER = {"symbol": "MSFT", "side": "buy", "qty": 1}


@dataclass
class Stack:
    db: Database
    broker: Simulator
    server: Server


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"PostgreSQL server binaries not found in {PG_BIN}: run `make deps`")
    cluster = Cluster()
    broker = Simulator("broker", Path(tmp_path_factory.mktemp("broker"))).start()
    server: Server | None = None
    try:
        prepare_template(cluster, "raptor_chaos_retry")
        db = Database(cluster, "raptor_chaos_retry")
        server = Server(db.app_url, env={**SERVER_ENV, "RAPTOR_LIVE_TRADING": "1", "RAPTOR_BROKER_URL": broker.url})
        server.start()
        yield Stack(db, broker, server)
    finally:
        if server is not None:
            server.stop()
        broker.stop()
        cluster.destroy()


def give_up_after_a_kill(env: Env, db: Database, user: dict[str, object], key: str, path: str, at: str) -> None:
    """One try (env.max_tries is 1) whose worker is SIGKILLed asleep at ``at``: no answer, given up."""
    delay = {"X-Raptor-Test-Delay-Ms": "1500", "X-Raptor-Test-Delay-At": at}
    body = LIVE_ORDER if path == LIVE else PAPER_ORDER
    t = threading.Thread(
        target=place,
        args=(env, random.Random(key), "c00", user, key, body, "main", 201, delay),
        kwargs={"path": path},
    )
    t.start()
    os.kill(wait_until(lambda: delayed_worker_pid(db.admin_url), 15, what="the delayed worker"), signal.SIGKILL)
    t.join()
    # the dead worker's backend sleeps on until its delay ends: the next victim must not be taken for it
    wait_until(lambda: delayed_worker_pid(db.admin_url) is None, 15, what="the dead worker's backend to end")


def test_the_closing_retry_adopts_a_fill_whose_client_gave_up(stack: Stack) -> None:
    db = stack.db
    live_user, paper_user = db.seed_user(cash_cents=START_CASH, mode="live"), db.seed_user(cash_cents=START_CASH)
    env = Env(
        {"direct": stack.server},
        [{"user_id": paper_user.user_id, "token": paper_user.token}],
        Records(),
        time.monotonic(),
        live_users=[{"user_id": live_user.user_id, "token": live_user.token}],
        max_tries=1,
    )
    live_key, paper_key = "5a1e0000-0000-4000-8000-000000000001", "5a1e0000-0000-4000-8000-000000000002"
    give_up_after_a_kill(env, db, env.live_users[0], live_key, LIVE, "after-broker")
    give_up_after_a_kill(env, db, env.users[0], paper_key, ORDERS, "after-writes")
    assert env.live_records.gave_up == {(live_key, "main")} and env.records.gave_up == {(paper_key, "main")}

    # Judged now, the broker's fill has no completed key: an orphan, and the run fails.
    before = check_live(stack.broker.fills(), completed_live_keys(db), env.live_answers)
    assert len(before.orphans) == 1 and before.violations == 1

    env.max_tries = 40  # the client that comes back has its usual patience
    retried = retry_unanswered(env)
    assert retried["keys retried after the quiet period"] == 2 and retried["  of them answered"] == 2, retried
    assert env.live_records.gave_up == set() and env.records.gave_up == set()

    after = check_live(stack.broker.fills(), completed_live_keys(db), env.live_answers)
    assert after.orphans == [] and after.violations == 0 and after.counters["broker fills"] == 1
    [answer] = env.live_answers
    assert answer.key == live_key and answer.adopted and answer.attempt == 2  # the dead worker's fill
    assert retried["  of them adopting a broker fill"] == 1

    snap = snapshot(db, {paper_user.user_id: START_CASH}, [paper_user.user_id])
    report = check(env.records.attempts, snap, env.records.gave_up)
    assert report.violations == [] and report.counters["orders executed"] == 1
