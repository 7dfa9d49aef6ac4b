"""`make chaos`: a chaos soak of Raptor behind the idempotency layer, judged by an independent
invariant checker (tests/python/chaos/checker.py).

    CHAOS_SECONDS=600 CHAOS_SEED=11 python tests/python/chaos/soak.py

What runs (all on 127.0.0.1, free ports, a private *durable* cluster):
  - Raptor under gunicorn twice, 4 workers each: one on the database directly, one through
    PgBouncer in transaction mode; every attempt picks one of the two at random;
  - CHAOS_CLIENTS (24) clients placing a stream of orders, one key each, retried like a
    well-behaved client library (timeout, dropped connection, 409 in flight and 503, honouring
    the retry hint, at most MAX_TRIES tries); some send each order two or three times at once,
    a few reuse a key with another body afterwards (422 expected); every answer is recorded;
  - every fourth client (and every fourth victim of a kill or a freeze) places its paper orders
    through the same fill written on Flask-SQLAlchemy (POST /api/trading/orm/orders,
    examples/raptor/orm.py): the same rows, checked as the SQL route's are;
  - a fault injector on a schedule drawn from CHAOS_SEED (same seed, same faults in the same
    order with the same parameters), every kind at least once in the first ~40 s;
  - the live route too: a few clients send their orders to the broker simulator
    (its own process and SQLite file) through POST /api/trading/live/orders, with faults of
    their own (a worker killed after the broker accepted, a zombie waking after the heal, the
    broker dropping the connection after accepting, a 5xx before accepting, a slow answer);
  - a quiet period longer than the stale window, in which every client finishes its retries;
  - then every key still without a final answer (its client gave up) sent once more, as that
    client would when it comes back (`retry_unanswered`): a broker fill whose client gave up
    while its key was in flight is adopted by the heal rather than left as an orphan;
  - the checker, reading only the database and the clients' records, and the live checker
    (tests/python/chaos/live_checker.py), reading the broker's fill ledger: 0 double fills and
    0 orphans (a fill without a completed key after the retries) are part of the pass.

Exit status 0 only with 0 violations; otherwise the keys involved are printed with their full
history. Records and server logs are kept in CHAOS_OUT (a temporary directory by default).
"""

from __future__ import annotations

import json
import os
import random
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import psycopg
import requests
from psycopg.rows import dict_row

from examples.simulators.process import Simulator
from idem_shim.policy import Policy
from tests.python.chaos.checker import INVARIANTS, VIOLATION_COUNTERS, Attempt, Snapshot, check, history
from tests.python.chaos.live_checker import LiveAnswer, check_live
from tests.python.e2e.e2e_harness import Cluster, Database, PgBouncer, Server, prepare_template, wait_until
from tests.python.support.races import delayed_worker_pid

STALE_SECONDS = 3.0  # IDEM_STALE_AFTER_SECONDS: short, so zombies and heals happen often
STATEMENT_TIMEOUT_MS = 2000  # raptor_web's statement_timeout (a role setting: PgBouncer too)
LOCK_HOLD_SECONDS = 3.0  # > the statement timeout: the orders queued behind it time out
FREEZE_SECONDS = STALE_SECONDS + 2.0  # a SIGSTOPped worker stays frozen past the stale window
CONNECT_TIMEOUT, READ_TIMEOUT = 2.0, 8.0  # the clients' HTTP timeouts
MAX_TRIES = 40  # a well-behaved client gives up after this many tries of one order...
MAX_ORDER_SECONDS = 120.0  # ...or this long
QUIET_SECONDS = STALE_SECONDS * 3  # after the load: longer than the stale window
START_CASH = 10**15  # nobody runs out of money: every market buy of a known symbol fills
USERS = 6
LIVE_USERS = 2
SYMBOLS = ["AAPL", "MSFT", "NVDA", "SPY", "TSLA"]
ORDERS = "/api/trading/orders"
LIVE = "/api/trading/live/orders"
LIVE_ENDPOINT = "POST " + LIVE
LIVE_CLIENT_EVERY = 6  # every sixth client trades live
#: Raptor's paper order on Flask-SQLAlchemy (examples/raptor/orm.py): the same rows, checked alike
ORM_ORDERS = "/api/trading/orm/orders"
ORM_CLIENT_EVERY = 4  # make chaos: every fourth client (none of the live ones) orders through it

