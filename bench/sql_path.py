"""Part 1, the SQL path: idem_claim + idem_complete against the same statements as raw SQL.

Same server, same database, same run: pgbench, 8 clients, prepared statements for both, fresh
keys. The two scripts alternate (A/B/A/B...) and the median of each side is compared, so a
drift of the machine (autovacuum, a neighbour, the table growing) falls on both equally.
"""

from __future__ import annotations

from bench.common import (
    ENDPOINT,
    REQUEST,
    RESPONSE,
    USERS,
    Mode,
    Report,
    execute,
    fmt_int,
    fmt_ms,
    fmt_x,
    log,
    median,
    pgbench,
)

CLIENTS = 8

# An identical copy of the store for raw statements: same columns, defaults, CHECKs, indexes
# (the unique NULLS NOT DISTINCT constraint included, renamed {unique}), the users foreign key
# and the same storage parameters. Part 1's raw side (bench_raw_keys) and bench/peers' floor
# (floor_keys) run on one.
RAW_COPY = """
DROP TABLE IF EXISTS {table};
CREATE TABLE {table} (LIKE idempotency_keys INCLUDING ALL);
CREATE SEQUENCE {table}_id_seq OWNED BY {table}.id;
ALTER TABLE {table} ALTER COLUMN id SET DEFAULT nextval('{table}_id_seq');
ALTER TABLE {table} ADD FOREIGN KEY (scope_user_id) REFERENCES users(id) ON DELETE CASCADE;
DO $$
DECLARE v_name text;
BEGIN
    SELECT conname INTO v_name FROM pg_constraint
     WHERE conrelid = '{table}'::regclass AND contype = 'u';
    EXECUTE format('ALTER TABLE {table} RENAME CONSTRAINT %I TO {unique}', v_name);
    -- LIKE copies no storage parameters: the same fillfactor (0007), so the UPDATE is as HOT
    EXECUTE format('ALTER TABLE {table} SET (%s)', (
        SELECT coalesce(string_agg(o, ', '), 'fillfactor = 100') FROM pg_class c,
               unnest(c.reloptions) o WHERE c.oid = 'idempotency_keys'::regclass));
END $$;
"""


def make_raw_copy(url: str, table: str, unique: str) -> None:
    """`table`, a copy of idempotency_keys as RAW_COPY makes it, checked to have its shape."""
    execute(url, RAW_COPY.format(table=table, unique=unique))
    check_same_shape(url, table)


# Completed keys for the replay and mismatch runs (fn_replay.sql / fn_mismatch.sql).
REPLAY_KEYS = """
INSERT INTO idempotency_keys
    (idem_key, scope_user_id, scope_endpoint, request_hash, response_code, response_body,
     status, created_at, locked_at, expires_at)
SELECT md5('replay:' || i)::uuid::text, 1 + i %% %(users)s, %(endpoint)s,
       encode(sha256(convert_to(%(request)s::jsonb::text, 'UTF8')), 'hex'), 201,
       %(response)s::jsonb, 'completed', now(), now(), now() + interval '24 hours'
  FROM generate_series(1, %(n)s) i
"""


def check_same_shape(url: str, table: str) -> None:
    """Refuse to compare unless the raw copy has the store's indexes and constraints."""
    import psycopg

    q = """SELECT (SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass),
                  (SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass),
                  (SELECT coalesce(reloptions, '{fillfactor=100}') FROM pg_class WHERE oid = %s::regclass)"""
    with psycopg.connect(url) as conn:
        a = conn.execute(q, ("idempotency_keys",) * 3).fetchone()
        b = conn.execute(q, (table,) * 3).fetchone()
    if a != b:
        raise RuntimeError(f"{table} differs from idempotency_keys (indexes, constraints): {a} vs {b}")


