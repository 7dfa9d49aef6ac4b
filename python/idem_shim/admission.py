"""Admission control of the claims that wait (``wait_ms``): the waiters' bound.

A duplicate that waits holds a pool connection inside ``pg_sleep``, and the request slot it
arrived on: at most half the pool may wait at once, so a retry storm on one key cannot starve
other requests. A waiter over the bound is admitted without its wait (answered at once:
in_flight, 409 with Retry-After).

A worker that serves one request at a time (gunicorn's default sync worker, uWSGI without
threads) has a single slot: there no claim waits at all (``workers.py``).
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
