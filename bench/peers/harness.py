"""Part 8, the peers: idem beside the other Python idempotency libraries, on one harness.

Each system serves its app of bench/peers/ (flask_apps.py, drf_app.py, fastapi_app.py): POST
/orders behind the library and POST /orders/raw beside it, the same handler (orders.py's one
INSERT into `orders`), in a database of its own on the same server, under gunicorn with
examples/raptor/gunicorn.conf.py and the same number of workers (sync; uvicorn's for the ASGI
app). idem and the floor run from the main venv, the peers from .venv-peers
(IDEM_PEERS_PYTHON; `make peers-venv`). wrk sends every protected request with a fresh
Idempotency-Key and every raw one with none (bench/wrk/fresh.lua).

The floor is no library: idem's shape in raw SQL with none of its rules (flask_apps.floor_app: a
claim committed asynchronously before the handler, the completion pipelined with the handler's
COMMIT). Its ratio and added p50 bound what any implementation of that shape reaches on this
harness; it is never the best peer.

Three cells on loopback, each a route pair at a time: 8 clients (two connections per worker),
1 client, and 8 clients on a 50 ms handler (`?handler_ms=50`). Then two cells with the database
one 1 ms round trip away (RTT_MS: a second server per system on the same database, reaching it
through bench/proxy.py, 0.5 ms each way, as part 2b does): 8 clients and 1 client, the production
shape, where each extra round trip is paid in wall time. ABBA rounds (the mode's number, or
bench/run.py's `--rounds N`), the loopback cells' first, then the distant cells' on servers of
their own (so the cluster never holds both sets of pools): an odd round runs the systems in order
and raw then protected, an even one both reversed. A figure is the median over the rounds of the
same round's pair: the ratio protected/raw of req/s, the added p50 (protected minus raw). Then a
race per system (keys × 10 concurrent same-key requests; double executions = rows in `orders`
past the first per key), and per request, sequential, counted through bench/proxy.py: round trips
to PostgreSQL, transaction ids assigned, write transactions (commit and abort records in the WAL,
pg_walinspect) and WAL bytes.

idem runs twice where its decorator takes `claim=`: the default shape, and `claim="in_transaction"`
(the key's row committed with the handler's writes). Where it does not, that row is skipped and
the table says so (`claim_supported`: the shim's Policy is read, nothing is assumed).
"""

from __future__ import annotations

import http.client
import os
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench.common import OUT, ROOT, Mode, Report, add_users, execute, fmt_x, in_threads, log, median
from bench.http_path import PY, CpuMeter, Server, WrkRun, wrk, wrk_bin
from bench.peers import orders
from bench.proxy import Proxy

PART = "8 peers"
RTT_MS = 1.0  # the distant cells' round-trip time to the database, as part 2b's (bench/latency.py)
RACE_CONCURRENCY = 10
SLOW_HANDLER_MS = 50
COUNTED_REQUESTS = 30  # sequential requests per route for round trips, transaction ids, WAL
TARGET_LEAD = 1.5  # idem's ratio at 8 clients against the best peer's (a library's: never the floor)
TARGET_P50_SHARE = 1 / 3  # idem's added p50 at one client against the best peer's
REPLAY_HEADERS = ("idempotent-replayed", "idempotency-replayed", "x-idempotent-replayed")  # the systems' own


@dataclass(frozen=True)
class System:
    key: str  # database suffix and server name
    package: str | None  # the PyPI distribution whose version names it (None: this checkout's)
    app: str  # gunicorn's app
    peer: bool  # a library of another project, served from the peers' venv (the best peer is one)
    store: tuple[str, ...] = ()  # `python ARGS` that makes its store as its docs say ({url}: the database's)
    env: dict[str, str] = field(default_factory=dict)  # its server's, besides DATABASE_URL
    label: str | None = None  # its name in the tables (default: the package's and version, or key)
    claim: str | None = None  # idem's claim= option, when it needs one the shim may not have yet

    def python(self) -> str:
        return peers_python() if self.peer else PY


