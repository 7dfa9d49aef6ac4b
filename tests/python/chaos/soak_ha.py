"""`make chaos-ha`: the chaos soak on a replicated store, with failover faults, judged by the same
invariant checker as `make chaos` (tests/python/chaos/checker.py).

    CHAOS_SECONDS=600 CHAOS_SEED=11 python -m tests.chaos.soak_ha

What runs: pg_auto_failover (scripts/ha.sh through tests/python/e2e/ha_harness.py: a monitor, a primary
and a synchronous standby, durable settings), Raptor under gunicorn (4 workers) on the libpq
multi-host URL with ``target_session_attrs=read-write``, CHAOS_CLIENTS (16) retrying clients of
tests/python/chaos/soak.py, and a fault injector on a schedule drawn from CHAOS_SEED. The kinds:
  - primary_killed: the primary's keeper, postmaster and backends SIGKILLed (a lost machine);
    the monitor promotes the standby; the time without a writable primary is measured;
  - old_primary_rejoined: after each primary_killed, the old primary started again: it rejoins
    as the standby (pg_rewind), and the pair is synchronous again;
  - standby_lost: the standby SIGKILLed; the primary must keep serving (pg_auto_failover's
    wait_primary drops the synchronous standby; commits stall until it does), then it returns.
Each fault starts from a whole pair and waits until the pair is whole again. Then the quiet
period, every key still without a final answer sent once more (soak.py's `retry_unanswered`),
and the checker over the database of the last primary. Exit status 0 only with 0
violations and every kind injected.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import asdict
from typing import Any

from tests.python.chaos.checker import check
from tests.python.chaos.soak import (
    STALE_SECONDS,
    START_CASH,
    STATEMENT_TIMEOUT_MS,
    Env,
    Records,
    client_loop,
    outcome_rows,
    print_violations,
    retry_unanswered,
    snapshot,
    soak_settings,
    table,
)
from tests.python.e2e.e2e_harness import Database, Server, prepare_template
from tests.python.e2e.ha_harness import NODES, HaCluster

FAULT_KINDS = ["primary_killed", "old_primary_rejoined", "standby_lost"]
USERS = 6
QUIET_SECONDS = STALE_SECONDS * 3


class FailoverInjector:
    def __init__(self, ha: HaCluster, env: Env, seed: int, log: Any) -> None:
        self.ha, self.env, self.rng, self.log = ha, env, random.Random(seed), log
        self.done: Counter[str] = Counter()
        self.no_primary: list[float] = []  # seconds without a writable primary, per primary_killed
        self.stalls: list[float] = []  # seconds until wait_primary, per standby_lost
        self.rejoins: list[float] = []  # seconds until the pair is whole again
        self.windows: list[tuple[str, float, float]] = []  # (kind, start, end) in load time

    def note(self, text: str) -> None:
        print(f"{self.env.now():8.2f}s {text}", file=self.log, flush=True)

    def run(self, until: float) -> None:
        kinds = ["primary_killed", "standby_lost"]
        first = kinds[:]
        self.rng.shuffle(first)
        i = 0
        while True:
            time.sleep(self.rng.uniform(1.0, 3.0) if i < 2 else self.rng.uniform(3.0, 8.0))
            if time.monotonic() >= until:
                return
            kind = first[i] if i < len(first) else self.rng.choice(kinds)
            i += 1
            try:
                getattr(self, kind)()
            except Exception as exc:  # reported and counted as not injected; the pair is mended
                self.note(f"fault {kind} not injected: {type(exc).__name__}: {exc}")
                for node in NODES:
                    self.ha.start(node)
                self.ha.wait_pair(180)

    def primary_killed(self) -> None:
        old = self.ha.primary()
        assert old is not None, "no primary"
        start = self.env.now()
        self.ha.kill(old)
        new = self.ha.wait_promoted(other_than=old, timeout=120)
        gone = self.env.now() - start
        self.no_primary.append(gone)
        self.windows.append(("primary_killed", start, self.env.now()))
        self.done["primary_killed"] += 1
        self.note(f"primary_killed: {old} killed, {new} primary after {gone:.1f}s")
        time.sleep(self.rng.uniform(1.0, 4.0))  # serving on one node for a while
        start = self.env.now()
        self.ha.start(old)
        self.ha.wait_pair(180)
        self.rejoins.append(self.env.now() - start)
        self.done["old_primary_rejoined"] += 1
        self.note(f"old_primary_rejoined: {old} is the standby after {self.env.now() - start:.1f}s")

    def standby_lost(self) -> None:
        primary = self.ha.primary()
        assert primary is not None, "no primary"
        standby = next(n for n in NODES if n != primary)
        start = self.env.now()
        self.ha.kill(standby)

        def waiting() -> bool:
            return self.ha.states().get(primary, ("", ""))[0] == "wait_primary"

        deadline = time.monotonic() + 120
        while not waiting():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{primary} never reached wait_primary")
            time.sleep(0.1)
        stall = self.env.now() - start
        self.stalls.append(stall)
        self.done["standby_lost"] += 1
        time.sleep(self.rng.uniform(2.0, 5.0))  # the primary serves alone
        self.windows.append(("standby_lost", start, self.env.now()))
        self.note(f"standby_lost: {standby} killed, {primary} wait_primary after {stall:.1f}s")
        start = self.env.now()
        self.ha.start(standby)
        self.ha.wait_pair(180)
        self.rejoins.append(self.env.now() - start)
        self.note(f"standby_lost: {standby} back as the standby after {self.env.now() - start:.1f}s")


def main() -> int:
    run = soak_settings("chaos-ha", clients=16)
    seconds, seed, n_clients, out = run.seconds, run.seed, run.clients, run.out
    ha = HaCluster(sync=True)
    server: Server | None = None
    fault_log = open(out / "faults.log", "w")
    try:
        prepare_template(ha, "raptor_chaos_ha")  # type: ignore[arg-type]  # stands in for a Cluster
        db = Database(ha, "raptor_chaos_ha")  # type: ignore[arg-type]
        db.query(f"ALTER ROLE raptor_web IN DATABASE raptor_chaos_ha SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        settings = db.query(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('fsync', 'synchronous_commit', 'full_page_writes', 'synchronous_standby_names') ORDER BY name"
        )
        print(f"chaos-ha: primary settings {settings}", flush=True)
        users = [db.seed_user(cash_cents=START_CASH) for _ in range(USERS)]
        server = Server(
            db.app_url,
            env={
                "IDEM_STALE_AFTER_SECONDS": str(STALE_SECONDS),
                "GUNICORN_TIMEOUT": "60",
                "RAPTOR_LOG_LEVEL": "WARNING",
                "IDEM_CONNECT_TIMEOUT": "2",
                "RAPTOR_DB_CONNECT_TIMEOUT_S": "2",
                "IDEM_STATEMENT_TIMEOUT_MS": str(STATEMENT_TIMEOUT_MS),
                "RAPTOR_ORDER_CLAIM": run.claim,
            },
        ).start()
        t0 = time.monotonic()
        env = Env({"direct": server}, [{"user_id": u.user_id, "token": u.token} for u in users], Records(), t0)
        load_end = t0 + seconds
        clients = [threading.Thread(target=client_loop, args=(env, i, seed, load_end)) for i in range(n_clients)]
        for t in clients:
            t.start()
        injector = FailoverInjector(ha, env, seed, fault_log)
        try:
            injector.run(until=load_end)
        finally:
            env.stopped.set()
            for t in clients:
                t.join()
        time.sleep(QUIET_SECONDS)
        retried = retry_unanswered(env)  # every key still without a final answer, once more
        duration = time.monotonic() - t0
        (out / "gunicorn.log").write_text(server.log())
        (out / "monitor-events.log").write_text(ha.events())
        snap = snapshot(db, {u.user_id: START_CASH for u in users})
        report = check(env.records.attempts, snap, env.records.gave_up)
    finally:
        if server is not None:
            server.stop()
        ha.destroy()
        fault_log.close()

    (out / "records.json").write_text(json.dumps([asdict(a) for a in env.records.attempts], default=str))
    c = report.counters

    def in_windows(kind: str, ok: bool) -> int:
        return sum(
            1
            for a in env.records.attempts
            if a.status is not None
            and (200 <= a.status < 300) == ok
            and (ok or a.status == 503)
            and any(k == kind and s <= a.started <= e for k, s, e in injector.windows)
        )

    rows: list[tuple[str, Any]] = [
        ("duration (load + quiet period)", f"{duration:.0f} s"),
        ("clients", n_clients),
        ("paper route's claim (CHAOS_CLAIM)", run.claim),
        ("requests", c["requests"]),
        ("orders (keys)", c["orders"]),
        ("orders executed", c["orders executed"]),
        ("faults", sum(injector.done.values())),
    ]
    rows += [(f"  {kind}", injector.done[kind]) for kind in FAULT_KINDS]
    rows += [
        ("longest time without a primary", f"{max(injector.no_primary, default=0):.1f} s"),
        (
            "mean time without a primary",
            f"{sum(injector.no_primary) / max(1, len(injector.no_primary)):.1f} s",
        ),
        ("longest commit stall, standby lost (until wait_primary)", f"{max(injector.stalls, default=0):.1f} s"),
        ("longest rejoin (until primary + secondary)", f"{max(injector.rejoins, default=0):.1f} s"),
        ("2xx while a primary was being replaced", in_windows("primary_killed", True)),
        ("503 while a primary was being replaced", in_windows("primary_killed", False)),
        ("2xx while the standby was lost", in_windows("standby_lost", True)),
    ]
    rows += [*retried.items(), *outcome_rows(c)]
    print()
    print(table(rows))
    violations = report.violations
    missing = [kind for kind in FAULT_KINDS if not injector.done[kind]]
    print_violations(report, env.records.attempts, snap)
    if missing:
        print(f"\nchaos-ha: fault kinds never injected: {', '.join(missing)} (see {out}/faults.log)")
    print(f"chaos-ha: {c['requests']} requests, {sum(injector.done.values())} faults, {len(violations)} violations")
    return 1 if violations or missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