def run(url: str, mode: Mode, report: Report) -> None:
    part = "1 SQL"
    make_raw_copy(url, "bench_raw_keys", "uq_bench_raw_key_user_endpoint")
    execute(
        url,
        REPLAY_KEYS,
        {"users": USERS, "endpoint": ENDPOINT, "request": REQUEST, "response": RESPONSE, "n": mode.replay_keys},
    )
    execute(url, "VACUUM ANALYZE")

    fn_tps: list[float] = []
    raw_tps: list[float] = []
    fn_lat: list[float] = []
    raw_lat: list[float] = []
    for i in range(mode.sql_pairs):
        # A/B, then B/A: neither side always runs first on a warmer or a bigger table
        order = ("fn", "raw") if i % 2 == 0 else ("raw", "fn")
        for side in order:
            script = "fn_claim_complete" if side == "fn" else "raw_claim_complete"
            r = pgbench(url, script, clients=CLIENTS, seconds=mode.sql_seconds)
            (fn_tps if side == "fn" else raw_tps).append(r.tps)
            (fn_lat if side == "fn" else raw_lat).append(r.latency_avg_ms)
            log(f"sql path {side}: {r.tps:,.0f} tx/s ({r.transactions} tx)")
    fn_m, raw_m = median(fn_tps), median(raw_tps)
    runs = f"median of {mode.sql_pairs} × {mode.sql_seconds} s"
    report.add(
        part,
        f"claim + complete, functions (tx/s, {CLIENTS} clients, {runs})",
        f"{fmt_int(fn_m)} tx/s, {fmt_ms(median(fn_lat))} avg",
    )
    report.add(
        part,
        f"same INSERT … ON CONFLICT + UPDATE as raw SQL (tx/s, {runs})",
        f"{fmt_int(raw_m)} tx/s, {fmt_ms(median(raw_lat))} avg",
    )
    r_all = ", ".join(f"{a / b:.2f}" for a, b in zip(fn_tps, raw_tps, strict=True))
    r_med = median([a / b for a, b in zip(fn_tps, raw_tps, strict=True)])
    report.add(part, f"functions / raw, median of the pairs ({r_all})", fmt_x(r_med), "≥ 0.90×", r_med >= 0.9)

    rep = pgbench(url, "fn_replay", clients=CLIENTS, seconds=mode.path_seconds, defines={"nreplay": mode.replay_keys})
    report.add(
        part,
        "replay path: idem_claim on a completed key (writes 1 audit row)",
        f"{fmt_int(rep.tps)} tx/s, {fmt_ms(rep.latency_avg_ms)} avg",
    )
    mis = pgbench(url, "fn_mismatch", clients=CLIENTS, seconds=mode.path_seconds, defines={"nreplay": mode.replay_keys})
    report.add(
        part,
        "mismatch path: idem_claim, same key, other body (writes nothing)",
        f"{fmt_int(mis.tps)} tx/s, {fmt_ms(mis.latency_avg_ms)} avg",
    )
    # sanity: the paths really were what they claim to be
    outcomes = _outcomes(url)
    report.note(
        f"SQL path: {CLIENTS} pgbench clients, -M prepared for both sides, fresh keys "
        f"md5(run:client:seq)::uuid; each side's transaction is two autocommit round "
        f"trips (claim, complete). Replay/mismatch over {mode.replay_keys:,} preloaded "
        f"completed keys. Rows written: {outcomes}."
    )


def _outcomes(url: str) -> str:
    import psycopg

    with psycopg.connect(url) as conn:
        fn = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FROM idempotency_keys"
        ).fetchone()
        raw = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FROM bench_raw_keys"
        ).fetchone()
        replays = conn.execute("SELECT count(*) FROM audit_log WHERE action = 'idempotency_replay'").fetchone()
    assert fn and raw and replays
    return (
        f"store {fn[1]:,} ({fn[0]:,} completed), raw copy {raw[1]:,} ({raw[0]:,} completed), "
        f"{replays[0]:,} replay audit rows"
    )
