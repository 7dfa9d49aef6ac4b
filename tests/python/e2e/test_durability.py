"""The shim's claim commits asynchronously; a crash must still never lose an execution's key
nor let a key execute twice (queries.CLAIM: set_config('synchronous_commit', 'off', true)).

The argument: WAL is one sequence, so the handler's synchronous commit flushes the claim's
record before its own; a claim lost in a crash belongs to a request whose business transaction
never committed. Shown here on a durable cluster (fsync, synchronous_commit, full_page_writes
on; wal_writer_delay 10 s so asynchronous commits sit in WAL buffers a long time):

1. workers run claim -> business row + idem_complete -> COMMIT with the shim's own statements,
   some of them pausing between the claim and the business transaction; meanwhile more claims
   are sent with nothing after them; then an immediate shutdown (no WAL written at exit);
2. after recovery: every acknowledged request has its business row and a completed key; no
   business row lacks its completed key; some asynchronous claims were indeed lost (the test
   exercises what it argues about);
3. every attempted key is retried as a client would until it is answered: each key's business
   row exists exactly once.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from idem_shim import queries
from idem_shim.records import ClaimRequest
from tests.python.e2e.e2e_harness import PYTHON, Cluster

ENDPOINT = "POST /durability"
BODY = '{"amount": 1}'
WORKERS = 6


def claim_params(key: str) -> tuple[object, ...]:
    request = ClaimRequest(
        key=key,
        user_id=None,
        endpoint=ENDPOINT,
        request_json=BODY,
        ttl=timedelta(hours=1),
        stale_after=timedelta(seconds=1),
        wait_ms=0,
        on_stale="heal",
    )
    return (*request.params(), None, None)


def execute_once(conn: psycopg.Connection, key: str) -> str:
    """One request: the shim's claim, then the business row and the completion in one
    transaction (synchronous commit, as the handler's). Returns the claim's outcome."""
    row = conn.execute(queries.CLAIM, claim_params(key)).fetchone()
    assert row is not None
    outcome, key_id, token = row[0], row[1], row[7]  # the claim token is the 8th column
    if outcome == "claimed":
        with conn.transaction():
            conn.execute("INSERT INTO business (idem_key) VALUES (%s)", (key,))
            conn.execute(queries.COMPLETE, (key_id, 201, '{"ok": true}', None, None, token))
    return str(outcome)


@pytest.mark.slow
def test_async_claims_lose_no_execution_in_an_immediate_shutdown() -> None:
    cluster = Cluster(durable=True, extra_conf="wal_writer_delay = 10s\n")
    try:
        cluster.create_database("durable")
        url = cluster.url("durable")
        subprocess.run([str(Path(PYTHON).with_name("idem")), "migrate", "-q", "--database-url", url], check=True)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE business (id bigserial PRIMARY KEY, idem_key text NOT NULL)")
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)

        attempted: list[str] = []
        acked: list[str] = []
        claimed_only: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()
        stop_sync = threading.Event()  # the workers whose requests complete stop first

        def worker(n: int) -> None:
            try:
                with psycopg.connect(url, autocommit=True) as conn:
                    while not (stop if n == 0 else stop_sync).is_set():
                        key = str(uuid.uuid4())
                        with lock:
                            attempted.append(key)
                        if n == 0:  # a request whose handler has not committed yet
                            row = conn.execute(queries.CLAIM, claim_params(key)).fetchone()
                            assert row is not None and row[0] == "claimed"
                            with lock:
                                claimed_only.append(key)
                            time.sleep(0.01)
                            continue
                        if execute_once(conn, key) == "claimed":
                            with lock:
                                acked.append(key)
                        if n == 1:
                            time.sleep(0.005)
            except psycopg.OperationalError:
                pass  # the server went away under us: the request was not acknowledged

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(WORKERS)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        # The last moments before the crash: the synchronous commits stop (each would flush the
        # WAL before it, claims included), and the claim-only worker goes on alone, so its last
        # claims are the asynchronous commits still in WAL buffers when the server dies.
        stop_sync.set()
        for t in threads[1:]:
            t.join(30)
        time.sleep(0.3)
        cluster.stop("immediate")
        stop.set()
        threads[0].join(30)
        cluster.start()

        with psycopg.connect(url, autocommit=True) as conn:
            rows: dict[str, str] = dict(
                conn.execute(
                    "SELECT idem_key, status FROM idempotency_keys WHERE scope_endpoint = %s", (ENDPOINT,)
                ).fetchall()
            )
            business = [r[0] for r in conn.execute("SELECT idem_key FROM business").fetchall()]
        assert len(acked) > 100, "the workers barely ran"
        missing = [k for k in acked if rows.get(k) != "completed"]
        assert not missing, f"acknowledged requests lost their key: {missing[:5]}"
        assert set(acked) <= set(business), "acknowledged business rows were lost"
        orphans = [k for k in business if rows.get(k) != "completed"]
        assert not orphans, f"business rows whose key is not completed: {orphans[:5]}"
        assert len(business) == len(set(business))
        lost_claims = [k for k in claimed_only if k not in rows]
        assert lost_claims, (
            "no asynchronous claim was lost in the crash: the test did not exercise the asynchronous commit"
        )

        # Clients retry every request they sent until it is answered.
        deadline = time.monotonic() + 60
        pending = list(dict.fromkeys(attempted))
        with psycopg.connect(url, autocommit=True) as conn:
            while pending and time.monotonic() < deadline:
                still = []
                for key in pending:
                    if execute_once(conn, key) in ("in_flight", "stale"):
                        still.append(key)  # a surviving claim of a dead request: healed soon
                pending = still
                if pending:
                    time.sleep(0.5)
            assert not pending, f"{len(pending)} keys never got an answer"
            counts: dict[str, int] = dict(
                conn.execute("SELECT idem_key, count(*) FROM business GROUP BY idem_key").fetchall()
            )
        twice = {k: c for k, c in counts.items() if c != 1}
        assert not twice, f"keys executed more than once: {list(twice.items())[:5]}"
        never = [k for k in dict.fromkeys(attempted) if k not in counts]
        assert not never, f"keys never executed after retries: {never[:5]}"
    finally:
        cluster.destroy()
