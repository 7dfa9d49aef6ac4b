"""The store's server stopped under load: what the clients of a Tier-1 route get while it is down,
and how soon the route serves again once it is back.

    python -m bench.outage [SECONDS] [WORKERS] [RESTARTS] [OLD_PYTHON_DIR]

A durable cluster of its own (fsync on; tests/python/e2e's harness), migrated, serves
tests/python/e2e/outage_app.py's ``POST /orders`` (fail_closed, one INSERT through
``connection()``) under gunicorn with WORKERS sync workers (4), every ``IDEM_*`` setting at its
default. wrk (two connections per worker, a fresh key per request) loads it for SECONDS (10)
with the store up; then the server is stopped (``pg_ctl -m fast``) and wrk loads it for SECONDS
more while it is down: answers per second, their statuses, p50 and p99. Then the server is
started again (``pg_ctl -w``: it returns once the server accepts connections) and one client
posts fresh keys one after another: the time from there to the first 201, and to the last 503.
The outage and the restart are repeated RESTARTS times (1). Last, the gunicorn log's lines: the
breaker's ``store_down``/``store_back`` per worker, and psycopg_pool's own attempts.

OLD_PYTHON_DIR (the python/ of `git worktree add /tmp/before REV`) runs the same again with that
shim first on the workers' PYTHONPATH: the before and after of a change on one machine. Nothing
is asserted (tests/python/e2e/test_outage.py does that); the figures go to bench/README.md
with the machine's load, printed before and after.
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import requests

from bench import common
from bench.http_path import WrkRun, wrk, wrk_bin
from tests.python.e2e.e2e_harness import ROOT, Cluster, Database, Server, prepare_template
from tests.python.e2e.outage_app import install

APP = "tests.python.e2e.outage_app:create_app()"
BODY = '{"qty": 1}'
RECOVERY_WATCH = 3.0  # seconds the restart's client keeps posting after its first 201


@dataclass
class Recovery:
    first_201_s: float  # from pg_ctl start's return to the first 201's answer
    last_503_s: float  # to the last 503's answer (0: none)
    answers: Counter[int]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def recover(server: Server) -> Recovery:
    """Fresh keys, one request at a time, from the moment the store accepts connections."""
    started = time.monotonic()
    first = last_503 = 0.0
    answers: Counter[int] = Counter()
    session = requests.Session()
    while not first or time.monotonic() - started < first + RECOVERY_WATCH:
        try:
            status = session.post(
                server.base + "/orders", data=BODY, headers=_headers(str(uuid.uuid4())), timeout=30
            ).status_code
        except requests.RequestException:
            status = 0
        answered = time.monotonic() - started
        answers[status] += 1
        if status == 201 and not first:
            first = answered
        elif status != 201:
            last_503 = answered
        if answered > 60:
            raise RuntimeError(f"no 201 within 60 s of the restart: {dict(answers)}\n{server.log()[-3000:]}")
    return Recovery(first, last_503, answers)


def _headers(key: str) -> dict[str, str]:
    return {"Content-Type": "application/json", "Idempotency-Key": key}


def run_wrk(server: Server, seconds: int, workers: int, tokens: str) -> WrkRun:
    return wrk(server.base + "/orders", "fresh.lua", [str(time.time_ns() % 2**31), tokens, BODY], seconds, 2 * workers)


def describe(run: WrkRun) -> str:
    return (
        f"{run.rps:,.0f} answers/s ({run.requests:,} in all, {run.bad:,} not 2xx), "
        f"p50 {common.fmt_ms(run.p50_ms)}, p99 {common.fmt_ms(run.p99_ms)}"
    )


def lines_per_worker(log: str, event: str) -> Counter[int]:
    return Counter(int(pid) for pid in re.findall(rf"\[(\d+)\] \w+ idem_shim: idempotency {event}\b", log))


def measure(
    name: str, db: Database, user_id: int, env: dict[str, str], seconds: int, workers: int, restarts: int
) -> None:
    tokens = common.OUT / "outage_tokens.txt"
    tokens.write_text("none\n")  # fresh.lua sends one; outage_app reads no session
    server = Server(
        db.app_url,
        env={"IDEM_DATABASE_URL": db.app_url, "E2E_USER_ID": str(user_id), **env},
        workers=workers,
        app=APP,
    ).start()  # examples/raptor/gunicorn.conf.py: sync workers, as Raptor's
    try:
        print(f"[{name}] load {load()}")
        run_wrk(server, 2, workers, str(tokens))  # warm-up
        print(f"[{name}] store up, {seconds} s: {describe(run_wrk(server, seconds, workers, str(tokens)))}")
        for i in range(restarts):
            db.cluster.stop("fast")
            try:
                down = run_wrk(server, seconds, workers, str(tokens))
            finally:
                db.cluster.start()
            back = recover(server)
            print(f"[{name}] outage {i + 1}, {seconds} s, store down: {describe(down)}")
            print(
                f"[{name}] restart {i + 1}: first 201 {back.first_201_s * 1000:.0f} ms after the server accepted "
                f"connections, last 503 at {back.last_503_s * 1000:.0f} ms; "
                f"answers {dict(sorted(back.answers.items()))}"
            )
        log = server.log()
        downs, backs = lines_per_worker(log, "store_down"), lines_per_worker(log, "store_back")
        print(
            f"[{name}] log: store_down per worker {sorted(downs.values())}, store_back {sorted(backs.values())}, "
            f"store_unavailable lines {len(re.findall(r' idempotency store_unavailable ', log))}, "
            f"psycopg_pool's 'error connecting' {log.count('error connecting in')}"
        )
        print(f"[{name}] load {load()}")
    finally:
        server.stop()


def main() -> None:
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    restarts = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    old = sys.argv[4] if len(sys.argv) > 4 else None
    if not wrk_bin():
        sys.exit("bench.outage: wrk is missing (apt-get install wrk)")
    common.OUT.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(durable=True)
    try:
        prepare_template(cluster, "outage")
        db = Database(cluster, "outage")
        user_id = install(db)
        measure("this shim", db, user_id, {}, seconds, workers, restarts)
        if old:
            measure(f"the shim of {old}", db, user_id, {"PYTHONPATH": f"{old}:{ROOT}"}, seconds, workers, restarts)
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
