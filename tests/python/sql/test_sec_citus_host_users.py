"""``idem migrate`` on a Citus database reads a host's own ``public.users`` as the migrating role,
whoever owns it (contract §3a: no routine runs a caller's code, whoever calls it).

On a database with the citus extension, the preflight first lists what the host must fix
(``idem_shim.schema.citus.problems``): where ``public.users`` is the host's (no marker of
migration 0001) it runs ``SELECT ... WHERE NOT EXISTS (SELECT 1 FROM public.users WHERE id = 0)``; owners.sql,
run just before, judges ``users`` only under idem's marker. The database's owner (the app's login role, which
owns public) makes ``users`` a view of its own: a view's functions run as whoever reads it, here
the superuser who runs ``idem migrate``. The test asserts the safe outcome (the attacker stays a
plain role, its function never ran), so it fails while the hole is open.

Runs on the local Citus cluster (``make test-citus`` sets IDEM_CITUS and the coordinator's URL).
"""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import testdb
from tests.python.support.sqlapi import connect, one

pytestmark = pytest.mark.skipif(
    not os.environ.get("IDEM_CITUS"), reason="needs the local Citus cluster: make test-citus"
)

USERS_VIEW = """
CREATE TABLE public.pwn_log (who text);
GRANT INSERT, SELECT ON public.pwn_log TO PUBLIC;
CREATE FUNCTION public.pwn_users() RETURNS SETOF integer LANGUAGE plpgsql AS $f$
BEGIN
    IF current_user <> {attacker} THEN
        INSERT INTO public.pwn_log VALUES (current_user);
        IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
            EXECUTE {escalate};
        END IF;
    END IF;
    RETURN NEXT 0;
END $f$;
CREATE VIEW public.users AS SELECT u AS id, NULL::text AS email FROM public.pwn_users() u;
"""


def test_idem_migrate_never_reads_a_host_users_view_of_the_database_owner(admin_url: str) -> None:
    name, role = f"idem_cv_{os.urandom(5).hex()}", f"webv_{os.urandom(4).hex()}"
    url = testdb.create(admin_url, name)
    try:
        with connect(url) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            admin.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(role)))
        with psycopg.connect(make_conninfo(url, user=role), autocommit=True) as attacker:
            attacker.execute(
                sql.SQL(USERS_VIEW).format(
                    attacker=sql.Literal(role),
                    escalate=sql.Literal(f"ALTER ROLE {sql.Identifier(role).as_string(attacker)} SUPERUSER"),
                )
            )
        done = subprocess.run(
            [testdb.idem_command(), "migrate", "--database-url", url], capture_output=True, text=True, timeout=300
        )
        with connect(url) as admin:
            superuser = one(admin, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,))["rolsuper"]
            ran = admin.execute("SELECT who FROM public.pwn_log").fetchall()
        assert not superuser and not ran, (
            f"idem migrate (rc {done.returncode}) ran the view's function as {ran}"
            f" (superuser now: {superuser}):\n{done.stdout}{done.stderr}"
        )
    finally:
        testdb.drop(admin_url, name)
        with connect(admin_url) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
