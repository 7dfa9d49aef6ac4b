"""
Part "citus": the store on the local Citus cluster (scripts/citus.sh) against a single
node, in one run, on the same server settings.

- "single node" is a database of the coordinator's own server without the citus extension, so
  both sides share one PostgreSQL, one configuration and one machine;
- "coordinator" is a database of the cluster with the store distributed (idem migrate).

Figures: claim + complete throughput (CLIENTS pgbench clients) and one-client latency on each;
the round trips of one decorated request (the client's, unchanged, and the coordinator's to the
workers, from citus.log_remote_commands); the cost of a request whose handler writes a second
user's row on the other worker (two-phase commit) against one that writes its own user's only.
Three nodes on two cores cannot show scale-out: these are the per-node costs docs/scaling.md's
estimate rests on.
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any

import psycopg

from bench.common import Mode, Report, fmt_int, fmt_ms, fmt_x, log, percentile, pgbench, ratio

import testdb  # isort: skip  (scripts/testdb.py, on sys.path through bench.common)

PART = "7 citus"
CLIENTS = 4
USERS = 200

SETUP = """
INSERT INTO users (id) SELECT g FROM generate_series(1, %(users)s) g ON CONFLICT DO NOTHING;
CREATE TABLE bench_orders (user_id integer NOT NULL, key_id bigint NOT NULL, qty integer,
                           PRIMARY KEY (user_id, key_id));
CREATE TABLE bench_pair (i integer PRIMARY KEY, a integer NOT NULL, b integer NOT NULL);
"""


def citus_url() -> str:
    url = os.environ.get("IDEM_CITUS_URL")
    if not url:
        raise RuntimeError("IDEM_CITUS_URL is not set: run it through `make bench-citus` (the local Citus cluster)")
    return url


def _fresh(base: str, name: str, distributed: bool) -> str:
    before = os.environ.get("IDEM_CITUS")
    try:
        if distributed:
            os.environ["IDEM_CITUS"] = "1"
        else:
            os.environ.pop("IDEM_CITUS", None)
        return testdb.fresh(base, name, [])
    finally:
        if before is None:
            os.environ.pop("IDEM_CITUS", None)
        else:
            os.environ["IDEM_CITUS"] = before


def _prepare(url: str, distributed: bool) -> int:
    """The business table and the user pairs; on Citus each pair's users are on two workers."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SETUP.replace("%(users)s", str(USERS)))
        if distributed:
            conn.execute("SELECT create_distributed_table('bench_orders', 'user_id', colocate_with => 'users')")
            conn.execute("SELECT create_reference_table('bench_pair')")
            rows = conn.execute(
                "SELECT u, p.nodeport FROM generate_series(1, %s) u"
                "  JOIN pg_dist_shard_placement p"
                "    ON p.shardid = get_shard_id_for_distribution_column('idempotency_keys', u)",
                (USERS,),
            ).fetchall()
            by_node: dict[int, list[int]] = {}
            for u, port in rows:
                by_node.setdefault(int(port), []).append(int(u))
            first, second = (sorted(v) for _, v in sorted(by_node.items()))
            pairs = list(zip(first, second, strict=False))
        else:
            pairs = [(u, u + USERS // 2) for u in range(1, USERS // 2 + 1)]
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO bench_pair VALUES (%s, %s, %s)", [(i + 1, a, b) for i, (a, b) in enumerate(pairs)]
            )
    return len(pairs)


def _remote_round_trips(url: str) -> tuple[int, int, int]:
    """Commands the coordinator sends to workers for one claim, one handler transaction, one replay."""
    lines: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: lines.append(str(d.message_primary or "")))
        conn.execute("SET citus.log_remote_commands = on")
        conn.execute("SET client_min_messages = log")
        key = str(uuid.uuid4())
        claim_sql = "SELECT key_id FROM idem_claim(%s, 1, 'POST /x', '{}')"
        row = conn.execute(claim_sql, (key,)).fetchone()
        assert row is not None
        n_claim = sum(1 for ln in lines if ln.startswith("issuing"))
        lines.clear()
        with conn.transaction():
            conn.execute("INSERT INTO bench_orders VALUES (1, %s, 1)", (row[0],))
            conn.execute("SELECT idem_complete(%s, 201, '{}')", (row[0],))
        n_handler = sum(1 for ln in lines if ln.startswith("issuing"))
        lines.clear()
        conn.execute(claim_sql, (key,))
        n_replay = sum(1 for ln in lines if ln.startswith("issuing"))
    return n_claim, n_handler, n_replay


def _latency_p50(url: str, script: str, defines: dict[str, Any], seconds: float) -> tuple[float, float]:
    """One client's (p50 latency in ms, requests/s) of a logged run."""
    run = pgbench(url, script, clients=1, seconds=seconds, defines=defines, logged=True)
    return percentile(run.latencies, 50), run.tps