SYSTEMS = [
    # idem's store: `idem migrate`, already run on every fresh database (scripts/testdb.py)
    System("idem", None, "bench.peers.flask_apps:idem_app()", peer=False),
    # the same app with claim="in_transaction" (flask_apps.idem_app reads BENCH_IDEM_CLAIM); skipped
    # with a note where the decorator takes no claim= yet
    System(
        "idem_tx",
        None,
        "bench.peers.flask_apps:idem_app()",
        peer=False,
        env={"BENCH_IDEM_CLAIM": "in_transaction"},
        label='idem, claim="in_transaction"',
        claim="in_transaction",
    ),
    # no library: idem's shape in raw SQL, on a copy of idem's table (flask_apps.floor_store)
    System("floor", None, "bench.peers.flask_apps:floor_app()", False, ("-m", "bench.peers.flask_apps", "floor-store")),
    # its README: `idemkit init-pg <database-url>`
    System(
        "idemkit", "idemkit", "bench.peers.flask_apps:idemkit_app()", True, ("-m", "idemkit.cli", "init-pg", "{url}")
    ),
    # its README: `python manage.py migrate`
    System("drf", "drf-idempotency", "bench.peers.drf_app:application", True, ("-m", "bench.peers.drf_app", "migrate")),
    # its PostgresBackend.init(); an ASGI app: gunicorn's uvicorn worker, as many as the others' sync ones
    System(
        "fastidempotent",
        "fastidempotent",
        "bench.peers.fastapi_app:app",
        True,
        ("-m", "bench.peers.fastapi_app", "init"),
        {"GUNICORN_CMD_ARGS": "--worker-class uvicorn_worker.UvicornWorker"},
    ),
]
CELLS = {
    "8 clients": (False, ""),  # (one client?, query string)
    "1 client": (True, ""),
    f"{SLOW_HANDLER_MS} ms handler": (False, f"?{orders.HANDLER_MS}={SLOW_HANDLER_MS}"),
}
#: The same route pairs with the database RTT_MS away: served by each system's second server,
#: whose DATABASE_URL goes through bench/proxy.py (RTT_MS / 2 each way).
DISTANT = f"{RTT_MS:g} ms RTT"
DISTANT_CELLS = {
    f"8 clients, {DISTANT}": (False, ""),
    f"1 client, {DISTANT}": (True, ""),
}
ALL_CELLS = {**CELLS, **DISTANT_CELLS}


def claim_supported() -> bool:
    """Whether this checkout's @idempotency_key takes claim= (a field of its Policy)."""
    from idem_shim.policy import Policy

    return "claim" in {f.name for f in fields(Policy)}


def runnable(systems: list[System]) -> tuple[list[System], list[tuple[System, str]]]:
    """(the systems this checkout can run, the skipped ones with the reason)."""
    if claim_supported():
        return systems, []
    skipped = [(s, "this idem_shim's @idempotency_key takes no claim= yet") for s in systems if s.claim]
    return [s for s in systems if not s.claim], skipped


def peers_python() -> str:
    return os.environ.get("IDEM_PEERS_PYTHON") or str(ROOT / ".venv-peers" / "bin" / "python")


FLOOR_LABEL = "floor: idem's shape in raw SQL, no rules"


