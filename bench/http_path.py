"""Parts 2 and 6, the HTTP path and memory: gunicorn + wrk, decorated against undecorated.

Four gunicorn servers run side by side with the project's own settings
(examples/raptor/gunicorn.conf.py: sync workers, WEB_CONCURRENCY workers each):
- Raptor's order route decorated, and the same app with RAPTOR_IDEMPOTENCY=off (the same
  handler and transaction handling, no idempotency layer);
- bench/app.py's single-INSERT route decorated, and with BENCH_IDEMPOTENCY=off.
wrk (Debian's, one thread, a Lua script) sends every request with a fresh Idempotency-Key;
the decorated and undecorated servers are loaded in turn (A/B, B/A, ...) and the medians
compared. A replay-only run repeats keys that already completed. The decorated Raptor's
workers' RSS is read after the warm-up and again after `memory_requests` requests.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from bench.common import (
    BENCH,
    OUT,
    ROOT,
    Mode,
    Report,
    execute,
    fmt_int,
    fmt_ms,
    fmt_x,
    log,
    median,
    ratio,
)

USERS = 256  # Raptor users (tokens): orders lock the user's account row, so few users would
# measure lock queues between requests of one user, not the idempotency layer
ORDER_BODY = '{"symbol": "AAPL", "side": "buy", "qty": 1}'
ITEM_BODY = '{"sku": "bench-widget", "qty": 1, "note": "single INSERT"}'
REPLAY_KEYS = 200
WORKER_CPU_TARGET_US = 200  # the decoration's share of a worker's CPU per request
PY = sys.executable


def wrk_bin() -> str | None:
    return shutil.which("wrk")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One gunicorn master started by the benchmark (and stopped by it, by pid)."""

    def __init__(self, name: str, app: str, env: dict[str, str], workers: int, python: str = PY) -> None:
        self.name, self.app, self.port, self.workers_n = name, app, free_port(), workers
        self.python = python  # the venv that serves it (bench/peers: .venv-peers for the peers)
        self.env = {
            **os.environ,
            **env,
            "PORT": str(self.port),
            "HOST": "127.0.0.1",
            "WEB_CONCURRENCY": str(workers),
            "GUNICORN_LOGLEVEL": "warning",
            "PYTHONPATH": env.get("PYTHONPATH", str(ROOT)),  # a lever may put an older shim first
        }
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # each server gets its own (conf)
        self.log_path = OUT / f"gunicorn_{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        OUT.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as logf:
            self.proc = subprocess.Popen(
                [self.python, "-m", "gunicorn", "-c", str(ROOT / "examples/raptor/gunicorn.conf.py"), self.app],
                env=self.env,
                cwd=ROOT,
                stdout=logf,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout: float = 30, tries: int = 3) -> None:
        """Until every worker answers /healthz. free_port's port is free only when it is chosen: a
        client's connection may take it as its source port before gunicorn binds it, so a server
        refused its port starts again on another one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                log = self.log_path.read_text()
                if "Connection in use" in log and tries > 1:
                    self.port = free_port()
                    self.env["PORT"] = str(self.port)
                    self.start()
                    return self.wait_ready(max(deadline - time.monotonic(), 1.0), tries - 1)
                raise RuntimeError(f"{self.name}: gunicorn exited: {log[-1500:]}")
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=2) as r:  # noqa: S310 (http://127.0.0.1)
                    if r.status == 200 and len(self.workers()) == self.workers_n:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: not ready after {timeout} s: {self.log_path.read_text()[-1500:]}")

    def workers(self) -> list[int]:
        assert self.proc is not None
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []

    def rss_kib(self) -> dict[int, int]:
        out = {}
        for pid in self.workers():
            try:
                with open(f"/proc/{pid}/status") as f:
                    m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
                if m:
                    out[pid] = int(m.group(1))
            except OSError:
                pass
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # gunicorn: graceful stop of its workers
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class WrkRun:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    bad: int  # non-2xx/3xx responses plus socket errors
    app_us: float = float("nan")  # CPU of the gunicorn processes per request
    db_us: float = float("nan")  # CPU of the database's backends per request
    # percentile -> ms, from fresh.lua's done() (bench/plots.py draws the distribution)
    percentiles: dict[float, float] = field(default_factory=dict)


def proc_cpu_us(pid: int) -> float:
    """Time the process has spent on a CPU (schedstat, nanoseconds), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1000.0
    except (OSError, ValueError, IndexError):
        return 0.0


