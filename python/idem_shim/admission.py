"""Admission control of the claims that wait (``wait_ms``): the waiters' bound.

A duplicate that waits holds a pool connection inside ``pg_sleep``: at most half the pool may
wait at once, so a retry storm on one key cannot starve other requests. A waiter over the bound
is admitted without its wait (answered at once: in_flight, 409 with Retry-After).
"""

from __future__ import annotations

import threading


class Waiters:
    """How many claims of one process may wait inside ``idem_claim`` at once."""

    def __init__(self, pool_max_size: int) -> None:
        self.max_waiters = max(1, pool_max_size // 2)
        self._slots = threading.BoundedSemaphore(self.max_waiters)

    def enter(self) -> bool:
        """Take a slot if one is free (never blocks); True when taken (``leave`` gives it back)."""
        return self._slots.acquire(blocking=False)

    def leave(self) -> None:
        self._slots.release()
