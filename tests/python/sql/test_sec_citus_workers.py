"""Attacks on a distributed store (Citus) from the database's owner on the workers.

The app's login role owns the database (``CREATE DATABASE app OWNER web``), on every node: on
PostgreSQL 15 it then owns ``public`` there (pg_database_owner), and it may connect to a worker's
copy of the database directly. What it plants there a superuser's session on the worker must
never run.

1. The nightly cleanup's events DELETE (sql/citus/071, run_command_on_shards, as pg_cron's DBA)
   compared ``e.ctid = ANY (...)`` through the owner's path on the worker: a planted ``=`` on
   (tid, tid) in ``public``, first on the database's path there, ran as the superuser.
2. idem's DDL guard was the coordinator's only: on a worker the owner dropped idem's routines
   (and could its shards) and made its own under their names, which the delegated completion ran
   as the superuser. ``idem migrate`` and the ``idem sql`` script now make the guard on every
   worker too (schema/citus.py's WORKER_GUARD).

Runs on the local Citus cluster (``make test-citus`` sets IDEM_CITUS and the coordinator's URL).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import testdb
from tests.python.sql.test_citus import worker_url
from tests.python.support.sqlapi import connect, new_key

pytestmark = pytest.mark.skipif(
    not os.environ.get("IDEM_CITUS"), reason="needs the local Citus cluster: make test-citus"
)


@contextmanager
def owned_store(admin_url: str, prefix: str, how: str = "migrate") -> Iterator[tuple[str, str]]:
    """A store whose database a login role owns on every node, installed by ``idem migrate`` or
    by the ``idem sql`` script through psql: (url, role)."""
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
        if how == "migrate":
            testdb.migrate(url)
        else:
            script = subprocess.run([testdb.idem_command(), "sql"], capture_output=True, text=True, check=True)
            subprocess.run(
                ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url], input=script.stdout, text=True, check=True
            )
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


@pytest.mark.parametrize("how", ["migrate", "script"])
def test_the_owner_replaces_no_idem_routine_on_a_worker(admin_url: str, how: str) -> None:
    """idem's DDL guard (985's event triggers) is made on the coordinator only: on a worker the
    owner of ``public`` drops idem's internal ``idem_token_claimed_at`` (a schema's owner may drop
    anything in it) and makes its own under the name. The completion the shim sends
    (``idem_complete_in_scope``, delegated to the claim's worker) runs ``idem_complete`` there,
    SECURITY DEFINER as the superuser who migrated, which calls ``public.idem_token_claimed_at``:
    the owner's body, as the superuser (here it then returns what idem's would: the completion
    succeeds, and nothing shows)."""
    with owned_store(admin_url, "cr", how) as (url, role):
        with connect(url) as admin:
            admin.execute("INSERT INTO users (id) SELECT g FROM generate_series(1, 16) g ON CONFLICT DO NOTHING")
        refused = []
        for n in (1, 2):
            with psycopg.connect(make_conninfo(worker_url(url, n), user=role), autocommit=True) as owner:
                owner.execute("SET citus.enable_ddl_propagation = off")  # its own DDL there, on the worker alone
                try:
                    with owner.transaction():  # idem's body under another name, then its own
                        row = owner.execute(
                            "SELECT pg_get_functiondef('public.idem_token_claimed_at(text)'::regprocedure)"
                        ).fetchone()
                        assert row is not None
                        owner.execute(row[0].replace("public.idem_token_claimed_at(", "public.pwn_claimed_at("))
                        owner.execute("DROP FUNCTION public.idem_token_claimed_at(text)")
                        owner.execute(
                            sql.SQL(
                                "CREATE FUNCTION public.idem_token_claimed_at(text) RETURNS timestamptz"
                                " LANGUAGE plpgsql AS $f$ BEGIN {escalate} RETURN public.pwn_claimed_at($1); END $f$"
                            ).format(escalate=escalation(owner, role))
                        )
                except psycopg.Error as exc:
                    refused.append(f"worker {n}: {exc.sqlstate} {exc}")
        with psycopg.connect(make_conninfo(url, user=role), autocommit=True) as web:
            for user in range(1, 17):  # claims on both workers, completed as the shim does
                claim = web.execute(
                    "SELECT key_id, claim_token FROM idem_claim(p_key => %s, p_user_id => %s,"
                    " p_endpoint => 'POST /t', p_request => '{}'::jsonb)",
                    (new_key(), user),
                ).fetchone()
                assert claim is not None
                web.execute(
                    "SELECT idem_complete_in_scope(p_scope => %s, p_key_id => %s, p_response_code => 201,"
                    " p_response_body => '{}'::jsonb, p_claim_token => %s)",
                    (user, claim[0], claim[1]),
                )
        assert [r.split(":")[0] for r in refused] == ["worker 1", "worker 2"], refused
        assert all("42501" in r and "idem_ddl_guard: DROP FUNCTION refused" in r for r in refused), refused
        for n in (1, 2):
            assert not superuser_on(url, role, n), (
                f"idem_complete_in_scope ran the owner's idem_token_claimed_at as the superuser on worker {n}"
                f" (refused: {refused})"
            )


@pytest.mark.parametrize("how", ["migrate", "script"])
def test_the_owner_plants_no_look_alike_in_a_schema_of_its_own_on_a_worker(admin_url: str, how: str) -> None:
    """The guard's fourth trigger (idem_guard_object) reaches every worker with the other three, and
    on a worker too idem's names are refused in any schema: the owner's ``postgres.idem_erase_user``
    there would run as a superuser whose session on the worker types the name unqualified."""
    with owned_store(admin_url, "sh", how) as (url, role):
        for n in (1, 2):
            with psycopg.connect(worker_url(url, n)) as admin:
                row = admin.execute(
                    "SELECT count(*) AS n FROM pg_event_trigger WHERE evtname LIKE 'idem_guard_%' AND evtenabled = 'A'"
                ).fetchone()
            assert row == (4,), f"worker {n}: {row}"
            with psycopg.connect(make_conninfo(worker_url(url, n), user=role), autocommit=True) as owner:
                owner.execute("SET citus.enable_ddl_propagation = off")  # its own DDL there, on the worker alone
                owner.execute("CREATE SCHEMA postgres")
                for statement in (
                    "CREATE FUNCTION postgres.idem_erase_user(p_user_id integer) RETURNS integer LANGUAGE sql RETURN 0",
                    "CREATE DOMAIN postgres.idem_key AS text",
                ):
                    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="idem_ddl_guard"):
                        owner.execute(statement)
