"""A database owned by the app's login role (``CREATE DATABASE app OWNER web``), not migrated yet,
and the DBA's tools on it: the attacker's set-up of the tests that ask what the database's owner
can make a superuser run (tests/python/sql/conftest.py's ``owned`` fixture is ``owned_database``).

The attacker is a plain login role that owns its database, so ``public`` too (PostgreSQL 15); the
DBA is the superuser of the test server's URL, who runs ``idem migrate`` into it. The DBA's
sessions pin their path (``pinned``), as idem's own do."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import testdb  # scripts/testdb.py, on sys.path through tests.python.support

_BYTES_REPR = re.compile(r"(?<!\w)b'")


def prints_bytes(output: str) -> bool:
    """Whether a tool printed a bytes repr (``b'0001...'``, what psycopg hands back under the
    owner's SQL_ASCII), not a name that merely ends in b before its closing quote (CI's
    ``'idem-cleanup:idem_own_2dc384db'`` did)."""
    return bool(_BYTES_REPR.search(output))


def pinned(url: str) -> psycopg.Connection[Any]:
    """A session on a path nothing planted is on (the test's own, the DBA's)."""
    return psycopg.connect(url, autocommit=True, options="-c search_path=pg_catalog,pg_temp")


def declared_command(url: str) -> str:
    """The cleanup job's command for the store at ``url``, as its idem_cleanup_job() declares it
    (it records that database's oid: a job runs only there)."""
    with pinned(url) as conn:
        row = conn.execute("SELECT command FROM public.idem_cleanup_job()").fetchone()
    assert row is not None
    return str(row[0])


def idem(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed CLI, as an operator runs it."""
    return subprocess.run([testdb.idem_command(), *args], capture_output=True, text=True, timeout=300)


@contextmanager
def owned_database(admin_url: str, *, owned: bool = True, prefix: str = "idem_own") -> Iterator[dict[str, str]]:
    """A new database a new plain login role owns, not migrated: its ``role``, its superuser
    ``url``, the role's ``attacker_url``, the database's name ``db`` and the superuser's name
    ``dba``. Dropped after, with the role. ``owned=False``: the same role and a database the
    superuser owns (a store later handed over, or a host whose public the role does not own)."""
    role, name = f"web_{uuid.uuid4().hex[:8]}", f"{prefix}_{uuid.uuid4().hex[:8]}"
    with pinned(admin_url) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        dba = admin.execute("SELECT session_user").fetchone()
    assert dba is not None
    url = testdb.url_for(admin_url, name)
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if owned:
        create += sql.SQL(" OWNER {}").format(sql.Identifier(role))
    with pinned(testdb.url_for(admin_url, "postgres")) as admin:
        admin.execute(create)
    try:
        yield {"role": role, "url": url, "attacker_url": make_conninfo(url, user=role), "db": name, "dba": dba[0]}
    finally:
        testdb.drop(admin_url, name)
        with pinned(admin_url) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def migrated_by_the_dba(owned: dict[str, str]) -> dict[str, str]:
    """``owned``, migrated by the superuser, its owner a member of idem_app."""
    done = idem("migrate", "--database-url", owned["url"], "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    with pinned(owned["url"]) as conn:
        conn.execute(sql.SQL("GRANT idem_app TO {}").format(sql.Identifier(owned["role"])))
    return owned


def set_database(owned: dict[str, str], **settings: str) -> None:
    """The owner's ALTER DATABASE ... SET: every later session there starts with it."""
    with pinned(owned["attacker_url"]) as conn:
        for name, value in settings.items():
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(owned["db"]), sql.Identifier(name), sql.Literal(value)
                )
            )


#: What the owner asks every session of its database to start with so that a session's first
#: statement waits, holding no lock, for as long as the owner keeps a serializable transaction
#: open (a deferrable transaction's safe snapshot: ``hold_a_serializable_transaction``).
SAFE_SNAPSHOT_TRAP = {
    "default_transaction_isolation": "serializable",
    "default_transaction_read_only": "on",
    "default_transaction_deferrable": "on",
}


@contextmanager
def attacker_session(owned: dict[str, str]) -> Iterator[psycopg.Connection[Any]]:
    """A session of the owner's, its transactions its own whatever the database's defaults."""
    with psycopg.connect(
        owned["attacker_url"],
        autocommit=True,
        options="-c search_path=pg_catalog,pg_temp -c default_transaction_read_only=off"
        " -c default_transaction_deferrable=off",
    ) as conn:
        yield conn


@contextmanager
def hold_a_serializable_transaction(owned: dict[str, str]) -> Iterator[None]:
    """The owner's serializable read-write transaction, its snapshot taken, open while inside."""
    with attacker_session(owned) as attacker:
        attacker.execute("BEGIN ISOLATION LEVEL SERIALIZABLE READ WRITE")
        attacker.execute("SELECT 1")  # its snapshot taken: a deferrable transaction now waits for it
        try:
            yield
        finally:
            attacker.execute("ROLLBACK")
