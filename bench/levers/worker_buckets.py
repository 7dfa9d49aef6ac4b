"""Lever: where the worker's added CPU goes, per decorated single-INSERT request, in buckets.

    python -m bench.levers.worker_buckets URL [ROUNDS] [REQUESTS] [plain]

``plain`` stops after the first pass (an older shim on PYTHONPATH, whose functions the buckets
do not name: PYTHONPATH=OLD/python:. python -m bench.levers.worker_buckets URL 8 300 plain).

bench/app.py's route, decorated and undecorated, both in this one process: no gunicorn, no
HTTP, the WSGI call alone (what both sides pay for the socket and the parsing is left out, so
the added figure is the decoration's). CPU is this thread's (``time.thread_time_ns``: the
pools' idle threads are left out). PROMETHEUS_MULTIPROC_DIR is set, as under gunicorn.

Two passes, each of ROUNDS rounds in A/B, B/A order:
1. plain: CPU per request of each side, nothing instrumented (the headline figures);
2. buckets: the same with timing wrappers around the functions named in ``BUCKETS``. A bucket
   is exclusive: time spent in a bucket nested inside another counts to the inner one only.
   What no bucket holds is "Flask, the decorator and the request scope".
The wrappers cost a little per call (bench/README.md); the buckets pass prints its own totals
beside the plain ones.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import psycopg

from bench.levers.wsgi_cpu import cpu_per_request

ITEM_BODY = b'{"sku": "bench-widget", "qty": 1, "note": "single INSERT"}'
OTHER = "Flask, the decorator and the request scope"


class Buckets:
    """Exclusive CPU time per named bucket, from wrappers set on functions and methods."""

    def __init__(self) -> None:
        self.ns: defaultdict[str, int] = defaultdict(int)
        self._stack: list[int] = []  # the child time of each open bucket
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, attr: str, name: str, *, outermost: bool = False) -> None:
        """Time ``owner.attr`` as bucket ``name``; ``outermost``: only when no bucket is open
        (psycopg's ``execute`` is the handler's INSERT unless a shim bucket called it)."""
        raw = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        fn = raw.__func__ if isinstance(raw, staticmethod) else raw
        clock, stack, ns = time.thread_time_ns, self._stack, self.ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            if outermost and stack:
                return fn(*args, **kwargs)
            start = clock()
            stack.append(0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = clock() - start
                ns[name] += elapsed - stack.pop()
                if stack:
                    stack[-1] += elapsed

        setattr(owner, attr, staticmethod(timed) if isinstance(raw, staticmethod) else timed)
        self._undo.append((owner, attr, raw))

    def unwrap(self) -> None:
        for owner, attr, raw in reversed(self._undo):
            setattr(owner, attr, raw)
        self._undo.clear()


def install(buckets: Buckets) -> None:
    """The buckets of the worker's added CPU (the names say what each holds)."""
    import flask
    import psycopg_pool

    from idem_shim import decorator, metrics, records, replay, scope, store

    w = buckets.wrap
    w(psycopg_pool.ConnectionPool, "getconn", "pool checkout and return")
    w(psycopg_pool.ConnectionPool, "putconn", "pool checkout and return")
    for name in ("parse_key", "read_body", "request_json"):
        w(decorator, name, "claim's parameters: key, body, fingerprint")
    w(records.ClaimRequest, "params", "claim's parameters: key, body, fingerprint")
    w(store.Store, "_claim_on", "claim's execute (psycopg: adapt, send, wait, decode)")
    w(decorator, "stored_body", "completion's parameters: body JSON, headers")
    w(decorator, "stored_headers", "completion's parameters: body JSON, headers")
    w(store.Store, "complete", "completion's execute + the COMMIT, pipelined")
    w(scope.RequestScope, "commit", "the handler's COMMIT (undecorated: the pool's)")
    w(psycopg.Connection, "commit", "the handler's COMMIT (undecorated: the pool's)")
    w(metrics.Metrics, "record_claim", "metrics (prometheus_client, multiprocess)")
    w(psycopg.Connection, "execute", "the handler's INSERT (psycopg)", outermost=True)
    w(scope.RequestScope, "connection", "BEGIN (scope.connection / psycopg's implicit one)")
    w(flask.Flask, "make_response", "Flask's make_response")
    del replay  # imported so the decorator's names resolve the same objects