class CpuMeter:
    """CPU spent by one server's processes and by every backend of the database, per request.

    Only one server is loaded at a time, so the backends' CPU is that server's database work
    (the idle server's backends spend next to nothing). All run on this machine: this is the
    split between the app's CPU and the database's, the figure that matters when the database
    has a machine of its own, as in production.
    """

    def __init__(self, admin_url: str) -> None:
        self.conn = psycopg.connect(admin_url, autocommit=True)

    def _backends(self) -> dict[int, float]:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        return {int(r[0]): proc_cpu_us(int(r[0])) for r in rows}

    def snapshot(self, server: Server) -> tuple[float, dict[int, float]]:
        assert server.proc is not None
        app = sum(proc_cpu_us(p) for p in [server.proc.pid, *server.workers()])
        return app, self._backends()

    def per_request(self, server: Server, before: tuple[float, dict[int, float]], run: WrkRun) -> None:
        app, backends = self.snapshot(server)
        n = max(run.requests, 1)
        run.app_us = (app - before[0]) / n
        run.db_us = sum(v - before[1].get(p, 0.0) for p, v in backends.items()) / n

    def close(self) -> None:
        self.conn.close()


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else float("nan")


_RUNS = [int(time.time()) % 1_000_000 * 1000]


def wrk(url: str, script: str, args: list[str], seconds: int, connections: int) -> WrkRun:
    binary = wrk_bin()
    assert binary
    cmd = [
        binary,
        "-t1",
        f"-c{connections}",
        f"-d{seconds}s",
        "--latency",
        "--timeout",
        "10s",
        "-s",
        str(BENCH / "wrk" / script),
        url,
        "--",
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = proc.stdout
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed: {proc.stderr[-1000:]} {out[-1000:]}")
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    n = re.search(r"(\d+) requests in", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    bad = int(non2xx.group(1)) if non2xx else 0
    if sock:
        # sync workers close every connection: the read errors wrk may count on a close are
        # not failed requests; connect errors and timeouts are
        bad += int(sock.group(1)) + int(sock.group(4))
    dist = re.search(r"^idem-percentiles (\S+)$", out, re.M)
    percentiles = (
        {float(p): int(us) / 1000.0 for p, us in (pair.split("=") for pair in dist.group(1).split(","))} if dist else {}
    )
    return WrkRun(
        percentiles=percentiles,
        rps=float(rps.group(1)) if rps else 0.0,
        p50_ms=_ms(p50.group(1)) if p50 else float("nan"),
        p99_ms=_ms(p99.group(1)) if p99 else float("nan"),
        requests=int(n.group(1)) if n else 0,
        bad=bad,
    )


def fresh_run(server: Server, path: str, tokens: Path, body: str, seconds: int) -> WrkRun:
    _RUNS[0] += 1
    # two requests queued per worker keep every worker busy
    return wrk(server.base + path, "fresh.lua", [str(_RUNS[0]), str(tokens), body], seconds, 2 * server.workers_n)


def setup(admin_url: str, users: int) -> tuple[str, list[str]]:
    """Raptor's schema and role, `users` users with (practically) unlimited paper cash."""
    sys.path.insert(0, str(ROOT))
    from examples.raptor.cli import app_url, init_db, seed_user

    init_db(admin_url)
    tokens = [seed_user(admin_url, cash_cents=10**15, with_leg=False)["token"] for _ in range(users)]
    from bench.app import SCHEMA

    execute(admin_url, SCHEMA)
    return app_url(admin_url), tokens


def post(server: Server, path: str, key: str, token: str, body: str) -> int:
    headers = {"Content-Type": "application/json", "Idempotency-Key": key, "Authorization": f"Bearer {token}"}
    req = urllib.request.Request(  # noqa: S310 (http://127.0.0.1 only)
        server.base + path, data=body.encode(), method="POST", headers=headers
    )
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310
        return int(r.status)


def alternate(
    a: Server, b: Server, path: str, tokens: Path, body: str, mode: Mode, meter: CpuMeter
) -> tuple[list[WrkRun], list[WrkRun]]:
    runs_a: list[WrkRun] = []
    runs_b: list[WrkRun] = []
    for i in range(mode.http_pairs):
        for side in (a, b) if i % 2 == 0 else (b, a):
            before = meter.snapshot(side)
            r = fresh_run(side, path, tokens, body, mode.http_seconds)
            meter.per_request(side, before, r)
            (runs_a if side is a else runs_b).append(r)
            log(
                f"http {side.name}: {r.rps:,.0f} req/s p50 {r.p50_ms:.2f} ms p99 {r.p99_ms:.2f} ms "
                f"({r.requests} requests, {r.bad} bad), CPU/request app {r.app_us:.0f} µs "
                f"db {r.db_us:.0f} µs"
            )
    return runs_a, runs_b


def cpu_split(dec: list[WrkRun], und: list[WrkRun]) -> tuple[str, float]:
    """ "app X → Y µs, database X → Y µs per request" and the app-side ratio."""
    da, ua = median([r.app_us for r in dec]), median([r.app_us for r in und])
    dd, ud = median([r.db_us for r in dec]), median([r.db_us for r in und])
    text = (
        f"app {ua:,.0f} → {da:,.0f} µs (+{da - ua:,.0f}), database {ud:,.0f} → {dd:,.0f} µs "
        f"(+{dd - ud:,.0f}); CPU-bound estimate of the ratio: all CPU "
        f"{fmt_x(ratio(ua + ud, da + dd))}, app only {fmt_x(ratio(ua, da))}"
    )
    return text, ratio(ua, da)


def summary(runs: list[WrkRun]) -> str:
    return (
        f"{fmt_int(median([r.rps for r in runs]))} req/s, p50 {fmt_ms(median([r.p50_ms for r in runs]))}, "
        f"p99 {fmt_ms(median([r.p99_ms for r in runs]))}"
    )


def run(admin_url: str, mode: Mode, report: Report, memory: bool = True) -> None:
    part = "2 HTTP"
    if not wrk_bin():
        report.add(part, "HTTP path", "not run: wrk is not installed (apt-get install wrk)", "runs", False)
        return
    app_url, tokens = setup(admin_url, 8 if mode.name == "smoke" else USERS)
    OUT.mkdir(parents=True, exist_ok=True)
    tokens_file = OUT / "tokens.txt"
    tokens_file.write_text("\n".join(tokens) + "\n")
    w = mode.http_workers
    servers = {
        "orders_on": Server(
            "orders_on", "examples.raptor:create_app()", {"DATABASE_URL": app_url, "RAPTOR_IDEMPOTENCY": "on"}, w
        ),
        "orders_off": Server(
            "orders_off", "examples.raptor:create_app()", {"DATABASE_URL": app_url, "RAPTOR_IDEMPOTENCY": "off"}, w
        ),
        "items_on": Server(
            "items_on", "bench.app:create_app()", {"DATABASE_URL": admin_url, "BENCH_IDEMPOTENCY": "on"}, w
        ),
        "items_off": Server(
            "items_off", "bench.app:create_app()", {"DATABASE_URL": admin_url, "BENCH_IDEMPOTENCY": "off"}, w
        ),
    }
    orders, items = "/api/trading/orders", "/bench/items"
    meter = CpuMeter(admin_url)
    try:
        for s in servers.values():
            s.start()
        for s in servers.values():
            s.wait_ready()
        for name, s in servers.items():  # warm-up: pools open, statements prepared
            if mode.name == "smoke":
                break
            fresh_run(
                s,
                orders if name.startswith("orders") else items,
                tokens_file,
                ORDER_BODY if name.startswith("orders") else ITEM_BODY,
                1,
            )
        on = servers["orders_on"]
        rss_before = on.rss_kib()
        served = 0

        dec, und = alternate(on, servers["orders_off"], orders, tokens_file, ORDER_BODY, mode, meter)
        served += sum(r.requests for r in dec)
        d_rps = median([r.rps for r in dec])
        runs = f"{2 * w} connections, {w} sync workers, median of {mode.http_pairs} × {mode.http_seconds} s"
        report.add(part, f"order route decorated, fresh keys ({runs})", summary(dec))
        report.add(part, "order route undecorated (RAPTOR_IDEMPOTENCY=off)", summary(und))
        o_ratio = median([a.rps / b.rps for a, b in zip(dec, und, strict=True)])
        pairs = ", ".join(f"{a.rps / b.rps:.2f}" for a, b in zip(dec, und, strict=True))
        report.add(
            part,
            f"order route decorated / undecorated, median of the pairs ({pairs})",
            fmt_x(o_ratio),
            "≥ 0.75×",
            o_ratio >= 0.75,
        )
        report.add(
            part, "order route CPU per request, undecorated → decorated (where the cost is)", cpu_split(dec, und)[0]
        )

        # replay-only: REPLAY_KEYS keys completed once each, then repeated at random
        pairs_file = OUT / "replay_pairs.txt"
        lines = []
        for i in range(REPLAY_KEYS):
            key, token = str(uuid.uuid4()), tokens[i % len(tokens)]
            post(on, orders, key, token, ORDER_BODY)
            lines.append(f"{key} {token}")
        pairs_file.write_text("\n".join(lines) + "\n")
        replays_before = _replay_rows(admin_url)
        rep = wrk(on.base + orders, "replay.lua", [str(pairs_file), ORDER_BODY], mode.http_seconds, 2 * w)
        served += rep.requests + REPLAY_KEYS
        replayed = _replay_rows(admin_url) - replays_before
        report.add(
            part,
            f"order route, replays only ({REPLAY_KEYS} completed keys repeated)",
            f"{fmt_int(rep.rps)} req/s, p50 {fmt_ms(rep.p50_ms)}, p99 {fmt_ms(rep.p99_ms)}",
        )
        d_p50 = median([r.p50_ms for r in dec])
        report.add(
            part,
            "replay / fresh decorated: throughput (p50 latency)",
            f"{fmt_x(ratio(rep.rps, d_rps))} ({fmt_x(ratio(rep.p50_ms, d_p50))})",
            "replay faster: > 1× (p50 < 1×)",
            rep.rps > d_rps and rep.p50_ms < d_p50,
        )
        if abs(replayed - rep.requests) > 2 * w:
            report.note(f"replay run: {rep.requests:,} requests but {replayed:,} replay audit rows")

        idec, iund = alternate(servers["items_on"], servers["items_off"], items, tokens_file, ITEM_BODY, mode, meter)
        i_ratio = median([a.rps / b.rps for a, b in zip(idec, iund, strict=True)])
        report.add(part, f"single-INSERT route (bench/app.py) decorated ({runs})", summary(idec))
        report.add(part, "single-INSERT route undecorated (BENCH_IDEMPOTENCY=off)", summary(iund))
        pairs = ", ".join(f"{a.rps / b.rps:.2f}" for a, b in zip(idec, iund, strict=True))
        report.add(
            part,
            f"single-INSERT decorated / undecorated, median of the pairs ({pairs})",
            fmt_x(i_ratio),
            "≥ 0.60×",
            i_ratio >= 0.6,
        )
        report.add(part, "single-INSERT CPU per request, undecorated → decorated", cpu_split(idec, iund)[0])
        worker_added = median([r.app_us for r in idec]) - median([r.app_us for r in iund])
        report.add(
            part,
            "single-INSERT: the worker's added CPU per request (gunicorn processes, schedstat)",
            f"{worker_added:+,.0f} µs",
            f"≤ +{WORKER_CPU_TARGET_US} µs",
            worker_added <= WORKER_CPU_TARGET_US,
        )
        bad = sum(r.bad for r in dec + und + idec + iund + [rep])
        if bad:
            report.note(
                f"HTTP: {bad} responses were not 2xx (or failed to connect): rerun "
                f"with --keep and read bench/out/run-PID/gunicorn_*.log"
            )

        if memory:
            while served < mode.memory_requests:  # top up the decorated Raptor to N requests
                r = fresh_run(
                    on,
                    orders,
                    tokens_file,
                    ORDER_BODY,
                    max(1, min(15, int((mode.memory_requests - served) / max(d_rps, 1)) + 1)),
                )
                served += r.requests
            rss_after = on.rss_kib()
            _memory(report, rss_before, rss_after, served)
    finally:
        meter.close()
        for s in servers.values():
            s.stop()


def _replay_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM audit_log WHERE action = 'idempotency_replay'").fetchone()
    return int(row[0]) if row else 0


def _memory(report: Report, before: dict[int, int], after: dict[int, int], served: int) -> None:
    part = "6 memory"
    common = sorted(set(before) & set(after))
    if not common:
        report.add(part, "worker RSS", "workers were replaced during the run", "no growth", False)
        return
    growth = [after[p] - before[p] for p in common]
    worst = max(growth)
    rel = worst / before[common[growth.index(worst)]]
    report.add(
        part,
        f"decorated Raptor worker RSS before → after {served:,} requests "
        f"({len(common)} workers, ~{served // len(common):,} each)",
        ", ".join(f"{before[p] / 1024:.1f} → {after[p] / 1024:.1f} MiB" for p in common),
    )
    report.add(
        part, "largest growth of one worker", f"{worst / 1024:+.1f} MiB ({rel:+.1%})", "≤ +10 % (noise)", rel <= 0.10
    )
