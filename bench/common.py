"""What every part of the benchmark shares: modes, databases, pgbench, statistics, the table.

Nothing here asserts a timing: a figure is measured, compared with its target and reported.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

#: A statement's parameters, as psycopg takes them.
Params = Sequence[Any] | Mapping[str, Any] | None

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# Logs and scratch files of this run (git-ignored; one directory per process, so a smoke run
# in `make test` never trips over a benchmark running beside it).
OUT = BENCH / "out" / f"run-{os.getpid()}"
PGBENCH_DIR = BENCH / "pgbench"
sys.path[:0] = [str(ROOT / "scripts")]

import testdb  # noqa: E402  (scripts/testdb.py: fresh migrated databases)

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))

# The endpoint and bodies every SQL-level part uses, so the function and raw paths hash the
# same text. The order body is what Raptor's order route receives.
ENDPOINT = "POST /api/trading/orders"
REQUEST = '{"symbol": "AAPL", "side": "buy", "qty": 10, "order_type": "market"}'
OTHER_REQUEST = '{"symbol": "AAPL", "side": "buy", "qty": 11, "order_type": "market"}'
RESPONSE = '{"order_id": 123456, "status": "filled", "fill_price_cents": 18923, "cash_cents": 9810770}'
USERS = 10_000


@dataclass(frozen=True)
class Mode:
    """Sizes and durations of one run; `quick` and `smoke` trade precision for time."""

    name: str
    sql_seconds: int  # one pgbench run of the SQL path
    sql_pairs: int  # A/B pairs (the median of each side is reported)
    path_seconds: int  # replay and mismatch runs
    scale_rows: int  # rows loaded for the scale part
    expired_rows: int  # of which expired (deleted by the cleanup part)
    scale_seconds: int  # one latency run (empty or full table)
    scale_pairs: int
    claim_rate: int  # claims per second offered in the latency runs (fixed rate)
    race_rounds: int
    race_threads: int
    http_seconds: int
    http_pairs: int
    memory_requests: int
    replay_keys: int
    http_workers: int = 4  # gunicorn workers per server (examples/raptor/gunicorn.conf.py's 4)
    latency_pairs: int = 10  # parts 2a/2b: one client, decorated/undecorated runs alternating
    latency_seconds: int = 4
    peers_rounds: int = 3  # part 8 (bench/peers): ABBA rounds; each figure is their median
    peers_seconds: int = 6  # one wrk run of a route at 8 clients (1 client: latency_seconds)
    peers_race_keys: int = 100  # keys of the race, each sent by 10 concurrent requests


MODES = {
    "full": Mode(
        "full",
        sql_seconds=6,
        sql_pairs=7,
        path_seconds=10,
        scale_rows=10_000_000,
        expired_rows=1_000_000,
        scale_seconds=10,
        scale_pairs=3,
        claim_rate=500,
        race_rounds=1000,
        race_threads=16,
        http_seconds=6,
        http_pairs=7,
        memory_requests=100_000,
        replay_keys=100_000,
    ),
    "quick": Mode(
        "quick",
        sql_seconds=3,
        sql_pairs=2,
        path_seconds=3,
        scale_rows=1_500_000,
        expired_rows=1_000_000,  # contract §6's 1 M expired rows, as in the full run
        scale_seconds=3,
        scale_pairs=2,
        claim_rate=500,
        race_rounds=1000,
        race_threads=16,
        http_seconds=4,
        http_pairs=2,
        memory_requests=10_000,
        replay_keys=20_000,
        latency_pairs=6,
        latency_seconds=2,
        peers_seconds=3,
    ),
    "smoke": Mode(
        "smoke",
        sql_seconds=1,
        sql_pairs=1,
        path_seconds=1,
        scale_rows=20_000,
        expired_rows=5_000,
        scale_seconds=1,
        scale_pairs=1,
        claim_rate=200,
        race_rounds=20,
        race_threads=16,
        http_seconds=1,
        http_pairs=1,
        memory_requests=300,
        replay_keys=1_000,
        http_workers=1,
        latency_pairs=1,
        latency_seconds=1,
        peers_rounds=1,
        peers_seconds=1,
        peers_race_keys=5,
    ),
}


# --- the report -------------------------------------------------------------------------


@dataclass
class Row:
    part: str
    figure: str
    value: str
    target: str = ""
    ok: bool | None = None  # None: informational, no target

    @property
    def verdict(self) -> str:
        return "" if self.ok is None else ("pass" if self.ok else "**miss**")


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # what bench/plots.py draws besides the rows: "latency" (2a's runs), "cleanup" (part 4's runs)
    data: dict[str, Any] = field(default_factory=dict)
    # Markdown blocks printed after the table (part 8's side-by-side tables)
    sections: list[str] = field(default_factory=list)

    def add(self, part: str, figure: str, value: str, target: str = "", ok: bool | None = None) -> None:
        row = Row(part, figure, value, target, ok)
        self.rows.append(row)
        verdict = f"  (target {target}: {row.verdict})" if target else ""
        print(f"  [{part}] {figure}: {value}{verdict}", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def markdown(self, header: list[str]) -> str:
        lines = list(header)
        lines += ["", "| part | figure | value | target | result |", "| --- | --- | --- | --- | --- |"]
        # in the order (1 SQL ... 6 memory), whatever order the parts ran in
        for r in sorted(self.rows, key=lambda r: r.part.split()[0]):
            lines.append(f"| {r.part} | {r.figure} | {r.value} | {r.target} | {r.verdict} |")
        if self.notes:
            lines.append("")
            lines += [f"- {n}" for n in self.notes]
        for section in self.sections:
            lines += ["", section.rstrip("\n")]
        return "\n".join(lines) + "\n"


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def in_threads(targets: Iterable[Callable[[], None]], on_error: Callable[[], None] | None = None) -> None:
    """Runs each target in a thread of its own and waits for all; the first error is raised here.
    `on_error` runs in the failing thread (a barrier's abort, so the others stop waiting)."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)
            if on_error is not None:
                on_error()

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# --- numbers ----------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of an unsorted list."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100.0 * len(s) + 0.5) - 1))
    return s[k]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def fmt_ms(x: float) -> str:
    return f"{x:.2f} ms" if x < 10 else f"{x:.1f} ms"


def fmt_rows(n: float) -> str:
    """10 M rows, 20 k rows: a size for a figure's name."""
    if n >= 1e6:
        return f"{n / 1e6:.0f} M rows"
    return f"{n / 1e3:.0f} k rows" if n >= 1e3 else f"{n:.0f} rows"


def fmt_x(x: float) -> str:
    return f"{x:.2f}×"


# --- databases --------------------------------------------------------------------------


def base_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("bench: DATABASE_URL is not set (run it through `make bench`)")
    return url


def fresh_db(name: str) -> str:
    """A new migrated database on DATABASE_URL's server (scripts/testdb.py)."""
    return testdb.fresh(base_url(), name, [])


def drop_db(name: str) -> None:
    testdb.drop(base_url(), name)


def execute(url: str, sql: str, params: Params = None) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql, params)


