"""Contract §4e for jobs: ``idempotent(claim="in_transaction")`` over a caller's pool, no Flask.

The same rules as a route's (tests/python/shim/test_claim_in_transaction.py): the key's row
commits with the work's writes or not at all; a duplicate waits on the holder up to ``wait_ms``
and returns its result, else ``InFlightError``; a failure keeps its ``on_failure`` meaning; a
job killed holding the key leaves nothing, and the next call runs at once as attempt 1.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from idem_shim import InFlightError, PreviousFailedError, attempt, connection, idempotent
from tests.python.support import in_transaction as helpers
from tests.python.support.shim import scalar, shim_db


@pytest.fixture
def url(fresh_admin_url: str) -> str:
    return shim_db(fresh_admin_url)


@pytest.fixture
def pool(url: str) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(url, min_size=1, max_size=8, kwargs={"autocommit": True}) as pool:
        yield pool


def orders(admin_url: str, route: str) -> int:
    return int(scalar(admin_url, "SELECT count(*) FROM shim_orders WHERE route = %s", (route,)))


def statuses(admin_url: str, key: str) -> list[str]:
    return [
        str(s)
        for s in scalar(
            admin_url,
            "SELECT coalesce(array_agg(status::text), '{}') FROM idempotency_keys WHERE idem_key = %s",
            (key,),
        )
    ]


def waiting(admin_url: str) -> int:
    return int(
        scalar(
            admin_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'transactionid'",
        )
    )


def test_a_duplicate_waits_for_the_holder_and_returns_its_result(
    pool: ConnectionPool[Any], fresh_admin_url: str
) -> None:
    parked, go = threading.Event(), threading.Event()
    calls: list[int] = []

    @idempotent(scope="jobs.intx", db=pool, key="key", wait_ms=5000, claim="in_transaction")
    def job(key: str) -> dict[str, Any]:
        calls.append(1)
        row = connection().execute("INSERT INTO shim_orders (route) VALUES ('intx-job') RETURNING id").fetchone()
        assert row is not None
        if len(calls) == 1:
            parked.set()
            assert go.wait(10)
        return {"order_id": row[0]}

    key = str(uuid.uuid4())
    results: list[Any] = []
    holder = threading.Thread(target=lambda: results.append(job(key=key)))
    holder.start()
    assert parked.wait(10)
    assert statuses(fresh_admin_url, key) == []  # nothing committed before the work
    dup = threading.Thread(target=lambda: results.append(job(key=key)))
    dup.start()
    helpers.wait_until(lambda: waiting(fresh_admin_url) == 1)
    go.set()
    holder.join(10)
    dup.join(10)
    assert len(results) == 2 and results[0] == results[1]
    assert len(calls) == 1
    assert orders(fresh_admin_url, "intx-job") == 1
    assert statuses(fresh_admin_url, key) == ["completed"]
    assert job(key=key) == results[0]  # and after: the stored result


def test_a_duplicate_past_wait_ms_raises_in_flight(pool: ConnectionPool[Any], fresh_admin_url: str) -> None:
    parked, go = threading.Event(), threading.Event()

    @idempotent(scope="jobs.intx.nowait", db=pool, key="key", claim="in_transaction")
    def job(key: str, first: bool) -> int:
        connection().execute("INSERT INTO shim_orders (route) VALUES ('intx-nowait')")
        if first:
            parked.set()
            assert go.wait(10)
        return 7

    key = str(uuid.uuid4())
    holder = threading.Thread(target=lambda: job(key=key, first=True))
    holder.start()
    assert parked.wait(10)
    with pytest.raises(InFlightError) as raised:
        job(key=key, first=True)
    assert raised.value.retry_after_ms >= 50
    go.set()
    holder.join(10)
    assert orders(fresh_admin_url, "intx-nowait") == 1


@pytest.mark.parametrize("on_failure", ["keep", "release"])
def test_an_exception_keeps_no_write_and_on_failure_its_meaning(
    pool: ConnectionPool[Any], fresh_admin_url: str, on_failure: str
) -> None:
    calls: list[int] = []

    @idempotent(scope=f"jobs.intx.{on_failure}", db=pool, key="key", on_failure=on_failure, claim="in_transaction")
    def job(key: str) -> int:
        calls.append(1)
        connection().execute("INSERT INTO shim_orders (route) VALUES (%s)", (f"intx-{on_failure}",))
        raise RuntimeError("the work failed")

    key = str(uuid.uuid4())
    with pytest.raises(RuntimeError):
        job(key=key)
    assert orders(fresh_admin_url, f"intx-{on_failure}") == 0
    if on_failure == "keep":
        assert statuses(fresh_admin_url, key) == ["failed"]
        with pytest.raises(PreviousFailedError):
            job(key=key)
        assert len(calls) == 1
    else:
        assert statuses(fresh_admin_url, key) == []
        with pytest.raises(RuntimeError):
            job(key=key)  # ran again
        assert len(calls) == 2


_KILLED = """
import sys, time
from psycopg_pool import ConnectionPool
from idem_shim import connection, idempotent

url, key = sys.argv[1], sys.argv[2]
with ConnectionPool(url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
    @idempotent(scope="jobs.intx.killed", db=pool, key="key", claim="in_transaction")
    def job(key):
        connection().execute("INSERT INTO shim_orders (route) VALUES ('intx-killed')")
        print("parked", flush=True)
        time.sleep(60)

    job(key=key)
"""


def test_a_job_killed_holding_its_key_leaves_nothing_and_runs_again_as_attempt_1(
    url: str, pool: ConnectionPool[Any], fresh_admin_url: str
) -> None:
    key = str(uuid.uuid4())
    holder = subprocess.Popen([sys.executable, "-c", _KILLED, url, key], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "parked"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    helpers.wait_until(
        lambda: (
            int(
                scalar(
                    fresh_admin_url,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND state LIKE 'idle in transaction%%'",
                )
            )
            == 0
        )
    )
    assert statuses(fresh_admin_url, key) == []
    assert orders(fresh_admin_url, "intx-killed") == 0

    @idempotent(scope="jobs.intx.killed", db=pool, key="key", claim="in_transaction")
    def job(key: str) -> int:
        connection().execute("INSERT INTO shim_orders (route) VALUES ('intx-killed')")
        return attempt()

    assert job(key=key) == 1  # fresh: no stale heal, no wait for one
    assert job(key=key) == 1  # the stored result
    assert orders(fresh_admin_url, "intx-killed") == 1


def test_a_connection_with_an_isolation_level_gets_its_begin(url: str, fresh_admin_url: str) -> None:
    """A job's own connection set to SERIALIZABLE: the claim's BEGIN is the one psycopg sends for
    it (the work runs serializable), not a bare one."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE

        @idempotent(scope="jobs.intx.iso", db=conn, key="key", claim="in_transaction")
        def job(key: str) -> str:
            row = connection().execute("SELECT current_setting('transaction_isolation')").fetchone()
            assert row is not None
            return str(row[0])

        assert job(key=str(uuid.uuid4())) == "serializable"
