"""Attacks on a distributed store (Citus), from outside.

1. A distributed store upgraded 4 -> 8 -> 9: the claims SQL API 8 gave a token are not tokenless.

Migration 0008 set ``tokenless_through = max(id)``; on a store distributed at SQL API 4 that is
the largest *user's* key_id, so under SQL API 8 every later claim of a smaller user was
completable without a token (the issue's finding 3). Migration 0012 marks the claims in flight
at the upgrade: ``'none'`` (tokenless) when ``id <= tokenless_through`` and ``created_at`` is no
later than 0008's run as yoyo recorded it *plus five minutes* (a margin for the migrating client's
clock). A claim that SQL API 8 took, with a token, in the first five minutes after its upgrade
— still in flight at the next upgrade, as an abandoned claim is until it expires — is marked
``'none'``: any member of ``idem_app`` then completes it with no token and a forged body, and the
victim's retry replays that body. The test asserts the refusal (IDM00: a token is required)
and that nothing changed.

2. ``idem migrate`` on a Citus database trusts migration 0001's marker comment: a ``public.users``
that carries it is taken for idem's own minimal table, and 000_distribute.sql inserts the reserved
user 0 into it as the migrating role. The database's owner (the app's role, which owns public)
creates such a table before the first migrate, with a column DEFAULT of its own: the superuser
who runs ``idem migrate`` evaluates it (a trigger or a policy would do the same). The owners'
check (owners.sql) looks at idem's and yoyo's names only, never at users or audit_log.

3. ``idem migrate`` bounds its lock waits by --wait-timeout (lock_timeout) on the coordinator
only: a lock the database's owner holds on a worker, on its own distributed users table, holds
the install for as long as the owner likes, and with it the cluster's install lock that every
other database's install waits for. The test asserts the install is refused within the bound.

Runs on the local Citus cluster (``make test-citus`` sets IDEM_CITUS and the coordinator's URL).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import testdb
from tests.python.sql.test_citus import worker_url
from tests.python.support import earlier
from tests.python.support.roles import login_role
from tests.python.support.sqlapi import connect, new_key, one

pytestmark = pytest.mark.skipif(
    not os.environ.get("IDEM_CITUS"), reason="needs the local Citus cluster: make test-citus"
)

CLAIM = "SELECT * FROM idem_claim(p_key => %s, p_user_id => %s, p_endpoint => 'POST /orders', p_request => '{}')"


def test_a_claim_sql_api_8_gave_a_token_is_not_tokenless_after_the_next_upgrade(admin_url: str, tmp_path: Path) -> None:
    name = f"idem_c48_{os.urandom(5).hex()}"
    url = testdb.create(admin_url, name)
    try:
        earlier.build(url, 4, tmp_path / "api4")
        with connect(url) as conn:
            conn.execute("INSERT INTO users (id) VALUES (1), (5) ON CONFLICT DO NOTHING")
            one(conn, CLAIM, (new_key(), 5))  # user 5's key_id is 5 * 2^31 + n: the largest
        with connect(url) as conn:  # SQL API 8's grants name idem_admin, which its migrate created
            conn.execute(
                "DO $$ BEGIN CREATE ROLE idem_admin NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            )
        earlier.build(url, 8, tmp_path / "api8")  # what SQL API 8's migrate did: 0008-0011
        with connect(url) as conn:
            assert one(conn, "SELECT idem_schema_version() AS v")["v"] == 8
            through = one(conn, "SELECT tokenless_through AS t FROM idem_secret")["t"]
            # A claim of SQL API 8, with its token; its worker dies and it stays in flight.
            taken = one(conn, CLAIM, (new_key(), 1))
            assert taken["claim_token"] is not None and taken["key_id"] <= through
        # Sequential: on a loaded machine Citus's adaptive executor opens a second connection per
        # worker for 0012's UPDATE, and the DROP FUNCTION after it then fails ("parallel operation
        # on a distributed table in the transaction"): a separate robustness problem of the upgrade.
        done = subprocess.run(
            [testdb.idem_command(), "migrate", "--database-url", url],
            capture_output=True,
            text=True,
            env={**os.environ, "PGOPTIONS": "-c citus.multi_shard_modify_mode=sequential"},
        )
        assert done.returncode == 0, done.stderr
        with login_role(url, "idem_app") as (_, web), connect(web) as attacker, connect(url) as admin:
            before = admin.execute("SELECT * FROM idempotency_keys ORDER BY id").fetchall()
            mark = one(admin, "SELECT legacy_token FROM idempotency_keys WHERE id = %s", (taken["key_id"],))
            try:
                attacker.execute(
                    "SELECT idem_complete(p_key_id => %s, p_response_code => 201,"
                    ' p_response_body => \'{"notice": "re-verify at https://evil.example"}\','
                    ' p_response_headers => \'{"Location": "https://evil.example/phish"}\')',
                    (taken["key_id"],),
                )
                outcome = "completed without a token"
            except psycopg.Error as exc:
                outcome = str(exc.sqlstate)
            after = admin.execute("SELECT * FROM idempotency_keys ORDER BY id").fetchall()
        assert outcome == "IDM00" and after == before, (
            f"SQL API 8's claim {taken['key_id']} (marked {mark['legacy_token']!r} by 0012) was {outcome} by a"
            f" member of idem_app; its row now: {[r for r in after if r['id'] == taken['key_id']]}"
        )
    finally:
        testdb.drop(admin_url, name)


#: The attacker's users table, under idem's marker, with a DEFAULT that reports and escalates.
MARKED_USERS = """
CREATE TABLE public.pwn_log (who text);
GRANT INSERT ON public.pwn_log TO PUBLIC;
CREATE FUNCTION public.pwn_default() RETURNS integer LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
    IF current_user <> {attacker} THEN
        INSERT INTO public.pwn_log VALUES (current_user);
        IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
            EXECUTE {escalate};
        END IF;
    END IF;
    RETURN 0;
