"""`make chaos-citus`: the chaos soak on a Citus formation under pg_auto_failover, judged by the
same invariant checkers as `make chaos` (tests/python/chaos/checker.py, live_checker.py).

    CHAOS_SECONDS=600 CHAOS_SEED=11 python -m tests.python.chaos.soak_citus

What runs: scripts/ha-citus.sh through tests/python/e2e/citus_ha_harness.py (a monitor, a
coordinator, worker groups of a primary and its synchronous standby; the formation of `make
test-chaos-citus` with IDEM_HA_CITUS_REUSE=1, else a private one), Raptor under gunicorn (4
workers) on the coordinator with its tables colocated with the store, the broker simulator,
CHAOS_CLIENTS (16) retrying clients of tests/python/chaos/soak.py on the paper and live routes
(up to CLIENT_TRIES tries or 120 s an order),
and two fault injectors on schedules drawn from CHAOS_SEED, side by side:

- the formation's, one fault at a time, each from a whole formation to a whole formation:
  worker_primary_killed  a worker's primary SIGKILLed (keeper, postmaster, backends); the monitor
                         promotes its standby, the new primary's keeper points the coordinator's
                         metadata at itself (citus_update_node); the old primary rejoins as standby
  worker_standby_lost    a worker's synchronous standby SIGKILLed: its primary's commits stall
                         until the monitor moves it to wait_primary; the standby returns
  coordinator_worker_cut the network between the coordinator and a worker's primary cut (every
                         connection reset, new ones refused: bench/proxy.py, put in the way by
                         pg_dist_poolinfo) for a few seconds, then healed
  worker_joined          a new worker group joins and the store and Raptor's tables are
                         rebalanced onto it without blocking writes (citus_rebalance_start,
                         force_logical); with the formation full, a group is first drained and
                         dropped (worker_drained), so that one can join again
  shard_moved            one shard group moved to another worker (citus_move_shard_placement,
                         force_logical)
  promotion_during_move  a shard group moving off a worker whose primary is killed as the copy
                         starts: the move fails with the reason, Citus drops what it copied, the
                         shard stays where it was
- the app's (tests/python/chaos/soak.py's Injector): gunicorn workers killed and frozen past the
  stale window, the coordinator's app backends terminated, a business row locked, HUP, and the
  live route's faults (a worker killed after the broker filled, a zombie, the broker dropping the
  connection, failing, slow).

While shards move, a sampler watches the coordinator for app backends waiting on a lock (a claim
that met a move's write block) and counts them; every request in flight during a move must get
an answer. Then the quiet period, every key still without a final answer sent once more (soak.py's
`retry_unanswered`), and the checkers over the run's own users (0 orphan fills is part of the pass). Exit status 0 only
with 0 violations, no unanswered request during a move, and (runs of FULL_ROUND_SECONDS or more)
every kind injected. The last line is the verdict.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.proxy import Proxy
from examples.simulators.process import Simulator
from tests.python.chaos.checker import Report, check
from tests.python.chaos.live_checker import LiveReport, check_live
from tests.python.chaos.soak import (
    LIVE_ENDPOINT,
    LIVE_USERS,
    QUIET_SECONDS,
    SERVER_ENV,
    START_CASH,
    STATEMENT_TIMEOUT_MS,
    USERS,
    Env,
    Injector,
    Records,
    client_loop,
    load_rows,
    outcome_rows,
    print_violations,
    retry_unanswered,
    schedule,
    snapshot,
    soak_settings,
    table,
)
from tests.python.e2e.citus_ha_harness import DB, CitusFormation, prepare_raptor
from tests.python.e2e.e2e_harness import Database, Server, wait_until

#: The formation's kinds, the quicker ones first: a run's first round takes them in a shuffled
#: order within each half, so that a short run reaches the most kinds.
QUICK_KINDS = ["coordinator_worker_cut", "shard_moved", "worker_standby_lost"]
SLOW_KINDS = ["worker_primary_killed", "worker_joined", "promotion_during_move"]
FORMATION_KINDS = [*QUICK_KINDS, *SLOW_KINDS]
APP_KINDS = [
    "sigkill_worker",
    "zombie_worker",
    "terminate_backends",
    "lock_business_row",
    "gunicorn_hup",
    "live_kill_after_accept",
    "live_zombie",
    "broker_drop_after_accept",
    "broker_5xx_before_accept",
    "broker_delay",
]
#: A client's tries for one order (MAX_ORDER_SECONDS, 120 s, caps them too): after a worker's
#: promotion every completion after a handler's writes answers 503 until the workers' metadata is
#: current again, up to a minute here, and a client retrying on each Retry-After makes ~50 tries
#: in that time; the soak's 40 would give up inside the window and leave its key in flight.
CLIENT_TRIES = 100
#: A run this long reaches every formation kind (a join and its rebalance alone take ~40 s here).
FULL_ROUND_SECONDS = 240
MAX_GROUPS = 3  # scripts/ha-citus.sh's ports hold three worker groups


# --- moves and the claims that wait on them -----------------------------------------------------


class MoveWatch:
    """While shards move, samples the coordinator every 20 ms for app backends waiting on a lock
    (a claim or a handler that met a move's write block: it lasts as long as the move's last
    catch-up, so a shorter wait can slip between two samples), and keeps each move's window."""

    def __init__(self, url: str, t0: float) -> None:
        self.url, self.t0 = url, t0
        self.windows: list[tuple[str, float, float]] = []  # (what, start, end) in load time
        self.waits: dict[tuple[int, str], float] = {}  # (pid, query_start) -> longest wait seen
        self.claims: set[tuple[int, str]] = set()  # the waits whose statement was a claim

    @contextmanager
    def moving(self, what: str) -> Iterator[None]:
        stop = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(stop,), daemon=True)
        start = time.monotonic() - self.t0
        sampler.start()
        try:
            yield
        finally:
            stop.set()
            sampler.join()
            self.windows.append((what, start, time.monotonic() - self.t0))

    def _sample(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
                    while not stop.is_set():
                        for pid, started, waited, query in conn.execute(
                            "SELECT pid, query_start::text, extract(epoch FROM clock_timestamp() - query_start),"
                            "       query FROM pg_stat_activity"
                            " WHERE usename = 'raptor_web' AND state = 'active' AND wait_event_type = 'Lock'"
                        ).fetchall():
                            key = (int(pid), str(started))
                            self.waits[key] = max(self.waits.get(key, 0.0), float(waited))
                            if "idem_claim" in str(query):
                                self.claims.add(key)
                        stop.wait(0.02)
            except psycopg.Error:
                stop.wait(0.5)  # the coordinator is busy or restarting: sample again

    def in_flight(self, env: Env) -> list[Any]:
        """Every attempt that was in flight while a move ran (paper and live)."""
        attempts = [*env.records.attempts, *env.live_records.attempts]
        return [a for a in attempts if overlaps(a, self.windows)]


#: The app's faults that drop HTTP connections on purpose: a request they cut off is unanswered
#: whether or not a shard was moving.
DROPS_CONNECTIONS = {"sigkill_worker", "zombie_worker", "gunicorn_hup", "live_kill_after_accept", "live_zombie"}


def overlaps(attempt: Any, windows: list[tuple[str, float, float]], margin: float = 0.0) -> bool:
    return any(s - margin <= attempt.started + attempt.elapsed and attempt.started <= e + margin for _, s, e in windows)


# --- the load and its judges ---------------------------------------------------------------------


@dataclass
class Verdict:
    report: Report
    live: LiveReport
    env: Env
    snap: Any
    violations: int


class CitusLoad:
    """Raptor on the coordinator (gunicorn, 4 workers, the live route on the broker simulator),
    users of its own, and CHAOS_CLIENTS retrying clients; `judge()` after the quiet period."""

    def __init__(self, db: Database, out: Path, seed: int, clients: int = 16, claim: str = "before") -> None:
        self.db, self.out, self.seed, self.clients = db, out, seed, clients
        self.broker = Simulator("broker", out / "broker").start()
        self.server: Server | None = None
        try:
            db.query(f"ALTER ROLE raptor_web IN DATABASE {DB} SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
            self.users = [db.seed_user(cash_cents=START_CASH) for _ in range(USERS)]
            self.live_users = [db.seed_user(cash_cents=START_CASH, mode="live") for _ in range(LIVE_USERS)]
            env = {
                **SERVER_ENV,
                "RAPTOR_LIVE_TRADING": "1",
                "RAPTOR_BROKER_URL": self.broker.url,
                "IDEM_STATEMENT_TIMEOUT_MS": str(STATEMENT_TIMEOUT_MS),
                "RAPTOR_ORDER_CLAIM": claim,
            }
            self.server = Server(db.app_url, env=env).start()
        except BaseException:
            self.close()
            raise
        self.env = Env(
            {"direct": self.server},
            [{"user_id": u.user_id, "token": u.token} for u in self.users],
            Records(),
            time.monotonic(),
            live_users=[{"user_id": u.user_id, "token": u.token} for u in self.live_users],
            max_tries=CLIENT_TRIES,
        )
        self.threads: list[threading.Thread] = []
        self.retried: Counter[str] = Counter()

    @property
    def user_ids(self) -> list[int]:
        return [u.user_id for u in [*self.users, *self.live_users]]

    def start(self, seconds: float) -> Env:
        self.env.t0 = time.monotonic()
        load_end = self.env.t0 + seconds
        self.threads = [
            threading.Thread(target=client_loop, args=(self.env, i, self.seed, load_end)) for i in range(self.clients)
        ]
        for t in self.threads:
            t.start()
        return self.env

    def stop(self) -> None:
        """End the load now (or at its end), let every client finish its retries, then be quiet."""
        self.env.stopped.set()
        for t in self.threads:
            t.join()
        time.sleep(QUIET_SECONDS)
        self.retried = retry_unanswered(self.env)  # every key still without a final answer, once more

    def judge(self) -> Verdict:
        snap = snapshot(self.db, {u.user_id: START_CASH for u in self.users}, self.user_ids)
        report = check(self.env.records.attempts, snap, self.env.records.gave_up)
        # one call per key on the coordinator: in a query over the keys Citus would send the
        # function (which reads the idem_secret reference table) to the shards, and refuse it
        with psycopg.connect(self.db.admin_url) as conn:
            keys = conn.execute(
                "SELECT idem_key, scope_user_id, scope_endpoint FROM public.idempotency_keys"
                " WHERE scope_endpoint = %s AND status = 'completed' AND scope_user_id = ANY(%s)",
                (LIVE_ENDPOINT, self.user_ids),
            ).fetchall()
            completed = {}
            for key, user_id, endpoint in keys:
                row = conn.execute(
                    "SELECT idem_downstream_key(%s, %s, %s, 'broker')", (key, user_id, endpoint)
                ).fetchone()
                assert row is not None
                completed[str(row[0])] = str(key)
        live = check_live(self.broker.fills(), completed, self.env.live_answers)
        return Verdict(report, live, self.env, snap, len(report.violations) + live.violations)

    def close(self) -> None:
        if self.server is not None:
            (self.out / "gunicorn.log").write_text(self.server.log())
            self.server.stop()
        self.broker.stop()


# --- the formation's faults --------------------------------------------------------------------


@dataclass
class FormationFaults:
    formation: CitusFormation
    env: Env
    watch: MoveWatch
    seed: int
    log: Any
    done: Counter[str] = field(default_factory=Counter)
    promotions: int = 0
    nodes_added: int = 0
    nodes_removed: int = 0
    no_primary: list[float] = field(default_factory=list)  # seconds a worker group had none
    resyncs: list[float] = field(default_factory=list)  # seconds from a promotion to current metadata
    stalls: list[float] = field(default_factory=list)  # seconds until wait_primary, standby lost
    windows: list[tuple[str, float, float]] = field(default_factory=list)  # (kind, start, end)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.seed}-formation")

    def note(self, text: str) -> None:
        print(f"{self.env.now():8.2f}s {text}", file=self.log, flush=True)

    def run(self, until: float) -> None:
        quick, slow = QUICK_KINDS[:], SLOW_KINDS[:]
        self.rng.shuffle(quick)
        self.rng.shuffle(slow)
        first = [*quick, *slow]
        i = 0
        while True:
            time.sleep(self.rng.uniform(1.0, 3.0) if i < len(first) else self.rng.uniform(3.0, 8.0))
            if time.monotonic() >= until:
                return
            kind = first[i] if i < len(first) else self.rng.choice(FORMATION_KINDS)
            i += 1
            start = self.env.now()
            try:
                self.formation.wait_whole()
                getattr(self, kind)()
                self.done[kind] += 1
                outcome = "ok"
            except Exception as exc:  # reported and not counted; the formation is mended
                outcome = f"not injected: {type(exc).__name__}: {exc}"
                self.mend()
            self.windows.append((kind, start, self.env.now()))
            self.note(f"fault {kind:<24} ({self.env.now() - start:.1f}s) {outcome}")

    def mend(self) -> None:
        for node in self.formation.node_names():
            try:
                self.formation.start(node)
            except RuntimeError as exc:
                self.note(f"mend: {node} did not start: {exc}")
        self.formation.wait_whole(300)

    def group(self) -> int:
        return int(self.rng.choice(self.formation.groups()))

    def worker_primary_killed(self, group: int | None = None) -> str:
        """Returns the new primary."""
        g = self.group() if group is None else group
        old = self.formation.primary(g)
        assert old is not None, f"group {g} has no primary"
        start = self.env.now()
        self.formation.kill(old)
        new = self.formation.wait_promoted(g, other_than=old)
        promoted = self.env.now()
        self.no_primary.append(promoted - start)
        self.promotions += 1
        self.note(f"worker_primary_killed: {old} killed, {new} primary of group {g} after {self.no_primary[-1]:.1f}s")
        # Citus delegates no call until every worker has the new metadata: completions after a
        # handler's writes answer 503 meanwhile (sql/citus/021)
        wait_until(self.formation.synced, 300, 0.2, what="the workers' copy of the metadata")
        self.resyncs.append(self.env.now() - promoted)
        self.note(f"worker_primary_killed: the workers' metadata current {self.resyncs[-1]:.1f}s after the promotion")
        time.sleep(self.rng.uniform(1.0, 3.0))  # the group serves on one node a while
        self.formation.start(old)
        self.formation.wait_whole()
        self.note(f"worker_primary_killed: {old} back as the standby of group {g}")
        return new

    def worker_standby_lost(self, group: int | None = None) -> None:
        g = self.group() if group is None else group
        primary, standby = self.formation.primary(g), self.formation.standby(g)
        assert primary is not None and standby is not None, self.formation.state()
        start = self.env.now()
        self.formation.kill(standby)
        wait_until(
            lambda: self.formation.nodes().get(primary, (0, "", ""))[1] == "wait_primary",
            120,
            0.1,
            what=f"{primary} in wait_primary",
        )
        self.stalls.append(self.env.now() - start)
        time.sleep(self.rng.uniform(2.0, 4.0))  # the primary serves alone
        self.formation.start(standby)
        self.formation.wait_whole()
        self.note(f"worker_standby_lost: {standby} killed, {primary} wait_primary after {self.stalls[-1]:.1f}s")

    def coordinator_worker_cut(self, group: int | None = None, seconds: float | None = None) -> None:
        """The coordinator reaches the worker through a proxy (pg_dist_poolinfo), which is cut."""
        g = self.group() if group is None else group
        primary = self.formation.primary(g)
        assert primary is not None
        proxy = Proxy(("127.0.0.1", 0), ("127.0.0.1", self.formation.node_port(primary)), 0.0).start()
        url = self.formation.url(DB)
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT nodeid FROM pg_dist_node WHERE groupid = %s AND noderole = 'primary'", (g,)
                ).fetchone()
                assert row is not None
                nodeid = int(row[0])
                conn.execute(
                    "INSERT INTO pg_dist_poolinfo (nodeid, poolinfo) VALUES (%s, %s)",
                    (nodeid, f"host=127.0.0.1 port={proxy.listen[1]}"),
                )
                try:
                    reconnect(conn)  # the coordinator's cached connections now go through it
                    proxy.cut()
                    cut = self.rng.uniform(2.0, 5.0) if seconds is None else seconds
                    self.note(f"coordinator_worker_cut: group {g} ({primary}) cut off for {cut:.1f}s")
                    time.sleep(cut)
                    proxy.heal()
                finally:
                    conn.execute("DELETE FROM pg_dist_poolinfo WHERE nodeid = %s", (nodeid,))
                    reconnect(conn)
        finally:
            proxy.stop()

    def worker_joined(self) -> None:
        if len(self.formation.groups()) >= MAX_GROUPS:
            self.worker_drained()
        with self.watch.moving("join"):
            g = self.formation.add_worker()
            self.nodes_added += 2
            self.note(f"worker_joined: group {g} added; rebalancing")
            out = self.formation.run("rebalance", timeout=900)
            self.note(f"worker_joined: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ''}")
            assert out.returncode == 0, out.stderr

    def worker_drained(self) -> None:
        g = max(self.formation.groups())
        with self.watch.moving("drain"):
            self.formation.drop_worker(g)
        self.nodes_removed += 2
        self.done["worker_drained"] += 1
        self.note(f"worker_drained: group {g} drained and dropped")

    def shard_moved(self) -> None:
        shard, group, source = self.rng.choice(self.formation.placements())
        target = self.rng.choice(sorted({port for _, g, port in self.formation.placements() if g != group}))
        with self.watch.moving("move"):
            self.formation.move_shard(shard, source, target)
        self.note(f"shard_moved: shard {shard} (and its colocated shards) from :{source} to :{target}")

    def promotion_during_move(self) -> str:
        """Returns the failed move's error (SQLSTATE: message)."""
        rows = self.formation.placements()
        shard, group, source = self.rng.choice(rows)
        target = self.rng.choice(sorted({port for _, g, port in rows if g != group}))
        primary = self.formation.primary(group)
        assert primary is not None
        error: dict[str, str] = {}

        def move() -> None:
            try:
                self.formation.move_shard(shard, source, target)
                error["message"] = "the move finished before the kill"
            except psycopg.Error as exc:
                error["message"] = f"{exc.sqlstate}: {exc}"

        def copying() -> bool:  # the move's replication slot exists on the source
            try:
                with psycopg.connect(self.formation.node_url(primary, DB), connect_timeout=2) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'citus_shard_move%'"
                    ).fetchone()
                return bool(row and row[0])
            except psycopg.Error:
                return False

        with self.watch.moving("move during a promotion"):
            mover = threading.Thread(target=move)
            mover.start()
            wait_until(copying, 60, 0.05, what="the move's replication slot on the source")
            self.worker_primary_killed(group)
            mover.join()
        with psycopg.connect(self.formation.url(DB), autocommit=True) as conn:
            placed = conn.execute("SELECT groupid FROM pg_dist_placement WHERE shardid = %s", (shard,)).fetchone()
            assert placed is not None and placed[0] == group, f"shard {shard} left group {group}: {placed}"

            def cleaned() -> bool:
                row = conn.execute("SELECT count(*) = 0 FROM pg_dist_cleanup").fetchone()
                return bool(row and row[0])

            wait_until(cleaned, 120, 1.0, what="Citus's cleanup of the failed move")
        self.note(f"promotion_during_move: shard {shard} stayed on group {group}; the move: {error['message']}")
        return error["message"]


