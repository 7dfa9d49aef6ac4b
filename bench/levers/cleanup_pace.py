"""Lever: the cleanup's pace. Each configuration deletes the same expired rows beside claims at
the bench's fixed rate; the claims' p99 during / before, the longest claim, rows/s, total time.

    DATABASE_URL=… python -m bench.levers.cleanup_pace [--rows N] [--expired N] [CALL …]

Each CALL (default: the shipped default, 20000/s at batches of 1000, 5000/s, 50000/s and
unpaced) runs on the same table, reloaded with the same expired rows, vacuumed and checkpointed
first (bench.scale.settle). Runs go round-robin, `--rounds` times, so a noisy minute on a shared
machine lands on every configuration alike. Prints one Markdown row per run.
"""

from __future__ import annotations

import argparse
import os
import time

from bench import common, scale
from bench.common import MODES, fmt_int, fmt_ms, fmt_x, percentile

CALLS = [
    "CALL idem_cleanup()",
    "CALL idem_cleanup(p_batch_size => 1000, p_max_rows_per_second => 5000)",
    "CALL idem_cleanup(p_batch_size => 1000, p_max_rows_per_second => 50000)",
    "CALL idem_cleanup(p_batch_size => 5000, p_max_rows_per_second => NULL)",
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_500_000)
    parser.add_argument("--expired", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("calls", nargs="*", default=CALLS)
    args = parser.parse_args()
    mode = MODES["quick"]
    mode = type(mode)(**{**mode.__dict__, "scale_rows": args.rows, "expired_rows": args.expired})
    name = f"idem_bench_pace_{os.getpid()}"
    url = common.fresh_db(name)
    try:
        common.add_users(url)
        common.log(f"loading {args.rows:,} rows ({args.expired:,} expired) ...")
        scale.load(url, args.rows, args.expired)
        print("| call | deleted | seconds | rows/s | p99 before → during | ratio | longest (before) | load |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        first = True
        for _ in range(args.rounds):
            for call in args.calls:
                if not first:
                    scale.reload_expired(url, mode)
                first = False
                run = scale.measure_cleanup(url, mode, call)
                b99, d99 = percentile(run.before.latencies, 99), percentile(run.during, 99)
                print(
                    f"| `{call}` | {run.deleted:,} | {run.seconds:.1f} | {fmt_int(run.deleted / run.seconds)} "
                    f"| {fmt_ms(b99)} → {fmt_ms(d99)} | {fmt_x(run.ratio)} "
                    f"| {fmt_ms(max(run.during, default=float('nan')))} "
                    f"({fmt_ms(max(run.before.latencies, default=float('nan')))}) "
                    f"| {os.getloadavg()[0]:.1f} |",
                    flush=True,
                )
                time.sleep(1)
    finally:
        common.drop_db(name)


if __name__ == "__main__":
    main()
