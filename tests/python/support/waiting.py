"""Waiting for a condition, never for a time: ``wait_until(predicate, timeout=..., what=...)``.

A test that needs "the job has run" or "the other backend is blocked" before it goes on polls
what it needs until it holds; a ``time.sleep`` that guesses how long that takes is slow where the
machine is fast and fails where it is loaded. The timeout is the most the test will wait, not an
expected duration, and its failure names what was awaited and what was last seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: How often the predicate is asked: short beside any timeout, long beside a catalogue query.
POLL_SECONDS = 0.01


def wait_until(
    predicate: Callable[[], T | None], timeout: float = 10.0, interval: float = POLL_SECONDS, *, what: str
) -> T:
    """Return the predicate's first truthy value; raise ``TimeoutError`` naming ``what`` (and the
    last value seen) if none comes within ``timeout`` seconds. The predicate is asked at least
    once, and once more at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return last  # truthy, so not None
        if time.monotonic() >= deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}; last seen: {last!r}")
        time.sleep(interval)
