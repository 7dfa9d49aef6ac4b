"""What a duplicate of an in-flight holder is told to wait (durations.HandlerDurations): the
time the holder probably still needs, from the scope's observed executions and the holder's
elapsed time, never more than the lease left nor less than 0."""

from __future__ import annotations

import pytest

from idem_shim.durations import FLOOR_MS, HandlerDurations


def observed(seconds: float, times: int = 8, scope: str = "POST /slow") -> HandlerDurations:
    durations = HandlerDurations()
    for _ in range(times):
        durations.record(scope, seconds)
    return durations


def test_a_half_second_handler_s_duplicate_is_told_what_is_left_of_it() -> None:
    durations = observed(0.5)
    assert 450 <= durations.retry_after_ms("POST /slow", 50, 5000) <= 500
    assert 150 <= durations.retry_after_ms("POST /slow", 350, 5000) <= 200
    assert durations.retry_after_ms("POST /slow", 499, 5000) == FLOOR_MS, "nearly done: the floor"


def test_a_holder_past_its_usual_time_waits_as_long_again() -> None:
    durations = observed(0.5)
    assert durations.retry_after_ms("POST /slow", 1200, 5000) == 1200, "late: about as long again"


@pytest.mark.parametrize(("elapsed", "told"), [(10, FLOOR_MS), (300, 300), (1000, 1000), (2500, 1000), (4900, 1000)])
def test_a_scope_not_seen_yet_is_polled_within_a_second(elapsed: int, told: int) -> None:
    """A new scope's duplicates (every worker's, until it ran one itself): as long again as the
    holder took, but never past a second, so Retry-After is 1 and the client is at most about a
    second late, where "as long again" alone said 1, 2, 3... 5 s for a holder long done."""
    durations = observed(0.5)
    assert durations.retry_after_ms("POST /other", elapsed, 5000) == told
    assert HandlerDurations().retry_after_ms("POST /other", elapsed, 5000) == told


@pytest.mark.parametrize("elapsed", [0, 10, 400, 2000, 29_000, 10**9])
@pytest.mark.parametrize("lease_ms", [0, 1, 40, 700, 5000])
def test_never_past_the_lease_left_nor_below_zero(elapsed: int, lease_ms: int) -> None:
    for durations in (observed(0.5), observed(20.0), HandlerDurations()):
        told = durations.retry_after_ms("POST /slow", elapsed, lease_ms)
        assert 0 <= told <= lease_ms


def test_a_store_that_cannot_say_the_holder_s_time_leaves_the_lease() -> None:
    assert observed(0.5).retry_after_ms("POST /slow", None, 3200) == 3200


def test_the_estimate_follows_a_handler_that_slows_down() -> None:
    durations = observed(0.1, times=20)
    fast = durations.usual_ms("POST /slow")
    for _ in range(20):
        durations.record("POST /slow", 1.0)
    slow = durations.usual_ms("POST /slow")
    assert fast is not None and slow is not None and fast < 200 < 800 < slow
