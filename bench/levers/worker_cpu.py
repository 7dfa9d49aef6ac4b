"""Lever: the worker's half. gunicorn worker CPU per request, decorated against undecorated.

    python -m bench.levers.worker_cpu ADMIN_URL [ROUNDS] [SECONDS] [OLD_PYTHON_DIR]

bench/app.py's single-INSERT route in two gunicorn servers of one sync worker each
(BENCH_IDEMPOTENCY on/off), loaded in turn by wrk with one connection; the worker's CPU
(/proc/PID/schedstat) divided by the requests served. ADMIN_URL: a fresh migrated database
(scripts/testdb.py fresh NAME). Profile the decorated worker with py-spy (pip install py-spy):
`py-spy record --gil -r 400 -f raw -p WORKER_PID` while wrk runs. OLD_PYTHON_DIR (e.g. the
python/ of `git worktree add /tmp/before REV`) adds a third server, decorated with that shim
(first on its PYTHONPATH), in the same rotation: the before and after of a change in one run.
"""

from __future__ import annotations

import random
import statistics
import sys

from bench import common
from bench.http_path import ITEM_BODY, Server, proc_cpu_us, setup, wrk


def main() -> None:
    url = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    seconds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    common.OUT.mkdir(parents=True, exist_ok=True)
    _, tokens = setup(url, 2)
    tokens_file = common.OUT / "worker_cpu_tokens.txt"
    tokens_file.write_text("\n".join(tokens) + "\n")
    on = Server("on", "bench.app:create_app()", {"DATABASE_URL": url, "BENCH_IDEMPOTENCY": "on"}, 1)
    off = Server("off", "bench.app:create_app()", {"DATABASE_URL": url, "BENCH_IDEMPOTENCY": "off"}, 1)
    servers = [on, off]
    if len(sys.argv) > 4:
        env = {"DATABASE_URL": url, "BENCH_IDEMPOTENCY": "on", "PYTHONPATH": f"{sys.argv[4]}:{common.ROOT}"}
        servers.append(Server("before", "bench.app:create_app()", env, 1))
    results: dict[str, list[float]] = {s.name: [] for s in servers}
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait_ready()
        for i in range(rounds + 1):  # round 0 warms up
            for s in servers if i % 2 == 0 else servers[::-1]:
                worker = s.workers()[0]
                before = proc_cpu_us(worker)
                r = wrk(
                    s.base + "/bench/items",
                    "fresh.lua",
                    [str(random.randrange(2**31)), str(tokens_file), ITEM_BODY],
                    seconds,
                    1,
                )
                if i:
                    results[s.name].append((proc_cpu_us(worker) - before) / max(r.requests, 1))
    finally:
        for s in servers:
            s.stop()
    for name, values in results.items():
        print(
            f"{name}: worker CPU per request {statistics.median(values):.0f} µs "
            f"({', '.join(f'{v:.0f}' for v in values)})"
        )
    print(f"added by the decoration: {statistics.median(results['on']) - statistics.median(results['off']):+.0f} µs")
    if "before" in results:
        before = statistics.median(results["before"]) - statistics.median(results["off"])
        print(f"added by the decoration with the shim of {sys.argv[4]}: {before:+.0f} µs")


if __name__ == "__main__":
    main()