def reconnect(conn: psycopg.Connection[Any]) -> None:
    """Make every coordinator backend drop its cached connections to the workers at the end of its
    next transaction (citus.max_cached_connection_lifetime), so that new ones follow the metadata."""
    conn.execute("ALTER SYSTEM SET citus.max_cached_connection_lifetime = 0")
    conn.execute("SELECT pg_reload_conf()")
    time.sleep(1.5)
    conn.execute("ALTER SYSTEM RESET citus.max_cached_connection_lifetime")
    conn.execute("SELECT pg_reload_conf()")


# --- the run -----------------------------------------------------------------------------------


def main() -> int:
    run = soak_settings("chaos-citus", clients=16)
    seconds, seed, n_clients, out = run.seconds, run.seed, run.clients, run.out
    t_setup = time.monotonic()
    formation = CitusFormation()
    fault_log = open(out / "faults.log", "w")
    load: CitusLoad | None = None
    try:
        for node in formation.node_names():  # a formation a previous run left with a node down
            formation.start(node)
        formation.wait_whole()
        prepare_raptor(formation)
        db = Database(formation, DB)  # type: ignore[arg-type]  # stands in for a Cluster
        load = CitusLoad(db, out, seed, n_clients, run.claim)
        print(f"chaos-citus: formation and app ready in {time.monotonic() - t_setup:.0f} s", flush=True)
        env = load.start(seconds)
        until = env.t0 + seconds
        watch = MoveWatch(formation.url(DB), env.t0)
        faults = FormationFaults(formation, env, watch, seed, fault_log)
        app = Injector(
            env,
            db,
            None,
            None,
            schedule(seed, seconds, APP_KINDS, targets=("direct",)),
            seed,
            fault_log,
            load.broker,
        )
        app_thread = threading.Thread(target=app.run, args=(until,))
        app_thread.start()
        try:
            faults.run(until)
        finally:
            app_thread.join()
            load.stop()
        duration = time.monotonic() - env.t0
        (out / "records.json").write_text(json.dumps([asdict(a) for a in env.records.attempts], default=str))
        verdict = load.judge()
        retried = load.retried
        (out / "monitor-events.log").write_text(formation.events())
        formation.wait_whole()
    finally:
        if load is not None:
            load.close()
        formation.destroy()
        fault_log.close()

    c, live = verdict.report.counters, verdict.live
    in_moves = watch.in_flight(env)
    dropping = [w for w in app.windows if w[0] in DROPS_CONNECTIONS]
    excused = [a for a in in_moves if a.status is None and overlaps(a, dropping, margin=2.0)]
    unanswered = [a for a in in_moves if a.status is None and a not in excused]
    kinds = Counter({**app.done, **faults.done})
    rows = [*load_rows(duration, n_clients, c, env, live), ("faults", sum(kinds.values()))]
    rows += [(f"  {kind}", kinds[kind]) for kind in [*FORMATION_KINDS, "worker_drained", *APP_KINDS]]
    rows += [
        ("promotions (worker standby made primary)", faults.promotions),
        ("nodes added (a group: primary + standby)", faults.nodes_added),
        ("nodes removed", faults.nodes_removed),
        ("longest time a worker group had no primary", f"{max(faults.no_primary, default=0):.1f} s"),
        (
            "longest wait for the workers' metadata after a promotion (completions 503)",
            f"{max(faults.resyncs, default=0):.1f} s",
        ),
        ("longest commit stall, standby lost (until wait_primary)", f"{max(faults.stalls, default=0):.1f} s"),
        ("shard moves and rebalances (windows)", len(watch.windows)),
        ("requests in flight during a move", len(in_moves)),
        ("  of which cut off by an app fault (a worker killed, frozen, HUP)", len(excused)),
        ("  of which unanswered otherwise (a violation)", len(unanswered)),
        ("app statements seen waiting on a lock during a move", len(watch.waits)),
        ("  of which claims (idem_claim)", len(watch.claims)),
        ("  longest wait seen", f"{max(watch.waits.values(), default=0):.2f} s"),
    ]
    rows += [*retried.items(), *outcome_rows(c)]
    print()
    print(table(rows))
    missing = [k for k in [*FORMATION_KINDS, *APP_KINDS] if not kinds[k]]
    print_violations(verdict.report, env.records.attempts, verdict.snap)
    for coid in live.double_fills:
        print(f"  [live: exactly one fill per client_order_id] double fill: {coid}")
    for line in live.off_ledger:
        print(f"  [live: every answer is the ledger's fill] {line}")
    for orphan in live.orphans:
        print(f"  [live: every fill has a completed key after the retries] orphan fill: {orphan}")
    for a in unanswered[:20]:
        print(f"  [every request during a move answered] {a.key} {a.client} at {a.started:.2f}s: {a.error}")
    if missing:
        print(f"\nchaos-citus: fault kinds not reached: {', '.join(missing)} (see {out}/faults.log)")
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()) if n)
    violations = verdict.violations + len(unanswered)
    print(
        f"chaos-citus: {c['requests']} requests + {len(env.live_records.attempts)} live, "
        f"{sum(kinds.values())} faults ({by_kind}), {faults.promotions} promotions, {faults.nodes_added} nodes added, "
        f"{violations} violations; broker: {live.counters['broker fills']} fills, "
        f"{live.counters['double fills']} double fills, {len(live.orphans)} orphans; "
        f"{len(watch.claims)} claims waited on a moving shard, {len(in_moves) - len(unanswered) - len(excused)} of "
        f"{len(in_moves)} requests during moves answered ({len(excused)} cut off by app faults)"
    )
    return 1 if violations or (missing and seconds >= FULL_ROUND_SECONDS) else 0


if __name__ == "__main__":
    raise SystemExit(main())
