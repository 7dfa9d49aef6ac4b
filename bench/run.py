"""
The benchmark: one command that measures contract §6's figures side by side and prints a table.

    python bench/run.py            # full: 10 M rows, 100 k requests (make bench, ~15 min)
    python bench/run.py --quick    # 1 M rows, 10 k requests, shorter runs (make bench-quick)
    python bench/run.py --smoke    # seconds, tiny sizes: proves the scripts still run (make test)

Parts: sql (pgbench: functions against raw SQL, replay, mismatch), http (gunicorn + wrk:
decorated against undecorated, single-INSERT route, replays), scale (claim latency on an
empty table against a loaded one; bytes per key), cleanup (idem_cleanup beside live claims),
race (same-key claim storms, double executions counted), memory (a worker's RSS), citus (the
store on the local Citus cluster against a single node: `make bench-citus`, not run by default),
peers (idem beside the other Python idempotency libraries, bench/peers/: `make bench-peers`, not
run by default).
Each part gets its own fresh migrated database on DATABASE_URL's server, dropped at the end.
The benchmark asserts no timing: a missed target is printed as a miss, and the exit status
is 0 unless a part could not run at all.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import shlex
import shutil
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench import common  # noqa: E402
from bench.common import MODES, Report, log  # noqa: E402

PARTS = ["sql", "http", "latency", "roundtrips", "scale", "cleanup", "race", "memory", "citus", "peers"]
#: what runs without --parts: citus needs the local Citus cluster (make bench-citus), peers the
#: peers' venv (make bench-peers)
DEFAULT_PARTS = [p for p in PARTS if p not in ("citus", "peers")]
PART_NAMES = {
    "sql": "1 SQL",
    "http": "2 HTTP",
    "latency": "2a latency",
    "roundtrips": "2b round trips",
    "scale": "3 scale",
    "cleanup": "4 cleanup",
    "race": "5 race",
    "memory": "6 memory",
    "citus": "7 citus",
    "peers": "8 peers",
}


def make_target(mode: str, parts: list[str], rounds: int | None = None) -> str:
    """ " (`make bench`)": the target that runs this command, if one does."""
    if parts == ["peers"]:
        flags = ([] if mode == "full" else [f"--{mode}"]) + ([] if rounds is None else [f"--rounds {rounds}"])
        if not flags:
            return " (`make bench-peers`)"
        value = flags[0] if len(flags) == 1 and rounds is None else f"'{' '.join(flags)}'"
        return f" (`make bench-peers BENCH_PEERS_ARGS={value}`)"
    if parts == ["citus"]:
        return " (`make bench-citus`)" if mode == "full" else ""
    if parts != DEFAULT_PARTS:
        return ""
    return {"full": " (`make bench`)", "quick": " (`make bench-quick`)", "smoke": ""}[mode]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="idem benchmark (contract §6)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", dest="mode", const="quick")
    size.add_argument("--smoke", action="store_const", dest="mode", const="smoke")
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--output", help="also write the table to this file")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases")
    parser.add_argument(
        "--rounds",
        type=int,
        help="ABBA rounds of the peers part (default: the mode's, 3; smoke 1); odd rounds as round 1, even as 2",
    )
    parser.add_argument(
        "--plots", help="draw the PNGs of bench/plots.py into this directory (needs matplotlib, extra `bench`)"
    )
    args = parser.parse_args(argv)
    mode = MODES[args.mode or "full"]
    if args.rounds is not None:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        mode = dataclasses.replace(mode, peers_rounds=args.rounds)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")

    command = "python bench/run.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    report = Report()
    started = time.monotonic()
    prefix = f"idem_bench_{mode.name}_{os.getpid()}"
    failures = 0
    dbs: list[str] = []

    def fresh(suffix: str) -> str:
        name = f"{prefix}_{suffix}"
        dbs.append(name)
        return common.fresh_db(name)

    try:
        measured = common.server(common.base_url())
    except psycopg.Error as exc:
        # Never a figure measured on nothing: say so and stop.
        print(
            f"bench: cannot reach the database server ({type(exc).__name__}: "
            f"{str(exc).strip()[:300]}); nothing was measured",
            file=sys.stderr,
        )
        print(f"**Not run: the database server cannot be reached** ({type(exc).__name__})")
        return 2
    load_start = os.getloadavg()
    log(measured.line())
    log(f"mode {mode.name}, parts {','.join(parts)}")
    needs_pgbench = {"sql", "scale", "cleanup", "citus"}
    citus_dbs: list[str] = []
    try:
        for part in PARTS:
            if part not in parts or (part == "memory" and "http" in parts):
                continue  # memory is measured during the http part when both run
            if part in needs_pgbench and not common.pgbench_available():
                report.add(
                    PART_NAMES[part],
                    "not run",
                    "pgbench is missing (apt-get install postgresql-15: PostgreSQL's pgbench)",
                    "runs",
                    False,
                )
                failures += 1
                continue
            t0 = time.monotonic()
            log(f"part {part} ...")
            try:
                if part == "sql":
                    from bench import sql_path

                    url = fresh("sql")
                    common.add_users(url)
                    sql_path.run(url, mode, report)
                elif part in ("scale", "cleanup"):
                    from bench import scale

                    if part == "scale" or "scale" not in parts:
                        scale.run(fresh("empty"), fresh("scale"), mode, report, parts)
                elif part == "race":
                    from bench import race

                    race.run(fresh("race"), mode, report)
                elif part in ("latency", "roundtrips"):
                    from bench import latency

                    if part == "latency" or "latency" not in parts:
                        latency.run(fresh("latency"), mode, report, parts)
                elif part == "citus":
                    from bench import citus

                    citus_dbs += citus.run(mode, report)
                elif part == "peers":
                    from bench.peers import harness

                    harness.run(lambda system: fresh(f"peers_{system}"), mode, report)
                elif part in ("http", "memory"):
                    from bench import http_path

                    http_path.run(fresh("http"), mode, report, memory=("memory" in parts))
            except Exception as exc:  # report the part as not run, go on with the others
                failures += 1
                traceback.print_exc()
                report.add(PART_NAMES[part], "could not run", f"{type(exc).__name__}: {str(exc)[:200]}", "runs", False)
            log(f"part {part} done in {time.monotonic() - t0:.0f} s")
    finally:
        if not args.keep and not failures:
            shutil.rmtree(common.OUT, ignore_errors=True)
        if not args.keep:
            for name in dbs:
                try:
                    common.drop_db(name)
                except Exception as exc:  # a drop failing must not hide the results
                    log(f"could not drop {name}: {exc}")
            if citus_dbs:
                from bench import citus

                citus.drop(citus_dbs)

    elapsed = time.monotonic() - started
    header = [
        measured.line(),
        "",
        f"## idem benchmark ({mode.name})",
        "",
        f"- command: `{command.strip()}`" + make_target(mode.name, parts, args.rounds),
        f"- run at {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC in {elapsed:.0f} s",
        *common.machine(),
        f"- load average (1 min) at start / end: {load_start[0]:.1f} / {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores (a load above the core count means other work shared the "
        "CPUs: read the ratios of pairs, not the absolute figures)",
    ]
    if mode.name != "full":
        header.append(
            f"- **{mode.name} mode**: {mode.scale_rows:,} rows instead of 10 million, "
            + (
                f"{mode.expired_rows:,} expired rows cleaned instead of 1 million, "
                if mode.expired_rows != 1_000_000
                else ""
            )
            + f"{mode.memory_requests:,} requests for memory instead of 100,000, "
            "shorter runs; use `make bench` for the figures of record"
        )
    if args.plots:
        try:
            from bench import plots

            label = (
                f"{command.strip()} ({mode.name}), {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
                f"load {load_start[0]:.1f}/{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
            )
            suffix = "" if mode.name == "full" else f"-{mode.name}"
            drawn = plots.write_all(report, label, Path(args.plots), suffix)
            header.append(f"- pictures: {', '.join(f'`{p}`' for p in drawn) or 'none (no part drew one)'}")
        except ImportError as exc:  # matplotlib is the bench extra's, never a runtime dependency
            log(f"no pictures: {exc} (pip install 'idem-shim[bench]')")
    text = report.markdown(header)
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
