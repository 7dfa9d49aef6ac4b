"""The database's budget: the server CPU of a claimed request's two calls, part by part.

    python -m bench.levers.db_budget [--pairs N] [--rounds R] [--perf SECONDS] [--profile N] [--keep]

On DATABASE_URL's server (the durable bench cluster: `make bench-db-up`, then DATABASE_URL=
postgresql://postgres@127.0.0.1:$IDEM_BENCH_PGPORT/idem; or `make bench-budget`), in a fresh
migrated database of its own. Run it on the database's machine: the backend's CPU comes from
/proc/PID/schedstat (nanoseconds on a CPU, so a sleeping backend counts nothing and other
processes' load barely moves it).

One request is what the shim sends for a claimed key: the claim statement (queries.CLAIM's
shape, autocommit, its set_config), then BEGIN, the handler's INSERT, the completion with the
response body and the stored headers, COMMIT. The backend's CPU is read between statements, so
each statement has its own figure.

**Subtraction experiments.** Each variant is a copy of idem_claim or idem_complete (read back
from the catalog, built in schema `budget`) with one part taken out: the same statement with
that part removed, nothing else changed (a replaced fragment that is not found stops the run,
so a variant can never silently measure the unchanged function). Stubs with the same signature
measure the call itself (PL/pgSQL entry, SECURITY DEFINER, the SET search_path clause), raw
statements on copies of the table measure the INSERT, each of its index entries and the
UPDATE. Every round runs every variant in a block of N requests, in a shuffled order; a part's
cost is the median over the rounds of (full - variant) in the same round.

`--profile N` adds plpgsql_check's profiler (per-statement time of N requests through the real
functions); `--perf SECONDS` samples the backend with `perf record` while the real functions
run (the top symbols). Both are views of the same work, not the budget's figures.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench import common

REQUEST = '{"body": ' + common.REQUEST + "}"
RESPONSE = common.RESPONSE
HEADERS = '{"Content-Type": "application/json"}'
USERS = 1000

CLAIM_ARGS = (
    "(p_key => %s::text, p_user_id => %s::integer, p_endpoint => %s::text, p_request => %s::jsonb, "
    "p_ttl => %s::interval, p_stale_after => %s::interval, p_wait_ms => %s::integer, "
    "p_on_stale => %s::text, p_key_format => %s::text, p_response_key => %s::text, p_response_key_fallback => %s::text)"
)
#: queries.CLAIM's shape: the same columns and the trailing set_config of the shim's statement.
# The function names are the variants', built here: no caller's text reaches these statements.
CLAIM_SQL = (
    "SELECT outcome, key_id, request_hash, response_code, response_body, retry_after_ms, "  # noqa: S608
    "response_headers, claim_token, set_config('synchronous_commit', CASE WHEN outcome = 'replay' "
    "THEN current_setting('synchronous_commit') ELSE 'off' END, true), attempt, holder_elapsed_ms FROM {fn}"
    + CLAIM_ARGS
)
COMPLETE_SQL = (
    "SELECT {fn}(p_key_id => %s::bigint, p_response_code => %s::integer, p_response_body => %s::jsonb, "
    "p_response_key => %s::text, p_response_headers => %s::jsonb, p_claim_token => %s::text)"
)
ITEM_SQL = "INSERT INTO budget.items (payload) VALUES (%s::jsonb) RETURNING id"

#: The raw statements, on copies of the table (budget.k_*), as the functions run them.
RAW_CLAIM_CTE_SQL = (
    "WITH k AS (INSERT INTO budget.{table} AS k (id, idem_key, scope_user_id, scope_endpoint, request_hash, "
    "status, created_at, locked_at, expires_at) VALUES (nextval('budget.seq'), %s::text, "
    "%s::integer, %s::text, encode(sha256(convert_to(%s::jsonb::text, 'UTF8')), 'hex'), 'in_flight', "
    "now(), now(), now() + interval '24 hours') {conflict} RETURNING k.id) "
    "SELECT k.id, NULL::text, set_config('synchronous_commit', 'off', true) FROM k"
)
RAW_COMPLETE_SQL = (
    "UPDATE budget.{table} k SET status = 'completed', response_code = %s::integer, "
    "response_body = %s::jsonb, response_headers = %s::jsonb WHERE k.id = %s::bigint AND k.status = 'in_flight'"
)


@dataclass
class Variant:
    """One way to run the request: the claim and completion statements and what builds them."""

    name: str
    part: str  # what (full - this) measures; "" for the full functions
    side: str  # "claim" or "complete": which statement's CPU the part is read from
    claim_edits: list[tuple[str, str]] = field(default_factory=list)
    complete_edits: list[tuple[str, str]] = field(default_factory=list)
    raw_table: str | None = None  # raw statements on budget.<raw_table>
    stub: str | None = None  # "sql", "plpgsql", "definer", "definer_path"
    unique: bool = True
    claim_fn: str = "public.idem_claim"
    complete_fn: str = "public.idem_complete"


def edit(source: str, edits: list[tuple[str, str]], what: str) -> str:
    for old, new in edits:
        count = source.count(old)
        if count != 1:
            raise SystemExit(f"db_budget: {what}: the fragment {old[:70]!r} occurs {count} times, not once")
        source = source.replace(old, new)
    return source


CLAIM_GUARDS_START = "    -- GUARD: arguments (misuse raises; outcomes are returned)"
CLAIM_GUARDS_END = "    -- jsonb's text form is canonical"
ATTEMPT_START = "            SELECT 1 + pg_catalog.count(*)::integer INTO v_attempt"
ATTEMPT_END = "(v_scope IS NULL AND e.scope_user_id IS NULL));"
HASH_EXPR = """pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
        COALESCE(p_request, 'null'::jsonb)::text, 'UTF8')), 'hex')"""
TOKEN_GUARD_START = "    SELECT public.idem_token_hash(s.secret, p_key_id, v_claimed_at) INTO v_token"  # noqa: S105
CLAIM_TOKEN = "SELECT public.idem_token_hash(s.secret, v_id, v_now) INTO v_token FROM public.idem_secret s;"  # noqa: S105
TOKEN_GUARD_END = "        v_claimed_at := NULL;\n    END IF;\n"  # noqa: S105


def cut(source: str, start: str, end: str, replacement: str = "") -> tuple[str, str]:
    """The (old, new) edit that removes source[start .. end] (end included)."""
    i = source.index(start)
    j = source.index(end, i) + len(end)
    return source[i:j], replacement


def variants(claim_src: str, complete_src: str, request_hash: str) -> list[Variant]:
    guards = cut(claim_src, CLAIM_GUARDS_START, CLAIM_GUARDS_END, CLAIM_GUARDS_END)
    attempt = cut(claim_src, ATTEMPT_START, ATTEMPT_END, "            v_attempt := 1;")
    token_guard = cut(complete_src, TOKEN_GUARD_START, TOKEN_GUARD_END)
    header_screen_start = "        IF p_response_headers::text OPERATOR(pg_catalog.~*)"
    return [
        Variant("full", "", "claim"),
        # --- the call itself: stubs with the same signature and result, nothing inside
        Variant("stub_sql", "the statement: protocol, parameters, the result row", "claim", stub="sql"),
        Variant("stub_plpgsql", "a PL/pgSQL call (FunctionScan, composite result)", "claim", stub="plpgsql"),
        Variant("stub_definer", "SECURITY DEFINER", "claim", stub="definer"),
        Variant("stub_definer_path", "the SET search_path clause", "claim", stub="definer_path"),
        # --- idem_claim, one part out at a time
        Variant("claim_no_guards", "argument checks", "claim", claim_edits=[guards]),
        Variant(
            "claim_no_canonical",
            "idem_canonical_key (inlined regex, lower)",
            "claim",
            claim_edits=[
                ("v_key        text := public.idem_canonical_key(p_key, p_key_format);", "v_key        text := p_key;")
            ],
        ),
        Variant(
            "claim_no_scope",
            "idem_scope, idem_new_key_id (inlined helpers)",
            "claim",
            claim_edits=[
                ("v_scope      integer := public.idem_scope(p_user_id);", "v_scope      integer := p_user_id;"),
                (
                    "VALUES (public.idem_new_key_id(v_scope),",
                    "VALUES (pg_catalog.nextval('public.idempotency_keys_id_seq'::pg_catalog.regclass),",
                ),
            ],
        ),
        Variant(
            "claim_no_hash",
            "the request hash (sha256 of the jsonb text)",
            "claim",
            claim_edits=[(HASH_EXPR, f"'{request_hash}'")],
        ),
        Variant(
            "claim_no_clock",
            "the clock and TTL arithmetic",
            "claim",
            claim_edits=[
                (
                    "v_now := COALESCE(p_now, pg_catalog.now()) + (pg_catalog.clock_timestamp() - v_started);",
                    "v_now := pg_catalog.now();",
                ),
                ("v_ttl := EXTRACT(epoch FROM p_ttl) * interval '1 second';", "v_ttl := p_ttl;"),
            ],
        ),
        Variant("claim_no_attempt", "the attempt probe (idempotency_events)", "claim", claim_edits=[attempt]),
        Variant(
            "claim_no_token",
            "the claim token (the secret read, sha256)",
            "claim",
            claim_edits=[(CLAIM_TOKEN, "v_token := NULL;")],
        ),
        # --- idem_complete, one part out at a time
        Variant(
            "complete_no_token",
            "the token check (the secret read, sha256)",
            "complete",
            complete_edits=[token_guard],
        ),
        Variant(
            "complete_no_token_at",
            "the token check and the claim time it names",
            "complete",
            complete_edits=[
                token_guard,
                (
                    "v_claimed_at  timestamptz := public.idem_token_claimed_at(p_claim_token);",
                    "v_claimed_at  timestamptz;",
                ),
            ],
        ),
        Variant(
            "complete_no_raw_check",
            "the raw-body test (idem_raw)",
            "complete",
            complete_edits=[
                (
                    "IF pg_catalog.jsonb_typeof(p_response_body) = 'object' AND p_response_body ? 'idem_raw' THEN",
                    "IF false THEN",
                )
            ],
        ),
        Variant(
            "complete_no_body_regex",
            "the body screen (regex over the body's text)",
            "complete",
            complete_edits=[
                (
                    "    IF v_checked::text OPERATOR(pg_catalog.~*)",
                    "    IF false AND v_checked::text OPERATOR(pg_catalog.~*)",
                )
            ],
        ),
        Variant(
            "complete_no_header_screen",
            "the header checks (type, two regexes, length, jsonpath)",
            "complete",
            complete_edits=[
                (
                    "    IF p_response_headers IS NOT NULL AND p_response_headers <> "
                    '\'{"Content-Type": "application/json"}\'::jsonb THEN',
                    "    IF false THEN",
                )
            ],
        ),
        Variant(
            "complete_no_header_jsonpath",
            "the header screen's jsonpath",
            "complete",
            complete_edits=[
                (
                    "           OR pg_catalog.jsonb_path_exists(p_response_headers,",
                    "           OR false AND pg_catalog.jsonb_path_exists(p_response_headers,",
                )
            ],
        ),
        Variant(
            "complete_no_header_regex",
            "the header screen's two regexes",
            "complete",
            complete_edits=[
                (header_screen_start, "        IF false AND p_response_headers::text OPERATOR(pg_catalog.~*)"),
                (
                    "           OR p_response_headers::text OPERATOR(pg_catalog.~) "
                    "E'\\\\\\\\[bfnr]|\\\\\\\\u00[01]|\\\\x7f'",
                    "           OR false",
                ),
            ],
        ),
        # --- the table: the same INSERT and UPDATE as raw statements on copies of it
        Variant("raw_full", "", "claim", raw_table="k_full"),
        Variant("raw_no_expiry_index", "the expiry index entry", "claim", raw_table="k_no_expiry"),
        Variant("raw_no_user_index", "the user index entry", "claim", raw_table="k_no_user"),
        Variant("raw_no_fk", "the users foreign key check", "claim", raw_table="k_no_fk"),
        Variant(
            "raw_no_unique", "the unique index entry and ON CONFLICT", "claim", raw_table="k_no_unique", unique=False
        ),
        Variant("raw_heap_pk", "", "claim", raw_table="k_heap_pk", unique=False),
    ]


def before_functions(conn: psycopg.Connection[Any], rev: str) -> Variant:
    """idem_claim and idem_complete as they are at git revision rev, built in schema budget (they
    call the helpers of this tree, so rev must share them): the A of an A/B."""
    v = Variant("before", "", "claim", claim_fn="budget.claim_before", complete_fn="budget.complete_before")
    for path, name, target in (
        ("sql/functions/010_idem_claim.sql", "public.idem_claim(", "budget.claim_before("),
        ("sql/functions/020_idem_complete.sql", "public.idem_complete(", "budget.complete_before("),
    ):
        text = subprocess.run(
            ["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True, cwd=common.ROOT
        ).stdout
        start = text.index("CREATE OR REPLACE FUNCTION")
        end = text.index("\n$$;", start) + 4
        conn.execute(text[start:end].replace(f"FUNCTION {name}", f"FUNCTION {target}", 1))  # type: ignore[call-overload]
    conn.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA budget TO idem_app")
    return v


def ab_report(results: dict[str, list[Block]], rev: str, load: str) -> str:
    def total(b: Block) -> float:
        return b.claim + b.begin_insert + b.complete + b.commit

    rows = [
        f"A/B, backend CPU per request (µs; median over {len(results['full'])} interleaved rounds, load {load}):",
        "",
        f"| statement | before ({rev}) | after (this tree) | after - before (paired median) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for side in ("claim", "complete", "commit"):
        rows.append(
            f"| {side} | {med(results, 'before', side):.1f} | {med(results, 'full', side):.1f} | "
            f"{paired(results, 'full', 'before', side):+.1f} |"
        )
    u = results["undecorated"]
    extra = {
        k: statistics.median(total(a) - total(b) for a, b in zip(results[k], u, strict=True))
        for k in ("before", "full")
    }
    diff = statistics.median(total(a) - total(b) for a, b in zip(results["full"], results["before"], strict=True))
    rows.append(
        f"| **the database's extra per request** (decorated - undecorated) | {extra['before']:.0f} "
        f"| {extra['full']:.0f} | {diff:+.0f} |"
    )
    return "\n".join(rows)


def build(conn: psycopg.Connection[Any], vs: list[Variant]) -> None:
    """Schema budget: the items table, the table copies, every variant's functions."""
    conn.execute("DROP SCHEMA IF EXISTS budget CASCADE")
    conn.execute("CREATE SCHEMA budget")
    conn.execute("GRANT USAGE ON SCHEMA budget TO idem_app")
    conn.execute(
        "CREATE TABLE budget.items (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload jsonb NOT NULL, "
        "created_at timestamptz NOT NULL DEFAULT now())"
    )
    conn.execute("GRANT ALL ON budget.items TO idem_app")
    conn.execute("CREATE SEQUENCE budget.seq")
    conn.execute("GRANT USAGE ON SEQUENCE budget.seq TO idem_app")
    copies = {
        "k_full": [],
        "k_no_expiry": ["expires_at"],
        "k_no_user": ["scope_user_id"],
        "k_no_fk": ["fk"],
        "k_no_unique": ["idem_key"],
        "k_heap_pk": ["expires_at", "scope_user_id", "fk", "idem_key"],
    }
    for table, drop in copies.items():
        conn.execute(f"CREATE TABLE budget.{table} (LIKE public.idempotency_keys INCLUDING ALL) WITH (fillfactor = 90)")
        if "fk" not in drop:
            conn.execute(
                f"ALTER TABLE budget.{table} ADD FOREIGN KEY (scope_user_id) "
                "REFERENCES public.users(id) ON DELETE CASCADE"
            )
        for (index,) in conn.execute(
            "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0] "
            "WHERE x.indrelid = %s::regclass AND a.attname = ANY(%s)",
            (f"budget.{table}", drop),
        ).fetchall():
            con = conn.execute(
                "SELECT conname FROM pg_constraint WHERE conindid = (SELECT oid FROM pg_class WHERE relname = %s "
                "AND relnamespace = 'budget'::regnamespace)",
                (index,),
            ).fetchone()
            if con:
                conn.execute(f'ALTER TABLE budget.{table} DROP CONSTRAINT "{con[0]}"')
            else:
                conn.execute(f'DROP INDEX budget."{index}"')
        conn.execute(f"GRANT ALL ON budget.{table} TO idem_app")
    claim_def = str(conn.execute("SELECT pg_get_functiondef('public.idem_claim'::regproc)").fetchone()[0])  # type: ignore[index]
    complete_def = str(conn.execute("SELECT pg_get_functiondef('public.idem_complete'::regproc)").fetchone()[0])  # type: ignore[index]
    for v in vs:
        if v.stub:
            v.claim_fn, v.complete_fn = stub(conn, v)
            continue
        if v.claim_edits:
            src = edit(claim_def, v.claim_edits, v.name)
            src = src.replace("FUNCTION public.idem_claim(", f"FUNCTION budget.claim_{v.name}(", 1)
            conn.execute(src)  # type: ignore[call-overload]
            v.claim_fn = f"budget.claim_{v.name}"
        if v.complete_edits:
            src = edit(complete_def, v.complete_edits, v.name)
            src = src.replace("FUNCTION public.idem_complete(", f"FUNCTION budget.complete_{v.name}(", 1)
            conn.execute(src)  # type: ignore[call-overload]
            v.complete_fn = f"budget.complete_{v.name}"
    # A claim without its token is completed by a completion that checks none (its CPU is not read).
    tokenless = edit(complete_def, [cut(complete_def, TOKEN_GUARD_START, TOKEN_GUARD_END)], "tokenless")
    conn.execute(tokenless.replace("FUNCTION public.idem_complete(", "FUNCTION budget.complete_tokenless(", 1))  # type: ignore[call-overload]
    for v in vs:
        if v.name == "claim_no_token":
            v.complete_fn = "budget.complete_tokenless"
    conn.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA budget TO idem_app")


