"""Which statement sequence ``claim="in_transaction"`` takes (contract §4e): a quick comparison.

Not a benchmark of record (no ratio, no durable server needed): one client, one connection, each
sequence below on a fresh key, and per request the median wall time and the WAL bytes. The
shim's own statements (``queries``) are sent as the shim sends them (psycopg, unprepared).
bench/README.md's "Claimed in the handler's transaction" gives the figures and the choice.

- ``raw``: the route undecorated: BEGIN, the business INSERT, COMMIT.
- ``before``: the default shape: the claim in autocommit; BEGIN, INSERT; idem_complete + COMMIT
  pipelined.
- ``in_tx``: BEGIN + the in_transaction claim + SAVEPOINT idem_work in one pipeline; INSERT;
  idem_complete + COMMIT pipelined.
- ``in_tx_nosp``: the same without the SAVEPOINT (what its cost is).
- ``in_tx_probe``: the same with a read of the key before the claim, in the same pipeline.
- ``probe``: a read of the key before the handler and its row inserted completed at the end, raw
  SQL with none of idem_claim's rules: the floor of a probe design.

    .venv/bin/python -m bench.claim_shapes postgresql://postgres@127.0.0.1:PORT/DB [N]
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, Final, LiteralString

import psycopg

from idem_shim import queries

Conn = psycopg.Connection[Any]

BUSINESS: Final = "INSERT INTO bench_orders (item) VALUES ('x')"
PROBE: Final[LiteralString] = (
    "SELECT status FROM public.idempotency_keys"
    " WHERE idem_key = %s AND scope_user_id IS NULL AND scope_endpoint = 'bench'"
)
INSERT_COMPLETED: Final[LiteralString] = (
    "INSERT INTO public.idempotency_keys (id, idem_key, scope_user_id, scope_endpoint, request_hash, status,"
    " response_code, response_body, created_at, locked_at, expires_at)"
    " VALUES (public.idem_new_key_id(NULL), %s, NULL, 'bench', 'h', 'completed', 201, '{\"id\": 1}',"
    " now(), now(), now() + interval '1 day')"
)


def claim_params(key: str) -> tuple[Any, ...]:
    # ClaimRequest.params() and the two response keys (None)
    return (key, None, "bench", "{}", "86400.0 seconds", "30.0 seconds", 0, "heal", "uuid", None, None)


def complete(conn: Conn, key_id: int, token: str) -> None:
    with conn.pipeline():
        conn.execute(queries.COMPLETE, (key_id, 201, '{"id": 1}', None, None, token), prepare=False)
        conn.execute("COMMIT")


def raw(conn: Conn) -> None:
    with conn.transaction():
        conn.execute(BUSINESS)


def before(conn: Conn) -> None:
    row = conn.execute(queries.CLAIM, claim_params(str(uuid.uuid4())), prepare=False).fetchone()
    assert row is not None and row[0] == "claimed"
    conn.execute("BEGIN")
    conn.execute(BUSINESS)
    complete(conn, row[1], row[7])


def in_tx(conn: Conn, savepoint: bool = True, probe_first: bool = False) -> None:
    key = str(uuid.uuid4())
    with conn.cursor() as cur:
        with conn.pipeline():
            conn.execute("BEGIN")
            if probe_first:
                conn.execute(PROBE, (key,))
            cur.execute(queries.CLAIM_IN_TRANSACTION, ("1000", "30000", *claim_params(key)))
            if savepoint:
                conn.execute(queries.WORK_SAVEPOINT)
        row = cur.fetchone()
    assert row is not None and row[0] == "claimed"
    conn.execute(BUSINESS)
    complete(conn, row[1], row[7])


def probe(conn: Conn) -> None:
    key = str(uuid.uuid4())
    with conn.cursor() as cur:
        with conn.pipeline():
            conn.execute("BEGIN")
            cur.execute(PROBE, (key,))
        assert cur.fetchone() is None
    conn.execute(BUSINESS)
    with conn.pipeline():
        conn.execute(INSERT_COMPLETED, (key,))
        conn.execute("COMMIT")


def measure(url: str, run: Callable[[Conn], None], n: int) -> tuple[float, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(50):
            run(conn)
        start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            run(conn)
            times.append(time.perf_counter() - t)
        wal = conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", start).fetchone()
    assert wal is not None
    return statistics.median(times) * 1e6, float(wal[0]) / n


def main() -> None:
    url, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_orders (id bigserial PRIMARY KEY, item text)")
    shapes: dict[str, Callable[[Conn], None]] = {
        "raw": raw,
        "before": before,
        "in_tx": in_tx,
        "in_tx_nosp": lambda c: in_tx(c, savepoint=False),
        "in_tx_probe": lambda c: in_tx(c, probe_first=True),
        "probe": probe,
    }
    for rnd in range(3):  # interleaved rounds, so a drift of the shared machine shows
        for name, run in shapes.items():
            us, wal = measure(url, run, n)
            print(f"round {rnd} {name:11s} p50 {us:7.1f} us  WAL {wal:6.0f} B/request", flush=True)


if __name__ == "__main__":
    main()
