"""Parts 2a and 2b: the latency a user feels, and round trips at network distance.

2a: one client, one request at a time (wrk, one connection), against bench/app.py's
single-INSERT route decorated and undecorated (BENCH_IDEMPOTENCY=off), alternating; p50 and
p99 of each and the added p50 (median of the pairs' differences).

2b: the same two servers reach PostgreSQL through bench/proxy.py, which delays every chunk by
half the injected round-trip time each way and counts the client's round trips. Round trips per
request are counted exactly over a fixed number of sequential requests; the added p50 is taken
as in 2a.
"""

from __future__ import annotations

import uuid

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.common import OUT, Mode, Report, fmt_ms, log, median
from bench.http_path import ITEM_BODY, Server, post, setup, wrk, wrk_bin
from bench.proxy import Proxy

ITEMS = "/bench/items"
LATENCY_TARGET_MS = 0.6
RTT_MS = 1.0
COUNTED_REQUESTS = 50


def _servers(tag: str, url: str) -> tuple[Server, Server]:
    on = Server(f"items_on_{tag}", "bench.app:create_app()", {"DATABASE_URL": url, "BENCH_IDEMPOTENCY": "on"}, 1)
    off = Server(f"items_off_{tag}", "bench.app:create_app()", {"DATABASE_URL": url, "BENCH_IDEMPOTENCY": "off"}, 1)
    return on, off


def _psycopg_path(tag: str, url: str) -> Server:
    """The decorated route with IDEM_LIBPQ_PATH=false: psycopg's cursor and pipeline for the claim
    and the completion, the path before the worker-CPU levers, measured in the same run."""
    env = {"DATABASE_URL": url, "BENCH_IDEMPOTENCY": "on", "IDEM_LIBPQ_PATH": "false"}
    return Server(f"items_psycopg_{tag}", "bench.app:create_app()", env, 1)


_RUN = [0]


#: (p50 ms, p99 ms, requests, the run's percentile -> ms) of one one-client run
OneClient = tuple[float, float, int, dict[float, float]]


def _one_client(server: Server, tokens: str, seconds: int) -> OneClient:
    _RUN[0] += 1
    r = wrk(server.base + ITEMS, "fresh.lua", [str(uuid.uuid4().int % 2**31), tokens, ITEM_BODY], seconds, 1)
    if r.bad:
        raise RuntimeError(f"{server.name}: {r.bad} failed requests (see {server.log_path})")
    return r.p50_ms, r.p99_ms, r.requests, r.percentiles


def _pairs(
    on: Server, off: Server, tokens: str, mode: Mode, label: str, before: Server | None = None
) -> tuple[list[OneClient], list[OneClient], list[OneClient]]:
    """Rounds of one run per server, in A/B(/C) then reversed order; the third list is ``before``'s."""
    runs: dict[str, list[OneClient]] = {on.name: [], off.name: []}
    sides = [on, off] if before is None else [on, off, before]
    if before is not None:
        runs[before.name] = []
    for i in range(mode.latency_pairs):
        for side in sides if i % 2 == 0 else sides[::-1]:
            r = _one_client(side, tokens, mode.latency_seconds)
            runs[side.name].append(r)
            log(f"{label} {side.name}: p50 {r[0]:.3f} ms p99 {r[1]:.3f} ms ({r[2]} requests)")
    return runs[on.name], runs[off.name], runs[before.name] if before is not None else []


def _rows(
    report: Report,
    part: str,
    what: str,
    dec: list[OneClient],
    und: list[OneClient],
    target: float | None,
) -> None:
    added = median([a[0] - b[0] for a, b in zip(dec, und, strict=True)])
    diffs = ", ".join(f"{a[0] - b[0]:+.2f}" for a, b in zip(dec, und, strict=True))
    report.add(
        part,
        f"{what}: decorated single-INSERT route, p50 / p99 (one client, one request "
        f"at a time, median of {len(dec)} runs)",
        f"{fmt_ms(median([r[0] for r in dec]))} / {fmt_ms(median([r[1] for r in dec]))}",
    )
    report.add(
        part,
        f"{what}: undecorated (BENCH_IDEMPOTENCY=off), p50 / p99",
        f"{fmt_ms(median([r[0] for r in und]))} / {fmt_ms(median([r[1] for r in und]))}",
    )
    if target is None:
        report.add(part, f"{what}: added p50, median of the pairs ({diffs})", f"{added:+.2f} ms")
    else:
        report.add(
            part,
            f"{what}: added p50, median of the pairs ({diffs})",
            f"{added:+.2f} ms",
            f"≤ {target} ms",
            added <= target,
        )


