"""Lever: does restarting pgbench lift the claims' p99 by itself? No cleanup, nothing else: one
20 s claims run against ten 2 s runs (bench.scale.claims: 500/s, 4 clients), in turn, twice.

    DATABASE_URL=… python -m bench.levers.claim_runs

It did (2026-12-01, durable bench cluster, empty store): p99 1.44 → 4.71 ms and 1.91 → 2.67 ms;
each start's new sessions plan idem_claim and catch up on pgbench's schedule. The cleanup part
used to measure its "during" window as 2 s runs against one "before" run; it now runs one
(bench/scale.py measure_cleanup).
"""

from __future__ import annotations

import os

from bench import common, scale
from bench.common import MODES, percentile


def main() -> None:
    mode = MODES["full"]
    name = f"idem_bench_runs_{os.getpid()}"
    url = common.fresh_db(name)
    try:
        common.add_users(url)
        for round_ in range(2):
            one = scale.claims(url, mode, 20).latencies
            many = [lat for _ in range(10) for lat in scale.claims(url, mode, 2).latencies]
            print(
                f"round {round_}: p99 one 20 s run {percentile(one, 99):.2f} ms ({len(one):,} claims), "
                f"ten 2 s runs {percentile(many, 99):.2f} ms ({len(many):,}); "
                f"p50 {percentile(one, 50):.2f} / {percentile(many, 50):.2f} ms",
                flush=True,
            )
    finally:
        common.drop_db(name)


if __name__ == "__main__":
    main()
