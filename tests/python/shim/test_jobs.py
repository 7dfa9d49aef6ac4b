"""``idem_shim.idempotent()`` (contract §4c) against a real database, no Flask app: exactly one
execution under real parallel connections, the stored result replayed (any JSON value), failure
kept or released, fencing after a heal, heartbeats, bad input refused before anything is claimed,
and the two examples built on it (the queue consumer, Raptor's credit-cash command).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg_pool import ConnectionPool

from idem_shim import (
    ClaimLostError,
    ConfigError,
    IdemError,
    InFlightError,
    KeyMismatchError,
    PreviousFailedError,
    attempt,
    connection,
    current_key_id,
    downstream_key,
    heartbeat,
    idempotent,
)
from tests.python.support.shim import scalar, shim_db


@pytest.fixture
def url(fresh_admin_url: str) -> str:
    """The app role (idem_app plus shim_orders), as a job would run."""
    return shim_db(fresh_admin_url)


@pytest.fixture
def pool(url: str) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(url, min_size=1, max_size=16, kwargs={"autocommit": True}) as pool:
        yield pool


def orders(admin_url: str, route: str) -> int:
    return int(scalar(admin_url, "SELECT count(*) FROM shim_orders WHERE route = %s", (route,)))


def write(route: str) -> int:
    row = connection().execute("INSERT INTO shim_orders (route) VALUES (%s) RETURNING id", (route,)).fetchone()
    assert row is not None
    return int(row[0])


def test_exactly_one_execution_under_parallel_duplicates(pool: ConnectionPool[Any], fresh_admin_url: str) -> None:
    executions = 0
    lock = threading.Lock()

    @idempotent(scope="jobs.race", db=pool, key="key", wait_ms=5000)
    def job(key: str, qty: int) -> dict[str, Any]:
        nonlocal executions
        with lock:
            executions += 1
        order_id = write("race")
        time.sleep(0.05)  # the duplicates arrive while this one holds the key
        return {"order_id": order_id, "qty": qty}

    key = str(uuid.uuid4())
    barrier = threading.Barrier(12)
    results: list[Any] = []

    def call() -> None:
        barrier.wait()
        results.append(job(key=key, qty=3))

    threads = [threading.Thread(target=call) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert executions == 1
    assert orders(fresh_admin_url, "race") == 1
    assert len(results) == 12 and all(r == results[0] for r in results), "every duplicate got the stored result"


@pytest.mark.parametrize("value", [{"a": [1, 2]}, [1, "two", None], "text", 42, 2.5, True, None, {"idem_raw": "x"}])
def test_any_json_value_is_replayed_as_itself(pool: ConnectionPool[Any], value: Any) -> None:
    runs = 0

    @idempotent(scope="jobs.values", db=pool)
    def job(key: str) -> Any:
        nonlocal runs
        runs += 1
        return value

    key = str(uuid.uuid4())
    assert job(key) == value
    assert job(key) == value
    assert runs == 1


def test_writes_and_completion_commit_together_on_a_plain_connection(url: str, fresh_admin_url: str) -> None:
    with psycopg.connect(url) as conn:  # not autocommit: the shim drives its transactions itself

        @idempotent(scope="jobs.conn", db=conn, key="ticket", user="user_id")
        def job(ticket: uuid.UUID, user_id: int) -> int:
            assert current_key_id() is not None
            return write("conn")

        ticket = uuid.uuid4()
        first = job(ticket, 1)
        assert job(ticket=ticket, user_id=1) == first
        assert job(ticket=ticket, user_id=2) != first, "keys are per user"
        assert conn.autocommit is False, "the connection is handed back as it came"
    assert orders(fresh_admin_url, "conn") == 2
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys WHERE scope_endpoint = 'jobs.conn'") == 2


def test_an_exception_fails_the_key_and_rolls_the_writes_back(pool: ConnectionPool[Any], fresh_admin_url: str) -> None:
    @idempotent(scope="jobs.keep", db=pool)
    def job(key: str) -> None:
        write("keep")
        raise RuntimeError("broker refused")

    key = str(uuid.uuid4())
    with pytest.raises(RuntimeError, match="broker refused"):
        job(key)
    with pytest.raises(PreviousFailedError):
        job(key)
    assert orders(fresh_admin_url, "keep") == 0


def test_release_frees_the_key_for_the_next_call(pool: ConnectionPool[Any], fresh_admin_url: str) -> None:
    attempts = 0

    @idempotent(scope="jobs.release", db=pool, on_failure="release")
    def job(key: str) -> str:
        nonlocal attempts
        attempts += 1
        write("release")
        if attempts == 1:
            raise TimeoutError("first attempt times out")
        return "done"

    key = str(uuid.uuid4())
    with pytest.raises(TimeoutError):
        job(key)
    assert scalar(fresh_admin_url, "SELECT event FROM idempotency_events WHERE scope_endpoint = 'jobs.release'") == (
        "released"
    )
    assert job(key) == "done"
    assert job(key) == "done"
    assert attempts == 2 and orders(fresh_admin_url, "release") == 1


def test_mismatch_and_in_flight_raise(pool: ConnectionPool[Any]) -> None:
    started, go = threading.Event(), threading.Event()

    @idempotent(scope="jobs.dup", db=pool, key="key")
    def job(key: str, qty: int) -> int:
        started.set()
        go.wait(5)
        return qty

    key = str(uuid.uuid4())
    holder = threading.Thread(target=job, args=(key, 1))
    holder.start()
    started.wait(5)
    with pytest.raises(InFlightError) as busy:
        job(key, 1)
    assert 0 < busy.value.retry_after_ms <= 5000
    go.set()
    holder.join()
    with pytest.raises(KeyMismatchError):
        job(key, 2)


def test_a_healed_holder_cannot_complete_and_its_writes_roll_back(
    pool: ConnectionPool[Any], fresh_admin_url: str
) -> None:
    """Fencing as in a request: the zombie's completion raises, its order never commits."""
    healed, zombie_done = threading.Event(), threading.Event()
    runs = 0

    @idempotent(scope="jobs.fence", db=pool, key="key", stale_after_seconds=1)
    def job(key: str) -> str:
        nonlocal runs
        runs += 1
        write("fence")
        if runs == 1:
            healed.wait(5)  # the first holder hangs past its lease
        else:
            healed.set()  # this call healed the stale holder and claimed the key: wake the zombie
            zombie_done.wait(5)
        return "ran"

    key = str(uuid.uuid4())
    zombie_error: list[BaseException] = []

    def zombie() -> None:
        try:
            job(key)
        except BaseException as exc:
            zombie_error.append(exc)
        finally:
            zombie_done.set()

    first = threading.Thread(target=zombie)
    first.start()
    time.sleep(1.2)  # past the shortest stale window the app's role may pass
    assert job(key) == "ran"
    first.join()
    assert len(zombie_error) == 1 and isinstance(zombie_error[0], ClaimLostError)
    assert orders(fresh_admin_url, "fence") == 1


