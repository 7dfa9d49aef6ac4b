"""Part 5, correctness under load: rounds of concurrent same-key claims, double executions counted.

Each round, `race_threads` threads (one connection each) wait at a barrier, then all claim the
same fresh key with the same body, exactly as the shim does: the claim in its own round trip,
then, for the winner, the "business write" (a row in bench_executions) and idem_complete in one
transaction. A double execution is a second bench_executions row for one round's key.

Then the same rounds under ``claim="in_transaction"`` (contract §4e), as the shim sends it: BEGIN,
``queries.CLAIM_IN_TRANSACTION`` (its wait bound 5 s) and the savepoint in one pipeline; the
winner's write and idem_complete in that transaction, then COMMIT; every duplicate waits on the
winner's row and replays (a bound reached is a 55P03, counted as ``in_flight``).
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections import Counter
from typing import Any

import psycopg

from bench.common import ENDPOINT, REQUEST, RESPONSE, Mode, Report, execute, fmt_int, in_threads
from idem_shim import queries

CLAIM = (
    "SELECT outcome, key_id, claim_token FROM idem_claim(p_key => %s, p_user_id => %s, p_endpoint => %s,"
    " p_request => %s::jsonb)"
)
COMPLETE = (
    "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => %s::jsonb, p_claim_token => %s)"
)
EXECUTE = "INSERT INTO bench_executions (round, idem_key, thread, shape) VALUES (%s, %s, %s, %s)"
#: The in_transaction claim's wait bound, ms, and its idle bound (queries.CLAIM_IN_TRANSACTION).
WAIT_MS, IDLE_MS = 5000, 30000


def run(url: str, mode: Mode, report: Report) -> None:
    execute(url, "INSERT INTO users (id) VALUES (1) ON CONFLICT DO NOTHING")
    execute(
        url,
        "CREATE TABLE bench_executions (round int NOT NULL, idem_key text NOT NULL, thread int NOT NULL,"
        " shape text NOT NULL)",
    )
    race(url, mode, report, "before")
    race(url, mode, report, "in_transaction")


def claim_in_transaction(conn: psycopg.Connection[Any], key: str) -> tuple[Any, ...] | None:
    """The shim's in_transaction claim: the transaction is left open (claimed) or ended."""
    params = (str(WAIT_MS), str(IDLE_MS), key, 1, ENDPOINT, REQUEST, "86400.0 seconds", "30.0 seconds", WAIT_MS)
    params += ("heal", "uuid", None, None)
    try:
        with conn.cursor() as cur:
            with conn.pipeline():
                conn.execute("BEGIN")
                cur.execute(queries.CLAIM_IN_TRANSACTION, params)
                conn.execute(queries.WORK_SAVEPOINT)
            row = cur.fetchone()
    except psycopg.errors.LockNotAvailable:
        conn.execute("ROLLBACK")
        return ("in_flight",)
    if row is not None and row[0] != "claimed":
        conn.execute("COMMIT")
    return row


def race(url: str, mode: Mode, report: Report, shape: str) -> None:
    part = "5 race"
    n = mode.race_threads
    keys = [str(uuid.uuid4()) for _ in range(mode.race_rounds)]
    barrier = threading.Barrier(n)
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def worker(tid: int) -> None:
        local: Counter[str] = Counter()
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                for rnd, key in enumerate(keys):
                    barrier.wait(timeout=30)
                    if shape == "in_transaction":
                        row = claim_in_transaction(conn, key)
                        assert row is not None
                        local[str(row[0])] += 1
                        if row[0] == "claimed":
                            conn.execute(EXECUTE, (rnd, key, tid, shape), prepare=True)
                            with conn.pipeline():
                                conn.execute(COMPLETE, (row[1], RESPONSE, row[7]), prepare=True)
                                conn.execute("COMMIT")
                        continue
                    row = conn.execute(CLAIM, (key, 1, ENDPOINT, REQUEST), prepare=True).fetchone()
                    assert row is not None
                    local[row[0]] += 1
                    if row[0] == "claimed":
                        with conn.transaction():
                            conn.execute(EXECUTE, (rnd, key, tid, shape), prepare=True)
                            conn.execute(COMPLETE, (row[1], RESPONSE, row[2]), prepare=True)
        finally:
            with lock:
                outcomes.update(local)

    t0 = time.monotonic()
    in_threads((functools.partial(worker, i) for i in range(n)), on_error=barrier.abort)
    elapsed = time.monotonic() - t0
    with psycopg.connect(url) as conn:
        per_round = conn.execute(
            "SELECT round, count(*) FROM bench_executions WHERE shape = %s GROUP BY round", (shape,)
        ).fetchall()
    executions = {r: c for r, c in per_round}
    doubles = sum(c - 1 for c in executions.values() if c > 1)
    none = mode.race_rounds - len(executions)
    report.add(
        part,
        f"{mode.race_rounds:,} rounds × {n} concurrent same-key claim + complete (threads, one connection each)"
        + (', claim="in_transaction"' if shape == "in_transaction" else ""),
        f"{sum(outcomes.values()):,} claims in {elapsed:.1f} s "
        f"({fmt_int(sum(outcomes.values()) / elapsed)}/s): "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(outcomes.items())),
    )
    label = "double executions" + (' (claim="in_transaction")' if shape == "in_transaction" else "")
    report.add(part, label, f"{doubles} (rounds with no execution: {none})", "0", doubles == 0)