END $f$;
CREATE TABLE public.users (id integer GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, email text UNIQUE,
                           created_at timestamptz NOT NULL DEFAULT now(),
                           seen integer DEFAULT public.pwn_default());
COMMENT ON TABLE public.users IS 'idem: minimal host table';
"""


@pytest.mark.parametrize("how", ["owns the database", "may create in public"])
def test_idem_migrate_never_runs_a_default_of_a_users_table_under_idems_marker(admin_url: str, how: str) -> None:
    """The marker is no proof: the table's owner and the code its defaults call are checked
    (owners.sql), whether or not the attacker also owns public."""
    name, role = f"idem_cm_{os.urandom(5).hex()}", f"webc_{os.urandom(4).hex()}"
    url = testdb.create(admin_url, name)
    try:
        with connect(url) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            if how == "owns the database":
                admin.execute(
                    sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(role))
                )
            else:
                admin.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
        with psycopg.connect(make_conninfo(url, user=role), autocommit=True) as attacker:
            attacker.execute(
                sql.SQL(MARKED_USERS).format(
                    attacker=sql.Literal(role),
                    escalate=sql.Literal(f"ALTER ROLE {sql.Identifier(role).as_string(attacker)} SUPERUSER"),
                )
            )
        done = subprocess.run([testdb.idem_command(), "migrate", "--database-url", url], capture_output=True, text=True)
        with connect(url) as admin:
            superuser = one(admin, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,))["rolsuper"]
            ran = admin.execute("SELECT who FROM public.pwn_log").fetchall()
        assert not superuser and not ran, (
            f"idem migrate (rc {done.returncode}) evaluated the attacker's DEFAULT as {ran}"
            f" (superuser now: {superuser}):\n{done.stdout}{done.stderr}"
        )
        assert done.returncode == 1 and "table public.users (owned by" in done.stderr, done.stderr
    finally:
        testdb.drop(admin_url, name)
        with connect(admin_url) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_a_lock_the_owner_holds_on_a_worker_holds_idem_migrate_no_longer_than_its_wait_timeout(
    admin_url: str,
) -> None:
    """idem migrate's lock waits are bounded by --wait-timeout (lock_timeout, migrate_lock.sql),
    and on Citus it holds the whole cluster's install lock meanwhile: every other database's
    install is refused until it ends. lock_timeout was the coordinator's only, never sent to the
    workers, so a lock the database's owner held there on its own table (its users, which the
    host distributes) held the install for as long as the owner liked: ROW EXCLUSIVE on its users
    shards, which the distribution's foreign keys wait for. Here the owner takes it in a session
    on a worker; from the coordinator alone, run_command_on_placements (anyone's to call) holds
    the same for a statement's length, begun once the guard's wait is over (seen by hand: an
    install held 47 s with --wait-timeout 3, another database's refused meanwhile)."""
    name, role = f"idem_cw_{os.urandom(5).hex()}", f"webw_{os.urandom(4).hex()}"
    url = testdb.create(admin_url, name)
    try:
        with connect(url) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        for n in range(3):  # the owner on every node: the host's tables are distributed by it
            node = url if n == 0 else worker_url(url, n)
            with psycopg.connect(testdb.url_for(node, "postgres"), autocommit=True) as admin:
                admin.execute(
                    sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(role))
                )
        with psycopg.connect(make_conninfo(url, user=role), autocommit=True) as owner:
            owner.execute("CREATE TABLE public.users (id integer PRIMARY KEY, email text)")
            owner.execute("SELECT create_distributed_table('public.users', 'id')")
            owner.execute("INSERT INTO public.users (id) VALUES (0)")
            shards = [
                r[0]
                for r in owner.execute(
                    "SELECT pg_catalog.shard_name('public.users'::regclass, s.shardid)"
                    "  FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)"
                    "  JOIN pg_dist_node n USING (groupid)"
                    " WHERE s.logicalrelid = 'public.users'::regclass AND n.nodeport = %s",
                    (psycopg.conninfo.conninfo_to_dict(worker_url(url, 1))["port"],),
                ).fetchall()
            ]
        assert shards
        with psycopg.connect(make_conninfo(worker_url(url, 1), user=role), autocommit=True) as holder:
            holder.execute("SET citus.enable_manual_changes_to_shards = on")
            holder.execute("BEGIN")
            holder.execute("LOCK TABLE " + ", ".join(shards) + " IN ROW EXCLUSIVE MODE")
            started = time.monotonic()
            try:
                done = subprocess.run(
                    [testdb.idem_command(), "migrate", "--database-url", url, "--wait-timeout", "3"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
            except subprocess.TimeoutExpired:
                pytest.fail("idem migrate --wait-timeout 3 still waited after 30 s for the owner's lock on a worker")
            took = time.monotonic() - started
            holder.execute("ROLLBACK")
        assert done.returncode == 1 and "lock" in done.stderr, done.stderr
        assert took < 20, f"{took:.0f} s"
        with connect(url) as admin:
            row = one(admin, "SELECT to_regclass('public.idempotency_keys') IS NULL AS untouched")
        assert row["untouched"], done.stderr
    finally:
        testdb.drop(admin_url, name)
        with connect(admin_url) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_the_roles_made_on_the_workers_resolve_nothing_through_the_owners_path(admin_url: str) -> None:
    """idem migrate checks every worker through run_command_on_workers (citus.py's probe): a session
    on the worker, as the DBA, that starts with the database's defaults there. The owner of the
    database on the worker set its search_path to public first and planted an operator = on
    (name, name) there: the worker's DO block compared rolname with it, as the superuser. Safe: the
    block pins its path and names pg_catalog's operator; the owner stays as it was."""
    name, role = f"idem_cr_{os.urandom(5).hex()}", f"webr_{os.urandom(4).hex()}"
    url = testdb.create(admin_url, name)
    worker = worker_url(url, 1)
    try:
        with connect(url) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        for n in range(3):
            node = url if n == 0 else worker_url(url, n)
            with psycopg.connect(testdb.url_for(node, "postgres"), autocommit=True) as admin:
                admin.execute(
                    sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(role))
                )
        with psycopg.connect(make_conninfo(worker, user=role), autocommit=True) as owner:
            owner.execute("SET citus.enable_ddl_propagation = off")  # its own DDL there, on the worker alone
            owner.execute(
                sql.SQL(
                    "CREATE FUNCTION public.pwn_eq(name, name) RETURNS boolean LANGUAGE plpgsql AS $f$"
                    " BEGIN IF pg_catalog.current_setting('is_superuser') = 'on' THEN EXECUTE {escalate}; END IF;"
                    " RETURN $1 OPERATOR(pg_catalog.=) $2; END $f$"
                ).format(escalate=sql.Literal(f"ALTER ROLE {sql.Identifier(role).as_string(owner)} SUPERUSER"))
            )
            owner.execute("CREATE OPERATOR public.= (LEFTARG = name, RIGHTARG = name, FUNCTION = public.pwn_eq)")
            owner.execute(
                sql.SQL("ALTER DATABASE {} SET search_path = public, pg_catalog").format(sql.Identifier(name))
            )
        done = subprocess.run([testdb.idem_command(), "migrate", "--database-url", url], capture_output=True, text=True)
        with psycopg.connect(testdb.url_for(worker, "postgres")) as admin:
            row = admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            superuser = bool(row and row[0])
        assert not superuser, f"idem migrate (rc {done.returncode}) made the owner superuser on the worker"
    finally:
        testdb.drop(admin_url, name)
        with connect(admin_url) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_the_cleanup_on_the_workers_resolves_nothing_through_the_owners_path(admin_url: str) -> None:
    """The nightly cleanup (CALL idem_cleanup(), pg_cron's job, as the DBA) deletes shard by shard
    through run_command_on_shards: a worker's session, which starts with the database's defaults
    there. The owner set its path there to public first and planted <= on timestamptz: the
    shard's DELETE compared expires_at with it, as the superuser. Safe: every operator and type of
    the shard's statements is named (sql/citus/071); the owner stays as it was."""
    name, role = f"idem_cc_{os.urandom(5).hex()}", f"webk_{os.urandom(4).hex()}"
    url = testdb.create(admin_url, name)
    try:
        with connect(url) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        for n in range(3):
            node = url if n == 0 else worker_url(url, n)
            with psycopg.connect(testdb.url_for(node, "postgres"), autocommit=True) as admin:
                admin.execute(
                    sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(role))
                )
        testdb.migrate(url)
        with connect(url) as admin:  # expired completed keys on shards of both workers
            admin.execute("INSERT INTO users (id) SELECT g FROM generate_series(1, 16) g ON CONFLICT DO NOTHING")
            for user in range(1, 17):
                got = admin.execute(
                    "SELECT (idem_claim(p_key => %s, p_user_id => %s, p_endpoint => 'POST /t',"
                    " p_request => '{}'::jsonb)).*",
                    (new_key(), user),
                ).fetchone()
                assert got is not None
            admin.execute(
                "UPDATE idempotency_keys SET status = 'completed', response_code = 201,"
                " created_at = now() - interval '2 days', locked_at = now() - interval '2 days',"
                " expires_at = now() - interval '1 day'"
            )
        for n in (1, 2):
            with psycopg.connect(make_conninfo(worker_url(url, n), user=role), autocommit=True) as owner:
                owner.execute("SET citus.enable_ddl_propagation = off")  # its own DDL there, on the worker alone
                owner.execute(
                    sql.SQL(
                        "CREATE FUNCTION public.pwn_le(timestamptz, timestamptz) RETURNS boolean"
                        " LANGUAGE plpgsql AS $f$"
                        " BEGIN IF pg_catalog.current_setting('is_superuser') = 'on' THEN"
                        " PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);"
                        " EXECUTE {escalate}; END IF;"
                        " RETURN $1 OPERATOR(pg_catalog.<=) $2; END $f$"
                    ).format(escalate=sql.Literal(f"ALTER ROLE {sql.Identifier(role).as_string(owner)} SUPERUSER"))
                )
                owner.execute(
                    "CREATE OPERATOR public.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz,"
                    " FUNCTION = public.pwn_le)"
                )
                owner.execute(
                    sql.SQL("ALTER DATABASE {} SET search_path = public, pg_catalog").format(sql.Identifier(name))
                )
        with connect(url) as admin:
            admin.execute("CALL public.idem_cleanup()")
            left = admin.execute("SELECT count(*) AS n FROM idempotency_keys").fetchone()
        for n in (1, 2):
            with psycopg.connect(testdb.url_for(worker_url(url, n), "postgres")) as admin:
                row = admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
                assert not (row and row[0]), f"CALL idem_cleanup() made the owner superuser on worker {n}"
        assert left == {"n": 0}, left
    finally:
        testdb.drop(admin_url, name)
        with connect(admin_url) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