def test_heartbeat_renews_the_lease_over_the_pool(pool: ConnectionPool[Any], fresh_admin_url: str) -> None:
    @idempotent(scope="jobs.beat", db=pool, stale_after_seconds=1)
    def job(key: str) -> str:
        for _ in range(5):
            time.sleep(0.4)
            assert heartbeat() is not None
        return "slow but alive"

    key = str(uuid.uuid4())
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(job(key)))
    worker.start()
    time.sleep(1.4)  # past stale_after: without the heartbeats this call would heal the holder
    with pytest.raises(InFlightError):
        job(key)
    worker.join()
    assert result == ["slow but alive"] and job(key) == "slow but alive"


def test_heartbeat_over_a_single_connection_says_it_needs_a_pool(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:

        @idempotent(scope="jobs.beat1", db=conn)
        def job(key: str) -> None:
            heartbeat()

        with pytest.raises(IdemError, match="needs a second connection"):
            job(str(uuid.uuid4()))


def test_bad_input_is_refused_before_anything_is_claimed(url: str, fresh_admin_url: str) -> None:
    with pytest.raises(TypeError, match="db must be a psycopg Connection"):
        idempotent(scope="jobs.bad", db=None)  # type: ignore[arg-type]
    with psycopg.connect(url, autocommit=True) as conn:
        with pytest.raises(ValueError, match="on_failure must be"):
            idempotent(scope="jobs.bad", db=conn, on_failure="retry")
        with pytest.raises(ValueError, match="scope must be"):
            idempotent(scope="", db=conn)
        with pytest.raises(TypeError, match="has no parameter 'message_id'"):
            idempotent(scope="jobs.bad", db=conn, key="message_id")(lambda key: key)

        @idempotent(scope="jobs.bad", db=conn)
        def job(key: str, payload: Any = None) -> Any:
            return payload

        with pytest.raises(ValueError, match="must be a UUID string"):
            job("not-a-uuid")
        with pytest.raises(TypeError, match=r"arguments of .* must be JSON-serialisable"):
            job(str(uuid.uuid4()), payload=object())
        with pytest.raises(TypeError, match=r"result of .* must be JSON-serialisable"):
            _returns_object(conn)
        with conn.transaction(), pytest.raises(IdemError, match="has a transaction open"):
            job(str(uuid.uuid4()))
    assert scalar(fresh_admin_url, "SELECT count(*) FROM idempotency_keys WHERE scope_endpoint = 'jobs.bad'") == 0
    assert orders(fresh_admin_url, "bad") == 0, "the work whose result could not be stored rolled back"


def _returns_object(conn: psycopg.Connection[Any]) -> Any:
    @idempotent(scope="jobs.bad", db=conn)
    def job(key: str) -> Any:
        connection().execute("INSERT INTO shim_orders (route) VALUES ('bad')")
        return object()

    return job(str(uuid.uuid4()))


def test_the_queue_consumer_applies_each_message_once(fresh_admin_url: str) -> None:
    from examples.queue_consumer import consume

    summary = consume(fresh_admin_url, messages=60, copies=3, workers=6)
    assert summary["deliveries"] == 180
    assert summary["executions"] == summary["ledger_rows"] == 60
    assert summary["ledger_cents"] == summary["expected_cents"]


def test_raptors_credit_cash_command_credits_once_per_key(fresh_admin_url: str) -> None:
    from examples.raptor.cli import init_db, raptor_cli, seed_user

    init_db(fresh_admin_url)
    user = seed_user(fresh_admin_url, cash_cents=1000)
    key = str(uuid.uuid4())
    runner = CliRunner()
    argv = ["credit-cash", "--database-url", fresh_admin_url, "--key", key, "--user-id", str(user["user_id"])]
    first = runner.invoke(raptor_cli, [*argv, "--cents", "250"])
    again = runner.invoke(raptor_cli, [*argv, "--cents", "250"])
    assert first.exit_code == 0, first.output
    assert (
        json.loads(first.output)
        == json.loads(again.output)
        == {
            "user_id": user["user_id"],
            "credited_cents": 250,
            "cash_cents": 1250,
            "ticket": key,
        }
    )
    other = runner.invoke(raptor_cli, [*argv, "--cents", "999"])
    assert other.exit_code == 1 and "first used with other arguments" in other.output
    assert (
        scalar(fresh_admin_url, "SELECT cash_cents FROM raptor.accounts WHERE user_id = %s", (user["user_id"],)) == 1250
    )
    missing = runner.invoke(raptor_cli, [*argv[:-1], "999999", "--cents", "5"])
    assert missing.exit_code == 1 and "user id 999999 is not in the store's users table" in missing.output


def test_downstream_key_and_attempt_work_inside_a_job_as_in_a_request(
    pool: ConnectionPool[Any], fresh_admin_url: str
) -> None:
    """Contract §4c: a job forwards the same key a DBA reconciles with idem_downstream_key (its key,
    user and scope), stable across its duplicates; attempt() is 1 for its first execution."""
    with psycopg.connect(fresh_admin_url, autocommit=True) as admin:
        user = admin.execute("INSERT INTO users (id) VALUES (987001) RETURNING id").fetchone()
    assert user is not None

    @idempotent(scope="jobs.forward", db=pool, key="key", user="user_id")
    def forward(key: str, user_id: int) -> dict[str, Any]:
        return {"broker": downstream_key("broker"), "stripe": downstream_key("stripe"), "attempt": attempt()}

    key = str(uuid.uuid4())
    first = forward(key=key, user_id=user[0])
    assert forward(key=key, user_id=user[0]) == first  # the duplicate gets the stored result
    want = scalar(
        fresh_admin_url,
        "SELECT idem_downstream_key(p_key => %s, p_user_id => %s, p_endpoint => %s, p_namespace => %s)",
        (key, user[0], "jobs.forward", "broker"),
    )
    assert first["broker"] == want and first["stripe"] != want
    assert first["attempt"] == 1


#: The job of the test below, run in a process of its own: it claims the key, reports what it
#: sees, then hangs holding the key until it is killed.
_KILLED_HOLDER = """
import sys, time
from psycopg_pool import ConnectionPool
from idem_shim import attempt, connection, downstream_key, idempotent

url, key = sys.argv[1], sys.argv[2]
with ConnectionPool(url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
    @idempotent(scope="jobs.killed", db=pool, key="key", user="user_id", stale_after_seconds=1)
    def job(key, user_id):
        connection().execute("INSERT INTO shim_orders (route) VALUES ('killed')")
        print(attempt(), downstream_key("broker"), flush=True)
        time.sleep(60)

    job(key=key, user_id=1)
"""


def test_a_job_killed_holding_its_key_runs_again_as_attempt_2_with_the_same_downstream_key(
    url: str, pool: ConnectionPool[Any], fresh_admin_url: str
) -> None:
    """Contract §4a for jobs: a consumer killed (SIGKILL, its own process) while it holds the key is
    healed after stale_after_seconds; the next execution is attempt 2 and forwards the same
    downstream key, so it can look its broker call up before making it again."""
    key = str(uuid.uuid4())
    holder = subprocess.Popen([sys.executable, "-c", _KILLED_HOLDER, url, key], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        first_attempt, first_downstream = holder.stdout.readline().split()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    assert first_attempt == "1"

    @idempotent(scope="jobs.killed", db=pool, key="key", user="user_id", stale_after_seconds=1)
    def job(key: str, user_id: int) -> dict[str, Any]:
        write("killed")
        return {"attempt": attempt(), "broker": downstream_key("broker")}

    time.sleep(1.2)  # past the dead holder's lease
    again = job(key=key, user_id=1)  # heals the stale holder, then claims and runs
    assert again == {"attempt": 2, "broker": first_downstream}
    assert job(key=key, user_id=1) == again  # a duplicate now replays the second execution's result
    assert orders(fresh_admin_url, "killed") == 1, "the killed holder's write never committed"


def test_idem_key_format_in_the_environment_holds_for_a_job(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Contract §4b: every IDEM_* setting is read from the environment where there is no app config:
    a consumer beside an app with IDEM_KEY_FORMAT=opaque takes the same Stripe-style keys; its
    own key_format= still wins."""
    monkeypatch.setenv("IDEM_KEY_FORMAT", "opaque")
    with psycopg.connect(url, autocommit=True) as conn:

        @idempotent(scope="jobs.opaque", db=conn)
        def job(key: str) -> Any:
            return {"ran": key}

        assert job("evt_1NirD82eZvKYlo2CIvbtLWuY") == {"ran": "evt_1NirD82eZvKYlo2CIvbtLWuY"}
        assert job("evt_1NirD82eZvKYlo2CIvbtLWuY") == {"ran": "evt_1NirD82eZvKYlo2CIvbtLWuY"}  # replayed

        @idempotent(scope="jobs.uuid_only", db=conn, key_format="uuid")
        def strict(key: str) -> Any:
            return None

        with pytest.raises(ValueError, match="must be a UUID string"):
            strict("evt_1NirD82eZvKYlo2CIvbtLWuY")
    monkeypatch.setenv("IDEM_KEY_FORMAT", "stripe")
    with psycopg.connect(url, autocommit=True) as conn, pytest.raises(ConfigError, match="IDEM_KEY_FORMAT"):
        idempotent(scope="jobs.bad_format", db=conn)