#: Raptor's settings under faults (every soak, the failover tests): a short stale window, the
#: test hooks, connection attempts that give up in 2 s.
SERVER_ENV = {
    "IDEM_STALE_AFTER_SECONDS": str(STALE_SECONDS),
    "GUNICORN_TIMEOUT": "60",
    "RAPTOR_TEST_HOOKS": "1",
    "RAPTOR_LOG_LEVEL": "WARNING",
    "IDEM_CONNECT_TIMEOUT": "2",
    "RAPTOR_DB_CONNECT_TIMEOUT_S": "2",
}

#: CHAOS_CLAIM: the claim shape of the paper order route (POST /api/trading/orders), passed to
#: Raptor as RAPTOR_ORDER_CLAIM. "before" (the default shape: the claim commits before the handler)
#: passes no option; "in_transaction" needs a shim whose @idempotency_key takes claim=. The
#: Flask-SQLAlchemy and live routes keep the default.
CLAIMS = ("before", "in_transaction")


def chaos_claim() -> str:
    """CHAOS_CLAIM, checked before anything starts: a shim without the option stops the soak
    with one line rather than a gunicorn that cannot import the app."""
    claim = os.environ.get("CHAOS_CLAIM", "").strip() or "before"
    if claim not in CLAIMS:
        raise SystemExit(f"chaos: CHAOS_CLAIM must be one of {', '.join(CLAIMS)}, got {claim!r}")
    if claim != "before" and "claim" not in {f.name for f in fields(Policy)}:
        raise SystemExit(
            f"chaos: CHAOS_CLAIM={claim} needs @idempotency_key(claim=...), which this idem_shim does not"
            " take yet (python/idem_shim/policy.py)"
        )
    return claim


FAULT_KINDS = [
    "sigkill_worker",  # SIGKILL the gunicorn worker serving an order, after its writes
    "zombie_worker",  # SIGSTOP it past the stale window, let a duplicate heal, SIGCONT
    "terminate_backends",  # pg_terminate_backend on every connection of the app's role
    "pg_restart_fast",  # pg_ctl stop -m fast, start
    "pg_restart_immediate",  # pg_ctl stop -m immediate (a crash), start: recovery from WAL
    "pgbouncer_restart",  # PgBouncer killed and started again on the same port
    "lock_business_row",  # an account row locked past the statement timeout
    "gunicorn_hup",  # HUP to a gunicorn master: every worker replaced
    # the live route
    "live_kill_after_accept",  # SIGKILL the worker of a live order after the broker filled it
    "live_zombie",  # SIGSTOP a live order's worker before the broker call, heal, SIGCONT
    "broker_drop_after_accept",  # the broker fills the next order and drops the connection
    "broker_5xx_before_accept",  # the broker answers 503 to the next two orders, filling none
    "broker_delay",  # the broker answers the next order 1.5 s late
]


# --- the fault schedule ------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    kind: str
    gap: float  # seconds to wait before it (after the previous fault ended)
    target: str  # "direct" | "bouncer": which gunicorn (or whose users) it hits
    user_index: int  # which user's account row (lock_business_row)
    delay_at: str  # where a victim order sleeps: before-writes | after-writes


def schedule(
    seed: int, seconds: float, kinds: list[str] = FAULT_KINDS, targets: tuple[str, ...] = ("direct", "bouncer")
) -> list[Fault]:
    """The faults of a run, drawn from `seed` alone: every kind once (in a shuffled order, short
    gaps, so a 60 s run sees all of them), then random kinds until `seconds` is surely filled."""
    rng = random.Random(seed)

    def fault(kind: str, gap: float) -> Fault:
        return Fault(
            kind,
            round(gap, 2),
            rng.choice(list(targets)),
            rng.randrange(USERS),
            rng.choice(["before-writes", "after-writes"]),
        )
        # (the live victims sleep before or after the broker call by kind, not by this draw)

    first = kinds[:]
    rng.shuffle(first)
    plan = [fault(kind, rng.uniform(0.5, 1.5)) for kind in first]
    # enough for any run: each fault takes at least its gap of 1 s
    while len(plan) < len(kinds) + seconds:
        plan.append(fault(rng.choice(kinds), rng.uniform(1.0, 4.0)))
    return plan


# --- clients -----------------------------------------------------------------------------------


class Records:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempts: list[Attempt] = []
        self.gave_up: set[tuple[str, str]] = set()

    def add(self, attempt: Attempt) -> None:
        with self.lock:
            self.attempts.append(attempt)


