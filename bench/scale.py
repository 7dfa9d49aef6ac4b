"""Parts 3 and 4: claim latency on a loaded table, and cleanup beside live claims.

Scale: one database keeps an empty store, another gets `scale_rows` rows loaded straight into
idempotency_keys with generate_series (two sessions in parallel, triggers off for the load only:
the rows satisfy the users foreign key by construction). Claim latency is measured with pgbench
at a fixed arrival rate (latency at the same load, not at saturation), alternating between the
empty and the loaded table.

Cleanup: `expired_rows` of the loaded rows have expired. Claims run at the same fixed rate
while `CALL public.idem_cleanup()` deletes them (the procedure's default pace, as pg_cron runs it);
the claims that ended inside the cleanup's window are compared with a run just before it. Then
the expired rows are loaded again and the same is measured unpaced (p_max_rows_per_second =>
NULL), for comparison. Each cleanup starts from a vacuumed, checkpointed table (`settle`).
"""

from __future__ import annotations

import functools
import re
import threading
import time
from dataclasses import dataclass, field

import psycopg

from bench.common import (
    USERS,
    Mode,
    PgbenchRun,
    Report,
    execute,
    fmt_int,
    fmt_ms,
    fmt_rows,
    fmt_x,
    in_threads,
    log,
    percentile,
    pgbench,
    ratio,
    scalar,
)

CLIENTS = 4

# A realistic mix: 60 % orders, 20 % LCC rolls (24 h), 20 % checkout sessions (7 days); 5 % of
# rows are service calls (no user); 97 % completed (2 % of them 422 answers), 3 % failed, one in
# 10,000 an orphaned in-flight row. Keys are random UUIDs (md5), so the unique index is built
# by random inserts like a real one, not packed by a sorted build. Rows g <= %(expired)s
# expired 6 to 7 hours ago (the daily cleanup has not run yet); the others are live.
LOAD = """
INSERT INTO idempotency_keys
    (idem_key, scope_user_id, scope_endpoint, request_hash, response_code, response_body,
     status, created_at, locked_at, expires_at)
SELECT md5('scale:' || g)::uuid::text,
       CASE WHEN g %% 20 = 0 THEN NULL ELSE 1 + (g::bigint * 7919) %% %(users)s END,
       e.endpoint,
       encode(sha256(int8send(g)), 'hex'),
       CASE s.status WHEN 'completed' THEN (CASE WHEN g %% 50 = 0 THEN 422 ELSE 201 END)
                     WHEN 'failed' THEN 500 END,
       CASE WHEN s.status = 'completed' THEN e.body END,
       s.status, t.created_at, t.created_at, t.created_at + e.ttl
  FROM generate_series(%(first)s::bigint, %(last)s::bigint, %(step)s) g
  CROSS JOIN LATERAL (
      SELECT CASE WHEN g %% 10 < 6 THEN 'POST /api/trading/orders'
                  WHEN g %% 10 < 8 THEN 'POST /api/trading/lcc/roll'
                  ELSE 'POST /api/billing/checkout-session' END AS endpoint,
             CASE WHEN g %% 10 < 8 THEN interval '24 hours' ELSE interval '7 days' END AS ttl,
             CASE WHEN g %% 10 < 8
                  THEN jsonb_build_object('order_id', g, 'status', 'filled', 'symbol', 'AAPL',
                                          'qty', 10, 'fill_price_cents', 18923)
                  ELSE jsonb_build_object('session_id', 'cs_' || md5(g::text),
                                          'url', 'https://checkout.example/c/' || g) END AS body
  ) e
  CROSS JOIN LATERAL (
      SELECT CASE WHEN g %% 10000 = 0 THEN 'in_flight'
                  WHEN g %% 100 < 3 THEN 'failed' ELSE 'completed' END AS status
  ) s
  CROSS JOIN LATERAL (
      SELECT CASE WHEN g <= %(expired)s
                  THEN now() - e.ttl - interval '6 hours' - (g %% 3600) * interval '1 second'
                  ELSE now() - (g %% 80000) * interval '1 second' END AS created_at
  ) t;
"""


