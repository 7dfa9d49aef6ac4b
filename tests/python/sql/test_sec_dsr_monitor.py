"""idem_dsr (the GDPR job) and idem_monitor (an exporter) against contract §3a, as an attacker sees
them: what each can execute and read, and what a member of idem_app can do to their calls."""

from __future__ import annotations

import time

import psycopg
import pytest

from tests.python.support.roles import login_role
from tests.python.support.sqlapi import claim, connect, new_key, one

#: Contract §3a: each role executes these and nothing else (of the routines in public).
EXECUTES = {
    "idem_dsr": {"idem_export_user", "idem_erase_user"},
    "idem_monitor": {"idem_health"},
}


@pytest.mark.parametrize("role", sorted(EXECUTES))
def test_each_role_executes_its_functions_and_reads_nothing_else(fresh_admin_url: str, role: str) -> None:
    with login_role(fresh_admin_url, role, prefix=role) as (name, _), connect(fresh_admin_url) as admin:
        runs = {
            r["proname"]
            for r in admin.execute(
                "SELECT p.proname FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = 'public' AND p.proname LIKE 'idem\\_%%'"
                " AND pg_catalog.has_function_privilege(%s, p.oid, 'EXECUTE')",
                (name,),
            )
        }
        assert runs == EXECUTES[role]
        reads = {
            (r["relname"], r["priv"])
            for r in admin.execute(
                "SELECT c.relname, p.priv FROM pg_catalog.pg_class c"
                " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace,"
                " unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE','REFERENCES','TRIGGER']) p(priv)"
                " WHERE n.nspname = 'public' AND c.relkind IN ('r','v','m','p','f')"
                " AND pg_catalog.has_table_privilege(%s, c.oid, p.priv)",
                (name,),
            )
        }
        assert reads == ({("idem_health", "SELECT")} if role == "idem_monitor" else set())
        seqs = admin.execute(
            "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind = 'S'"
            " AND (pg_catalog.has_sequence_privilege(%s, c.oid, 'USAGE')"
            " OR pg_catalog.has_sequence_privilege(%s, c.oid, 'SELECT'))",
            (name, name),
        ).fetchall()
        assert seqs == []
        member_of = admin.execute(
            "SELECT r.rolname FROM pg_catalog.pg_roles r WHERE pg_catalog.pg_has_role(%s, r.oid, 'USAGE')"
            " AND r.rolname <> %s ORDER BY 1",
            (name, name),
        ).fetchall()
        assert [r["rolname"] for r in member_of] == [role]


def test_a_handler_holding_a_users_row_lock_cannot_hang_the_erasure(fresh_admin_url: str) -> None:
    """A member of idem_app claims under the data subject's id (any existing user), takes the
    row's lock in a transaction it never ends (a heartbeat), and the GDPR job's erasure of that
    user waits for it without end: the DBA's tool hangs on what the request path's role did."""
    with (
        connect(fresh_admin_url) as admin,
        login_role(fresh_admin_url, "idem_app") as (_, web_url),
        login_role(fresh_admin_url, "idem_dsr", prefix="gdpr") as (_, dsr_url),
    ):
        uid = one(admin, "INSERT INTO users DEFAULT VALUES RETURNING id")["id"]
        with connect(web_url) as web, psycopg.connect(web_url) as holder:
            mine = claim(web, new_key(), user_id=uid)
            holder.execute(
                "SELECT public.idem_heartbeat(p_key_id => %s, p_claim_token => %s)",
                (mine["key_id"], mine["claim_token"]),
            )  # holder's transaction stays open: the row is locked
            with connect(dsr_url) as job:
                job.execute("SET statement_timeout = '15s'")  # the test's bound, not the function's
                started = time.monotonic()
                with pytest.raises(psycopg.Error) as refused:
                    job.execute("SELECT public.idem_erase_user(p_user_id => %s)", (uid,))
                waited = time.monotonic() - started
                assert not isinstance(refused.value, psycopg.errors.QueryCanceled), (
                    f"idem_erase_user waited {waited:.1f}s on idem_app's row lock"
                )
                assert refused.value.sqlstate == "55P03" and waited < 14
                assert "nothing was erased" in str(refused.value)
                assert (
                    one(admin, "SELECT count(*) AS n FROM idempotency_keys WHERE scope_user_id = %s", (uid,))["n"] == 1
                )
                holder.rollback()
                assert one(job, "SELECT public.idem_erase_user(p_user_id => %s) AS n", (uid,))["n"] == 1
