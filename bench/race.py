"""Part 5, correctness under load: rounds of concurrent same-key claims, double executions counted.

Each round, `race_threads` threads (one connection each) wait at a barrier, then all claim the
same fresh key with the same body, exactly as the shim does: the claim in its own round trip,
then, for the winner, the "business write" (a row in bench_executions) and idem_complete in one
transaction. A double execution is a second bench_executions row for one round's key.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections import Counter

import psycopg

from bench.common import ENDPOINT, REQUEST, RESPONSE, Mode, Report, execute, fmt_int, in_threads

CLAIM = (
    "SELECT outcome, key_id, claim_token FROM idem_claim(p_key => %s, p_user_id => %s, p_endpoint => %s,"
    " p_request => %s::jsonb)"
)
COMPLETE = (
    "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => %s::jsonb, p_claim_token => %s)"
)
EXECUTE = "INSERT INTO bench_executions (round, idem_key, thread) VALUES (%s, %s, %s)"


def run(url: str, mode: Mode, report: Report) -> None:
    part = "5 race"
    execute(url, "INSERT INTO users (id) VALUES (1) ON CONFLICT DO NOTHING")
    execute(url, "CREATE TABLE bench_executions (round int NOT NULL, idem_key text NOT NULL, thread int NOT NULL)")
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
                    row = conn.execute(CLAIM, (key, 1, ENDPOINT, REQUEST), prepare=True).fetchone()
                    assert row is not None
                    local[row[0]] += 1
                    if row[0] == "claimed":
                        with conn.transaction():
                            conn.execute(EXECUTE, (rnd, key, tid), prepare=True)
                            conn.execute(COMPLETE, (row[1], RESPONSE, row[2]), prepare=True)
        finally:
            with lock:
                outcomes.update(local)

    t0 = time.monotonic()
    in_threads((functools.partial(worker, i) for i in range(n)), on_error=barrier.abort)
    elapsed = time.monotonic() - t0
    with psycopg.connect(url) as conn:
        per_round = conn.execute("SELECT round, count(*) FROM bench_executions GROUP BY round").fetchall()
    executions = {r: c for r, c in per_round}
    doubles = sum(c - 1 for c in executions.values() if c > 1)
    none = mode.race_rounds - len(executions)
    report.add(
        part,
        f"{mode.race_rounds:,} rounds × {n} concurrent same-key claim + complete (threads, one connection each)",
        f"{sum(outcomes.values()):,} claims in {elapsed:.1f} s "
        f"({fmt_int(sum(outcomes.values()) / elapsed)}/s): "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(outcomes.items())),
    )
    report.add(part, "double executions", f"{doubles} (rounds with no execution: {none})", "0", doubles == 0)