def load(url: str, rows: int, expired: int) -> float:
    """Loads `rows` rows in two parallel sessions; returns the seconds it took."""
    t0 = time.monotonic()

    def worker(first: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET session_replication_role = replica")
            conn.execute(LOAD, {"users": USERS, "first": first, "last": rows, "step": 2, "expired": expired})

    in_threads(functools.partial(worker, f) for f in (1, 2))
    return time.monotonic() - t0


def sizes(url: str) -> tuple[int, int, int, int, int]:
    """(rows, heap+toast bytes, index bytes, unique index bytes, number of indexes)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM idempotency_keys), pg_table_size('idempotency_keys'), "
            "pg_indexes_size('idempotency_keys'), pg_relation_size('uq_idem_key_user_endpoint'), "
            "(SELECT count(*) FROM pg_index WHERE indrelid = 'idempotency_keys'::regclass)"
        ).fetchone()
    assert row
    return row[0], row[1], row[2], row[3], row[4]


def claims(url: str, mode: Mode, seconds: float) -> PgbenchRun:
    return pgbench(url, "fn_claim", clients=CLIENTS, seconds=seconds, rate=mode.claim_rate, logged=True)


def run(empty_url: str, scale_url: str, mode: Mode, report: Report, parts: list[str]) -> None:
    for url in (empty_url, scale_url):
        execute(url, "INSERT INTO users (id) SELECT g FROM generate_series(1, %s) g ON CONFLICT DO NOTHING", (USERS,))
    log(f"loading {mode.scale_rows:,} rows ...")
    secs = load(scale_url, mode.scale_rows, mode.expired_rows)
    t0 = time.monotonic()
    execute(scale_url, "VACUUM (ANALYZE) idempotency_keys")
    execute(empty_url, "VACUUM (ANALYZE) idempotency_keys")
    vac = time.monotonic() - t0
    # The load leaves gigabytes of dirty buffers and WAL behind it; without this, a checkpoint
    # writes them out during the latency runs (a table loaded over months never has that).
    execute(scale_url, "CHECKPOINT")
    rows, heap, index, unique, n_indexes = sizes(scale_url)
    if "scale" in parts:
        part = "3 scale"
        report.add(
            part,
            "rows loaded (generate_series, 2 sessions)",
            f"{rows:,} in {secs:.0f} s ({fmt_int(rows / secs)} rows/s); VACUUM ANALYZE {vac:.0f} s, then CHECKPOINT",
        )
        report.add(
            part,
            f"bytes per key: table (heap + TOAST) / indexes ({n_indexes}) / unique index alone",
            f"{heap / rows:.0f} / {index / rows:.0f} / {unique / rows:.0f} B "
            f"({heap / 2**20:,.0f} MiB + {index / 2**20:,.0f} MiB)",
        )
        empty: list[float] = []
        full: list[float] = []
        for i in range(mode.scale_pairs):
            for side in ("empty", "full") if i % 2 == 0 else ("full", "empty"):
                r = claims(empty_url if side == "empty" else scale_url, mode, mode.scale_seconds)
                (empty if side == "empty" else full).extend(r.latencies)
        e50, f50 = percentile(empty, 50), percentile(full, 50)
        e99, f99 = percentile(empty, 99), percentile(full, 99)
        at = f"{mode.claim_rate}/s, {CLIENTS} clients, {mode.scale_pairs}×{mode.scale_seconds} s each"
        report.add(
            part,
            f"claim latency, empty table: p50 / p99 ({at})",
            f"{fmt_ms(e50)} / {fmt_ms(e99)} ({len(empty):,} claims)",
        )
        report.add(
            part, f"claim latency, {fmt_rows(rows)}: p50 / p99", f"{fmt_ms(f50)} / {fmt_ms(f99)} ({len(full):,} claims)"
        )
        report.add(
            part,
            f"p50 {fmt_rows(rows)} / empty (p99: {fmt_x(ratio(f99, e99))})",
            fmt_x(ratio(f50, e50)),
            "≤ 1.5×",
            ratio(f50, e50) <= 1.5,
        )
    if "cleanup" in parts:
        report.data["cleanup"] = cleanup(scale_url, mode, report)


def _buffer_writes(conn: psycopg.Connection) -> tuple[int, int, int]:
    """Dirty buffers written so far by backends, the bgwriter and the checkpointer: a cleanup
    dirties every page it deletes from, and when they outgrow shared_buffers the backends
    (claims included) write some back themselves before they can read a page."""
    row = conn.execute("SELECT buffers_backend, buffers_clean, buffers_checkpoint FROM pg_stat_bgwriter").fetchone()
    assert row
    return int(row[0]), int(row[1]), int(row[2])


#: The cleanup as pg_cron and `flask idempotency cleanup` run it (the procedure's defaults), and
#: the same at full speed beside it, for comparison.
DEFAULT_CLEANUP = "CALL public.idem_cleanup()"
UNPACED_CLEANUP = "CALL public.idem_cleanup(p_max_rows_per_second => NULL)"


@dataclass
class CleanupRun:
    """One measured cleanup: the claims' latencies before it and while it ran, and its figures."""

    call: str
    deleted: int
    start: float  # epoch seconds
    end: float
    before: PgbenchRun
    during: list[float] = field(default_factory=list)  # latencies (ms) of claims inside [start, end]
    samples: list[tuple[float, float]] = field(default_factory=list)  # (end epoch, ms) of every claim
    writes: tuple[int, int, int] = (0, 0, 0)  # buffers written by backends / bgwriter / checkpointer

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def ratio(self) -> float:
        return ratio(percentile(self.during, 99), percentile(self.before.latencies, 99))


def settle(url: str) -> None:
    """Start a cleanup from a vacuumed, checkpointed table: the dirty buffers of the load (or of
    the previous cleanup's deletes) are written now, not by the claims measured beside the
    cleanup, and the dead rows of a previous run are gone."""
    execute(url, "VACUUM (ANALYZE) idempotency_keys")
    execute(url, "CHECKPOINT")


#: The unpaced loop's speed here (about 230,000 rows/s), taken low, for sizing the claims' run.
_UNPACED_ROWS_PER_SECOND = 100_000


def expected_seconds(url: str, call: str) -> float:
    """How long ``call`` should take: the expired rows at its pace (the procedure's default pace
    unless the call names one; NULL: the unpaced loop)."""
    expired = int(scalar(url, "SELECT count(*) FROM idempotency_keys WHERE expires_at < now()") or 0)
    named = re.search(r"p_max_rows_per_second\s*=>\s*(\w+)", call)
    if named is None:
        pace = scalar(url, "SELECT max_rows_per_second FROM idem_cleanup_plan()")
    else:
        pace = None if named.group(1).upper() == "NULL" else int(named.group(1))
    return expired / (int(pace) if pace else _UNPACED_ROWS_PER_SECOND)


def measure_cleanup(url: str, mode: Mode, call: str) -> CleanupRun:
    """Claims at the fixed rate, alone, then beside `call`; the claims inside its window.

    The claims beside the cleanup run as one pgbench run sized to outlast it (its expected time
    and a quarter, plus the second before it starts): pgbench started again every 2 s, as this once
    did, puts each start's new sessions and first plans into the window and alone lifts the
    claims' p99 1.4-3× with no cleanup at all (1.44 → 4.71 ms, one 20 s run against ten 2 s runs).
    Only a cleanup slower than that is followed by shorter runs until it ends."""
    settle(url)
    first_run = int(1.25 * expected_seconds(url, call)) + 5
    before = claims(url, mode, max(mode.scale_seconds, 2))
    done = threading.Event()
    window: list[float] = []
    deleted: list[int] = []
    errors: list[BaseException] = []
    writes: list[tuple[int, int, int]] = []

    def run_cleanup() -> None:
        try:
            time.sleep(1.0)  # claims are running first
            with psycopg.connect(url, autocommit=True) as conn:
                writes.append(_buffer_writes(conn))
                window.append(time.time())
                row = conn.execute(call).fetchone()
                window.append(time.time())
                writes.append(_buffer_writes(conn))
                deleted.append(int(row[0]) if row else -1)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    t = threading.Thread(target=run_cleanup)
    t.start()
    during_runs = [claims(url, mode, first_run)]
    while not done.is_set():  # a cleanup slower than expected: claims go on until it ends
        during_runs.append(claims(url, mode, 2))
    t.join()
    if errors:
        raise errors[0]
    start, end = window
    samples = [s for r in during_runs for s in r.samples]
    during = [lat for (ended, lat) in samples if start <= ended - lat / 1000.0 and ended <= end]
    (b_backend, b_clean, b_ckpt), (a_backend, a_clean, a_ckpt) = writes
    return CleanupRun(
        call,
        deleted[0],
        start,
        end,
        before,
        during,
        samples,
        (a_backend - b_backend, a_clean - b_clean, a_ckpt - b_ckpt),
    )


def reload_expired(url: str, mode: Mode) -> None:
    """Put the expired rows back (the same keys: the cleanup deleted them) for the next run."""
    load(url, mode.expired_rows, mode.expired_rows)


def cleanup(url: str, mode: Mode, report: Report) -> list[CleanupRun]:
    part = "4 cleanup"
    runs = [measure_cleanup(url, mode, DEFAULT_CLEANUP)]
    reload_expired(url, mode)
    runs.append(measure_cleanup(url, mode, UNPACED_CLEANUP))
    for run_, label in zip(runs, ("default pace", "unpaced"), strict=True):
        b99, d99 = percentile(run_.before.latencies, 99), percentile(run_.during, 99)
        report.add(
            part,
            f"`{run_.call}` ({label}): expired rows deleted",
            f"{run_.deleted:,} in {run_.seconds:.1f} s ({fmt_int(run_.deleted / run_.seconds)} rows/s)",
        )
        report.add(
            part,
            f"{label}: claim p50 / p99 before ({mode.claim_rate}/s, {CLIENTS} clients) → during",
            f"{fmt_ms(percentile(run_.before.latencies, 50))} / {fmt_ms(b99)} → "
            f"{fmt_ms(percentile(run_.during, 50))} / {fmt_ms(d99)} ({len(run_.during):,} claims during)",
        )
        report.add(
            part,
            f"{label}: longest single claim during the cleanup (before)",
            f"{fmt_ms(max(run_.during, default=float('nan')))} "
            f"({fmt_ms(max(run_.before.latencies, default=float('nan')))})",
        )
        report.add(
            part,
            f"{label}: buffers written during it by backends / bgwriter / checkpointer",
            " / ".join(f"{n:,}" for n in run_.writes),
        )
        if label == "default pace":
            report.add(part, "p99 during / before (default pace)", fmt_x(run_.ratio), "≤ 2×", run_.ratio <= 2)
        else:
            report.add(part, "p99 during / before (unpaced, for comparison)", fmt_x(run_.ratio))
        if mode.expired_rows and run_.deleted < mode.expired_rows:
            report.note(
                f"cleanup ({label}) deleted {run_.deleted:,} rows, fewer than the {mode.expired_rows:,} "
                "expired ones: look at SKIP LOCKED and the batch loop"
            )
    return runs
