"""Lever (the machine's, not idem's): what a round trip costs when the cores idle between steps.

    python -m bench.levers.idle_wakeups URL [ROUNDS] [REQUESTS]

One request at a time, every step that waits on the other process (a query waiting on the
backend, the backend waiting on the next query) lets a core go idle, and waking an idle core of a
virtual machine is a trip through the host when the guest does not poll before it halts (this
kind's kernel command line: ``haltpoll.guest_halt_poll_ns=0``). This prints, in one run:

1. ``SELECT 1`` (prepared) wall time, back to back and with a 2 ms pause between calls (what the
   one-client parts see: the cores idle between requests and during every round trip);
2. bench/app.py's single-INSERT route, decorated and undecorated, in this process (the WSGI call,
   no HTTP: bench.levers.worker_buckets' apps), one request at a time with a 2 ms pause, wall p50
   and the added p50;
3. both again while this process holds ``/dev/cpu_dma_latency`` at 0 (what tuned's
   latency-performance profile does: the cores poll instead of halting), when it may (root).

The decorated request has one round trip more than the undecorated one (contract §6): row 1's two
columns say what that round trip costs one request at a time on this machine, a floor of the
one-client targets that lies in the machine, not in idem. Row 3 is the experiment of taking it
away; on this kind it did not (bench/README.md has both runs): the guest's idle driver keeps
halting.
Rounds alternate the sides (A/B, B/A); medians of the rounds' p50s.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from bench.levers.worker_buckets import environ, make_apps

PAUSE_S = 0.002


@contextlib.contextmanager
def cores_polling(on: bool) -> Iterator[bool]:
    """Hold /dev/cpu_dma_latency at 0 while inside (the kernel keeps the request while the file is
    open); yields whether it is held."""
    if not on:
        yield False
        return
    try:
        fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
    except OSError:
        yield False
        return
    try:
        os.write(fd, struct.pack("i", 0))
        yield True
    finally:
        os.close(fd)


def p50_us(run: Callable[[], None], n: int, pause: float) -> float:
    spent = []
    for _ in range(n):
        start = time.perf_counter_ns()
        run()
        spent.append(time.perf_counter_ns() - start)
        if pause:
            time.sleep(pause)
    return statistics.median(spent) / 1000


def request(app: Any) -> Callable[[], None]:
    envs = iter([])

    def one() -> None:
        nonlocal envs
        env = next(envs, None)
        if env is None:
            envs = iter([environ(app) for _ in range(500)])  # built in batches, outside most timings
            env = next(envs)
        body = app.wsgi_app(env, lambda status, headers, exc_info=None: None)
        b"".join(body)
        getattr(body, "close", lambda: None)()

    return one


def main() -> None:
    url = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="idem-idle-"))
    apps = make_apps(url)
    serve = {side: request(app) for side, app in apps.items()}
    with psycopg.connect(url, autocommit=True) as conn:
        select = lambda: conn.execute("SELECT 1", prepare=True).fetchone()  # noqa: E731
        for side in serve:  # warm-up: prepared statements, pools, metric children
            p50_us(serve[side], 100, 0)
        rows: list[tuple[str, float, float, float, float]] = []
        for polling in (False, True):
            with cores_polling(polling) as held:
                if polling and not held:
                    print("cores polling: /dev/cpu_dma_latency cannot be opened (not root?): rows 3 left out")
                    break
                figures: dict[str, list[float]] = {"rt": [], "rt_paused": [], "decorated": [], "undecorated": []}
                for i in range(rounds):
                    figures["rt"].append(p50_us(select, n, 0))
                    figures["rt_paused"].append(p50_us(select, n, PAUSE_S))
                    for side in ("decorated", "undecorated") if i % 2 == 0 else ("undecorated", "decorated"):
                        figures[side].append(p50_us(serve[side], n, PAUSE_S))
                med = {k: statistics.median(v) for k, v in figures.items()}
                label = "cores polling (cpu_dma_latency 0)" if polling else "default idle (cores halt)"
                rows.append((label, med["rt"], med["rt_paused"], med["undecorated"], med["decorated"]))
    print(f"{rounds} rounds of {n} calls each, medians of the rounds' p50 (µs of wall time):")
    print("| idle | SELECT 1 back to back | SELECT 1, 2 ms apart | route undecorated | route decorated | added p50 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, rt, paused, off, on in rows:
        print(f"| {label} | {rt:.0f} | {paused:.0f} | {off:.0f} | {on:.0f} | {on - off:+.0f} |")


if __name__ == "__main__":
    main()