def stub(conn: psycopg.Connection[Any], v: Variant) -> tuple[str, str]:
    """Functions with the real signatures and nothing inside: what the call itself costs."""
    assert v.stub is not None
    if v.stub == "sql":
        return "", ""
    attrs = {
        "plpgsql": "",
        "definer": "SECURITY DEFINER",
        "definer_path": "SECURITY DEFINER SET search_path = pg_catalog, pg_temp",
    }[v.stub]
    claim, complete = f"budget.claim_stub_{v.stub}", f"budget.complete_stub_{v.stub}"
    conn.execute(
        f"""CREATE OR REPLACE FUNCTION {claim}(p_key text, p_user_id integer, p_endpoint text, p_request jsonb,
            p_ttl interval DEFAULT '24 hours', p_stale_after interval DEFAULT '30 seconds', p_wait_ms integer DEFAULT 0,
            p_on_stale text DEFAULT 'heal', p_now timestamptz DEFAULT NULL, p_response_key text DEFAULT NULL,
            p_response_key_fallback text DEFAULT NULL, p_key_format text DEFAULT 'uuid')
            RETURNS public.idem_claim_result LANGUAGE plpgsql VOLATILE {attrs} AS $$
            BEGIN
                RETURN ROW('claimed', 0::bigint, NULL, NULL, NULL, NULL, NULL, NULL, 1, NULL)::public.idem_claim_result;
            END $$"""  # type: ignore[arg-type]
    )
    conn.execute(
        f"""CREATE OR REPLACE FUNCTION {complete}(p_key_id bigint, p_response_code integer, p_response_body jsonb,
            p_response_key text DEFAULT NULL, p_response_headers jsonb DEFAULT NULL, p_claim_token text DEFAULT NULL)
            RETURNS void LANGUAGE plpgsql VOLATILE {attrs} AS $$
            BEGIN
                RETURN;
            END $$"""  # type: ignore[arg-type]
    )
    return claim, complete