@dataclass
class Env:
    servers: dict[str, Server]
    users: list[dict[str, Any]]
    records: Records
    t0: float
    # set to end the load before load_end (chaos-ha and the failover e2e: after the promotion)
    stopped: threading.Event = field(default_factory=threading.Event)
    live_users: list[dict[str, Any]] = field(default_factory=list)
    live_records: Records = field(default_factory=Records)
    live_answers: list[LiveAnswer] = field(default_factory=list)
    max_tries: int = MAX_TRIES  # a client's patience for one order (MAX_ORDER_SECONDS caps it too)
    # the paper orders of every Nth client and of every Nth victim go to ORM_ORDERS (0: none)
    orm_client_every: int = 0
    orm_keys: set[str] = field(default_factory=set)  # the keys sent there

    def paper_path(self, index: int, key: str) -> str:
        """ORDERS, or ORM_ORDERS for the index'th client (or victim) when this soak drives it."""
        if self.orm_client_every and index % self.orm_client_every == self.orm_client_every - 2:
            with self.records.lock:
                self.orm_keys.add(key)
            return ORM_ORDERS
        return ORDERS

    def now(self) -> float:
        return time.monotonic() - self.t0


def place(
    env: Env,
    rng: random.Random,
    client: str,
    user: dict[str, Any],
    key: str,
    body: dict[str, Any],
    variant: str,
    expect: int,
    first_headers: dict[str, str] | None = None,
    every_try: bool = False,
    path: str = ORDERS,
) -> Attempt | None:
    """Send one order until it has a final answer, the way a careful client library would.
    Returns the final attempt, or None when the client gave up (recorded)."""
    session = requests.Session()
    started = time.monotonic()
    backoff = 0.1
    for attempt_no in range(env.max_tries):
        server_name = rng.choice(list(env.servers))  # "direct", "bouncer" (one server in chaos-ha)
        server = env.servers[server_name]
        headers = {"Authorization": f"Bearer {user['token']}", "Idempotency-Key": key}
        if first_headers and (attempt_no == 0 or every_try):
            headers.update(first_headers)
        a = Attempt(
            key=key,
            variant=variant,
            body=body,
            user_id=user["user_id"],
            client=client,
            server=server_name,
            expect=expect,
            started=env.now(),
            elapsed=0.0,
        )
        sent = time.monotonic()
        wait: float
        try:
            r = session.post(server.base + path, json=body, headers=headers, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT))
        except requests.RequestException as exc:
            a.error = type(exc).__name__
            session.close()
            session = requests.Session()  # a dropped connection: start clean
            wait = backoff
            backoff = min(backoff * 2, 2.0)
        else:
            a.status = r.status_code
            try:
                payload = r.json()
            except ValueError:
                payload = {}
            if isinstance(payload, dict):
                a.error = payload.get("error")
                a.order_id = payload.get("order_id")
                if path == LIVE and 200 <= r.status_code < 300 and "broker_order_id" in payload:
                    with env.records.lock:
                        env.live_answers.append(
                            LiveAnswer(
                                key,
                                payload["client_order_id"],
                                payload["broker_order_id"],
                                payload["attempt"],
                                payload["adopted"],
                            )
                        )
            a.replayed = r.headers.get("Idempotent-Replayed") == "true"
            if "Retry-After" in r.headers:
                a.retry_after = float(r.headers["Retry-After"])
            # Retry-After in seconds; the body's retry_after_ms is the same hint, finer
            hint_ms = payload.get("retry_after_ms") if isinstance(payload, dict) else None
            wait = (
                hint_ms / 1000 if isinstance(hint_ms, int) else a.retry_after if a.retry_after is not None else backoff
            )
            backoff = min(backoff * 2, 2.0)
        a.elapsed = time.monotonic() - sent
        records = env.live_records if path == LIVE else env.records  # the paper checker reads its own
        records.add(a)
        if a.final:
            return a
        if time.monotonic() - started > MAX_ORDER_SECONDS:
            break
        time.sleep(wait * rng.uniform(1.0, 1.25))
    records = env.live_records if path == LIVE else env.records
    with records.lock:
        records.gave_up.add((key, variant))
    return None


