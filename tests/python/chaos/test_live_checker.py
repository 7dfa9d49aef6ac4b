"""The live checker on hand-made ledgers: it must see a double fill, an orphan left after the
soak's closing retries, and an answer that names another broker order than the one filled (so it
cannot pass a broken run)."""

from __future__ import annotations

from tests.python.chaos.live_checker import LiveAnswer, check_live


def fill(coid: str, order_id: str) -> dict[str, str]:
    return {"client_order_id": coid, "order_id": order_id}


def test_a_clean_run_has_no_violation() -> None:
    r = check_live([fill("d1", "o1")], {"d1": "k1"}, [LiveAnswer("k1", "d1", "o1", 2, True)])
    assert r.violations == 0 and r.orphans == [] and r.counters["live answers adopting an earlier order"] == 1


def test_a_double_fill_is_a_violation() -> None:
    r = check_live([fill("d1", "o1"), fill("d1", "o2")], {"d1": "k1"}, [])
    assert r.double_fills == ["d1"] and r.violations == 1


def test_a_fill_left_without_a_completed_key_is_an_orphan_and_a_violation() -> None:
    # judged after the soak retried every unanswered key: an orphan left is one the retry
    # could not adopt (a failed key, a retry refused), not a client that merely gave up
    r = check_live([fill("d9", "o9")], {}, [])
    assert [o["client_order_id"] for o in r.orphans] == ["d9"] and r.violations == 1


def test_a_fill_the_retry_adopted_is_no_orphan() -> None:
    r = check_live([fill("d9", "o9")], {"d9": "k9"}, [LiveAnswer("k9", "d9", "o9", 2, True)])
    assert r.orphans == [] and r.violations == 0


def test_an_answer_off_the_ledger_is_a_violation() -> None:
    r = check_live([fill("d1", "o1")], {"d1": "k1"}, [LiveAnswer("k1", "d1", "o2", 1, False)])
    assert r.violations == 1
    r = check_live(
        [fill("d1", "o1")],
        {"d1": "k1"},
        [LiveAnswer("k1", "d1", "o1", 1, False), LiveAnswer("k1", "d1", "o3", 1, False)],
    )
    assert r.violations == 2  # off the ledger, and two answers disagreeing
