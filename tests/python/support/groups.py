"""
Tests that share a named resource never run at once (tests/python/conftest.py's hooks call these):
a test marked ``xdist_group(name)`` holds a lock of that name on DATABASE_URL's server from the
start of its setup to the end of its teardown, its module's fixtures included when it is the test
that makes or ends them.

A test marked ``alone`` changes what every database of the server shares (it stops a Citus worker):
it holds the server's own lock (server_lock()) exclusively, and while a run holds any such test
every other test of the run holds that lock shared, so none runs beside it. A run without one takes
no server lock at all, nor does a test a mark skips. The server's lock is taken before any group,
so no two tests wait for each other.

``make test-py``'s ``--dist loadgroup`` was meant to send a group to one worker, in order;
pytest-xdist 3.8 cannot under pytest 9 (it renames a grouped item through ``item._nodeid``, which
pytest 9 no longer reads, so the mark is ignored without a word: docs/adopting.md's scratch
database was dropped under it by docs/operations.md's cookbook on another worker), and no
scheduler keeps apart two pytest runs on one server. The server's lock does, whatever worker or
run a test is in: the next test of the group waits for it.

The lock is a session's advisory lock in the ``postgres`` database: no test drops that database,
the session sits idle between its statements (idem migrate's guard waits for no idle session, nor
for another database's), and idem's own advisory locks take one bigint key, never the two keys
used here. Before the session is closed the test checks that it still holds every lock: had the
session ended under it, another test of the group could have come in, and the teardown fails.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
import pytest

import testdb  # isort: skip  (scripts/testdb.py, on sys.path through tests.python.support)

#: The first key of pg_advisory_lock(int, int), 'idem' in ASCII; the second is the group's hashtext.
NAMESPACE = 0x6964656D

_HELD = pytest.StashKey[psycopg.Connection[Any]]()
_RUN_HAS_ALONE = pytest.StashKey[bool]()


def server_lock() -> str:
    """The lock a test marked ``alone`` holds exclusively, and every other test of its run shared;
    IDEM_TESTS_SERVER_LOCK names another (test_xdist_groups.py's probe runs inside a run)."""
    return os.environ.get("IDEM_TESTS_SERVER_LOCK", "the whole server")


def _skipped(item: pytest.Item) -> bool:
    """Whether a mark skips the test for certain: ``skip``, or ``skipif`` on a condition that is
    true already (test_citus.py's module mark outside make test-citus). Such a test takes no lock:
    it runs no fixture, and an ``alone`` one would hold the whole run up for nothing."""
    if item.get_closest_marker("skip"):
        return True
    for mark in item.iter_markers("skipif"):
        condition = mark.args[0] if mark.args else mark.kwargs.get("condition")
        if not isinstance(condition, str) and condition:
            return True
    return False


def _run_has_alone(item: pytest.Item) -> bool:
    """Whether any test of the run that will run is marked ``alone`` (each xdist worker collects
    them all)."""
    stash = item.session.stash
    if _RUN_HAS_ALONE not in stash:
        stash[_RUN_HAS_ALONE] = any(i.get_closest_marker("alone") and not _skipped(i) for i in item.session.items)
    return stash[_RUN_HAS_ALONE]


def names(item: pytest.Item) -> list[str]:
    """The locks of a test, in the order taken: the server's first where the run needs it, then its
    groups (as pytest-xdist reads its mark) in one order; none for a test a mark skips."""
    if _skipped(item):
        return []
    groups = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    )
    return ([server_lock()] if _run_has_alone(item) else []) + groups


def acquire(item: pytest.Item) -> None:
    """Wait for the locks of the test's groups and hold them; nothing without a group. Without
    DATABASE_URL nothing either: the tests that share a resource on a server cannot run then
    (conftest's admin_url stops the session)."""
    groups = names(item)
    url = os.environ.get("DATABASE_URL")
    if not groups or not url:
        return
    conn = psycopg.connect(
        testdb.url_for(url, "postgres"), autocommit=True, application_name=f"idem tests: {'; '.join(groups)}"[:63]
    )
    try:
        for name in groups:  # in one order: two tests of the same two groups never wait for each other
            if name == server_lock() and not item.get_closest_marker("alone"):
                conn.execute("SELECT pg_advisory_lock_shared(%s, hashtext(%s))", (NAMESPACE, name))
            else:
                conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (NAMESPACE, name))
    except BaseException:
        conn.close()
        raise
    item.stash[_HELD] = conn


def release(item: pytest.Item) -> None:
    """Close the session that holds the test's locks, having checked that it still holds them."""
    conn = item.stash.get(_HELD, None)
    if conn is None:
        return
    del item.stash[_HELD]
    groups = names(item)
    try:
        row = conn.execute(
            """SELECT count(*) FROM unnest(%s::text[]) AS g(name)
                WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                                   WHERE l.locktype = 'advisory' AND l.pid = pg_catalog.pg_backend_pid() AND l.granted
                                     AND l.classid = %s::oid AND l.objid = hashtext(g.name)::oid AND l.objsubid = 2)""",
            (groups, NAMESPACE),
        ).fetchone()
        missing = row[0] if row else len(groups)
        lost = f"{missing} of its {len(groups)} lock(s) not held any more" if missing else ""
    except psycopg.Error as exc:
        lost = f"its session ended ({type(exc).__name__}: {exc})"
    finally:
        conn.close()
    if lost:
        raise RuntimeError(
            f"the lock of {groups} was lost while the test ran, {lost}: another test of the group may have run at once"
        )
