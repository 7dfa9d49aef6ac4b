"""Lever: the worker's CPU of idem's route against the floor's, in one process.

    python -m bench.levers.floor_worker URL [ROUNDS] [REQUESTS]

bench/peers' apps (flask_apps.idem_app and floor_app) served straight through the WSGI call, no
gunicorn, no HTTP: the raw route (no idempotency), idem's decorated route and the floor's (idem's
shape in raw SQL with none of its rules: one claim statement, the completion pipelined with the
COMMIT). Rounds alternate the order of the three; CPU per request of this thread
(``time.thread_time_ns``) and of the process (``time.process_time_ns``: psycopg_pool's threads
too), medians of the rounds. What idem's Python adds beyond the least any implementation of its
shape does is the difference of the last two rows; the database's side is not in these figures
(the peers' harness measures both under load, "The peers side by side").
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from werkzeug.test import EnvironBuilder

from bench.levers.wsgi_cpu import cpu_per_request
from bench.peers import flask_apps, orders

CLOCKS: dict[str, Callable[[], int]] = {"thread": time.thread_time_ns, "process": time.process_time_ns}


def environ(path: str, keyed: bool) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if keyed:
        headers["Idempotency-Key"] = str(uuid.uuid4())
    return EnvironBuilder(path=path, method="POST", data=orders.BODY, headers=headers).get_environ()


def serve(app: Any, path: str, keyed: bool, n: int, clock: Callable[[], int]) -> float:
    """CPU µs per request over ``n`` requests (the environs are built untimed)."""
    return cpu_per_request(app, [environ(path, keyed) for _ in range(n)], clock, f"floor_worker: {path}")


def main() -> None:
    url = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 400
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="idem-floor-"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(orders.SCHEMA)
        conn.execute("INSERT INTO users (id) VALUES (1) ON CONFLICT DO NOTHING")
    flask_apps.floor_store(url)
    idem, floor = flask_apps.idem_app(), flask_apps.floor_app()
    cells = {
        "raw route (no idempotency)": (idem, orders.RAW, False),
        "idem's decorated route": (idem, orders.PROTECTED, True),
        "the floor's route (no rules)": (floor, orders.PROTECTED, True),
    }
    for app, path, keyed in cells.values():  # warm-up: pools, prepared statements, metric children
        serve(app, path, keyed, 200, time.thread_time_ns)
    spent: dict[str, dict[str, list[float]]] = {c: {k: [] for k in CLOCKS} for c in cells}
    for i in range(rounds):
        for cell in list(cells) if i % 2 else list(cells)[::-1]:
            for name, clock in CLOCKS.items():
                spent[cell][name].append(serve(*cells[cell], n, clock))
    raw = {k: statistics.median(spent["raw route (no idempotency)"][k]) for k in CLOCKS}
    print(f"{rounds} rounds of {n} requests per clock, medians, µs of CPU per request (added to the raw route):")
    print("| route | this thread | the process |")
    print("| --- | ---: | ---: |")
    for cell in cells:
        t, p = (statistics.median(spent[cell][k]) for k in CLOCKS)
        print(f"| {cell} | {t:.0f} ({t - raw['thread']:+.0f}) | {p:.0f} ({p - raw['process']:+.0f}) |")


if __name__ == "__main__":
    main()
