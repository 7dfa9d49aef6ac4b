"""Attacks on a distributed store (Citus) from the database's owner on the workers.

The app's login role owns the database (``CREATE DATABASE app OWNER web``), on every node: on
PostgreSQL 15 it then owns ``public`` there (pg_database_owner), and it may connect to a worker's
copy of the database directly. What it plants there a superuser's session on the worker must
never run.

1. The nightly cleanup's events DELETE (sql/citus/071, run_command_on_shards, as pg_cron's DBA)
   compared ``e.ctid = ANY (...)`` through the owner's path on the worker: a planted ``=`` on
   (tid, tid) in ``public``, first on the database's path there, ran as the superuser.

Runs on the local Citus cluster (``make test-citus`` sets IDEM_CITUS and the coordinator's URL).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import testdb
from tests.python.sql.test_citus import worker_url
from tests.python.support.sqlapi import connect

pytestmark = pytest.mark.skipif(
    not os.environ.get("IDEM_CITUS"), reason="needs the local Citus cluster: make test-citus"
)


@contextmanager
def owned_store(admin_url: str, prefix: str) -> Iterator[tuple[str, str]]:
    """A migrated store whose database a login role owns on every node: (url, role)."""
    name, role = f"idem_{prefix}_{os.urandom(5).hex()}", f"web{prefix}_{os.urandom(4).hex()}"
    url = testdb.create(admin_url, name)
    try:
        with connect(url) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE idem_app").format(sql.Identifier(role)))
        for n in range(3):
            node = url if n == 0 else worker_url(url, n)
            with psycopg.connect(testdb.url_for(node, "postgres"), autocommit=True) as admin:
                admin.execute(
                    sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(role))
                )
        testdb.migrate(url)
        yield url, role
    finally:
        testdb.drop(admin_url, name)
        with connect(admin_url) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def escalation(owner: psycopg.Connection[object], role: str) -> sql.Composed:
    """A plpgsql statement that makes the role superuser on this worker when a superuser runs it."""
    return sql.SQL(
        "IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN"
        " PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);"
        " EXECUTE {escalate}; END IF;"
    ).format(escalate=sql.Literal(f"ALTER ROLE {sql.Identifier(role).as_string(owner)} SUPERUSER"))


def superuser_on(url: str, role: str, n: int) -> bool:
    with psycopg.connect(testdb.url_for(worker_url(url, n), "postgres")) as admin:
        row = admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        return bool(row and row[0])


def test_the_cleanups_events_delete_on_the_workers_resolves_nothing_through_the_owners_path(admin_url: str) -> None:
    with owned_store(admin_url, "ce") as (url, role):
        with connect(url) as admin:  # events past 7 days, on shards of both workers
            admin.execute("INSERT INTO users (id) SELECT g FROM generate_series(1, 16) g ON CONFLICT DO NOTHING")
            admin.execute(
                "INSERT INTO idempotency_events (event, key_id, scope_user_id, scope_endpoint, occurred_at)"
                " SELECT 'stale_heal', g::bigint * 2147483648 + 1, g, 'POST /t', now() - interval '8 days'"
                "   FROM generate_series(1, 16) g"
            )
        for n in (1, 2):
            with psycopg.connect(make_conninfo(worker_url(url, n), user=role), autocommit=True) as owner:
                owner.execute("SET citus.enable_ddl_propagation = off")  # its own DDL there, on the worker alone
                owner.execute(
                    sql.SQL(
                        "CREATE FUNCTION public.pwn_eq(tid, tid) RETURNS boolean LANGUAGE plpgsql AS $f$"
                        " BEGIN {escalate} RETURN $1 OPERATOR(pg_catalog.=) $2; END $f$"
                    ).format(escalate=escalation(owner, role))
                )
                owner.execute("CREATE OPERATOR public.= (LEFTARG = tid, RIGHTARG = tid, FUNCTION = public.pwn_eq)")
                owner.execute(
                    sql.SQL("ALTER DATABASE {} SET search_path = public, pg_catalog").format(
                        sql.Identifier(url.rsplit("/", 1)[1])
                    )
                )
        with connect(url) as admin:
            admin.execute("CALL public.idem_cleanup()")
            left = admin.execute("SELECT count(*) AS n FROM idempotency_events").fetchone()
        for n in (1, 2):
            assert not superuser_on(url, role, n), f"CALL idem_cleanup() made the owner superuser on worker {n}"
        assert left == {"n": 0}, left