def statements(v: Variant) -> tuple[str, str]:
    if v.raw_table:
        conflict = "(idem_key, scope_user_id, scope_endpoint) DO NOTHING" if v.unique else ""
        claim = RAW_CLAIM_CTE_SQL.format(table=v.raw_table, conflict=("ON CONFLICT " + conflict) if conflict else "")
        return claim, RAW_COMPLETE_SQL.format(table=v.raw_table)
    if v.stub == "sql":
        claim = (
            "SELECT 'claimed'::text, 0::bigint, %s::text, %s::integer, %s::text, %s::jsonb, %s::interval, "
            "%s::interval, %s::integer, %s::text, %s::text, %s::text, %s::text, "
            "set_config('synchronous_commit', 'off', true)"
        )
        return claim, "SELECT %s::bigint, %s::integer, %s::jsonb, %s::text, %s::jsonb, %s::text"
    return CLAIM_SQL.format(fn=v.claim_fn), COMPLETE_SQL.format(fn=v.complete_fn)


def cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


@dataclass
class Block:
    claim: float = 0.0  # µs per request
    begin_insert: float = 0.0
    complete: float = 0.0
    commit: float = 0.0


def run_block(conn: psycopg.Connection[Any], v: Variant | None, n: int) -> Block:
    """n requests of variant v (None: undecorated, BEGIN / INSERT / COMMIT only)."""
    pid = conn.info.backend_pid
    claim_sql, complete_sql = statements(v) if v else ("", "")
    totals = [0, 0, 0, 0]
    for _ in range(n):
        key = str(uuid.uuid4())
        user = random.randint(1, USERS)
        t0 = cpu_ns(pid)
        key_id, token = 0, None
        if v:
            if v.raw_table:
                row = conn.execute(claim_sql, (key, user, common.ENDPOINT, REQUEST), prepare=True).fetchone()  # type: ignore[arg-type]
            else:
                args = (key, user, common.ENDPOINT, REQUEST, "24 hours", "30 seconds", 0, "heal", "uuid", None, None)
                row = conn.execute(claim_sql, args, prepare=True).fetchone()  # type: ignore[arg-type]
            assert row is not None
            if v.raw_table:
                key_id = row[0]
            elif v.stub != "sql":
                key_id, token = row[1], row[7]
        t1 = cpu_ns(pid)
        conn.execute("BEGIN", prepare=False)
        conn.execute(ITEM_SQL, (RESPONSE,), prepare=True)
        t2 = cpu_ns(pid)
        if v:
            if v.raw_table:
                conn.execute(complete_sql, (201, RESPONSE, HEADERS, key_id), prepare=True)  # type: ignore[arg-type]
            else:
                conn.execute(complete_sql, (key_id, 201, RESPONSE, None, HEADERS, token), prepare=True)  # type: ignore[arg-type]
        t3 = cpu_ns(pid)
        conn.execute("COMMIT", prepare=False)
        t4 = cpu_ns(pid)
        for i, d in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            totals[i] += d
    return Block(*(t / n / 1000 for t in totals))


