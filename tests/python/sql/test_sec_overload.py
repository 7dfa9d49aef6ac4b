"""An overload of idem's own function wins a call that leaves its argument's type open (contract §3a:
"every type, function and operator qualified or exactly typed").

The PL/pgSQL definers name their helpers ``public.<name>(...)`` and resolve them when they run.
Where an argument is an untyped ``NULL`` — ``public.idem_scope(NULL)`` in
``idem_record_lost_claim`` (granted to ``idem_app``) and in ``idem_inspect`` (a DBA's) — an
overload ``public.idem_scope(text)`` is a better match than idem's ``idem_scope(integer)``
(PostgreSQL prefers the string category for an unknown argument). The attacker needs no
ownership of anything: only CREATE on ``public``, which ``PUBLIC`` keeps on every database of a
cluster upgraded from PostgreSQL 14 or older (pg_upgrade keeps the ACL), and which any app whose
own migrations create tables there has. The owner-path test plants look-alikes of pg_catalog's
functions and operators, never overloads of idem's own, so it does not see this.

As a plain member of ``idem_app`` (a handler with SQL injection): claim, release the claim with
``idem_fail(p_release => true)`` (the row is gone), then report it lost: the report runs the
attacker's function as the store's owner. The DBA's ``idem_inspect`` runs it too. Each test
asserts the safe outcome: nothing planted ran, the attacker is no superuser.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.python.support.roles import login_role
from tests.python.support.sqlapi import claim, connect, new_key

OVERLOAD = """
CREATE FUNCTION public.idem_scope(p_user_id text) RETURNS integer LANGUAGE plpgsql AS $f$
BEGIN
    IF current_user <> {attacker} THEN
        INSERT INTO public.overload_ran (who) VALUES (current_user);
        IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
            EXECUTE {escalate};
        END IF;
    END IF;
    RETURN NULL;
END $f$"""


@pytest.fixture
def writable_public(fresh_admin_url: str) -> Iterator[dict[str, str]]:
    """A store whose public PUBLIC may create in (a database of a cluster upgraded from PostgreSQL
    14), and a handler's login role: a member of idem_app that owns nothing."""
    with connect(fresh_admin_url) as admin:
        admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        admin.execute("CREATE TABLE public.overload_ran (who text)")
        admin.execute("GRANT INSERT ON public.overload_ran TO PUBLIC")
    with login_role(fresh_admin_url, "idem_app") as (role, url):
        # idem's DDL guard refuses the overload (test_sec_token_levers); past it, as where no
        # superuser migrated, the definers' exactly typed calls must still never pick it
        with connect(fresh_admin_url) as admin:
            admin.execute("ALTER EVENT TRIGGER idem_guard_routine DISABLE")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                sql.SQL(OVERLOAD).format(
                    attacker=sql.Literal(role),
                    escalate=sql.Literal(f"ALTER ROLE {sql.Identifier(role).as_string(conn)} SUPERUSER"),
                )
            )
        with connect(fresh_admin_url) as admin:
            admin.execute("ALTER EVENT TRIGGER idem_guard_routine ENABLE ALWAYS")
        yield {"role": role, "url": url, "admin_url": fresh_admin_url}
        with connect(fresh_admin_url) as admin:
            admin.execute(sql.SQL("ALTER ROLE {} NOSUPERUSER").format(sql.Identifier(role)))
            admin.execute("DROP FUNCTION IF EXISTS public.idem_scope(text)")


def verdict(setup: dict[str, str]) -> tuple[bool, list[Any]]:
    with connect(setup["admin_url"]) as admin:
        row = admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (setup["role"],)).fetchone()
        ran = admin.execute("SELECT who FROM public.overload_ran").fetchall()
    assert row is not None
    return bool(row["rolsuper"]), ran


def test_a_lost_claims_report_never_runs_an_overload_of_idem_scope(writable_public: dict[str, str]) -> None:
    with connect(writable_public["url"]) as attacker:
        held = claim(attacker, new_key())
        attacker.execute(
            "SELECT idem_fail(p_key_id => %s, p_claim_token => %s, p_release => true)",
            (held["key_id"], held["claim_token"]),
        )
        try:
            attacker.execute(
                "SELECT idem_record_lost_claim(p_key_id => %s, p_claim_token => %s)",
                (held["key_id"], held["claim_token"]),
            )
        except psycopg.Error:
            pass  # a refusal is safe; what matters is what ran
    superuser, ran = verdict(writable_public)
    assert not superuser and not ran, (
        f"idem_record_lost_claim ran the attacker's public.idem_scope(text) as {ran} (superuser now: {superuser})"
    )


def test_a_dbas_inspect_never_runs_an_overload_of_idem_scope(writable_public: dict[str, str]) -> None:
    with connect(writable_public["admin_url"]) as dba:
        dba.execute("SELECT * FROM public.idem_inspect(p_key => %s)", (new_key(),))
    superuser, ran = verdict(writable_public)
    assert not superuser and not ran, (
        f"idem_inspect ran the attacker's public.idem_scope(text) as {ran} (superuser now: {superuser})"
    )
