"""Which WSGI workers a claim may wait on (``wait_ms``): not one that serves a request at a time.

A duplicate that waits holds the request slot it came on. gunicorn's default sync worker (and
uWSGI without threads) has one: a waiting duplicate holds the whole worker, and a storm of them as
many workers, so an unrelated request queued behind them for the whole wait (measured: 2.43 s of
a 3 s wait, 4 sync workers, 4 duplicates; docs/shim.md, "Waiting under gunicorn"). There no claim
waits: the duplicate is answered at once (409 with its Retry-After), and one WARNING per process
says why and what serves waits (threaded workers). ``admission.py`` bounds the waiters elsewhere.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from .logs import log_event


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
