"""The floor of the worker's half: psycopg's client CPU for the statements the decoration adds.

    python -m bench.levers.client_cpu URL [ROUNDS]

No Flask, no gunicorn: process CPU (time.process_time) per iteration of
- the shim's claim statement alone,
- claim, then BEGIN + INSERT + idem_complete and COMMIT pipelined (what a decorated route does),
- BEGIN + INSERT + COMMIT (what the undecorated route does).
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

import psycopg

from idem_shim import queries
from idem_shim.records import ClaimRequest


def main() -> None:
    url = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=5)
    conn.execute("CREATE TABLE IF NOT EXISTS lever_items (id bigserial PRIMARY KEY, payload jsonb)")
    conn.execute("INSERT INTO users (id) VALUES (1) ON CONFLICT DO NOTHING")

    def claim() -> tuple[int, str]:
        request = ClaimRequest(
            str(uuid.uuid4()), 1, "POST /lever", '{"a": 1}', timedelta(hours=24), timedelta(seconds=30), 0, "heal"
        )
        row = conn.execute(queries.CLAIM, (*request.params(), None, None)).fetchone()  # type: ignore[arg-type]
        assert row is not None
        return int(row[1]), str(row[7])  # key_id, claim_token

    def decorated() -> None:
        key_id, token = claim()
        tx = psycopg.Transaction(conn)
        tx.__enter__()
        conn.execute("INSERT INTO lever_items (payload) VALUES ('{}')")
        with conn.pipeline():
            conn.execute(queries.COMPLETE, (key_id, 201, '{"id": 1}', None, None, token))
            tx.__exit__(None, None, None)

    def undecorated() -> None:
        with conn.transaction():
            conn.execute("INSERT INTO lever_items (payload) VALUES ('{}')")

    def measure(fn: Callable[[], object], n: int = 400) -> float:
        t0 = time.process_time()
        for _ in range(n):
            fn()
        return (time.process_time() - t0) / n * 1e6

    cases: dict[str, Callable[[], object]] = {
        "claim statement alone": claim,
        "decorated: claim + BEGIN/INSERT + pipelined idem_complete/COMMIT": decorated,
        "undecorated: BEGIN/INSERT/COMMIT": undecorated,
    }
    results: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            results[name].append(measure(fn))
    for name, values in results.items():
        print(f"{name}: {statistics.median(values):.0f} µs client CPU ({', '.join(f'{v:.0f}' for v in values)})")


if __name__ == "__main__":
    main()