def order_body(rng: random.Random) -> tuple[dict[str, Any], int]:
    if rng.random() < 0.03:  # refused by the handler: a 4xx that is stored and replayed
        return {"symbol": "ZZZZ", "side": "buy", "qty": rng.randint(1, 5)}, 422
    return {"symbol": rng.choice(SYMBOLS), "side": "buy", "qty": rng.randint(1, 5)}, 201


def client_loop(env: Env, index: int, seed: int, load_end: float) -> None:
    rng = random.Random(f"{seed}-client-{index}")
    name = f"c{index:02d}"
    live = bool(env.live_users) and index % LIVE_CLIENT_EVERY == LIVE_CLIENT_EVERY - 1
    user = env.live_users[index % len(env.live_users)] if live else env.users[index % len(env.users)]
    while time.monotonic() < load_end and not env.stopped.is_set():
        key = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        path = LIVE if live else env.paper_path(index, key)
        body, expect = order_body(rng)
        if live:
            body, expect = {"symbol": rng.choice(SYMBOLS), "side": "buy", "qty": rng.randint(1, 5)}, 201
        copies = rng.choice([2, 3]) if rng.random() < 0.15 else 1
        dups = [
            threading.Thread(
                target=place,
                args=(env, random.Random(f"{seed}-{key}-{i}"), f"{name}.dup{i}", user, key, body, "main", expect),
                kwargs={"path": path},
            )
            for i in range(1, copies)
        ]
        for t in dups:
            t.start()
        final = place(env, rng, name, user, key, body, "main", expect, path=path)
        for t in dups:
            t.join()
        if final is not None and rng.random() < 0.04:
            place(env, rng, name, user, key, {**body, "qty": body["qty"] + 1}, "reuse", 422, path=path)
        time.sleep(rng.uniform(0.0, 0.05))


def retry_unanswered(env: Env, workers: int = 16) -> Counter[str]:
    """The soak's last step, after the quiet period: every (key, variant) a client gave up on, paper
    and live, is sent again as that client would send it once back (the same key, body and route,
    its usual patience, no test hook), so a fill whose client gave up while its key was in flight
    is adopted by the heal (live: the broker's order, found by its client_order_id) instead of
    left as an orphan. What is still unanswered after it stays in ``gave_up``."""
    tokens = {u["user_id"]: u for u in [*env.users, *env.live_users]}
    todo: list[tuple[Records, Attempt]] = []
    for records in (env.records, env.live_records):
        with records.lock:
            last = {(a.key, a.variant): a for a in records.attempts}  # in record order: the last try
            todo += [(records, last[kv]) for kv in sorted(records.gave_up)]
            records.gave_up.clear()
    answers = len(env.live_answers)

    def again(item: tuple[Records, Attempt]) -> bool:
        records, a = item
        live = records is env.live_records
        path = LIVE if live else ORM_ORDERS if a.key in env.orm_keys else ORDERS
        rng = random.Random(f"retry-{a.key}-{a.variant}")
        return place(env, rng, a.client, tokens[a.user_id], a.key, a.body, a.variant, a.expect, path=path) is not None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        answered = sum(pool.map(again, todo))
    retried: Counter[str] = Counter()
    retried["keys retried after the quiet period"] = len(todo)
    retried["  of them answered"] = answered
    retried["  of them adopting a broker fill"] = sum(1 for a in env.live_answers[answers:] if a.adopted)
    return retried


def completed_live_keys(db: Database) -> dict[str, str]:
    """downstream key ('broker') -> idem_key of every completed live key: what the live checker
    matches the broker's fills against."""
    return {
        str(r[0]): str(r[1])
        for r in db.query(
            "SELECT idem_downstream_key(idem_key, scope_user_id, scope_endpoint, 'broker'), idem_key"
            "  FROM public.idempotency_keys WHERE scope_endpoint = %s AND status = 'completed'",
            (LIVE_ENDPOINT,),
        )
    }


# --- the fault injector ------------------------------------------------------------------------