def _delegation(url: str, defines: dict[str, Any], seconds: float, many: Any, report: Report) -> None:
    """Function delegation (create_distributed_function) on the coordinator, measured:
    - off: idem_claim and idem_complete planned on the coordinator (each statement inside them
      a round trip to the worker);
    - complete delegated: idem_complete_in_scope (sql/citus/021), the whole completion run on the
      worker in the caller's transaction, which is what the shim calls on Citus;
    - claim delegated too: idem_claim distributed by p_user_id (measured here only, last, in this
      throwaway database: not adopted, docs/scaling.md says why)."""
    off_p50, off_tps = _latency_p50(url, "citus_one_user", defines, seconds)
    on_p50, on_tps = _latency_p50(url, "citus_one_user_delegated", defines | {"off": 0}, seconds)
    on_many = pgbench(url, "citus_one_user_delegated", clients=CLIENTS, seconds=seconds, defines=defines | {"off": 0})
    fresh = {**defines, "off": 10 * USERS}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO users (id) SELECT g FROM generate_series(%s::integer, %s::integer) g ON CONFLICT DO NOTHING",
            (10 * USERS + 1, 11 * USERS),
        )
        claim = conn.execute("SELECT 'public.idem_claim'::regproc::regprocedure::text").fetchone()
        assert claim is not None
        conn.execute(
            "SELECT create_distributed_function(%s, distribution_arg_name => 'p_user_id',"
            " colocate_with => 'idempotency_keys')",
            (claim[0],),
        )
    # (Citus has no way back for a distributed function: the database is dropped after the run)
    both_p50, both_tps = _latency_p50(url, "citus_one_user_delegated", fresh, seconds)
    both_many = pgbench(url, "citus_one_user_delegated", clients=CLIENTS, seconds=seconds, defines=fresh)
    for label, p50, tps, many_tps in (
        ("off (the functions planned on the coordinator)", off_p50, off_tps, many.tps),
        ("idem_complete delegated (idem_complete_in_scope: what the shim calls)", on_p50, on_tps, on_many.tps),
        ("idem_claim delegated too (measured only)", both_p50, both_tps, both_many.tps),
    ):
        report.add(
            PART,
            f"delegation {label}: one client p50, requests/s; {CLIENTS} clients",
            f"{fmt_ms(p50)}, {fmt_int(tps)} requests/s; {fmt_int(many_tps)} requests/s",
        )
    log(
        f"citus: delegation: off p50 {off_p50:.2f} ms {off_tps:.0f}/s; complete {on_p50:.2f} ms {on_tps:.0f}/s;"
        f" claim+complete {both_p50:.2f} ms {both_tps:.0f}/s (one client); {CLIENTS} clients: "
        f"{many.tps:.0f} / {on_many.tps:.0f} / {both_many.tps:.0f} requests/s"
    )


def run(mode: Mode, report: Report) -> list[str]:
    """Measures; returns the names of the databases it made (bench/run.py drops them)."""
    base = citus_url()
    tag = f"idem_bench_citus_{os.getpid()}"
    single = _fresh(base, f"{tag}_single", distributed=False)
    dist = _fresh(base, f"{tag}_dist", distributed=True)
    made = [f"{tag}_single", f"{tag}_dist"]
    seconds = max(3, mode.sql_seconds)
    figures: dict[str, Any] = {}
    for side, url, distributed in (("single node", single, False), ("coordinator", dist, True)):
        npairs = _prepare(url, distributed)
        defines = {"npairs": npairs}
        log(f"citus: {side}: {CLIENTS} clients ...")
        many = pgbench(url, "citus_one_user", clients=CLIENTS, seconds=seconds, defines=defines)
        one = pgbench(url, "citus_one_user", clients=1, seconds=seconds, defines=defines)
        figures[side] = (many, one)
        report.add(
            PART,
            f"claim + handler + complete, {CLIENTS} clients, {side}",
            f"{fmt_int(many.tps)} requests/s",
        )
        report.add(PART, f"one client's request latency, {side}", fmt_ms(one.latency_avg_ms))
        if distributed:
            span_many = pgbench(url, "citus_two_users", clients=CLIENTS, seconds=seconds, defines=defines)
            span_one = pgbench(url, "citus_two_users", clients=1, seconds=seconds, defines=defines)
            report.add(
                PART,
                "a handler writing a second user's row on the other worker (2PC), throughput",
                f"{fmt_int(span_many.tps)} requests/s ({fmt_x(ratio(many.tps, span_many.tps))} fewer than one user's)",
            )
            report.add(
                PART,
                "the same, one client's latency",
                f"{fmt_ms(span_one.latency_avg_ms)} ({fmt_x(ratio(span_one.latency_avg_ms, one.latency_avg_ms))} "
                "one user's)",
            )
            n_claim, n_handler, n_replay = _remote_round_trips(url)
            report.add(
                PART,
                "coordinator-to-worker commands per request (claim / handler's transaction / replay)",
                f"{n_claim} / {n_handler} / {n_replay}",
            )
            _delegation(url, defines, seconds, many, report)  # last: it leaves idem_claim delegated
    (s_many, s_one), (c_many, c_one) = figures["single node"], figures["coordinator"]
    report.add(
        PART,
        "coordinator against single node",
        f"throughput {fmt_x(ratio(s_many.tps, c_many.tps))} lower, one-client latency "
        f"{fmt_x(ratio(c_one.latency_avg_ms, s_one.latency_avg_ms))}",
    )
    report.add(
        PART,
        "client round trips per decorated request",
        "the same on both (the shim's calls do not change: claim, then the handler's transaction)",
    )
    report.note(
        "Citus part: single node = a database without the extension on the coordinator's own server "
        "(same settings: fsync off); coordinator = the store distributed over 2 workers on the same 2 "
        "cores. Three nodes on two cores cannot show scale-out; docs/scaling.md uses these per-node costs."
    )
    return made


def drop(names: list[str]) -> None:
    base = citus_url()
    for name in names:
        if re.search(r"_dist$", name):
            os.environ["IDEM_CITUS"] = "1"
        try:
            testdb.drop(base, name)
        finally:
            os.environ.pop("IDEM_CITUS", None)