def run(admin_url: str, mode: Mode, report: Report, parts: list[str]) -> None:
    if not wrk_bin():
        for part, name in (("latency", "2a latency"), ("roundtrips", "2b round trips")):
            if part in parts:
                report.add(name, "not run", "wrk is not installed (apt-get install wrk)", "runs", False)
        return
    _, tokens = setup(admin_url, 2)
    OUT.mkdir(parents=True, exist_ok=True)
    tokens_file = OUT / "latency_tokens.txt"
    tokens_file.write_text("\n".join(tokens) + "\n")
    servers: list[Server] = []
    proxy: Proxy | None = None
    try:
        if "latency" in parts:
            on, off = _servers("direct", admin_url)
            before = _psycopg_path("direct", admin_url)
            servers += [on, off, before]
            for s in (on, off, before):
                s.start()
            for s in (on, off, before):
                s.wait_ready()
                _one_client(s, str(tokens_file), 1)  # warm-up: pool open, statements prepared
            dec, und, old = _pairs(on, off, str(tokens_file), mode, "latency", before)
            _rows(report, "2a latency", "loopback", dec, und, LATENCY_TARGET_MS)
            added_old = median([a[0] - b[0] for a, b in zip(old, und, strict=True)])
            added_new = median([a[0] - b[0] for a, b in zip(dec, und, strict=True)])
            report.add(
                "2a latency",
                "loopback: added p50 before → after the worker-CPU levers, same run (before: "
                "IDEM_LIBPQ_PATH=false, psycopg's cursor and pipeline)",
                f"{added_old:+.2f} → {added_new:+.2f} ms",
            )
            report.data["latency"] = ([r[3] for r in dec], [r[3] for r in und])
            for s in (on, off, before):
                s.stop()
        if "roundtrips" in parts:
            target = conninfo_to_dict(admin_url)
            proxy = Proxy(
                ("127.0.0.1", 0), (str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432)), RTT_MS / 2
            ).start()
            via = make_conninfo(admin_url, host=proxy.listen[0], port=str(proxy.listen[1]), sslmode="disable")
            on, off = _servers("proxied", via)
            servers += [on, off]
            for s in (on, off):
                s.start()
            per_request: dict[str, float] = {}
            messages: dict[str, str] = {}
            for s in (on, off):
                s.wait_ready()
                _one_client(s, str(tokens_file), 1)
                for _ in range(10):  # the pool's connections are open, statements prepared
                    post(s, ITEMS, str(uuid.uuid4()), tokens[0], ITEM_BODY)
                before, msgs_before, _ = proxy.counts.snapshot()
                for _ in range(COUNTED_REQUESTS):
                    post(s, ITEMS, str(uuid.uuid4()), tokens[0], ITEM_BODY)
                after, msgs_after, _ = proxy.counts.snapshot()
                per_request[s.name] = (after - before) / COUNTED_REQUESTS
                messages[s.name] = ", ".join(
                    f"{k} {(msgs_after.get(k, 0) - msgs_before.get(k, 0)) / COUNTED_REQUESTS:g}"
                    for k in sorted(msgs_after)
                    if msgs_after.get(k, 0) != msgs_before.get(k, 0)
                )
            d, u = per_request[on.name], per_request[off.name]
            part = "2b round trips"
            report.add(
                part,
                f"round trips to PostgreSQL per request, decorated / undecorated "
                f"(bench/proxy.py, {COUNTED_REQUESTS} sequential requests each)",
                f"{d:g} / {u:g} (messages per request, decorated: {messages[on.name]}; "
                f"undecorated: {messages[off.name]})",
            )
            report.add(part, "round trips added by the decoration", f"{d - u:+g}", "exactly +1", abs(d - u - 1) < 0.01)
            dec, und, _ = _pairs(on, off, str(tokens_file), mode, "rtt 1 ms")
            _rows(report, part, f"{RTT_MS:g} ms RTT injected", dec, und, None)
    finally:
        for s in servers:
            s.stop()
        if proxy is not None:
            proxy.stop()
