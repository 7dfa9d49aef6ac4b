"""Backend CPU of the pool's reset (``queries.RESET_SESSION``) against ``SELECT 1``.

    python -m bench.levers.reset_cost URL [N]

The shim's pool runs the reset on each connection given back, on its worker thread after the
answer: a cost of the database's, not of the request's wall time. CPU from /proc/PID/schedstat,
so run it on the database's machine; the median of 5 blocks of N statements each.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psycopg

from idem_shim import queries


def _cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def main(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        pid = conn.info.backend_pid
        runs: dict[str, list[tuple[float, float]]] = {}
        for _ in range(5):
            for name, statement in (("SELECT 1", "SELECT 1"), ("the pool's reset", queries.RESET_SESSION)):
                cpu, wall = _cpu_ns(pid), time.perf_counter()
                for _ in range(n):
                    conn.execute(statement, prepare=False)
                runs.setdefault(name, []).append(
                    ((_cpu_ns(pid) - cpu) / n / 1000, (time.perf_counter() - wall) / n * 1e6)
                )
        for name, values in runs.items():
            cpu_us = sorted(v[0] for v in values)[2]
            wall_us = sorted(v[1] for v in values)[2]
            print(f"{name}: backend CPU {cpu_us:.1f} µs, wall {wall_us:.1f} µs per statement (median of 5 x {n})")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000)
