"""The database's owner cannot plant a look-alike of idem's objects in a schema of its own (contract
§3a; issue 39, F1 and its item 2: idem's DDL guard covers every schema).

A superuser's psql starts with ``search_path = "$user", public``: a schema named like the DBA's
role comes first. The owner (``CREATE DATABASE app OWNER web``, a member of ``idem_app``) makes
``CREATE SCHEMA postgres; GRANT USAGE ON SCHEMA postgres TO PUBLIC`` and, there, a function
``idem_erase_user(p_user_id integer)`` that makes it a superuser: the DBA's unqualified call runs
it. The guard watched ``public`` only. Now no role but a superuser or the store's owner makes,
renames into or moves into any schema (``pg_temp`` too) a routine, type, domain or relation (its
row type) under one of idem's names, or an operator on one of idem's types; and ``idem migrate``
and ``idem status`` name a schema called after a role that another role owns (the ``"$user"``
shadow), with the fix, in one line each, their exit code unchanged.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.python.support.owned import attacker_session, idem, pinned

ROOT = Path(__file__).resolve().parents[3]
GUARD = ROOT / "sql" / "functions" / "985_idem_ddl_guard.sql"

#: What the owner types in the schema named like the DBA's role ({s}) or another of its own ({o}):
#: each is refused with 42501 by idem's DDL guard.
PLANTS = {
    "function in the DBA's schema": "CREATE FUNCTION {s}.idem_erase_user(p_user_id integer) RETURNS integer "
    "LANGUAGE sql RETURN 0",
    "procedure in the DBA's schema": "CREATE PROCEDURE {s}.idem_cleanup() LANGUAGE sql BEGIN ATOMIC SELECT 1; END",
    "function in another schema": "CREATE FUNCTION {o}.idem_health() RETURNS integer LANGUAGE sql RETURN 0",
    "aggregate": "CREATE AGGREGATE {o}.idem_sum(integer) (sfunc = pg_catalog.int4pl, stype = integer)",
    "composite type": "CREATE TYPE {s}.idem_claim_result AS (a integer)",
    "enum type": "CREATE TYPE {o}.idem_state AS ENUM ('x')",
    "domain": "CREATE DOMAIN {s}.idem_key AS text",
    "view (its row type)": "CREATE VIEW {s}.idempotency_keys AS SELECT 1 AS id",
    "table (its row type)": "CREATE TABLE {o}.idempotency_events (id integer)",
    "operator on idem's type": "CREATE OPERATOR {o}.= (leftarg = public.idem_claim_result, "
    "rightarg = public.idem_claim_result, function = {o}.same)",
    "temporary function": "CREATE FUNCTION pg_temp.idem_erase_user(p_user_id integer) RETURNS integer "
    "LANGUAGE sql RETURN 0",
    "function renamed into a name": "ALTER FUNCTION {o}.mine(integer) RENAME TO idem_export_user",
    "type renamed into a name": "ALTER TYPE {o}.mine_t RENAME TO idem_claim_result",
    "domain renamed into a name": "ALTER DOMAIN {o}.mine_d RENAME TO idem_key",
    "view renamed into a name": "ALTER VIEW {o}.mine_v RENAME TO idempotency_keys",
    "function moved": "ALTER FUNCTION {o}.idem_planted(integer) SET SCHEMA {s}",
    "type moved": "ALTER TYPE {o}.idem_planted_t SET SCHEMA {s}",
    "operator moved": "ALTER OPERATOR {o}.=(public.idem_claim_result, public.idem_claim_result) SET SCHEMA {s}",
}


def _prepare(url: str, dba: str, web: str) -> dict[str, sql.Identifier]:
    """The owner's schemas (one named like the DBA's role, open to PUBLIC, and one more), its own
    objects under names of its own, and what it planted before a guard was there (made by the
    superuser, handed to it): idem-named objects it may then try to move."""
    s, o, w = sql.Identifier(dba), sql.Identifier("web_own"), sql.Identifier(web)
    with pinned(url) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(s, w))
        conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(o, w))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO PUBLIC").format(s))
        for statement, kind, name in (
            (
                "CREATE FUNCTION {o}.idem_planted(integer) RETURNS integer LANGUAGE sql RETURN 0",
                "FUNCTION",
                "idem_planted(integer)",
            ),
            ("CREATE TYPE {o}.idem_planted_t AS (a integer)", "TYPE", "idem_planted_t"),
            (
                "CREATE FUNCTION {o}.same(public.idem_claim_result, public.idem_claim_result) RETURNS boolean "
                "LANGUAGE sql RETURN true",
                "FUNCTION",
                "same(public.idem_claim_result, public.idem_claim_result)",
            ),
            (
                "CREATE OPERATOR {o}.= (leftarg = public.idem_claim_result, rightarg = public.idem_claim_result, "
                "function = {o}.same)",
                "OPERATOR",
                "=(public.idem_claim_result, public.idem_claim_result)",
            ),
            ("CREATE FUNCTION {o}.mine(integer) RETURNS integer LANGUAGE sql RETURN 0", "FUNCTION", "mine(integer)"),
            ("CREATE TYPE {o}.mine_t AS (a integer)", "TYPE", "mine_t"),
            ("CREATE DOMAIN {o}.mine_d AS text", "DOMAIN", "mine_d"),
            ("CREATE VIEW {o}.mine_v AS SELECT 1 AS id", "VIEW", "mine_v"),
        ):
            conn.execute(sql.SQL(statement).format(o=o))
            conn.execute(sql.SQL("ALTER " + kind + " {}." + name + " OWNER TO {}").format(o, w))
    return {"s": s, "o": o}


def _superuser(url: str, role: str) -> bool:
    with pinned(url) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = %s", (role,)).fetchone()
    assert row is not None
    return bool(row[0])


@pytest.mark.parametrize("what", sorted(PLANTS))
def test_the_owner_cannot_plant_idems_names_in_any_schema(migrated: dict[str, str], what: str) -> None:
    """Each look-alike, made, renamed into or moved into a schema of the owner's (or pg_temp), is
    refused with 42501 by idem's DDL guard, and nothing is left."""
    names = _prepare(migrated["url"], migrated["dba"], migrated["role"])
    if what == "operator on idem's type":  # the one made before the guard is in its way: its own is new
        with pinned(migrated["url"]) as conn:
            conn.execute(
                sql.SQL("DROP OPERATOR {}.=(public.idem_claim_result, public.idem_claim_result)").format(names["o"])
            )
    with attacker_session(migrated) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute(sql.SQL(PLANTS[what]).format(**names))
    assert str(refused.value.diag.message_primary).startswith("idem_ddl_guard: "), refused.value
    assert "any schema" in str(refused.value.diag.message_primary), refused.value
    assert refused.value.diag.message_hint, refused.value
    with pinned(migrated["url"]) as conn:
        planted = conn.execute(
            "SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc p WHERE p.proname IN"
            " ('idem_erase_user', 'idem_cleanup', 'idem_health', 'idem_sum', 'idem_export_user')"
            " AND p.pronamespace <> 'public'::pg_catalog.regnamespace"
        ).fetchone()
    assert planted == (0,)
    assert not _superuser(migrated["url"], migrated["role"])


