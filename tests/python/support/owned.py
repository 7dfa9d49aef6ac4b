"""A database owned by the app's login role (``CREATE DATABASE app OWNER web``), not migrated yet,
and the DBA's tools on it: the attacker's set-up of the tests that ask what the database's owner
can make a superuser run (tests/python/sql/conftest.py's ``owned`` fixture is ``owned_database``).

The attacker is a plain login role that owns its database, so ``public`` too (PostgreSQL 15); the
DBA is the superuser of the test server's URL, who runs ``idem migrate`` into it. The DBA's
sessions pin their path (``pinned``), as idem's own do."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import testdb  # scripts/testdb.py, on sys.path through tests.python.support


def pinned(url: str) -> psycopg.Connection[Any]:
    """A session on a path nothing planted is on (the test's own, the DBA's)."""
    return psycopg.connect(url, autocommit=True, options="-c search_path=pg_catalog,pg_temp")


def idem(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed CLI, as an operator runs it."""
    return subprocess.run([testdb.idem_command(), *args], capture_output=True, text=True, timeout=300)


@contextmanager
def owned_database(admin_url: str) -> Iterator[dict[str, str]]:
    """A new database a new plain login role owns, not migrated: its ``role``, its superuser
    ``url``, the role's ``attacker_url``, the database's name ``db`` and the superuser's name
    ``dba``. Dropped after, with the role."""
    role, name = f"web_{uuid.uuid4().hex[:8]}", f"idem_own_{uuid.uuid4().hex[:8]}"
    with pinned(admin_url) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        dba = admin.execute("SELECT session_user").fetchone()
    assert dba is not None
    url = testdb.url_for(admin_url, name)
    with pinned(testdb.url_for(admin_url, "postgres")) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(role)))
    try:
        yield {"role": role, "url": url, "attacker_url": make_conninfo(url, user=role), "db": name, "dba": dba[0]}
    finally:
        testdb.drop(admin_url, name)
        with pinned(admin_url) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
