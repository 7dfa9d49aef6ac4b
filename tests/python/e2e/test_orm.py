"""Flask-SQLAlchemy under gunicorn (contract §4d): the four ways issue 40 found the naive app paying
twice or paying under a failed key, each 0 or 1 payment with ``Idem(app, sqlalchemy=db)``. The app
is tests/python/e2e/orm_app.py, served with several sync workers; payments are counted in the
database per key, and a same-key race pays once too. ``ORM_TEST_NAIVE=1`` serves the naive app
(``Idem(app)``): the four cases then fail (the race does not: the claim alone keeps it at one).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.python.e2e.e2e_harness import Database, Server, StartServer, new_key
from tests.python.e2e.orm_app import ORM_DDL
from tests.python.support.waiting import wait_until

ORM_APP = "tests.python.e2e.orm_app:create_app()"

pytestmark = pytest.mark.slow


@pytest.fixture
def orm_server(db: Database, start_server: StartServer) -> Server:
    db.query(ORM_DDL.format(role="raptor_web"))
    return start_server(db.app_url, workers=3, app=ORM_APP)


def paid(db: Database, key: str) -> int:
    return int(db.scalar("SELECT count(*) FROM public.orm_payments WHERE client_key = %s", (key,)))


def pay(server: Server, path: str, key: str, **headers: str) -> requests.Response:
    return requests.post(
        server.base + path, json={"lines": ["charge", "fee"]}, headers={"Idempotency-Key": key, **headers}, timeout=30
    )


def test_exception_after_commit_under_release_then_retry_pays_once(orm_server: Server, db: Database) -> None:
    key = new_key()
    assert pay(orm_server, "/payments/release", key, **{"X-Test-Fail": "1"}).status_code == 500
    assert pay(orm_server, "/payments/release", key).status_code == 201
    assert paid(db, key) == 1


def test_exception_after_commit_under_keep_pays_nothing_and_says_failed(orm_server: Server, db: Database) -> None:
    key = new_key()
    assert pay(orm_server, "/payments", key, **{"X-Test-Fail": "1"}).status_code == 500
    retried = pay(orm_server, "/payments", key)
    assert (retried.status_code, retried.json()["error"]) == (409, "idempotency_previous_failed")
    assert paid(db, key) == 0


def test_a_holder_fenced_by_a_heal_takes_its_orm_writes_down(orm_server: Server, db: Database) -> None:
    """The first request outlives its 1 s stale window after db.session.commit(); a duplicate
    heals the key and pays; the first's completion is fenced and its payment rolls back."""
    key = new_key()
    first: dict[str, Any] = {}
    slow = threading.Thread(
        target=lambda: first.update(answer=pay(orm_server, "/payments/slow", key, **{"X-Test-Delay-Ms": "3000"}))
    )
    slow.start()
    time.sleep(1.5)
    wait_until(lambda: paid_once(orm_server, key), timeout=10, interval=0.2, what="the duplicate healing the key")
    slow.join(15)
    assert first["answer"].status_code == 409  # its claim was lost: nothing of it committed
    assert paid(db, key) == 1


def test_a_worker_killed_after_commit_pays_once_after_the_stale_window(
    orm_server: Server, db: Database, tmp_path: Path
) -> None:
    key = new_key()
    pid_file = tmp_path / "worker.pid"
    headers = {"X-Test-Delay-Ms": "10000", "X-Test-Pid-File": str(pid_file)}
    killed = threading.Thread(target=lambda: _ignore_reset(lambda: pay(orm_server, "/payments/slow", key, **headers)))
    killed.start()
    pid = int(wait_until(lambda: pid_file.read_text() if pid_file.exists() else None, 10, what="the worker's pid"))
    os.kill(pid, signal.SIGKILL)  # after db.session.commit(), before the decorator's COMMIT
    killed.join(15)
    time.sleep(1.2)  # the stale window (1 s)
    wait_until(lambda: paid_once(orm_server, key), timeout=15, interval=0.3, what="the retry healing the key")
    assert paid(db, key) == 1


def test_a_same_key_race_pays_once(orm_server: Server, db: Database) -> None:
    """Eight clients at once with one key, across the workers: one payment; the others are
    replays or told it is in flight."""
    key = new_key()
    barrier = threading.Barrier(8)
    codes: list[int] = []

    def client() -> None:
        barrier.wait()
        codes.append(pay(orm_server, "/payments", key, **{"X-Test-Delay-Ms": "200"}).status_code)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(codes) == 8 and set(codes) <= {201, 409} and 201 in codes
    assert paid(db, key) == 1


def paid_once(server: Server, key: str) -> bool:
    """The duplicate's answer: 201 once it healed the key (409 in flight before)."""
    return pay(server, "/payments/slow", key).status_code == 201


def _ignore_reset(call: Any) -> None:
    """A request whose worker is killed under it: the connection is cut, nothing to answer."""
    try:
        call()
    except requests.RequestException:
        pass
