"""Lever: the index layout. Two databases with different layouts, the same claim + complete
pairs through the functions, alternating blocks; backend CPU, WAL bytes, HOT updates, bytes.

    python -m bench.levers.index_layout URL_A URL_B [BLOCKS] [PAIRS_PER_BLOCK]

Build the variants from fresh migrated databases (scripts/testdb.py fresh NAME), e.g. the layout
before 0007 with `psql -f sql/migrations/0007.hot-completion.rollback.sql`. Run it on the
database's machine: the backend CPU comes from /proc/PID/schedstat.
"""

from __future__ import annotations

import random
import statistics
import sys
import uuid

import psycopg

from bench.common import ENDPOINT, REQUEST, RESPONSE

CLAIM = (
    "SELECT key_id, claim_token FROM idem_claim(p_key => %s, p_user_id => %s, p_endpoint => %s, p_request => %s::jsonb)"
)
COMPLETE = (
    "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => %s::jsonb, p_claim_token => %s)"
)


def cpu_us(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1000


def main() -> None:
    urls = {"A": sys.argv[1], "B": sys.argv[2]}
    blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 9
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
    conns = {k: psycopg.connect(u, autocommit=True, prepare_threshold=0) for k, u in urls.items()}
    for c in conns.values():
        c.execute("INSERT INTO users (id) SELECT g FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING")
    cpu: dict[str, list[float]] = {k: [] for k in urls}
    wal: dict[str, list[float]] = {k: [] for k in urls}
    for b in range(blocks):
        for k in list(urls) if b % 2 == 0 else list(urls)[::-1]:
            c = conns[k]
            lsn = c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
            c0 = cpu_us(c.info.backend_pid)
            for _ in range(n):
                row = c.execute(
                    CLAIM,
                    (
                        str(uuid.uuid4()),
                        random.randint(1, 1000),
                        ENDPOINT,
                        REQUEST,
                    ),
                ).fetchone()
                assert row is not None
                c.execute(COMPLETE, (row[0], RESPONSE, row[1]))
            c1 = cpu_us(c.info.backend_pid)
            w = c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", (lsn,)).fetchone()[0]  # type: ignore[index]
            if b > 0:  # the first block warms caches
                cpu[k].append((c1 - c0) / n)
                wal[k].append(float(w) / n)
    for k, c in conns.items():
        upd, hot = c.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'"
        ).fetchone()  # type: ignore[misc]
        heap, idx, rows = c.execute(
            "SELECT pg_table_size('idempotency_keys'), "
            "pg_indexes_size('idempotency_keys'), count(*) "
            "FROM idempotency_keys"
        ).fetchone()  # type: ignore[misc]
        print(
            f"{k}: backend CPU per pair {statistics.median(cpu[k]):.0f} µs "
            f"({', '.join(f'{x:.0f}' for x in cpu[k])}), WAL per pair {statistics.median(wal[k]):.0f} B, "
            f"HOT updates {hot}/{upd}, bytes per row heap {heap / rows:.0f} / indexes {idx / rows:.0f}"
        )


if __name__ == "__main__":
    main()
