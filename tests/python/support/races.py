"""Ordering a race without sleeps: wait until the other backend is where the test needs it.

A test that needs "B is blocked behind A's transaction" or "B is inside its wait window" before it
lets A go on asks PostgreSQL: ``pg_stat_activity.wait_event_type`` of B's backend is ``Lock``
(blocked on a row or table lock) or ``Timeout`` (in ``pg_sleep``, idem_claim's p_wait_ms poll).
It polls the catalogue (``waiting.wait_until``), never assumes a duration. The same catalogue finds the gunicorn worker
serving a test-delayed order (``delayed_worker_pid``), for the e2e suite and the chaos soak, and
when a key's claim is in flight (``wait_for_claim``: the holder is in its handler).
"""

from __future__ import annotations

import re

import psycopg

from tests.python.support.waiting import wait_until


def wait_for_wait_event(admin_url: str, pid: int, wait_event_type: str, timeout: float = 10.0) -> str:
    """Return once backend ``pid`` waits on ``wait_event_type``; its wait_event is returned.

    ``admin_url`` must be a superuser's: pg_stat_activity hides other roles' wait events.
    """
    with psycopg.connect(admin_url, autocommit=True) as conn:

        def waiting() -> tuple[str, str] | None:
            row = conn.execute(
                "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            return (str(row[0]), str(row[1])) if row is not None and row[0] == wait_event_type else None

        found = wait_until(waiting, timeout=timeout, what=f"backend {pid} to wait on {wait_event_type}")
    return found[1]


def wait_until_blocked(admin_url: str, pid: int, timeout: float = 10.0) -> str:
    """Return once backend ``pid`` is blocked on a lock (another transaction holds it)."""
    return wait_for_wait_event(admin_url, pid, "Lock", timeout)


def wait_for_backends(admin_url: str, wait_event: str, count: int = 1, timeout: float = 10.0) -> None:
    """Return once ``count`` backends of ``admin_url``'s database wait on ``wait_event`` at once
    (``PgSleep``: idem_claim polling inside its p_wait_ms window)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:

        def enough() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = %s",
                (wait_event,),
            ).fetchone()
            return row is not None and row[0] >= count

        wait_until(enough, timeout=timeout, what=f"{count} backend(s) waiting on {wait_event}")


def wait_for_claim(admin_url: str, key: str, timeout: float = 10.0) -> None:
    """Return once the key's claim is in flight (committed: its holder is in its handler)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        wait_until(
            lambda: conn.execute(
                "SELECT 1 FROM public.idempotency_keys WHERE idem_key = %s AND status = 'in_flight'", (key,)
            ).fetchone(),
            timeout=timeout,
            what=f"the claim of key {key} to be in flight",
        )


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
