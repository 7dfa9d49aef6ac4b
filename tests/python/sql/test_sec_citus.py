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

Runs on the local Citus cluster (``make test-citus`` sets IDEM_CITUS and the coordinator's URL).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import testdb
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
