"""The chaos soak's judge of the live route: it reads the broker's fill ledger (the
simulator's own SQLite state, over its API), the store's completed live keys, and the clients'
records, and counts:

- double fills: a client_order_id filled more than once (the worst double write, contract §5);
- orphan fills: a fill whose client_order_id is no completed key's idem_downstream_key once the
  soak has retried every key left without a final answer (soak.py's ``retry_unanswered``, as
  a client that comes back would): a client that gave up while its key was in flight is
  adopted by that retry, so an orphan left after it is a violation (one the retry could not
  adopt: a failed key, a retry refused; docs/operations.md reconciles it in production);
- answers off the ledger: a 201 whose broker order is not the one filled for its key, or two
  answers of one key naming different broker orders.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LiveAnswer:
    """A live order's final 2xx answer, as its client saw it."""

    key: str
    client_order_id: str
    broker_order_id: str
    attempt: int
    adopted: bool


@dataclass
class LiveReport:
    counters: Counter[str] = field(default_factory=Counter)
    double_fills: list[str] = field(default_factory=list)
    orphans: list[dict[str, Any]] = field(default_factory=list)
    off_ledger: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return len(self.double_fills) + len(self.off_ledger) + len(self.orphans)


def check_live(fills: list[dict[str, Any]], completed: dict[str, str], answers: list[LiveAnswer]) -> LiveReport:
    """``fills``: the broker's ledger; ``completed``: downstream key -> idem_key of every completed
    live key; ``answers``: every final 201 a live client received."""
    report = LiveReport()
    per_coid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for fill in fills:
        per_coid[fill["client_order_id"]].append(fill)
    report.counters["broker fills"] = len(fills)
    report.double_fills = sorted(coid for coid, rows in per_coid.items() if len(rows) > 1)
    report.counters["double fills"] = len(report.double_fills)
    report.orphans = [rows[0] for coid, rows in sorted(per_coid.items()) if coid not in completed]
    report.counters["orphan fills (no completed key)"] = len(report.orphans)
    by_key: dict[str, set[str]] = defaultdict(set)
    for a in answers:
        by_key[a.key].add(a.broker_order_id)
        filled = per_coid.get(a.client_order_id, [])
        if [f["order_id"] for f in filled] != [a.broker_order_id]:
            report.off_ledger.append(f"{a.key}: answered {a.broker_order_id}, ledger {[f['order_id'] for f in filled]}")
        report.counters["live answers from a re-execution (attempt > 1)"] += a.attempt > 1
        report.counters["live answers adopting an earlier order"] += a.adopted
    report.off_ledger += [f"{key}: answers name {sorted(ids)}" for key, ids in by_key.items() if len(ids) > 1]
    report.counters["live answers off the ledger"] = len(report.off_ledger)
    return report