def scalar(url: str, sql: str, params: Params = None) -> object:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()
    return row[0] if row else None


def add_users(url: str, count: int = USERS) -> None:
    """Scope users 1..count (idempotency_keys.scope_user_id references users)."""
    execute(url, "INSERT INTO users (id) SELECT g FROM generate_series(1, %s) g ON CONFLICT DO NOTHING", (count,))


DURABILITY = ("fsync", "synchronous_commit", "full_page_writes")


@dataclass(frozen=True)
class Server:
    """The settings of the measured server that decide what a commit costs."""

    version: str
    settings: dict[str, str]

    @property
    def durable(self) -> bool:
        return all(self.settings.get(name) == "on" for name in DURABILITY)

    @property
    def shared_buffers(self) -> str:
        sb = self.settings.get("shared_buffers", "?")
        if sb.endswith("8kB") and sb[:-3].isdigit():
            return f"{int(sb[:-3]) * 8 // 1024} MB"
        return sb

    def line(self) -> str:
        """The table's first line: durable or not, and the settings that matter."""
        s = self.settings
        settings = (
            f"fsync {s.get('fsync')}, synchronous_commit {s.get('synchronous_commit')}, "
            f"full_page_writes {s.get('full_page_writes')}, shared_buffers "
            f"{self.shared_buffers}, max_connections {s.get('max_connections')}, "
            f"PostgreSQL {self.version}"
        )
        if self.durable:
            return f"**Server: durable (production shape)**: {settings}"
        off = ", ".join(n for n in DURABILITY if s.get(n) != "on")
        return (
            f"**Server NOT durable ({off} not on): these figures hide the cost of a commit "
            f"that waits for the WAL and are not contract §6's (it asks for a durable server)**: "
            f"{settings}"
        )