def connect(url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=0)
    conn.execute("SET ROLE idem_app")
    return conn


def measure(url: str, vs: list[Variant], pairs: int, rounds: int, log: Callable[[str], None]) -> dict[str, list[Block]]:
    results: dict[str, list[Block]] = {v.name: [] for v in vs}
    results["undecorated"] = []
    with connect(url) as conn:
        for v in vs:  # warm: plans, caches, prepared statements
            run_block(conn, v, 30)
        run_block(conn, None, 30)
        order: list[Variant | None] = [*vs, None]
        for r in range(rounds):
            random.shuffle(order)
            for v in order:
                results[v.name if v else "undecorated"].append(run_block(conn, v, pairs))
            log(
                f"round {r + 1}/{rounds}: full claim {results['full'][-1].claim:.0f} µs, "
                f"complete {results['full'][-1].complete:.0f} µs"
            )
    return results


def paired(results: dict[str, list[Block]], a: str, b: str, side: str) -> float:
    """Median over rounds of (a - b) on one statement's CPU."""
    return statistics.median(getattr(x, side) - getattr(y, side) for x, y in zip(results[a], results[b], strict=True))


def med(results: dict[str, list[Block]], name: str, side: str) -> float:
    return statistics.median(getattr(x, side) for x in results[name])