def _label(system: System) -> str:
    if system.label is not None:
        return system.label
    if system.package is None:
        return FLOOR_LABEL if system.key == "floor" else system.key
    out = subprocess.run(
        [system.python(), "-c", f"import importlib.metadata as m; print(m.version({system.package!r}))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return f"{system.package} {out.stdout.strip()}"


def _setup(system: System, url: str) -> None:
    """The `orders` table, user 1 (idem's scope), and the library's own store as its docs make it."""
    execute(url, orders.SCHEMA)
    add_users(url, 1)
    if system.store:
        env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
        args = [system.python(), *(a.replace("{url}", url) for a in system.store)]
        proc = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{system.key}'s store: {' '.join(args)} failed: {proc.stderr[-1500:]}")


@dataclass
class Side:
    """The runs of one route of one system, one per round and cell."""

    runs: dict[str, list[WrkRun]] = field(default_factory=dict)


@dataclass
class Measured:
    system: System
    label: str
    url: str
    server: Server
    distant: Server | None = None  # the same app reaching the database through the delaying proxy
    raw: Side = field(default_factory=Side)
    protected: Side = field(default_factory=Side)
    race: str = ""
    doubles: int = -1
    per_request: dict[str, dict[str, float]] = field(default_factory=dict)

    def ratio(self, cell: str) -> float:
        pairs = zip(self.protected.runs[cell], self.raw.runs[cell], strict=True)
        return median([p.rps / r.rps for p, r in pairs if r.rps])

    def added_p50(self, cell: str) -> float:
        pairs = zip(self.protected.runs[cell], self.raw.runs[cell], strict=True)
        return median([p.p50_ms - r.p50_ms for p, r in pairs])


_RUN = [int.from_bytes(os.urandom(3), "big")]


def _serving(m: Measured, cell: str) -> Server:
    """The server of a cell: the distant one for the RTT cells."""
    if cell in DISTANT_CELLS:
        assert m.distant is not None, f"{m.label}: no distant server"
        return m.distant
    return m.server


def _wrk(m: Measured, protected: bool, cell: str, seconds: int, mode: Mode, tokens: Path) -> WrkRun:
    one_client, query = ALL_CELLS[cell]
    _RUN[0] += 1
    path = (orders.PROTECTED if protected else orders.RAW) + query
    args = [str(_RUN[0]), str(tokens), orders.BODY] + ([] if protected else ["nokey"])
    connections = 1 if one_client else 2 * mode.http_workers
    return wrk(_serving(m, cell).base + path, "fresh.lua", args, seconds, connections)


def _rounds(
    systems: list[Measured], mode: Mode, tokens: Path, meters: dict[str, CpuMeter], cells: dict[str, tuple[bool, str]]
) -> None:
    for rnd in range(mode.peers_rounds):
        for m in systems if rnd % 2 == 0 else systems[::-1]:
            for cell, (one_client, _) in cells.items():
                seconds = mode.latency_seconds if one_client else mode.peers_seconds
                server = _serving(m, cell)
                for protected in (False, True) if rnd % 2 == 0 else (True, False):
                    before = meters[m.label].snapshot(server)
                    r = _wrk(m, protected, cell, seconds, mode, tokens)
                    meters[m.label].per_request(server, before, r)
                    if r.bad:
                        raise RuntimeError(f"{m.label}: {r.bad} failed requests (see {server.log_path})")
                    side = m.protected if protected else m.raw
                    side.runs.setdefault(cell, []).append(r)
                    log(
                        f"peers round {rnd + 1} {m.label} {cell} {'protected' if protected else 'raw'}: "
                        f"{r.rps:,.0f} req/s p50 {r.p50_ms:.2f} ms (CPU/request app {r.app_us:.0f} µs, "
                        f"db {r.db_us:.0f} µs)"
                    )


def _post(port: int, path: str, key: str | None) -> tuple[int, bool]:
    """(status, replayed?) of one POST; a replay is told by the library's replay header."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    try:
        conn.request("POST", path, body=orders.BODY, headers=headers)
        resp = conn.getresponse()
        resp.read()
        replayed = any(name.lower() in REPLAY_HEADERS and value == "true" for name, value in resp.getheaders())
        return resp.status, replayed
    finally:
        conn.close()


def _race(m: Measured, keys: int) -> None:
    """Rounds of RACE_CONCURRENCY threads at a barrier, all sending the same fresh key."""
    round_keys = [str(uuid.uuid4()) for _ in range(keys)]
    barrier = threading.Barrier(RACE_CONCURRENCY)
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def worker() -> None:
        for key in round_keys:
            barrier.wait(timeout=60)
            status, replayed = _post(m.server.port, orders.PROTECTED, key)
            with lock:
                outcomes[f"{status}{' replayed' if replayed else ''}"] += 1

    in_threads([worker] * RACE_CONCURRENCY, on_error=barrier.abort)
    with psycopg.connect(m.url) as conn:
        rows: dict[str, int] = dict(
            conn.execute(
                "SELECT idem_key, count(*) FROM orders WHERE idem_key = ANY(%s) GROUP BY idem_key", (round_keys,)
            ).fetchall()
        )
    m.doubles = sum(c - 1 for c in rows.values() if c > 1)
    none = keys - len(rows)
    m.race = (
        f"{m.doubles} double"
        + (f", {none} keys never executed" if none else "")
        + " ("
        + ", ".join(f"{k} ×{v}" for k, v in sorted(outcomes.items()))
        + ")"
    )
    log(f"peers race {m.label}: {m.race}")


@dataclass(frozen=True)
class ServerState:
    """The next transaction id and the WAL position: their deltas between two states count the
    transaction ids assigned (every writing transaction and subtransaction) and WAL bytes at
    once, with no statistics flush to wait for; `write_transactions` reads the WAL between them."""

    xid: int
    lsn: str
    wal_bytes: int


#: pg_walinspect's records: a commit or abort record ends each transaction that wrote (a read-only
#: one writes none, a subtransaction's is its parent's), asynchronous commits too. ``xids``: only
#: these transactions' (a test's, on a cluster others write to), or NULL for all.
_WRITE_TRANSACTIONS = """
SELECT count(*) FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
 WHERE resource_manager = 'Transaction' AND record_type IN ('COMMIT', 'ABORT')
   AND (%(xids)s::text[] IS NULL OR xid::text = ANY(%(xids)s::text[]))"""


def server_state(url: str) -> ServerState:
    """The state at the WAL's insert position (what has been written so far, asynchronous commits
    too), once it is flushed: pg_walinspect reads no further, and the WAL writer flushes an
    asynchronous commit within a few hundred ms."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_current_wal_insert_lsn()::text, "
            "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
        ).fetchone()
        assert row is not None
        for _ in range(200):
            flushed = conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (row[1],)).fetchone()
            if flushed and flushed[0]:
                break
            time.sleep(0.01)
    return ServerState(int(row[0]), str(row[1]), int(row[2]))