def test_the_dbas_unqualified_call_cannot_reach_a_look_alike(migrated: dict[str, str]) -> None:
    """The issue's attack, whole: the owner's escalating idem_erase_user in a schema named like the
    DBA's role is refused, so the DBA's unqualified call (under "$user", public) runs idem's."""
    dba, web = migrated["dba"], migrated["role"]
    s = sql.Identifier(dba)
    with attacker_session(migrated) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(s))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO PUBLIC").format(s))
        escalate = sql.SQL("ALTER ROLE {} SUPERUSER").format(sql.Identifier(web)).as_string(conn)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="idem_ddl_guard"):
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}.idem_erase_user(p_user_id integer)"
                    " RETURNS TABLE (p_table text, p_deleted bigint) LANGUAGE plpgsql AS {}"
                ).format(
                    s,
                    sql.Literal(
                        sql.SQL(
                            "BEGIN IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN "
                            "EXECUTE {}; END IF; RETURN QUERY SELECT * FROM public.idem_erase_user(p_user_id); END"
                        )
                        .format(sql.Literal(escalate))
                        .as_string(conn)
                    ),
                )
            )
    with psycopg.connect(migrated["url"], autocommit=True) as conn:  # the DBA's psql: "$user", public
        conn.execute("SELECT * FROM idem_erase_user(p_user_id => 7)")
    assert not _superuser(migrated["url"], web)