def report(results: dict[str, list[Block]], vs: list[Variant], load: str) -> str:
    lines = [
        f"backend CPU per request (µs; median over {len(results['full'])} rounds, load {load}):",
        "",
        "| part | claim | completion |",
        "| --- | ---: | ---: |",
    ]

    def row(label: str, claim: float | str, complete: float | str) -> None:
        fmt = lambda x: x if isinstance(x, str) else f"{x:.1f}"  # noqa: E731
        lines.append(f"| {label} | {fmt(claim)} | {fmt(complete)} |")

    fc, fx = med(results, "full", "claim"), med(results, "full", "complete")
    row("**the statement, whole** (full functions)", fc, fx)
    row(
        "statement floor: protocol, parameters, result row (stub_sql)",
        med(results, "stub_sql", "claim"),
        med(results, "stub_sql", "complete"),
    )
    for a, b, label in (
        ("stub_plpgsql", "stub_sql", "a PL/pgSQL call: FunctionScan, composite result"),
        ("stub_definer", "stub_plpgsql", "SECURITY DEFINER"),
        ("stub_definer_path", "stub_definer", "the SET search_path clause"),
    ):
        row(f"{label} ({a} - {b})", paired(results, a, b, "claim"), paired(results, a, b, "complete"))
    for v in vs:
        if v.name == "full" or v.stub or v.raw_table:
            continue
        value = paired(results, "full", v.name, v.side)
        row(f"{v.part} (full - {v.name})", value if v.side == "claim" else "", value if v.side == "complete" else "")
    lines.append("")
    lines.append(
        "the table, raw statements on copies (claim = the INSERT in its own transaction, completion = the UPDATE):"
    )
    lines.append("")
    lines.append("| raw | claim | completion |")
    lines.append("| --- | ---: | ---: |")
    row(
        "INSERT … ON CONFLICT + UPDATE, all indexes and the foreign key (raw_full)",
        med(results, "raw_full", "claim"),
        med(results, "raw_full", "complete"),
    )
    for v in vs:
        if v.raw_table and v.part:
            row(f"{v.part} (raw_full - {v.name})", paired(results, "raw_full", v.name, "claim"), "")
    row(
        "INSERT into the heap with its primary key only (raw_heap_pk)",
        med(results, "raw_heap_pk", "claim"),
        med(results, "raw_heap_pk", "complete"),
    )
    lines.append("")
    u = results["undecorated"]
    lines.append(
        f"commit: the business transaction's COMMIT {med(results, 'full', 'commit'):.1f} µs with the completion, "
        f"{statistics.median(b.commit for b in u):.1f} µs without (undecorated); BEGIN + the handler's INSERT "
        f"{med(results, 'full', 'begin_insert'):.1f} / {statistics.median(b.begin_insert for b in u):.1f} µs."
    )
    extra = [
        f.claim + f.begin_insert + f.complete + f.commit - (x.claim + x.begin_insert + x.complete + x.commit)
        for f, x in zip(results["full"], u, strict=True)
    ]
    lines.append(
        "the database's extra CPU per request (decorated - undecorated, all four statements): "
        f"**{statistics.median(extra):.0f} µs**"
    )
    return "\n".join(lines)