def write_transactions(url: str, before: ServerState, after: ServerState, xids: list[int] | None = None) -> int | None:
    """Transactions that wrote between two states (``xids``: of these only), or None without
    pg_walinspect (PostgreSQL 15's contrib; created in url's database, which needs a superuser)."""
    params = {"start": before.lsn, "end": after.lsn, "xids": None if xids is None else [str(x) for x in xids]}
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            row = conn.execute(_WRITE_TRANSACTIONS, params).fetchone()
    except psycopg.Error as exc:
        log(f"peers: write transactions not counted ({type(exc).__name__}: {str(exc).strip()[:200]})")
        return None
    return int(row[0]) if row else None


def _through(url: str, addr: tuple[str, int]) -> str:
    """url's database, user and options at another address, TLS off (the proxy reads the
    messages). A URL, not a conninfo string: asyncpg (idemkit) takes only URLs."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    netloc = (f"{user}@" if user else "") + f"{addr[0]}:{addr[1]}"
    query = "&".join(q for q in [parts.query, "sslmode=disable"] if q)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _count(m: Measured) -> None:
    """Round trips, transaction ids and WAL bytes per request, one request at a time, through
    a proxy that adds no delay: a one-worker server of the same app on the proxy's port."""
    target = conninfo_to_dict(m.url)
    upstream = (str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432))
    proxy = Proxy(("127.0.0.1", 0), upstream, 0).start()
    env = {**m.system.env, "DATABASE_URL": _through(m.url, proxy.listen)}
    server = Server(f"{m.system.key}_counted", m.system.app, env, 1, m.system.python())
    try:
        server.start()
        server.wait_ready()
        for side, path in (("raw", orders.RAW), ("protected", orders.PROTECTED)):
            for n in range(5 + COUNTED_REQUESTS):  # 5 first: the pools' connections open, statements prepared
                if n == 5:
                    trips0, _, _ = proxy.counts.snapshot()
                    state0 = server_state(m.url)
                status, _ = _post(server.port, path, str(uuid.uuid4()) if side == "protected" else None)
                if status != 201:
                    raise RuntimeError(f"{m.label} {path}: {status} (see {server.log_path})")
            trips1, _, _ = proxy.counts.snapshot()
            state1 = server_state(m.url)
            m.per_request[side] = {
                "round trips": (trips1 - trips0) / COUNTED_REQUESTS,
                "transaction ids": (state1.xid - state0.xid) / COUNTED_REQUESTS,
                "WAL bytes": (state1.wal_bytes - state0.wal_bytes) / COUNTED_REQUESTS,
            }
            writes = write_transactions(m.url, state0, state1)
            if writes is not None:
                m.per_request[side]["write transactions"] = writes / COUNTED_REQUESTS
    finally:
        server.stop()
        proxy.stop()