class Injector:
    def __init__(
        self,
        env: Env,
        db: Database,
        cluster: Cluster | None,  # None: a soak without the restart kinds (make chaos-citus)
        bouncer: PgBouncer | None,
        plan: list[Fault],
        seed: int,
        log: Any,
        broker: Simulator,
    ) -> None:
        self.env, self.db, self.cluster, self.bouncer, self.broker = env, db, cluster, bouncer, broker
        self.plan, self.seed, self.log = plan, seed, log
        self.done: Counter[str] = Counter()
        self.victims: list[threading.Thread] = []
        self.windows: list[tuple[str, float, float]] = []  # (kind, start, end) of every fault tried

    def run(self, until: float) -> None:
        plan = list(self.plan)
        retried: Counter[str] = Counter()
        for i, fault in enumerate(plan):  # (grows while iterated: a failed fault is retried)
            time.sleep(fault.gap)
            if time.monotonic() >= until:
                break
            started = self.env.now()
            try:
                getattr(self, fault.kind)(fault, i)
                outcome = "ok"
            except Exception as exc:  # a fault that could not be set up is reported, not fatal
                outcome = f"not injected: {type(exc).__name__}: {exc}"
                if retried[fault.kind] < 3:  # try the same fault again next, once per failure
                    retried[fault.kind] += 1
                    plan.insert(i + 1, fault)
            else:
                self.done[fault.kind] += 1
            self.windows.append((fault.kind, started, self.env.now()))
            print(
                f"{started:8.2f}s fault {i:3d} {fault.kind:<22} {fault.target:<7} "
                f"({self.env.now() - started:.1f}s) {outcome}",
                file=self.log,
                flush=True,
            )
        for t in self.victims:
            t.join()

    def _victim(
        self, fault: Fault, i: int, live_at: str | None = None
    ) -> tuple[int, str, dict[str, Any], dict[str, Any]]:
        """An order that sleeps inside its transaction, sent as any client would (and retried
        like one, each try asking for the sleep, so a try that met an outage does not leave
        the fault without a victim); returns the pid of the worker serving it. ``live_at``
        (before-broker, after-broker): a live order, sleeping there."""
        rng = random.Random(f"{self.seed}-victim-{i}")
        live = live_at is not None
        user = self.env.live_users[fault.user_index % LIVE_USERS] if live else self.env.users[fault.user_index]
        key = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        body, _ = order_body(rng)
        body["symbol"] = rng.choice(SYMBOLS)
        if live:
            body = {"symbol": body["symbol"], "side": "buy", "qty": rng.randint(1, 5)}
        headers = {"X-Raptor-Test-Delay-Ms": "1500", "X-Raptor-Test-Delay-At": live_at or fault.delay_at}
        path = LIVE if live else self.env.paper_path(i, key)

        def send() -> None:
            # the victim's first try always goes to the targeted server
            place(
                self.env,
                _Pinned(rng, fault.target),
                f"victim{i}",
                user,
                key,
                body,
                "main",
                201,
                headers,
                every_try=True,
                path=path,
            )

        t = threading.Thread(target=send)
        t.start()
        self.victims.append(t)
        pid = wait_until(lambda: delayed_worker_pid(self.db.admin_url), 10, what="the victim's worker")
        return pid, key, body, user

    def sigkill_worker(self, fault: Fault, i: int) -> None:
        pid, *_ = self._victim(fault, i)
        os.kill(pid, signal.SIGKILL)

    def zombie_worker(self, fault: Fault, i: int, live_at: str | None = None) -> None:
        pid, key, body, user = self._victim(fault, i, live_at)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(STALE_SECONDS + 0.3)
            # a duplicate of the frozen order, on its route: it heals the stale key and executes
            dup = threading.Thread(
                target=place,
                args=(
                    self.env,
                    random.Random(f"{self.seed}-zombie-dup-{i}"),
                    f"victim{i}.dup",
                    user,
                    key,
                    body,
                    "main",
                    201,
                ),
                kwargs={"path": LIVE if live_at else ORM_ORDERS if key in self.env.orm_keys else ORDERS},
            )
            dup.start()
            self.victims.append(dup)
            time.sleep(FREEZE_SECONDS - STALE_SECONDS - 0.3)
        finally:
            os.kill(pid, signal.SIGCONT)

    def terminate_backends(self, fault: Fault, i: int) -> None:
        self.db.query(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE usename = 'raptor_web' AND pid <> pg_backend_pid()"
        )

    def pg_restart_fast(self, fault: Fault, i: int) -> None:
        assert self.cluster is not None
        self.cluster.stop("fast")
        time.sleep(0.5)
        self.cluster.start()

    def pg_restart_immediate(self, fault: Fault, i: int) -> None:
        assert self.cluster is not None
        self.cluster.stop("immediate")
        time.sleep(0.5)
        self.cluster.start()

    def pgbouncer_restart(self, fault: Fault, i: int) -> None:
        assert self.bouncer is not None
        self.bouncer.restart()

    def lock_business_row(self, fault: Fault, i: int) -> None:
        user = self.env.users[fault.user_index]
        with psycopg.connect(self.db.admin_url) as conn:
            conn.execute("SELECT 1 FROM raptor.accounts WHERE user_id = %s FOR UPDATE", (user["user_id"],))
            time.sleep(LOCK_HOLD_SECONDS)
            conn.rollback()

    def live_kill_after_accept(self, fault: Fault, i: int) -> None:
        pid, *_ = self._victim(fault, i, "after-broker")
        os.kill(pid, signal.SIGKILL)

    def live_zombie(self, fault: Fault, i: int) -> None:
        self.zombie_worker(fault, i, "before-broker")

    def broker_drop_after_accept(self, fault: Fault, i: int) -> None:
        self.broker.faults(drop_after_accept=1)

    def broker_5xx_before_accept(self, fault: Fault, i: int) -> None:
        self.broker.faults(fail_before_accept=2)

    def broker_delay(self, fault: Fault, i: int) -> None:
        self.broker.faults(delay_ms=1500, delay_count=1)

    def gunicorn_hup(self, fault: Fault, i: int) -> None:
        server = self.env.servers[fault.target]
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGHUP)


