"""
Cleanup that never hurts live traffic.

- The batch's plan: the expiry index idx_idem_keys_expires finds the expired rows and the
  primary key deletes them; no statement of a batch scans the table (auto_explain on the real
  function, custom and generic plans, after ANALYZE on a table with enough rows).
- A cleanup of many expired rows (200k by default; IDEM_OPS_CLEANUP_ROWS=1000000 for the contract's
  million) runs beside claims from other connections, some of them on the very keys being
  deleted; no claim waits on more than one batch's transaction (counted in pg_locks, not timed).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import psycopg
import pytest

from tests.python.support.sqlapi import claim, connect, new_key, one
from tests.python.support.waiting import wait_until

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


@pytest.mark.slow
def test_a_large_cleanup_beside_live_claims_never_blocks_a_claim_for_more_than_a_batch(
    fresh_admin_url: str, admin_url: str
) -> None:
    """Counted, not timed: a sampler reads pg_stat_activity and pg_locks for the claimers' backends
    waiting on a lock, and which transaction they wait for (a row lock's wait is on its holder's
    transaction id). A claim on a fresh key never waits; one on a key being deleted waits, if at
    all, for one batch's transaction (the cleaner's, each batch its own), never for a second."""
    load(fresh_admin_url, total=ROWS + 20_000, expired=ROWS)
    with connect(fresh_admin_url) as conn:
        doomed = [
            r["idem_key"]
            for r in conn.execute(
                "SELECT idem_key FROM idempotency_keys WHERE expires_at <= now() ORDER BY random() LIMIT 3000"
            )
        ]
    #: backend pid -> the index of the claim its thread is making now (published before each call)
    making: dict[int, int] = {}
    thread_of: dict[int, int] = {}  # backend pid -> its claimer's number
    claimed: list[list[int]] = []  # per thread: how many claims it made

    def claims(n: int, keys: list[str] | None, stop: threading.Event) -> None:
        with connect(fresh_admin_url) as conn:
            pid = conn.info.backend_pid
            thread_of[pid] = n
            i = 0
            while not stop.is_set():
                key = keys[i % len(keys)] if keys and i < len(keys) else new_key()
                making[pid] = i
                got = claim(conn, key, request={"qty": i})
                assert got["outcome"] == "claimed", got
                i += 1
            claimed[n].append(i)

    # (claimer pid, its claim's index) -> the locks it was seen waiting for: their type and, for a
    # row's, the transaction id that holds it
    waits: dict[tuple[int, int], set[tuple[str, str | None]]] = {}
    sampling = threading.Event()

    def sample() -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            while not sampling.is_set():
                before = dict(making)
                # pg_locks alone (one snapshot of the lock table): a waiter's ungranted lock
                rows = conn.execute(
                    "SELECT w.pid, w.locktype, w.transactionid::text FROM pg_locks w"
                    " WHERE NOT w.granted AND w.pid = ANY(%s)",
                    (list(before),),
                ).fetchall()
                after = dict(making)
                for pid, locktype, xid in rows:
                    # a relation's extension lock is the inserters' own (a new page, microseconds),
                    # taken with or without a cleanup beside them: not a wait behind it
                    if locktype != "extend" and before.get(pid) == after.get(pid):  # the same claim throughout
                        waits.setdefault((pid, before[pid]), set()).add((locktype, xid))

    # 4 claimers on fresh keys, 2 on keys the cleanup is deleting.
    key_sets: list[list[str] | None] = [None] * 4 + [doomed[:1500], doomed[1500:]]
    claimed.extend([] for _ in key_sets)
    stop = threading.Event()
    threads = [threading.Thread(target=claims, args=(n, key_sets[n], stop)) for n in range(len(key_sets))]
    for t in threads:
        t.start()
    wait_until(lambda: len(making) == len(key_sets), what="every claimer's first claim")
    sampler = threading.Thread(target=sample)
    sampler.start()
    # What CALL idem_cleanup() does (one batch, one commit, until a short batch), driven from
    # here so that each batch's transaction is known.
    batch_xids: list[str] = []
    deleted = 0
    with connect(fresh_admin_url) as cleaner:
        while True:
            with cleaner.transaction():
                n = one(cleaner, "SELECT idem_cleanup_batch(p_batch_size => %s) AS n", (BATCH,))["n"]
                batch_xids.append(one(cleaner, "SELECT pg_current_xact_id_if_assigned()::text AS x")["x"])
            deleted += n
            if n < BATCH:
                break
    stop.set()
    for t in threads:
        t.join()
    sampling.set()
    sampler.join()

    on_doomed = sum(c[0] for c in claimed[4:])
    fresh_waits = {claim_: seen for claim_, seen in waits.items() if thread_of[claim_[0]] < 4}
    behind_two = {claim_: seen for claim_, seen in waits.items() if len(seen) > 1}
    not_a_batch = {
        claim_: seen
        for claim_, seen in waits.items()
        if any(locktype != "transactionid" or x not in batch_xids for locktype, x in seen)
    }
    report = (
        f"cleanup of {deleted} rows in {len(batch_xids)} batches of {BATCH}; claims during it: "
        f"{sum(c[0] for c in claimed)} ({on_doomed} on keys being deleted); "
        f"claims seen waiting on a lock: {len(waits)}, on {len({x for s in waits.values() for x in s})} locks"
    )
    print("\n" + report)
    assert deleted >= ROWS - len(doomed)  # the claimers removed some expired rows themselves
    with connect(fresh_admin_url) as conn:
        assert conn.execute("SELECT count(*) AS n FROM idempotency_keys WHERE expires_at <= now()").fetchone() == {
            "n": 0
        }
    assert on_doomed > 100, report  # the contended claims really ran during the cleanup
    assert len(set(batch_xids)) == len(batch_xids), batch_xids  # each batch its own transaction
    assert not fresh_waits, f"claims on fresh keys waited on a lock: {fresh_waits}; {report}"
    assert not not_a_batch, f"claims waited on what is not one batch of the cleaner's: {not_a_batch}; {report}"
    assert not behind_two, f"claims waited on more than one batch: {behind_two}; {report}"
