"""Admission control of the claims that wait (``wait_ms``): the waiters' bound.

A duplicate that waits holds a pool connection inside ``pg_sleep``, and the request slot it
arrived on: at most half the pool may wait at once, so a retry storm on one key cannot starve
other requests. A waiter over the bound is admitted without its wait (answered at once:
in_flight, 409 with Retry-After).

A worker that serves one request at a time (gunicorn's default sync worker, uWSGI without
threads) has a single slot: a waiting duplicate holds the whole worker, and a storm of them as
many workers, so an unrelated request queued behind them for the whole wait (measured: 2.4 s of
a 3 s wait, 4 sync workers, 4 duplicates; docs/shim.md). There no claim waits: the duplicate is
answered at once, and one WARNING per process says why and what serves waits (threads).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from .logs import log_event


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


def serves_one_at_a_time(environ: Mapping[str, Any]) -> bool:
    """True under a WSGI worker that serves one request at a time: ``wsgi.multithread`` false
    from a pre-fork server (``wsgi.multiprocess``: gunicorn's sync workers, uWSGI's processes) or
    from gunicorn (``SERVER_SOFTWARE``; one sync worker is not multiprocess). Werkzeug's test
    client, which says neither, is not one (its tests run duplicates from threads)."""
    if environ.get("wsgi.multithread", True):
        return False
    return bool(environ.get("wsgi.multiprocess")) or str(environ.get("SERVER_SOFTWARE", "")).startswith("gunicorn/")


_said_lock = threading.Lock()
_said = False


def single_slot_wait(endpoint: str, wait_ms: int) -> int:
    """The wait of a claim on a worker that serves one request at a time: none (its duplicate
    would hold the whole worker); the first such claim of the process logs one WARNING."""
    global _said
    with _said_lock:
        said, _said = _said, True
    if not said:
        log_event(
            logging.WARNING,
            "wait_skipped",
            endpoint=endpoint,
            wait_ms=wait_ms,
            error="this worker serves one request at a time (gunicorn's sync worker): a duplicate "
            "waiting for its holder would hold the whole worker, so duplicates are answered 409 at "
            "once; serve waits from threaded workers (gunicorn --threads N, worker_class gthread)",
        )
    return 0
