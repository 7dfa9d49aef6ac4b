"""The chaos soak's invariant checker: judges a run by its history, not by its log lines.

It reads two things only: the database after the quiet period (a `Snapshot`) and what every
client recorded about every attempt it made (`Attempt`s). Nothing here talks to the app, so a
test can feed it a fabricated history (tests/python/chaos/test_checker.py) and watch it fail.

The six invariants of the soak, one function each:
  1. at most one execution per key (order rows and their business audit rows), and exactly one
     for every key whose client received a 2xx;
  2. no acknowledged write lost: every 2xx names an order that exists with the data sent;
  3. every answer for one key (and body) agrees with every other and with the stored answer;
  4. atomicity of the completion: no completed key without its business rows, no business
     row without its completed key (and every account's cash and positions add up);
  5. nothing stuck: no key in_flight after the quiet period; the rest are completed, failed,
     or absent because their client gave up (counted, not a violation);
  6. no 5xx but the documented 503 during an outage.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

#: The 503 bodies an outage may produce: the shim's (contract §4) and the app's own (the database
#: went away under a handler, examples/raptor/__init__.py). Both carry Retry-After.
DOCUMENTED_503 = frozenset({"idempotency_store_unavailable", "service_unavailable"})

INVARIANTS = {
    1: "at most one execution per key, exactly one when a 2xx was received",
    2: "no acknowledged write lost",
    3: "every answer for a key agrees",
    4: "atomicity of the completion",
    5: "nothing stuck",
    6: "no 5xx but the documented 503",
}


@dataclass
class Attempt:
    """One HTTP attempt as a client saw it."""

    key: str
    variant: str  # "main": the order's own body; "reuse": the same key with another body
    body: dict[str, Any]
    user_id: int
    client: str
    server: str  # "direct" | "bouncer"
    expect: int  # the status a first execution answers: 201, or 422 for an unknown symbol
    started: float  # seconds since the load began
    elapsed: float
    status: int | None = None  # None: no HTTP answer (timeout, dropped connection)
    error: str | None = None  # the body's "error" member, or the exception's class name
    order_id: int | None = None
    replayed: bool = False
    retry_after: float | None = None

    @property
    def final(self) -> bool:
        """An answer a client stops retrying on: 2xx, or 4xx but 409 in_flight."""
        return (
            self.status is not None
            and 200 <= self.status < 500
            and not (self.status == 409 and self.error == "idempotency_in_flight")
        )


@dataclass
class Snapshot:
    """What the checker reads from the database."""

    keys: list[dict[str, Any]]  # idem_key, status, response_code, response_body, id
    orders: list[dict[str, Any]]  # id, user_id, symbol, side, qty, status, fill_price_cents, client_key
    fill_audits: list[dict[str, Any]]  # order_id, user_id (action paper_order_filled)
    cash: dict[int, int]  # user_id -> cash_cents now
    positions: dict[tuple[int, str], int]  # (user_id, symbol) -> qty now
    start_cash: dict[int, int]  # user_id -> cash_cents when seeded (no positions then)
    events: dict[str, int] = field(default_factory=dict)  # idempotency_events by event


@dataclass
class Violation:
    invariant: int
    kind: str
    key: str | None
    detail: str


@dataclass
class Report:
    counters: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)

    def add(self, invariant: int, kind: str, key: str | None, detail: str) -> None:
        self.violations.append(Violation(invariant, kind, key, detail))
        self.counters[kind] += 1

    @property
    def keys(self) -> list[str]:
        return sorted({v.key for v in self.violations if v.key})


def check(attempts: list[Attempt], snap: Snapshot, gave_up: set[tuple[str, str]]) -> Report:
    """Judge the run. `gave_up` holds (key, variant) whose client exhausted its tries."""
    report = Report()
    by_key: dict[str, list[Attempt]] = defaultdict(list)
    for a in attempts:
        by_key[a.key].append(a)
    key_rows = {row["idem_key"]: row for row in snap.keys}
    orders_by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in snap.orders:
        orders_by_key[o["client_key"]].append(o)
    orders_by_id = {o["id"]: o for o in snap.orders}
    audits = Counter(a["order_id"] for a in snap.fill_audits)

    _count(report, attempts, by_key, snap, gave_up)
    for key, tries in by_key.items():
        row = key_rows.get(key)
        orders = orders_by_key.get(key, [])
        _executions(report, key, tries, orders, audits)
        _acknowledged(report, key, tries, orders_by_id)
        _agreement(report, key, tries, row)
        _atomicity(report, key, row, orders)
        _stuck(report, key, tries, row, gave_up)
        _server_errors(report, key, tries)
    # Business rows and key rows nobody asked for (or the client's records lost track of).
    for key, orders in orders_by_key.items():
        if key not in by_key:
            report.add(4, "effects without completion", key, f"{len(orders)} order(s) for a key no client sent")
    for key, row in key_rows.items():
        if key not in by_key:
            report.add(
                5 if row["status"] == "in_flight" else 4,
                "unknown keys",
                key,
                f"a {row['status']} key row no client sent",
            )
    _balances(report, snap)
    return report


#: The counters of violations, by kind: reported even when zero (the soak's table ends with them).
VIOLATION_COUNTERS = (
    "double executions",
    "lost acknowledged writes",
    "disagreeing answers",
    "completions without effects",
    "effects without completion",
    "stuck keys",
    "other 5xx",
)


def _count(
    report: Report,
    attempts: list[Attempt],
    by_key: dict[str, list[Attempt]],
    snap: Snapshot,
    gave_up: set[tuple[str, str]],
) -> None:
    c = report.counters
    c["requests"] = len(attempts)
    c["orders"] = sum(1 for tries in by_key.values() if any(a.variant == "main" for a in tries))
    c["orders executed"] = len(snap.orders)
    c["key reuses with another body"] = sum(1 for tries in by_key.values() if any(a.variant == "reuse" for a in tries))
    first = {(a.key, a.variant, a.client) for a in attempts}
    c["retries"] = len(attempts) - len(first)
    c["2xx"] = sum(1 for a in attempts if a.status is not None and 200 <= a.status < 300)
    c["replays"] = sum(1 for a in attempts if a.replayed)
    c["409 in flight"] = sum(1 for a in attempts if a.status == 409 and a.error == "idempotency_in_flight")
    c["409 previous failed"] = sum(1 for a in attempts if a.status == 409 and a.error == "idempotency_previous_failed")
    c["422 body mismatch"] = sum(1 for a in attempts if a.status == 422 and a.error == "idempotency_key_body_mismatch")
    c["503"] = sum(1 for a in attempts if a.status == 503)
    c["no answer (timeout, dropped)"] = sum(1 for a in attempts if a.status is None)
    c["keys failed"] = sum(1 for row in snap.keys if row["status"] == "failed")
    c["keys given up by their client"] = len(gave_up)
    c["stale heals"] = snap.events.get("stale_heal", 0)
    c["lost claims (zombies refused)"] = snap.events.get("lost_claim", 0)
    for kind in VIOLATION_COUNTERS:
        c[kind] += 0


def _executions(
    report: Report, key: str, tries: list[Attempt], orders: list[dict[str, Any]], audits: Counter[int]
) -> None:
    if len(orders) > 1:
        report.add(1, "double executions", key, f"{len(orders)} orders: ids {sorted(o['id'] for o in orders)}")
    for o in orders:
        if audits[o["id"]] > 1:
            report.add(
                1, "double executions", key, f"order {o['id']} has {audits[o['id']]} paper_order_filled audit rows"
            )
        elif o["status"] == "filled" and audits[o["id"]] == 0:
            report.add(4, "effects without completion", key, f"order {o['id']} has no paper_order_filled audit row")


def _acknowledged(report: Report, key: str, tries: list[Attempt], orders_by_id: dict[int, dict[str, Any]]) -> None:
    for a in tries:
        if a.variant != "main" or a.status is None or not 200 <= a.status < 300:
            continue
        order = orders_by_id.get(a.order_id) if a.order_id is not None else None
        if order is None:
            report.add(
                2,
                "lost acknowledged writes",
                key,
                f"{a.client} got {a.status} for order {a.order_id}, which does not exist",
            )
            continue
        want = {
            "user_id": a.user_id,
            "symbol": str(a.body["symbol"]).upper(),
            "side": a.body["side"],
            "qty": a.body["qty"],
            "status": "filled",
            "client_key": key,
        }
        got = {name: order[name] for name in want}
        if got != want:
            report.add(2, "lost acknowledged writes", key, f"order {a.order_id} is {got}, the client sent {want}")


def _agreement(report: Report, key: str, tries: list[Attempt], row: dict[str, Any] | None) -> None:
    for variant in ("main", "reuse"):
        finals = [a for a in tries if a.variant == variant and a.final]
        if not finals:
            continue
        answers = {(a.status, a.error, a.order_id) for a in finals}
        if len(answers) > 1:
            report.add(
                3, "disagreeing answers", key, f"{variant}: {len(answers)} different answers {sorted(answers, key=str)}"
            )
            continue
        status, error, order_id = answers.pop()
        expect = finals[0].expect
        if variant == "reuse":
            if (status, error) != (422, "idempotency_key_body_mismatch"):
                report.add(
                    3, "disagreeing answers", key, f"a reused key with another body got {status} {error}, not 422"
                )
            continue
        if status == 409:  # idempotency_previous_failed: the key must be failed
            if row is None or row["status"] != "failed":
                report.add(3, "disagreeing answers", key, f"answered previous_failed, stored {row and row['status']}")
            continue
        if status != expect:
            report.add(3, "disagreeing answers", key, f"answered {status} {error}, a first execution answers {expect}")
        if row is None or row["status"] != "completed" or row["response_code"] != status:
            report.add(
                3,
                "disagreeing answers",
                key,
                f"answered {status}, stored {row and (row['status'], row['response_code'])}",
            )
        elif (row["response_body"] or {}).get("order_id") != order_id:
            report.add(
                3,
                "disagreeing answers",
                key,
                f"answered order {order_id}, stored order {(row['response_body'] or {}).get('order_id')}",
            )


def _atomicity(report: Report, key: str, row: dict[str, Any] | None, orders: list[dict[str, Any]]) -> None:
    status = row["status"] if row else None
    if status == "completed" and row is not None and row["response_code"] == 201:
        stored = (row["response_body"] or {}).get("order_id")
        if not orders:
            report.add(4, "completions without effects", key, f"completed with 201 (order {stored}) but no order row")
        elif stored not in {o["id"] for o in orders}:
            report.add(
                4,
                "completions without effects",
                key,
                f"completed with order {stored}, the order rows are {sorted(o['id'] for o in orders)}",
            )
    elif orders:
        report.add(
            4,
            "effects without completion",
            key,
            f"{len(orders)} order row(s) but the key is {status or 'absent'}"
            + (f" ({row['response_code']})" if row else ""),
        )


def _stuck(
    report: Report, key: str, tries: list[Attempt], row: dict[str, Any] | None, gave_up: set[tuple[str, str]]
) -> None:
    if row is not None and row["status"] == "in_flight":
        report.add(5, "stuck keys", key, "in_flight after the quiet period")
        return
    if row is None and (key, "main") not in gave_up:
        if any(a.variant == "main" and a.final for a in tries):
            report.add(5, "stuck keys", key, "answered, yet no key row")
        else:
            report.add(5, "stuck keys", key, "no final answer, no key row, and the client did not give up")


def _server_errors(report: Report, key: str, tries: list[Attempt]) -> None:
    for a in tries:
        if (
            a.status is not None
            and a.status >= 500
            and not (a.status == 503 and a.error in DOCUMENTED_503 and a.retry_after is not None)
        ):
            report.add(
                6,
                "other 5xx",
                key,
                f"{a.client} via {a.server} at {a.started:.2f}s: {a.status} {a.error} (Retry-After {a.retry_after})",
            )


def _balances(report: Report, snap: Snapshot) -> None:
    spent: Counter[int] = Counter()
    held: Counter[tuple[int, str]] = Counter()
    for o in snap.orders:
        if o["status"] == "filled" and o["side"] == "buy":
            spent[o["user_id"]] += o["qty"] * o["fill_price_cents"]
            held[(o["user_id"], o["symbol"])] += o["qty"]
    for user_id, start in snap.start_cash.items():
        if snap.cash.get(user_id) != start - spent[user_id]:
            report.add(
                4,
                "effects without completion",
                None,
                f"user {user_id}: cash {snap.cash.get(user_id)}, its filled orders say {start - spent[user_id]}",
            )
    for pos in set(held) | {p for p, q in snap.positions.items() if q}:
        if snap.positions.get(pos, 0) != held[pos]:
            report.add(
                4,
                "effects without completion",
                None,
                f"position {pos}: {snap.positions.get(pos, 0)}, its filled orders say {held[pos]}",
            )


def history(key: str, attempts: list[Attempt], snap: Snapshot) -> str:
    """Everything known about one key: every attempt in time order, its row, its orders."""
    lines = [f"key {key}"]
    for a in sorted((a for a in attempts if a.key == key), key=lambda a: a.started):
        d = asdict(a)
        lines.append(
            f"  {a.started:8.3f}s +{a.elapsed:.3f}s {a.client:>10} {a.server:>7} "
            f"{a.variant:>5} -> {a.status} {a.error or ''} order={a.order_id} "
            f"replayed={a.replayed} retry_after={a.retry_after} body={d['body']}"
        )
    for row in snap.keys:
        if row["idem_key"] == key:
            lines.append(f"  key row: {row}")
    for o in snap.orders:
        if o["client_key"] == key:
            lines.append(f"  order row: {o}")
    return "\n".join(lines)