class _Pinned(random.Random):
    """The victim's random source: its first server choice is the targeted server."""

    def __init__(self, rng: random.Random, first: str) -> None:
        super().__init__(rng.random())
        self._first: str | None = first

    def choice(self, seq: Any) -> Any:
        if self._first is not None and list(seq) == ["direct", "bouncer"]:
            first, self._first = self._first, None
            return first
        return super().choice(seq)


# --- the run -----------------------------------------------------------------------------------


def snapshot(db: Database, start_cash: dict[int, int], users: list[int] | None = None) -> Snapshot:
    """What the checker reads; ``users``: only these users' rows (a database that other runs share)."""
    with psycopg.connect(db.admin_url, row_factory=dict_row) as conn:
        keys = conn.execute(
            "SELECT id, idem_key, status, response_code, response_body FROM public.idempotency_keys"
            " WHERE scope_endpoint <> %(live)s"  # the live route's keys are the live checker's
            "   AND (%(users)s::int[] IS NULL OR scope_user_id = ANY(%(users)s))",
            {"live": LIVE_ENDPOINT, "users": users},
        ).fetchall()
        orders = conn.execute(
            "SELECT id, user_id, symbol, side, qty, status, fill_price_cents, client_key FROM raptor.paper_orders"
            " WHERE %(users)s::int[] IS NULL OR user_id = ANY(%(users)s)",
            {"users": users},
        ).fetchall()
        audits = conn.execute(
            "SELECT (context->>'order_id')::bigint AS order_id, user_id "
            "FROM public.audit_log WHERE action = 'paper_order_filled'"
            " AND (%(users)s::int[] IS NULL OR user_id = ANY(%(users)s))",
            {"users": users},
        ).fetchall()
        cash = {
            r["user_id"]: r["cash_cents"]
            for r in conn.execute(
                "SELECT user_id, cash_cents FROM raptor.accounts"
                " WHERE %(users)s::int[] IS NULL OR user_id = ANY(%(users)s)",
                {"users": users},
            ).fetchall()
        }
        positions = {
            (r["user_id"], r["symbol"]): r["qty"]
            for r in conn.execute(
                "SELECT user_id, symbol, qty FROM raptor.positions"
                " WHERE %(users)s::int[] IS NULL OR user_id = ANY(%(users)s)",
                {"users": users},
            ).fetchall()
        }
        events = {
            r["event"]: r["n"]
            for r in conn.execute(
                "SELECT event, count(*) AS n FROM public.idempotency_events"
                " WHERE %(users)s::int[] IS NULL OR scope_user_id = ANY(%(users)s) GROUP BY event",
                {"users": users},
            ).fetchall()
        }
    return Snapshot(
        keys=keys,
        orders=orders,
        fill_audits=audits,
        cash=cash,
        positions=positions,
        start_cash=start_cash,
        events=events,
    )


def table(rows: list[tuple[str, Any]]) -> str:
    width = max(len(name) for name, _ in rows)
    out = [f"| {'measure':<{width}} | value |", f"| {'-' * width} | ----- |"]
    out += [f"| {name:<{width}} | {value} |" for name, value in rows]
    return "\n".join(out)