def test_a_superuser_and_the_stores_owner_still_make_idems_names_anywhere(migrated: dict[str, str]) -> None:
    """The guard stands in no one's way but the others': a superuser makes an idem-named routine,
    type and operator outside public, and so does the store's owner (a non-superuser owner of
    public.idempotency_keys, recorded by a superuser's rerun of the guard)."""
    url, web = migrated["url"], migrated["role"]
    keeper = f"{web}_keeper"
    with pinned(url) as conn:
        conn.execute("CREATE SCHEMA su_own")
        conn.execute("CREATE FUNCTION su_own.idem_tool() RETURNS integer LANGUAGE sql RETURN 1")
        conn.execute("CREATE DOMAIN su_own.idem_key AS text")
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(keeper)))
        conn.execute(sql.SQL("CREATE SCHEMA keeper_own AUTHORIZATION {}").format(sql.Identifier(keeper)))
        conn.execute(sql.SQL("ALTER TABLE public.idempotency_keys OWNER TO {}").format(sql.Identifier(keeper)))
        conn.execute(GUARD.read_text(encoding="utf-8"))  # records the store's owner again
    try:
        with psycopg.connect(url, user=keeper, autocommit=True, options="-c search_path=pg_catalog,pg_temp") as conn:
            conn.execute("CREATE FUNCTION keeper_own.idem_tool() RETURNS integer LANGUAGE sql RETURN 1")
            conn.execute("CREATE TYPE keeper_own.idem_state AS ENUM ('x')")
            conn.execute("ALTER FUNCTION keeper_own.idem_tool() RENAME TO idem_tool2")
        with attacker_session(migrated) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE FUNCTION pg_temp.idem_tool() RETURNS integer LANGUAGE sql RETURN 1")
    finally:
        with pinned(url) as conn:
            row = conn.execute("SELECT session_user").fetchone()
            assert row is not None
            conn.execute(sql.SQL("ALTER TABLE public.idempotency_keys OWNER TO {}").format(sql.Identifier(row[0])))
            conn.execute(GUARD.read_text(encoding="utf-8"))
            conn.execute("DROP SCHEMA keeper_own CASCADE")
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(keeper)))


def _shadow_lines(output: str, schema: str) -> list[str]:
    return [line for line in output.splitlines() if "WARNING" in line and f"schema {schema} " in line]


def test_migrate_and_status_name_a_schema_that_shadows_a_roles_search_path(migrated: dict[str, str]) -> None:
    """A schema named like the DBA's role that the owner made (empty: the guard keeps idem's names
    out of it, but whatever the owner names there comes first on that role's path): both verbs say
    so in one line with the fix, and exit as they would without it."""
    dba, web = migrated["dba"], migrated["role"]
    with attacker_session(migrated) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(dba)))
    for verb in ("migrate", "status"):
        done = idem(verb, "--database-url", migrated["url"])
        assert done.returncode == 0, done.stdout + done.stderr
        lines = _shadow_lines(done.stdout + done.stderr, dba)
        assert len(lines) == 1, done.stdout + done.stderr
        assert f"owned by {web}" in lines[0] and "ALTER SCHEMA" in lines[0] and "search_path" in lines[0], lines
    with pinned(migrated["url"]) as conn:  # the fix the line names
        conn.execute(
            sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(dba), sql.Identifier(f"{dba}_{web}"))
        )
    done = idem("status", "--database-url", migrated["url"])
    assert done.returncode == 0 and not _shadow_lines(done.stdout + done.stderr, dba), done.stdout + done.stderr


def test_a_roles_own_schema_is_no_shadow(migrated: dict[str, str]) -> None:
    """A schema named like the role that owns it (the owner's own "$user" schema) says nothing."""
    web = migrated["role"]
    with attacker_session(migrated) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(web)))
    done = idem("status", "--database-url", migrated["url"])
    assert done.returncode == 0 and not _shadow_lines(done.stdout + done.stderr, web), done.stdout + done.stderr
