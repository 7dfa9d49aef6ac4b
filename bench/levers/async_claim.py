"""Lever: the claim commits asynchronously. Interleaved A/B of the shim's own statements.

    python -m bench.levers.async_claim URL [PAIRS]

A = queries.CLAIM with the session's synchronous_commit (the claim's commit waits for a WAL
flush), B = queries.CLAIM as shipped (synchronous_commit off for the claim's own transaction).
Each request: the claim (autocommit), then BEGIN, an INSERT and idem_complete, COMMIT (which
waits for the flush in both). Run it against a durable server (make bench-db-up): on a server
with fsync off there is nothing to save. Prints p50/p99 of the claim and of the whole request.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from datetime import timedelta

import psycopg

from idem_shim import queries
from idem_shim.records import ClaimRequest

SYNC_CLAIM = queries.CLAIM.replace(
    "CASE WHEN outcome = 'replay' THEN current_setting('synchronous_commit')\n                       ELSE 'off' END",
    "current_setting('synchronous_commit')",
)


def main() -> None:
    url, pairs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    assert SYNC_CLAIM != queries.CLAIM, "queries.CLAIM changed: update this A/B"
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=1)
    conn.execute("CREATE TABLE IF NOT EXISTS lever_items (id bigserial PRIMARY KEY, payload jsonb)")
    conn.execute("INSERT INTO users (id) VALUES (1) ON CONFLICT DO NOTHING")

    def one(claim: str) -> tuple[float, float]:
        request = ClaimRequest(
            str(uuid.uuid4()), 1, "POST /lever", '{"a": 1}', timedelta(hours=24), timedelta(seconds=30), 0, "heal"
        )
        t0 = time.perf_counter()
        row = conn.execute(claim, (*request.params(), None, None)).fetchone()  # type: ignore[arg-type]
        t1 = time.perf_counter()
        assert row is not None
        with conn.transaction():
            conn.execute("INSERT INTO lever_items (payload) VALUES ('{}')")
            conn.execute(queries.COMPLETE, (row[1], 201, '{"ok": 1}', None, None, row[7]))  # row[7]: claim_token
        return (t1 - t0) * 1e3, (time.perf_counter() - t0) * 1e3

    sides = {"sync claim": SYNC_CLAIM, "async claim": queries.CLAIM}
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    for i in range(pairs):
        for name in list(sides) if i % 2 == 0 else list(sides)[::-1]:
            results[name].append(one(sides[name]))
    for name, values in results.items():
        whole = sorted(v[1] for v in values)
        print(
            f"{name}: claim p50 {statistics.median(v[0] for v in values):.3f} ms, request p50 "
            f"{statistics.median(whole):.3f} ms, p99 {whole[int(0.99 * len(whole))]:.3f} ms"
        )


if __name__ == "__main__":
    main()