#: The outcome counters every soak's table ends with (soak_ha.py prints them too).
OUTCOME_COUNTERS = (
    "retries",
    "2xx",
    "replays",
    "409 in flight",
    "409 previous failed",
    "422 body mismatch",
    "503",
    "no answer (timeout, dropped)",
    "keys failed",
    "keys given up by their client",
    "stale heals",
    "lost claims (zombies refused)",
    *VIOLATION_COUNTERS,
)


def outcome_rows(counts: Any) -> list[tuple[str, Any]]:
    return [(name, counts[name]) for name in OUTCOME_COUNTERS]


def load_rows(duration: float, clients: int, counts: Any, env: Env, live: Any) -> list[tuple[str, Any]]:
    """The rows every soak's table starts with: the load, paper and live, and the broker's ledger."""
    return [
        ("duration (load + quiet period)", f"{duration:.0f} s"),
        ("clients", clients),
        ("requests", counts["requests"]),
        ("orders (keys)", counts["orders"]),
        ("orders executed", counts["orders executed"]),
        ("live requests", len(env.live_records.attempts)),
        ("live orders (keys)", len({a.key for a in env.live_records.attempts})),
        ("live keys given up by their client", len(env.live_records.gave_up)),
        *live.counters.items(),
    ]


@dataclass(frozen=True)
class SoakSettings:
    seconds: float
    seed: int
    clients: int
    out: Path
    claim: str = "before"  # CHAOS_CLAIM


def soak_settings(name: str, clients: int) -> SoakSettings:
    """CHAOS_SECONDS, CHAOS_SEED, CHAOS_CLIENTS (default ``clients``), CHAOS_OUT (default a new
    temporary directory) and CHAOS_CLAIM, announced in one line."""
    claim = chaos_claim()
    settings = SoakSettings(
        float(os.environ.get("CHAOS_SECONDS", "600")),
        int(os.environ.get("CHAOS_SEED", "11")),
        int(os.environ.get("CHAOS_CLIENTS", str(clients))),
        Path(os.environ.get("CHAOS_OUT") or tempfile.mkdtemp(prefix=f"idem-{name}-")),
        claim,
    )
    settings.out.mkdir(parents=True, exist_ok=True)
    print(
        f"{name}: {settings.seconds:.0f} s of load, seed {settings.seed}, {settings.clients} clients,"
        f" paper route's claim {claim}; records and logs in {settings.out}",
        flush=True,
    )
    return settings


def print_violations(report: Any, attempts: Any, snap: Any) -> None:
    """Each violation with its invariant, then the history of the first 50 keys involved."""
    if not report.violations:
        return
    print(f"\n{len(report.violations)} violation(s):")
    for v in report.violations:
        print(f"  [{v.invariant}: {INVARIANTS[v.invariant]}] {v.kind}: {v.key or '-'}: {v.detail}")
    for key in report.keys[:50]:
        print()
        print(history(key, attempts, snap))