def _revision() -> str:
    """The checkout idem was measured at (git describe), or "this checkout" outside git."""
    proc = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else "this checkout"


def _arrow(m: Measured, metric: str) -> str:
    """raw → protected of one per-request count, or "not counted"."""
    r, p = m.per_request.get("raw", {}), m.per_request.get("protected", {})
    if metric not in r or metric not in p:
        return "not counted"
    fmt = "{:,.0f}" if metric == "WAL bytes" else "{:.1f}"
    return f"{fmt.format(r[metric])} → {fmt.format(p[metric])}"


def _skipped_rows(skipped: list[tuple[System, str]], columns: int) -> list[str]:
    return [f"| {_label(s)} | skipped: {why} |" + " |" * (columns - 2) for s, why in skipped]


def _tables(systems: list[Measured], mode: Mode, skipped: list[tuple[System, str]]) -> str:
    cells, far = list(CELLS), list(DISTANT_CELLS)
    rounds = mode.peers_rounds
    lines = [
        f"### Peers side by side ({mode.name}: {rounds} ABBA rounds, {mode.peers_seconds} s a run at 8 "
        f"clients, {mode.latency_seconds} s at 1; gunicorn, {mode.http_workers} workers per system; "
        f"idem at {_revision()})",
        "",
        f"| system | ratio protected/raw, 8 clients (median of {rounds}) | 1 client | added p50, 1 client "
        f"| {SLOW_HANDLER_MS} ms handler, 8 clients | race {mode.peers_race_keys}×{RACE_CONCURRENCY} |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in systems:
        bold = "**" if m.system.key == "idem" else ""
        figures = [m.label, fmt_x(m.ratio(cells[0])), fmt_x(m.ratio(cells[1])), f"{m.added_p50(cells[1]):+.2f} ms"]
        figures.append(fmt_x(m.ratio(cells[2])))
        lines.append("| " + " | ".join(f"{bold}{f}{bold}" for f in figures) + f" | {m.doubles} double |")
    lines += _skipped_rows(skipped, 6)
    lines += [
        "",
        f"The database {DISTANT} away (bench/proxy.py, {RTT_MS / 2:g} ms each way, in front of every system's "
        "second server; the same rounds), and what each request costs it (counted on loopback, one request "
        "at a time: the counts do not depend on the distance):",
        "",
        f"| system | ratio protected/raw, 8 clients, {DISTANT} | 1 client, {DISTANT} | added p50, 1 client, "
        f"{DISTANT} | round trips to PostgreSQL | write transactions | WAL bytes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in systems:
        bold = "**" if m.system.key == "idem" else ""
        figures = [m.label, fmt_x(m.ratio(far[0])), fmt_x(m.ratio(far[1])), f"{m.added_p50(far[1]):+.2f} ms"]
        figures += [_arrow(m, "round trips"), _arrow(m, "write transactions"), _arrow(m, "WAL bytes")]
        lines.append("| " + " | ".join(f"{bold}{f}{bold}" for f in figures) + " |")
    lines += _skipped_rows(skipped, 7)
    lines += [
        "",
        "Same run, what each costs on loopback (medians over the rounds; CPU from /proc schedstat: the "
        "gunicorn processes, and the database's backends of that system's database):",
        "",
        "| system | req/s raw → protected, 8 clients (pairs) | p50 raw → protected, 1 client "
        "| CPU per request, app | CPU per request, database | round trips to PostgreSQL "
        "| transaction ids (subtransactions too) | write transactions | WAL bytes | race outcomes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in systems:
        raw, pro = m.raw.runs, m.protected.runs
        pairs = ", ".join(f"{p.rps / r.rps:.2f}" for p, r in zip(pro[cells[0]], raw[cells[0]], strict=True))
        ra, pa = median([x.app_us for x in raw[cells[0]]]), median([x.app_us for x in pro[cells[0]]])
        rd, pd = median([x.db_us for x in raw[cells[0]]]), median([x.db_us for x in pro[cells[0]]])
        lines.append(
            f"| {m.label} | {median([x.rps for x in raw[cells[0]]]):,.0f} → "
            f"{median([x.rps for x in pro[cells[0]]]):,.0f} ({pairs}) "
            f"| {median([x.p50_ms for x in raw[cells[1]]]):.2f} → {median([x.p50_ms for x in pro[cells[1]]]):.2f} ms "
            f"| {ra:,.0f} → {pa:,.0f} µs ({pa - ra:+,.0f}) | {rd:,.0f} → {pd:,.0f} µs ({pd - rd:+,.0f}) "
            f"| {_arrow(m, 'round trips')} | {_arrow(m, 'transaction ids')} | {_arrow(m, 'write transactions')} "
            f"| {_arrow(m, 'WAL bytes')} | {m.race} |"
        )
    return "\n".join(lines) + "\n"


#: The targets of claim="in_transaction" (issue 42, item 4): its ratio at 8 clients against raw and against the
#: best peer's, and its added p50 at one client against the best peer's
TX_RATIO, TX_LEAD, TX_P50_SHARE = 0.8, 2.0, 1 / 4


def _targets(systems: list[Measured], report: Report, skipped: list[tuple[System, str]]) -> None:
    idem = next(m for m in systems if m.system.key == "idem")
    floor = next(m for m in systems if m.system.key == "floor")
    peers = [m for m in systems if m.system.peer]  # the libraries: the floor is none
    cells, far = list(CELLS), list(DISTANT_CELLS)
    best = max(peers, key=lambda m: m.ratio(cells[0]))
    idem_r, floor_r, best_r = idem.ratio(cells[0]), floor.ratio(cells[0]), best.ratio(cells[0])
    report.add(
        PART,
        f"idem's ratio protected/raw at 8 clients / the best peer's ({best.label} {fmt_x(best_r)})",
        f"{fmt_x(idem_r)}: **{fmt_x(idem_r / best_r)}**",
        f"≥ {TARGET_LEAD}×",
        idem_r / best_r >= TARGET_LEAD,
    )
    report.add(  # how far idem is from the ceiling of its own shape, and that ceiling from the peers
        PART,
        f"idem's ratio at 8 clients / the floor's (idem's shape in raw SQL, no rules); the floor's / the best "
        f"peer's ({best.label})",
        f"{fmt_x(idem_r)} / {fmt_x(floor_r)}: **{fmt_x(idem_r / floor_r)}**; "
        f"{fmt_x(floor_r)} / {fmt_x(best_r)}: **{fmt_x(floor_r / best_r)}**",
    )
    quickest = min(peers, key=lambda m: m.added_p50(cells[1]))
    share = idem.added_p50(cells[1]) / quickest.added_p50(cells[1]) if quickest.added_p50(cells[1]) > 0 else 1.0
    report.add(
        PART,
        f"idem's added p50 at 1 client / the best peer's ({quickest.label} {quickest.added_p50(cells[1]):+.2f} ms)",
        f"{idem.added_p50(cells[1]):+.2f} ms: **{fmt_x(share)}**",
        "≤ 0.33×",
        share <= TARGET_P50_SHARE,
    )
    # The same two comparisons with the database RTT_MS away (figures, no target of their own).
    far_best = max(peers, key=lambda m: m.ratio(far[0]))
    far_quickest = min(peers, key=lambda m: m.added_p50(far[1]))
    report.add(
        PART,
        f"{DISTANT}: idem's ratio at 8 clients / the best peer's ({far_best.label} {fmt_x(far_best.ratio(far[0]))}); "
        f"idem's added p50 at 1 client, the best peer's ({far_quickest.label})",
        f"{fmt_x(idem.ratio(far[0]))}: **{fmt_x(idem.ratio(far[0]) / far_best.ratio(far[0]))}**; "
        f"{idem.added_p50(far[1]):+.2f} ms, {far_quickest.added_p50(far[1]):+.2f} ms",
    )
    tx = next((m for m in systems if m.system.claim == "in_transaction"), None)
    if tx is not None:
        tx_r = tx.ratio(cells[0])
        report.add(
            PART, f"{tx.label}: ratio protected/raw at 8 clients", fmt_x(tx_r), f"≥ {TX_RATIO}×", tx_r >= TX_RATIO
        )
        report.add(
            PART,
            f"{tx.label}: ratio at 8 clients / the best peer's ({best.label})",
            fmt_x(tx_r / best_r),
            f"≥ {TX_LEAD:g}×",
            tx_r / best_r >= TX_LEAD,
        )
        tx_share = tx.added_p50(cells[1]) / quickest.added_p50(cells[1]) if quickest.added_p50(cells[1]) > 0 else 1.0
        report.add(
            PART,
            f"{tx.label}: added p50 at 1 client / the best peer's ({quickest.label})",
            f"{tx.added_p50(cells[1]):+.2f} ms: **{fmt_x(tx_share)}**",
            "≤ 0.25×",
            tx_share <= TX_P50_SHARE,
        )
    for s, why in skipped:
        report.add(PART, f"{_label(s)}: not run", f"skipped: {why}")
    for m in systems:
        report.add(PART, f"{m.label}: double executions in the race", str(m.doubles), "0", m.doubles == 0)


def _start(servers: list[Server]) -> None:
    for server in servers:
        server.start()
    for server in servers:
        server.wait_ready()


def run(fresh_db: Callable[[str], str], mode: Mode, report: Report) -> None:
    if not wrk_bin():
        report.add(PART, "not run", "wrk is not installed (apt-get install wrk)", "runs", False)
        return
    if not Path(peers_python()).exists():
        report.add(PART, "not run", f"no peers' venv at {peers_python()} (make peers-venv)", "runs", False)
        return
    OUT.mkdir(parents=True, exist_ok=True)
    tokens = OUT / "peers_tokens.txt"
    tokens.write_text("user-1\n")  # fresh.lua sends a bearer token; no app reads it
    chosen, skipped = runnable(SYSTEMS)
    for s, why in skipped:
        log(f"peers: {_label(s)} skipped: {why}")
    systems: list[Measured] = []
    meters: dict[str, CpuMeter] = {}
    proxy: Proxy | None = None
    try:
        for system in chosen:
            url = fresh_db(system.key)
            _setup(system, url)
            label = _label(system)
            env = {**system.env, "DATABASE_URL": url}
            server = Server(f"peers_{system.key}", system.app, env, mode.http_workers, system.python())
            systems.append(Measured(system, label, url, server))
            meters[label] = CpuMeter(url)
        _start([m.server for m in systems])
        for m in systems:
            for protected in (False, True):  # warm-up: pools open, statements prepared
                _wrk(m, protected, next(iter(CELLS)), 1, mode, tokens)
        _rounds(systems, mode, tokens, meters, CELLS)
        for m in systems:
            _race(m, mode.peers_race_keys)
        for m in systems:  # the loopback servers go before the distant ones open their pools
            m.server.stop()
        # The distant cells: every system's second server reaches its database through one proxy.
        target = conninfo_to_dict(systems[0].url)
        upstream = (str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432))
        proxy = Proxy(("127.0.0.1", 0), upstream, RTT_MS / 2).start()
        for m in systems:
            env = {**m.system.env, "DATABASE_URL": _through(m.url, proxy.listen)}
            m.distant = Server(f"peers_{m.system.key}_far", m.system.app, env, mode.http_workers, m.system.python())
        _start([m.distant for m in systems if m.distant is not None])
        for m in systems:
            for protected in (False, True):
                _wrk(m, protected, next(iter(DISTANT_CELLS)), 1, mode, tokens)
        _rounds(systems, mode, tokens, meters, DISTANT_CELLS)
    finally:
        for meter in meters.values():
            meter.close()
        for m in systems:
            m.server.stop()
            if m.distant is not None:
                m.distant.stop()
        if proxy is not None:
            proxy.stop()
    for m in systems:
        _count(m)
    report.sections.append(_tables(systems, mode, skipped))
    _targets(systems, report, skipped)
