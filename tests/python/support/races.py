"""Ordering a race without sleeps: wait until the other backend is where the test needs it.

A test that needs "B is blocked behind A's transaction" or "B is inside its wait window" before it
lets A go on asks PostgreSQL: ``pg_stat_activity.wait_event_type`` of B's backend is ``Lock``
(blocked on a row or table lock) or ``Timeout`` (in ``pg_sleep``, idem_claim's p_wait_ms poll).
It polls the catalogue, never assumes a duration. The same catalogue finds the gunicorn worker
serving a test-delayed order (``delayed_worker_pid``), for the e2e suite and the chaos soak.
"""

from __future__ import annotations

import re
import time

import psycopg


def wait_for_wait_event(admin_url: str, pid: int, wait_event_type: str, timeout: float = 10.0) -> str:
    """Return once backend ``pid`` waits on ``wait_event_type``; its wait_event is returned.

    ``admin_url`` must be a superuser's: pg_stat_activity hides other roles' wait events.
    """
    deadline = time.monotonic() + timeout
    with psycopg.connect(admin_url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            if row is not None and row[0] == wait_event_type:
                return str(row[1])
            if time.monotonic() > deadline:
                raise TimeoutError(f"backend {pid} never waited on {wait_event_type} (last seen: {row})")
            time.sleep(0.01)


def wait_until_blocked(admin_url: str, pid: int, timeout: float = 10.0) -> str:
    """Return once backend ``pid`` is blocked on a lock (another transaction holds it)."""
    return wait_for_wait_event(admin_url, pid, "Lock", timeout)


def wait_for_backends(admin_url: str, wait_event: str, count: int = 1, timeout: float = 10.0) -> None:
    """Return once ``count`` backends of ``admin_url``'s database wait on ``wait_event`` at once
    (``PgSleep``: idem_claim polling inside its p_wait_ms window)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(admin_url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = %s",
                (wait_event,),
            ).fetchone()
            if row is not None and row[0] >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} backends waited on {wait_event}")
            time.sleep(0.01)


#: The comment Raptor's test delay (``X-Raptor-Test-Delay``) puts in its sleeping statement.
_DELAYED = re.compile(r"raptor-test-delay pid=(\d+)")


def delayed_worker_pid(admin_url: str) -> int | None:
    """The pid of the gunicorn worker whose backend is sleeping in a test-delayed order now, or
    None. Only an active backend counts: an idle one keeps its last statement's text, so a worker
    that finished its delayed order would still match."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() "
            "AND query LIKE '%raptor-test-delay pid=%'"
        ).fetchall()
    for (query,) in rows:
        if m := _DELAYED.search(query):
            return int(m.group(1))
    return None