def profile(url: str, n: int) -> str:
    """plpgsql_check's profiler over n requests through the real functions: time per statement."""
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
        conn.execute("LOAD 'plpgsql_check'")
        conn.execute("SET plpgsql_check.profiler = on")
        conn.execute("SET ROLE idem_app")
        full = Variant("full", "", "claim")
        run_block(conn, full, n)
        conn.execute("RESET ROLE")
        out = []
        for fn in ("public.idem_claim", "public.idem_complete"):
            out.append(f"{fn}: plpgsql_check profiler, {n} requests (µs per call of each statement that ran)")
            rows = conn.execute(
                "SELECT stmtid, parent_stmtid, lineno, exec_stmts, total_time, stmtname FROM "
                "plpgsql_profiler_function_statements_tb(%s::regproc) WHERE exec_stmts > 0 ORDER BY stmtid",
                (fn,),
            ).fetchall()
            for stmtid, parent, lineno, execs, total, name in rows:
                out.append(
                    f"  stmt {stmtid:3} (parent {parent}) line {lineno:4}: "
                    f"{1000 * total / max(execs, 1):7.1f} µs × {execs / n:.0f}  {name}"
                )
        return "\n".join(out)


def perf_sample(url: str, seconds: int) -> str:
    """perf record of the backend while the real functions run; the top symbols."""
    if not shutil.which("perf"):
        return "perf: not installed"
    with connect(url) as conn:
        pid = conn.info.backend_pid
        stop = threading.Event()
        full = Variant("full", "", "claim")

        def load() -> None:
            while not stop.is_set():
                run_block(conn, full, 50)

        run_block(conn, full, 50)
        t = threading.Thread(target=load)
        t.start()
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "perf.data")
            rec = subprocess.run(
                ["perf", "record", "-F", "2999", "-p", str(pid), "-o", data, "--", "sleep", str(seconds)],
                capture_output=True,
                text=True,
            )
            stop.set()
            t.join()
            if rec.returncode != 0:
                return f"perf record failed: {rec.stderr.strip()[-300:]}"
            rep = subprocess.run(
                [
                    "perf",
                    "report",
                    "-i",
                    data,
                    "--stdio",
                    "--no-children",
                    "--sort",
                    "dso,symbol",
                    "--percent-limit",
                    "0.7",
                ],
                capture_output=True,
                text=True,
            )
        return "\n".join(x for x in rep.stdout.splitlines() if x and not x.startswith("#"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=300, help="requests per block")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", default="", help="comma-separated variant names (full is always run)")
    parser.add_argument("--profile", type=int, default=0, help="requests under plpgsql_check's profiler")
    parser.add_argument("--perf", type=int, default=0, help="seconds of perf record on the backend")
    parser.add_argument("--keep", action="store_true", help="keep the database (db_budget_PID)")
    parser.add_argument("--ab", default="", metavar="REV", help="A/B: this tree's functions against REV's (git)")
    args = parser.parse_args()
    started = time.time()
    log = common.log
    name = f"db_budget_{os.getpid()}"
    url = common.fresh_db(name)
    try:
        common.add_users(url, USERS)
        log(f"server: {common.server(url).line()}")
        with psycopg.connect(url, autocommit=True) as conn:
            request_hash = hashlib.sha256(
                str(conn.execute("SELECT %s::jsonb::text", (REQUEST,)).fetchone()[0]).encode()  # type: ignore[index]
            ).hexdigest()
            claim_src = str(
                conn.execute("SELECT prosrc FROM pg_proc WHERE oid = 'public.idem_claim'::regproc").fetchone()[0]
            )  # type: ignore[index]
            complete_src = str(
                conn.execute("SELECT prosrc FROM pg_proc WHERE oid = 'public.idem_complete'::regproc").fetchone()[0]
            )  # type: ignore[index]
            vs = variants(claim_src, complete_src, request_hash)
            if args.ab:
                args.only = "full"
            if args.only:
                keep = {"full", "undecorated", *args.only.split(",")}
                vs = [v for v in vs if v.name in keep]
            build(conn, vs)
            if args.ab:
                vs.append(before_functions(conn, args.ab))
        load0 = os.getloadavg()[0]
        results = measure(url, vs, args.pairs, args.rounds, log)
        load = f"{load0:.1f} → {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        if args.ab:
            print(ab_report(results, args.ab, load))
        elif args.only:
            for v in vs:
                print(
                    f"{v.name:28} claim {med(results, v.name, 'claim'):7.1f}  "
                    f"complete {med(results, v.name, 'complete'):7.1f}"
                )
        else:
            print(report(results, vs, load))
        if args.profile:
            print()
            print(profile(url, args.profile))
        if args.perf:
            print()
            print(f"perf record -F 2999 of the backend, {args.perf} s of requests through the real functions:")
            print(perf_sample(url, args.perf))
        log(f"db_budget: {time.time() - started:.0f} s")
    finally:
        if not args.keep:
            common.drop_db(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
