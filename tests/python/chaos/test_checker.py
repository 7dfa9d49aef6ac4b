"""The chaos checker must be able to fail: a clean fabricated history passes, and each kind of
corruption of it (a double execution first of all) is caught under the right invariant."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.python.chaos.checker import Attempt, Snapshot, check, history

K1 = "11111111-1111-4111-8111-111111111111"  # filled, one replay through the other server
K2 = "22222222-2222-4222-8222-222222222222"  # unknown symbol: 422, stored and replayed
K3 = "33333333-3333-4333-8333-333333333333"  # handler timed out: failed, then previous_failed
K4 = "44444444-4444-4444-8444-444444444444"  # client gave up during an outage: no row
START = 1_000_000
BODY = {"symbol": "NVDA", "side": "buy", "qty": 3}


def attempt(
    key: str,
    status: int | None,
    error: str | None = None,
    order_id: int | None = None,
    *,
    variant: str = "main",
    body: dict[str, Any] | None = None,
    expect: int = 201,
    replayed: bool = False,
    retry_after: float | None = None,
    client: str = "c01",
    started: float = 0.0,
) -> Attempt:
    return Attempt(
        key=key,
        variant=variant,
        body=body or BODY,
        user_id=1,
        client=client,
        server="direct",
        expect=expect,
        started=started,
        elapsed=0.01,
        status=status,
        error=error,
        order_id=order_id,
        replayed=replayed,
        retry_after=retry_after,
    )


def clean() -> tuple[list[Attempt], Snapshot, set[tuple[str, str]]]:
    attempts = [
        attempt(K1, None, "ReadTimeout", started=1.0),
        attempt(K1, 503, "idempotency_store_unavailable", retry_after=1.0, started=2.0),
        attempt(K1, 409, "idempotency_in_flight", retry_after=1.0, client="c01.dup1", started=2.1),
        attempt(K1, 201, None, 7, started=3.0),
        attempt(K1, 201, None, 7, replayed=True, client="c01.dup1", started=3.1),
        attempt(
            K1, 422, "idempotency_key_body_mismatch", variant="reuse", body={**BODY, "qty": 4}, expect=422, started=4.0
        ),
        attempt(K2, 422, "unknown_symbol", body={**BODY, "symbol": "ZZZZ"}, expect=422),
        attempt(K3, 503, "service_unavailable", retry_after=1.0),
        attempt(K3, 409, "idempotency_previous_failed"),
        attempt(K4, 503, "idempotency_store_unavailable", retry_after=1.0),
    ]
    snap = Snapshot(
        keys=[
            {
                "id": 1,
                "idem_key": K1,
                "status": "completed",
                "response_code": 201,
                "response_body": {"order_id": 7, "status": "filled"},
            },
            {
                "id": 2,
                "idem_key": K2,
                "status": "completed",
                "response_code": 422,
                "response_body": {"error": "unknown_symbol"},
            },
            {"id": 3, "idem_key": K3, "status": "failed", "response_code": None, "response_body": None},
        ],
        orders=[
            {
                "id": 7,
                "user_id": 1,
                "symbol": "NVDA",
                "side": "buy",
                "qty": 3,
                "status": "filled",
                "fill_price_cents": 100,
                "client_key": K1,
            }
        ],
        fill_audits=[{"order_id": 7, "user_id": 1}],
        cash={1: START - 300},
        positions={(1, "NVDA"): 3},
        start_cash={1: START},
    )
    return attempts, snap, {(K4, "main")}


def test_a_clean_history_has_no_violation() -> None:
    attempts, snap, gave_up = clean()
    report = check(attempts, snap, gave_up)
    assert report.violations == []
    assert report.counters["requests"] == 10
    assert report.counters["retries"] == 4  # 10 attempts, 6 first tries
    assert report.counters["keys given up by their client"] == 1


def double_execution(a: list[Attempt], s: Snapshot) -> None:
    """The injected bug: the same key executed twice (a second order, its audit row and its
    money), while every client still saw one and the same answer."""
    s.orders.append({**s.orders[0], "id": 8})
    s.fill_audits.append({"order_id": 8, "user_id": 1})
    s.cash[1] -= 300
    s.positions[(1, "NVDA")] += 3


def double_audit(a: list[Attempt], s: Snapshot) -> None:
    s.fill_audits.append({"order_id": 7, "user_id": 1})


def lost_ack(a: list[Attempt], s: Snapshot) -> None:
    s.orders.clear()
    s.fill_audits.clear()
    s.cash[1] = START
    s.positions.clear()
    s.keys[0] = {**s.keys[0], "status": "failed", "response_code": None, "response_body": None}


def wrong_data(a: list[Attempt], s: Snapshot) -> None:
    s.orders[0]["qty"] = 2


def disagreeing(a: list[Attempt], s: Snapshot) -> None:
    a.append(attempt(K1, 409, "idempotency_previous_failed", client="c09"))


def reuse_accepted(a: list[Attempt], s: Snapshot) -> None:
    a.append(attempt(K1, 201, None, 7, variant="reuse", body={**BODY, "qty": 4}, expect=422))


def completion_without_effects(a: list[Attempt], s: Snapshot) -> None:
    s.keys.append(
        {"id": 4, "idem_key": K4, "status": "completed", "response_code": 201, "response_body": {"order_id": 99}}
    )


def effects_without_completion(a: list[Attempt], s: Snapshot) -> None:
    s.orders.append(
        {
            "id": 9,
            "user_id": 1,
            "symbol": "NVDA",
            "side": "buy",
            "qty": 3,
            "status": "filled",
            "fill_price_cents": 100,
            "client_key": K3,
        }
    )
    s.fill_audits.append({"order_id": 9, "user_id": 1})
    s.cash[1] -= 300
    s.positions[(1, "NVDA")] += 3


def money_moved_without_order(a: list[Attempt], s: Snapshot) -> None:
    s.cash[1] -= 300


def stuck(a: list[Attempt], s: Snapshot) -> None:
    s.keys.append({"id": 5, "idem_key": K4, "status": "in_flight", "response_code": None, "response_body": None})


def answered_but_no_row(a: list[Attempt], s: Snapshot) -> None:
    del s.keys[1]  # K2's stored 422


def undocumented_5xx(a: list[Attempt], s: Snapshot) -> None:
    a.append(attempt(K1, 500, None, client="c03"))


def bare_503(a: list[Attempt], s: Snapshot) -> None:
    a.append(attempt(K1, 503, "service_unavailable", client="c03"))  # no Retry-After


@pytest.mark.parametrize(
    ("corrupt", "invariant", "kind"),
    [
        (double_execution, 1, "double executions"),
        (double_audit, 1, "double executions"),
        (lost_ack, 2, "lost acknowledged writes"),
        (wrong_data, 2, "lost acknowledged writes"),
        (disagreeing, 3, "disagreeing answers"),
        (reuse_accepted, 3, "disagreeing answers"),
        (completion_without_effects, 4, "completions without effects"),
        (effects_without_completion, 4, "effects without completion"),
        (money_moved_without_order, 4, "effects without completion"),
        (stuck, 5, "stuck keys"),
        (answered_but_no_row, 5, "stuck keys"),
        (undocumented_5xx, 6, "other 5xx"),
        (bare_503, 6, "other 5xx"),
    ],
)
def test_each_corruption_is_caught(
    corrupt: Callable[[list[Attempt], Snapshot], None], invariant: int, kind: str
) -> None:
    attempts, snap, gave_up = clean()
    attempts, snap = copy.deepcopy(attempts), copy.deepcopy(snap)
    corrupt(attempts, snap)
    report = check(attempts, snap, gave_up)
    assert report.violations, f"{corrupt.__name__} went unnoticed"
    assert (invariant, kind) in {(v.invariant, v.kind) for v in report.violations}
    assert report.counters[kind] >= 1


def test_a_double_execution_is_reported_with_the_keys_full_history() -> None:
    attempts, snap, gave_up = clean()
    double_execution(attempts, snap)
    report = check(attempts, snap, gave_up)
    assert report.keys == [K1]
    text = history(K1, attempts, snap)
    assert text.count("order row:") == 2 and "ReadTimeout" in text and "key row:" in text
    # every attempt of the key, in time order
    assert text.index("ReadTimeout") < text.index("replayed=True")
