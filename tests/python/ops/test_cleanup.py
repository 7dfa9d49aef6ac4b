"""
Cleanup that never hurts live traffic.

- The batch's plan: the expiry index idx_idem_keys_expires finds the expired rows and the
  primary key deletes them; no statement of a batch scans the table (auto_explain on the real
  function, custom and generic plans, after ANALYZE on a table with enough rows).
- A cleanup of many expired rows (200k by default; IDEM_OPS_CLEANUP_ROWS=1000000 for the contract's
  million) runs beside claims from other connections, some of them on the very keys being
  deleted; no claim waits longer than about one batch.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

import psycopg
import pytest

from tests.python.support.sqlapi import claim, connect, new_key, one

ROWS = int(os.environ.get("IDEM_OPS_CLEANUP_ROWS", "200000"))
BATCH = 5000

LOAD = """
INSERT INTO idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, status,
                              response_code, response_body, created_at, locked_at, expires_at)
SELECT gen_random_uuid()::text, NULL, 'POST /api/trading/orders', 'h',
       CASE WHEN i %% 50 = 0 THEN 'failed' ELSE 'completed' END, 201, '{"order_id": 1}'::jsonb,
       now() - s.age, now() - s.age, now() - s.age + interval '1 day'
  FROM generate_series(1, %(n)s) AS i,
       LATERAL (SELECT CASE WHEN i <= %(expired)s THEN interval '2 days' ELSE interval '1 hour' END AS age) s
"""


def load(url: str, total: int, expired: int) -> None:
    with connect(url) as conn:
        conn.execute(LOAD, {"n": total, "expired": expired})
        conn.execute("ANALYZE idempotency_keys")


def explained_batch(conn: psycopg.Connection[Any], generic: bool) -> list[str]:
    """Plans of every statement idem_cleanup_batch runs, as auto_explain reports them."""
    plans: list[str] = []
    conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_level = notice")
    conn.execute("SET plan_cache_mode = " + ("force_generic_plan" if generic else "force_custom_plan"))
    with conn.transaction(force_rollback=True):
        conn.execute("SELECT idem_cleanup_batch(p_batch_size => %s)", (BATCH,))
    return [p for p in plans if "Query Text: DELETE" in p]


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
def test_a_cleanup_batch_uses_the_expiry_index_and_never_scans_the_table(fresh_admin_url: str, generic: bool) -> None:
    load(fresh_admin_url, total=100_000, expired=20_000)
    with connect(fresh_admin_url) as conn:
        plans = explained_batch(conn, generic)
    assert len(plans) == 1  # a full batch of finished rows: no orphan pass, no event trim
    plan = plans[0]
    assert "Index Scan using idx_idem_keys_expires on idempotency_keys f" in plan, plan
    assert "Index Scan using idempotency_keys_pkey on idempotency_keys k" in plan, plan
    assert "Seq Scan" not in plan, plan


def test_the_orphan_and_event_passes_use_their_indexes(fresh_admin_url: str) -> None:
    load(fresh_admin_url, total=50_000, expired=100)  # fewer than a batch: the other passes run too
    with connect(fresh_admin_url) as conn:
        conn.execute("ANALYZE idempotency_events")
        plans = explained_batch(conn, generic=False)
    assert len(plans) == 3
    assert "idx_idem_keys_expires" in plans[0]
    assert "idx_idem_keys_expires" in plans[1], plans[1]  # orphans too (0007)
    assert all("Seq Scan on idempotency_keys" not in p for p in plans), plans


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.mark.slow
def test_a_large_cleanup_beside_live_claims_never_blocks_a_claim_for_more_than_a_batch(fresh_admin_url: str) -> None:
    load(fresh_admin_url, total=ROWS + 20_000, expired=ROWS)
    with connect(fresh_admin_url) as conn:
        doomed = [
            r["idem_key"]
            for r in conn.execute(
                "SELECT idem_key FROM idempotency_keys WHERE expires_at <= now() ORDER BY random() LIMIT 3000"
            )
        ]

    def claims(latencies: list[float], keys: list[str] | None, stop: threading.Event) -> None:
        with connect(fresh_admin_url) as conn:
            i = 0
            while not stop.is_set():
                key = keys[i % len(keys)] if keys and i < len(keys) else new_key()
                started = time.perf_counter()
                got = claim(conn, key, request={"qty": i})
                latencies.append(time.perf_counter() - started)
                assert got["outcome"] == "claimed", got
                i += 1

    def run_claimers(
        seconds: float | None, stop: threading.Event, key_sets: list[list[str] | None]
    ) -> tuple[list[threading.Thread], list[list[float]]]:
        results: list[list[float]] = [[] for _ in key_sets]
        threads = [threading.Thread(target=claims, args=(results[n], key_sets[n], stop)) for n in range(len(key_sets))]
        for t in threads:
            t.start()
        if seconds is not None:
            time.sleep(seconds)
            stop.set()
            for t in threads:
                t.join()
        return threads, results

    # Baseline: the same claimers, no cleanup.
    _, base = run_claimers(2.0, threading.Event(), [None] * 6)
    baseline = [x for r in base for x in r]

    # Cleanup beside them: 4 claimers on fresh keys, 2 on keys the cleanup is deleting.
    stop = threading.Event()
    threads, during = run_claimers(None, stop, [None] * 4 + [doomed[:1500], doomed[1500:]])
    # What CALL idem_cleanup() does (one batch, one commit, until a short batch), driven from
    # here so that each batch's duration is measured.
    batch_seconds: list[float] = []
    deleted = 0
    with connect(fresh_admin_url) as cleaner:
        started = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            n = one(cleaner, "SELECT idem_cleanup_batch(p_batch_size => %s) AS n", (BATCH,))["n"]
            batch_seconds.append(time.perf_counter() - t0)
            deleted += n
            if n < BATCH:
                break
        cleanup_seconds = time.perf_counter() - started
    stop.set()
    for t in threads:
        t.join()
    live = [x for r in during for x in r]
    on_doomed = [x for r in during[4:] for x in r]

    report = (
        f"cleanup of {deleted} rows: {cleanup_seconds:.2f} s in {len(batch_seconds)} batches of {BATCH} "
        f"(median {1000 * statistics.median(batch_seconds):.0f} ms, max {1000 * max(batch_seconds):.0f} ms"
        f" a batch); claims during it: {len(live)}, "
        f"p50 {1000 * statistics.median(live):.2f} ms, p99 {1000 * percentile(live, 0.99):.2f} ms, "
        f"max {1000 * max(live):.1f} ms (on keys being deleted: max {1000 * max(on_doomed):.1f} ms); "
        f"baseline {len(baseline)} claims p50 {1000 * statistics.median(baseline):.2f} ms, "
        f"p99 {1000 * percentile(baseline, 0.99):.2f} ms, max {1000 * max(baseline):.1f} ms"
    )
    print("\n" + report)
    assert deleted >= ROWS - len(doomed)  # the claimers removed some expired rows themselves
    with connect(fresh_admin_url) as conn:
        assert conn.execute("SELECT count(*) AS n FROM idempotency_keys WHERE expires_at <= now()").fetchone() == {
            "n": 0
        }
    assert len(on_doomed) > 100, report  # the contended claims really ran during the cleanup
    # A claim may wait for the one batch that holds its row, never for the whole cleanup; the
    # slack covers this process's own scheduling noise (see the baseline's max).
    assert max(live) < 1.0, report
    assert max(on_doomed) < max(batch_seconds) + max(0.25, 2 * max(baseline)), report
    assert cleanup_seconds > 2 * max(on_doomed), report  # ... and the cleanup as a whole was longer
