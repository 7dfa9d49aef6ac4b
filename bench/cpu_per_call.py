"""
Server CPU per call: how many microseconds of the backend's own CPU one statement costs.

    python bench/cpu_per_call.py URL [N]

On a shared, noisy machine, wall-clock throughput swings by tens of percent from one second to
the next; the CPU time the backend process spends (/proc/PID/schedstat, so run it on the
database's machine) barely moves. It runs N claim + complete pairs through the
functions and N through the raw statements on bench_raw_keys (bench/sql_path.py creates it),
alternating in blocks, and prints the backend CPU per pair for each, to find where the
functions' cost is rather than to report a target.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import ENDPOINT, REQUEST, RESPONSE  # noqa: E402

FN_CLAIM = (
    "SELECT key_id, claim_token FROM idem_claim(p_key => %s, p_user_id => %s, p_endpoint => %s, p_request => %s::jsonb)"
)
FN_COMPLETE = (
    "SELECT idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => %s::jsonb, p_claim_token => %s)"
)
RAW_CLAIM = (
    "INSERT INTO bench_raw_keys AS k (idem_key, scope_user_id, scope_endpoint, request_hash, "
    "status, created_at, locked_at, expires_at) VALUES (%s, %s, %s, "
    "encode(sha256(convert_to(%s::jsonb::text, 'UTF8')), 'hex'), 'in_flight', now(), now(), "
    "now() + interval '24 hours') ON CONFLICT ON CONSTRAINT uq_bench_raw_key_user_endpoint "
    "DO NOTHING RETURNING k.id"
)
RAW_COMPLETE = (
    "UPDATE bench_raw_keys k SET status = 'completed', response_code = 201, "
    "response_body = %s::jsonb WHERE k.id = %s AND k.status = 'in_flight'"
)


def backend_cpu_us(pid: int) -> float:
    """The process's time on a CPU so far (schedstat: nanoseconds, not 10 ms ticks)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1000.0


def block(conn: psycopg.Connection, pid: int, side: str, n: int) -> tuple[float, float]:
    """(claim CPU µs, complete CPU µs) per call over n fresh keys."""
    claim_us = complete_us = 0.0
    for _ in range(n):
        key = str(uuid.uuid4())
        user = 1 + hash(key) % 1000
        t0 = backend_cpu_us(pid)
        token = None
        if side == "fn":
            kid, token = conn.execute(FN_CLAIM, (key, user, ENDPOINT, REQUEST), prepare=True).fetchone()  # type: ignore[misc]
        else:
            kid = conn.execute(RAW_CLAIM, (key, user, ENDPOINT, REQUEST), prepare=True).fetchone()[0]  # type: ignore[index]
        t1 = backend_cpu_us(pid)
        if side == "fn":
            conn.execute(FN_COMPLETE, (kid, RESPONSE, token), prepare=True)
        else:
            conn.execute(RAW_COMPLETE, (RESPONSE, kid), prepare=True)
        t2 = backend_cpu_us(pid)
        claim_us += t1 - t0
        complete_us += t2 - t1
    return claim_us / n, complete_us / n


def measure(url: str, n: int = 20000, blocks: int = 4) -> dict[str, tuple[float, float]]:
    with psycopg.connect(url, autocommit=True) as conn:
        pid = conn.info.backend_pid
        block(conn, pid, "fn", 200)  # warm: compile the functions, prepare the statements
        block(conn, pid, "raw", 200)
        sums = {"fn": [0.0, 0.0], "raw": [0.0, 0.0]}
        for i in range(blocks):
            for side in ("fn", "raw") if i % 2 == 0 else ("raw", "fn"):
                a, b = block(conn, pid, side, n // blocks)
                sums[side][0] += a / blocks
                sums[side][1] += b / blocks
    return {k: (v[0], v[1]) for k, v in sums.items()}


def main() -> int:
    url = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    res = measure(url, n)
    for side, (claim, complete) in res.items():
        print(f"{side:4} claim {claim:6.1f} µs  complete {complete:6.1f} µs  total {claim + complete:6.1f} µs")
    fn, raw = sum(res["fn"]), sum(res["raw"])
    print(f"raw / functions CPU per pair: {raw / fn:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
