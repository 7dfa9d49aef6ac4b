"""
Databases for the Python tests, on the server DATABASE_URL points at (make sets it). Each fixture's
name says which role it connects as:

- ``admin_url``: the superuser URL of that server, as given (session);
- ``template_db``: the name of one database per session, migrated once, used as a template;
- ``fresh_admin_url``: a new database cloned from the template for one test, as the superuser,
  dropped after it; tests that commit (all the concurrency ones) get a clean store this way;
- ``fresh_app_role_url``: the same fresh database seen as the least-privileged ``idem_app`` role.

Tests that share a named resource carry ``xdist_group(name)``: each holds a lock of that name on the
server from the start of its setup to the end of its teardown, so no two of a group run at once,
whichever workers they land on (tests/python/support/groups.py says why pytest-xdist cannot be left to it).
A test marked ``alone`` (it stops a Citus worker) runs with no other test beside it.

The tests under tests/python/unit/ use none of them and run without a server (``make test-unit``).
Shared helpers live in tests/python/support/ (never imported from here, never from a test module).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.python.support import groups, roles

import testdb  # isort: skip  (scripts/testdb.py, on sys.path through tests.python.support)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    groups.acquire(item)  # before any fixture of the test, its module's too
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)
    finally:
        groups.release(item)  # after every fixture it ends


@pytest.fixture(scope="session")
def admin_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        pytest.exit("DATABASE_URL is not set: run the tests with `make test-py`", returncode=2)
    return url


@pytest.fixture(scope="session")
def template_db(admin_url: str) -> Iterator[str]:
    name = f"idem_tpl_{os.getpid()}"
    testdb.fresh(admin_url, name, [])
    yield name
    testdb.drop(admin_url, name)


@pytest.fixture
def fresh_admin_url(admin_url: str, template_db: str) -> Iterator[str]:
    name = f"idem_t_{uuid.uuid4().hex[:10]}"
    url = testdb.create(admin_url, name, template=template_db)
    yield url
    testdb.drop(admin_url, name)


@pytest.fixture
def fresh_app_role_url(fresh_admin_url: str) -> str:
    return roles.as_app_role(fresh_admin_url)
