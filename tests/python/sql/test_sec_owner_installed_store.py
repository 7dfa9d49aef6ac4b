"""A store the database's owner installed as itself, then upgraded (or re-run) by a superuser
(contract §3a): what the store's owner made is trusted (schema/sql/owners.sql), and the
superuser's install writes the store owner's tables as the superuser.

The attacker is a plain login role that owns its database; idem's roles exist (cluster-wide, made
by any earlier install), so it applies the ``idem sql`` script as itself: no guard (it is no
superuser), and it owns the store, yoyo's tables and every routine. It empties its
``_yoyo_version`` and hangs a trigger on it. A superuser then runs ``idem migrate`` or the script
again, nothing pending: yoyo_version.sql's INSERT fires the trigger as the superuser (yoyo's lock,
``_yoyo_log`` and any migration's DML on the store's tables would as well)."""

from __future__ import annotations

import subprocess

import pytest
from psycopg import sql

from idem_shim.schema.preflight import ROLES
from tests.python.sql.test_sec_owned_database import outcome, spy
from tests.python.support.owned import idem, pinned

_TRAP = """
DELETE FROM public._yoyo_version;
CREATE FUNCTION public.trap() RETURNS trigger LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM public.spy('a trigger on public._yoyo_version'); RETURN NEW; END $f$;
CREATE TRIGGER trap BEFORE INSERT ON public._yoyo_version FOR EACH ROW EXECUTE FUNCTION public.trap()"""


def _script(url: str) -> subprocess.CompletedProcess[str]:
    script = idem("sql", "--wait-timeout", "5")
    assert script.returncode == 0, script.stderr
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", url],
        input=script.stdout,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("verb", ["migrate", "sql"])
def test_a_superusers_upgrade_never_runs_a_trigger_of_the_owner_installed_store(
    owned: dict[str, str], admin_url: str, verb: str
) -> None:
    """Safe: the superuser's verb refuses a store another role owns (store_owner.sql), naming the
    role to run it as, and nothing the owner hung there ran."""
    with pinned(admin_url) as conn:  # idem's roles, cluster-wide, as any earlier install made them
        for role in ROLES:
            if conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
                conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    installed = _script(owned["attacker_url"])
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    with pinned(owned["attacker_url"]) as conn:
        spy(conn, owned)
        conn.execute(_TRAP)
    if verb == "sql":
        done = _script(owned["url"])
    else:
        done = idem("migrate", "--database-url", owned["url"], "--wait-timeout", "5")
    superuser, ran = outcome(owned)
    assert not superuser and not ran, f"idem {verb} ran the owner's trigger as {ran}: {done.stdout + done.stderr}"
    assert done.returncode != 0 and f"the store is owned by {owned['role']}, neither" in done.stdout + done.stderr, (
        done.stdout + done.stderr
    )