def main() -> int:
    seconds = float(os.environ.get("CHAOS_SECONDS", "600"))
    seed = int(os.environ.get("CHAOS_SEED", "11"))
    n_clients = int(os.environ.get("CHAOS_CLIENTS", "24"))
    if not 16 <= n_clients <= 32:
        raise SystemExit("chaos: CHAOS_CLIENTS must be in 16..32")
    out = Path(os.environ.get("CHAOS_OUT") or tempfile.mkdtemp(prefix="idem-chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    claim = chaos_claim()
    plan = schedule(seed, seconds)
    print(
        f"chaos: {seconds:.0f} s of load, seed {seed}, {n_clients} clients, stale window "
        f"{STALE_SECONDS:.0f} s, paper route's claim {claim}; records and logs in {out}",
        flush=True,
    )

    cluster = Cluster(durable=True)
    broker = Simulator("broker", out / "broker").start()
    bouncer: PgBouncer | None = None
    servers: dict[str, Server] = {}
    fault_log = open(out / "faults.log", "w")
    try:
        prepare_template(cluster, "raptor_chaos")
        db = Database(cluster, "raptor_chaos")
        db.query(f"ALTER ROLE raptor_web IN DATABASE raptor_chaos SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        settings = db.query(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('fsync', 'synchronous_commit', 'full_page_writes') ORDER BY name"
        )
        assert all(v == "on" for _, v in settings), settings
        users = [db.seed_user(cash_cents=START_CASH) for _ in range(USERS)]
        env_users = [{"user_id": u.user_id, "token": u.token} for u in users]
        live_users = [db.seed_user(cash_cents=START_CASH, mode="live") for _ in range(LIVE_USERS)]
        bouncer = PgBouncer(cluster)
        common = {
            **SERVER_ENV,
            "RAPTOR_LIVE_TRADING": "1",
            "RAPTOR_BROKER_URL": broker.url,
            "RAPTOR_ORDER_CLAIM": claim,
        }
        servers["direct"] = Server(
            db.app_url, env={**common, "IDEM_STATEMENT_TIMEOUT_MS": str(STATEMENT_TIMEOUT_MS)}
        ).start()
        servers["bouncer"] = Server(
            db.app_url.replace(f":{cluster.port}/", f":{bouncer.port}/"),
            env={**common, "IDEM_PREPARE_THRESHOLD": "none", "IDEM_STATEMENT_TIMEOUT_MS": "none"},
        ).start()

        t0 = time.monotonic()
        env = Env(
            servers,
            env_users,
            Records(),
            t0,
            live_users=[{"user_id": u.user_id, "token": u.token} for u in live_users],
            orm_client_every=ORM_CLIENT_EVERY,
        )
        load_end = t0 + seconds
        clients = [threading.Thread(target=client_loop, args=(env, i, seed, load_end)) for i in range(n_clients)]
        for t in clients:
            t.start()
        injector = Injector(env, db, cluster, bouncer, plan, seed, fault_log, broker)
        injector.run(until=load_end)  # returns once the load window ends and victims are done
        # the quiet period: no new orders, no faults; every client finishes its retries
        for t in clients:
            t.join()
        time.sleep(max(0.0, QUIET_SECONDS - (time.monotonic() - load_end)))
        retried = retry_unanswered(env)  # every key still without a final answer, once more
        duration = time.monotonic() - t0
        for name, server in servers.items():  # a copy of each log, kept with the records
            (out / f"gunicorn-{name}.log").write_text(server.log())

        snap = snapshot(db, {u.user_id: START_CASH for u in users})
        report = check(env.records.attempts, snap, env.records.gave_up)
        broker_faults = broker.faults()["applied"]
        live = check_live(broker.fills(), completed_live_keys(db), env.live_answers)
    finally:
        broker.stop()
        for server in servers.values():
            server.stop()
        if bouncer is not None:
            bouncer.stop()
        cluster.destroy()
        fault_log.close()

    (out / "records.json").write_text(json.dumps([asdict(a) for a in env.records.attempts], default=str))
    c = report.counters
    faults = sum(injector.done.values())
    rows = [*load_rows(duration, n_clients, c, env, live)]
    rows.insert(4, ("  of them on the Flask-SQLAlchemy route", len(env.orm_keys)))
    rows.insert(2, ("paper route's claim (CHAOS_CLAIM)", claim))
    rows.append(("faults", faults))
    rows += [(f"  {kind}", injector.done[kind]) for kind in FAULT_KINDS]
    rows += [(f"  broker applied {name}", n) for name, n in broker_faults.items()]
    rows += [*retried.items(), *outcome_rows(c)]
    print()
    print(table(rows))
    violations = report.violations
    missing = [kind for kind in FAULT_KINDS if not injector.done[kind]]
    for coid in live.double_fills:
        print(f"  [live: exactly one fill per client_order_id] double fill: {coid}")
    for line in live.off_ledger:
        print(f"  [live: every answer is the ledger's fill] {line}")
    for orphan in live.orphans:
        print(f"  [live: every fill has a completed key after the retries] orphan fill: {orphan}")
    print_violations(report, env.records.attempts, snap)
    if missing and seconds >= 60:
        print(f"\nchaos: fault kinds never injected: {', '.join(missing)} (see {out}/faults.log)")
    print(
        f"chaos: {c['requests']} requests + {len(env.live_records.attempts)} live, {faults} faults, "
        f"{len(violations) + live.violations} violations; broker: {live.counters['broker fills']} fills, "
        f"{live.counters['double fills']} double fills, {len(live.orphans)} orphans"
    )
    return 1 if violations or live.violations or (missing and seconds >= 60) else 0


if __name__ == "__main__":
    raise SystemExit(main())
