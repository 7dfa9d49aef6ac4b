"""The databases the tests make for themselves, written once: an empty one (``empty_database``),
the cron database or a skip (``cron_database``), and a database dropped first if a run that failed
half-way left it (``create_database``, for the e2e harnesses' own clusters)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql

import testdb  # scripts/testdb.py, on sys.path through tests.python.support


@contextmanager
def empty_database(admin_url: str, prefix: str = "idem_e") -> Iterator[str]:
    """A new database, nothing migrated in it (its URL); dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        yield testdb.create(admin_url, name)
    finally:
        testdb.drop(admin_url, name)


def cron_database(admin_url: str) -> str:
    """``admin_url``, provided its database is pg_cron's (cron.database_name) with the extension
    created; else the test is skipped."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("""SELECT current_setting('cron.database_name', true) = current_database(),
                                     EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron')""").fetchone()
    if not row or not row[0] or not row[1]:
        pytest.skip("DATABASE_URL is not pg_cron's database (cron.database_name) with the extension created")
    return admin_url


def create_database(admin_url: str, name: str, template: str | None = None) -> None:
    """``CREATE DATABASE name [TEMPLATE template]`` on the server of ``admin_url`` (a superuser's),
    dropped first if it exists."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        conn.execute(stmt)