def environ(app: Any) -> dict[str, Any]:
    from werkzeug.test import EnvironBuilder

    headers = {"Idempotency-Key": str(uuid.uuid4()), "Content-Type": "application/json"}
    return EnvironBuilder(path="/bench/items", method="POST", data=ITEM_BODY, headers=headers).get_environ()


def serve(app: Any, n: int) -> float:
    """CPU µs per request over ``n`` requests, each a fresh key; the environ is built untimed."""
    return cpu_per_request(app, [environ(app) for _ in range(n)], time.thread_time_ns, "worker_buckets")


def make_apps(url: str) -> dict[str, Any]:
    os.environ["DATABASE_URL"] = url
    from bench.app import SCHEMA, create_app

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("INSERT INTO users (id) VALUES (1) ON CONFLICT DO NOTHING")
    apps = {}
    for side in ("decorated", "undecorated"):
        os.environ["BENCH_IDEMPOTENCY"] = "on" if side == "decorated" else "off"
        apps[side] = create_app()
    return apps


def alternate(apps: dict[str, Any], rounds: int, n: int, between: Callable[[str, int], None]) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {side: [] for side in apps}
    order = list(apps)
    for i in range(rounds + 1):  # round 0 warms up (prepared statements, metric children)
        for side in order if i % 2 else order[::-1]:
            between(side, i)
            spent = serve(apps[side], n)
            if i:
                results[side].append(spent)
    return results


def main() -> None:
    url = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 400
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="idem-buckets-"))
    apps = make_apps(url)

    plain = alternate(apps, rounds, n, lambda side, i: None)
    on, off = (statistics.median(plain[s]) for s in ("decorated", "undecorated"))
    print(f"plain, {rounds} rounds of {n} requests, median CPU per request (this thread):")
    for side, values in plain.items():
        print(f"  {side}: {statistics.median(values):.0f} µs ({', '.join(f'{v:.0f}' for v in values)})")
    print(f"  added by the decoration: {on - off:+.0f} µs")
    if sys.argv[4:] == ["plain"]:
        return

    buckets = Buckets()
    install(buckets)
    per_side: dict[str, defaultdict[str, float]] = {s: defaultdict(float) for s in apps}
    current: list[Any] = []

    def between(side: str, i: int) -> None:  # bank the last side's buckets (not the warm-up's)
        if current and current[1]:
            for name, ns in buckets.ns.items():
                per_side[current[0]][name] += ns
        buckets.ns.clear()
        current[:] = [side, i]

    timed = alternate(apps, rounds, n, between)
    between("", 0)
    buckets.unwrap()
    served = rounds * n
    print(
        f"\nbuckets, µs per request (exclusive; instrumented totals {statistics.median(timed['decorated']):.0f}"
        f" / {statistics.median(timed['undecorated']):.0f} µs):"
    )
    print("| bucket | decorated | undecorated | added |")
    print("| --- | ---: | ---: | ---: |")
    names = sorted({k for s in per_side.values() for k in s}, key=lambda k: -per_side["decorated"][k])
    rest = {s: statistics.median(timed[s]) - sum(per_side[s].values()) / served / 1000 for s in apps}
    for name in [*names, OTHER]:
        d, u = ((rest[s] if name == OTHER else per_side[s][name] / served / 1000) for s in ("decorated", "undecorated"))
        print(f"| {name} | {d:.1f} | {u:.1f} | {d - u:+.1f} |")
    added = statistics.median(timed["decorated"]) - statistics.median(timed["undecorated"])
    print(
        f"| **total** | {statistics.median(timed['decorated']):.1f} | "
        f"{statistics.median(timed['undecorated']):.1f} | {added:+.1f} |"
    )


if __name__ == "__main__":
    main()