def server(url: str) -> Server:
    """The server's settings; raises psycopg.OperationalError when it cannot be reached."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        settings: dict[object, object] = dict(
            conn.execute(
                "SELECT name, setting || COALESCE(unit, '') FROM pg_settings WHERE name = ANY(%s)",
                (["shared_buffers", "max_connections", *DURABILITY],),
            ).fetchall()
        )
    return Server(str(version).split(" ")[0], {str(k): str(v) for k, v in settings.items()})


def machine() -> list[str]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.+)", f.read())
            cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return [
        f"- machine: {os.cpu_count()} cores ({cpu}), {mem_gb:.0f} GiB RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}; the database server on the "
        "same machine",
    ]


def pgbench_available() -> bool:
    return bool(shutil.which("pgbench")) or (PG_BIN / "pgbench").exists()


# --- pgbench ----------------------------------------------------------------------------


def pgbench_bin() -> str:
    found = shutil.which("pgbench") or str(PG_BIN / "pgbench")
    return found


@dataclass
class PgbenchRun:
    tps: float
    latency_avg_ms: float
    transactions: int
    failed: int
    # (end_epoch_seconds, latency_ms) of every transaction when the run was logged
    samples: list[tuple[float, float]] = field(default_factory=list)

    @property
    def latencies(self) -> list[float]:
        return [lat for _, lat in self.samples]


_RUN_COUNTER = [int(time.time()) % 100_000 * 100]


def run_tag() -> int:
    """A number unique to this pgbench run: keys are md5(run:client:seq), never reused."""
    _RUN_COUNTER[0] += 1
    return _RUN_COUNTER[0]


def pgbench(
    url: str,
    script: str,
    *,
    clients: int,
    seconds: float,
    threads: int | None = None,
    rate: int | None = None,
    defines: dict[str, object] | None = None,
    logged: bool = False,
    prepared: bool = True,
) -> PgbenchRun:
    """Runs one pgbench script (bench/pgbench/NAME.sql) for `seconds` and parses its summary.

    `logged` keeps every transaction's latency (pgbench --log) for percentiles.
    """
    OUT.mkdir(parents=True, exist_ok=True)
    threads = threads or min(clients, os.cpu_count() or 1)
    args = [
        pgbench_bin(),
        "-n",
        "-c",
        str(clients),
        "-j",
        str(threads),
        "-T",
        str(seconds),
        "-f",
        str(PGBENCH_DIR / f"{script}.sql"),
        "-D",
        f"run={run_tag()}",
        "-D",
        "seq=0",
        "-D",
        f"users={USERS}",
    ]
    if prepared:
        args += ["-M", "prepared"]
    for k, v in (defines or {}).items():
        args += ["-D", f"{k}={v}"]
    if rate:
        args += ["-R", str(rate)]
    prefix = OUT / f"pgb_{script}_{time.time_ns()}"
    if logged:
        args += ["--log", f"--log-prefix={prefix}"]
    args.append(url)
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0 or "aborted" in proc.stderr:
        raise RuntimeError(f"pgbench {script} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    out = proc.stdout
    tps_m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    lat_m = re.search(r"latency average = ([\d.]+) ms", out)
    tx_m = re.search(r"number of transactions actually processed: (\d+)", out)
    fail_m = re.search(r"number of failed transactions: (\d+)", out)
    run = PgbenchRun(
        tps=float(tps_m.group(1)) if tps_m else 0.0,
        latency_avg_ms=float(lat_m.group(1)) if lat_m else float("nan"),
        transactions=int(tx_m.group(1)) if tx_m else 0,
        failed=int(fail_m.group(1)) if fail_m else 0,
    )
    if logged:
        for path in glob.glob(f"{prefix}.*"):
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    # client_id transaction_no time script_no time_epoch time_us [schedule_lag]
                    if len(parts) >= 6 and parts[2].isdigit():
                        end = int(parts[4]) + int(parts[5]) / 1e6
                        run.samples.append((end, int(parts[2]) / 1000.0))
            os.unlink(path)
    return run
