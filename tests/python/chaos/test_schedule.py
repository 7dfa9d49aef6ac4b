"""The fault schedule: drawn from the seed alone, and every kind of fault early in any run."""

from __future__ import annotations

from tests.python.chaos.soak import FAULT_KINDS, schedule


def test_the_same_seed_gives_the_same_schedule() -> None:
    assert schedule(11, 600) == schedule(11, 600)
    assert schedule(11, 60)[:20] == schedule(11, 600)[:20]  # the duration only adds faults
    assert schedule(11, 600) != schedule(12, 600)


def test_every_kind_comes_first_within_the_first_fifteen_seconds() -> None:
    for seed in range(50):
        plan = schedule(seed, 60)
        first = plan[: len(FAULT_KINDS)]
        assert sorted(f.kind for f in first) == sorted(FAULT_KINDS)
        assert sum(f.gap for f in first) <= 1.5 * len(FAULT_KINDS)


def test_a_schedule_outlasts_its_run() -> None:
    for seconds in (60, 120, 600):
        assert sum(f.gap for f in schedule(3, seconds)) >= seconds
