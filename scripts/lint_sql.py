"""
Lint every idem routine: `python scripts/lint_sql.py URL` (a migrated database).

- plpgsql_check on each PL/pgSQL function and procedure named idem_*, with extra, performance and
  security warnings on, and on the schema tool's own SQL (python/idem_shim/schema/sql/*.sql):
  each file runs in a transaction that is rolled back, and a DO block's body is checked by
  plpgsql_check as a temporary function;
- the rule that no routine resolves a name through its caller's search_path (contract §3a), for every
  idem_* function and procedure, definer or not: a function either pins
  `SET search_path = pg_catalog, pg_temp` or is LANGUAGE sql with a SQL-standard body (RETURN /
  BEGIN ATOMIC, resolved when it is created); a SECURITY DEFINER pins, whatever its body; a
  procedure (which cannot carry SET if it commits) pins the path itself as its first statement
  and after every COMMIT or ROLLBACK, and qualifies the types of its variables (resolved before
  its first statement);
- the two text rules of scripts/lint_sql_calls.py, on every PL/pgSQL body: calls between idem
  routines are exactly typed (no overload planted in public can win them), and no plain quoted
  literal holds a backslash (a session's standard_conforming_strings would change it).

Prints each finding and exits 1 if there is any.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import psycopg
from lint_sql_calls import backslash_literals, untyped_calls

TOOL_SQL = Path(__file__).resolve().parents[1] / "python" / "idem_shim" / "schema" / "sql"
DO_BLOCK = re.compile(r"^DO (\$\w*\$)\n(.*?)\n\1;", re.S | re.M)

QUERY = """
SELECT p.oid::regprocedure::text AS routine, c.level, c.message, c.lineno, c.statement, c.hint
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_catalog.pg_language l ON l.oid = p.prolang
 CROSS JOIN LATERAL public.plpgsql_check_function_tb(
           p.oid,
           extra_warnings => true,
           performance_warnings => true,
           security_warnings => true) c
 WHERE n.nspname IN ('public', 'idem_guard') AND p.proname LIKE 'idem\\_%' AND l.lanname = 'plpgsql'
 ORDER BY 1, c.lineno
"""

COUNT = """
SELECT count(*) FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_catalog.pg_language l ON l.oid = p.prolang
 WHERE n.nspname IN ('public', 'idem_guard') AND p.proname LIKE 'idem\\_%' AND l.lanname = 'plpgsql'
"""

# A SECURITY DEFINER routine runs as its owner; PostgreSQL searches pg_temp FIRST for types and
# relations unless the path names it last, so without this exact setting a session could plant a
# pg_temp.text domain whose CHECK runs as the owner. Every name it holds, any schema.
UNPINNED_DEFINERS = """
SELECT p.oid::regprocedure::text, COALESCE(pg_catalog.array_to_string(p.proconfig, ' '), '(no SET clause)')
  FROM pg_catalog.pg_proc p
 WHERE p.prosecdef AND p.proname LIKE 'idem\\_%'
   AND NOT COALESCE('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
 ORDER BY 1
"""
PINNED = "SET search_path = pg_catalog, pg_temp"

# Every other idem_* routine, with what the rule needs to know of it.
ROUTINES = """
SELECT p.oid::regprocedure::text, p.prokind, l.lanname, p.prosqlbody IS NOT NULL, p.prosrc,
       COALESCE('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_catalog.pg_language l ON l.oid = p.prolang
 WHERE n.nspname IN ('public', 'idem_guard') AND p.proname LIKE 'idem\\_%' AND NOT p.prosecdef
 ORDER BY 1
"""
#: What a procedure runs first and after each COMMIT or ROLLBACK.
PIN = "PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);"
_COMMENT = re.compile(r"--[^\n]*")
_END_OF_TRANSACTION = re.compile(r"\b(?:COMMIT|ROLLBACK)\s*(?:AND\s+(?:NO\s+)?CHAIN\s*)?;", re.I)
_DECLARED = re.compile(r"^\s*(\w+)\s+(?:CONSTANT\s+)?([^\s;:]+)", re.I | re.M)


def unpinned_procedure(source: str) -> str | None:
    """Why a procedure's transactions may resolve names through the caller's path, or None."""
    body = _COMMENT.sub("", source)
    parts = re.split(r"^\s*(BEGIN)\b", body, maxsplit=1, flags=re.M | re.I)
    if len(parts) != 3:
        return "no BEGIN"
    head, _begin, rest = parts
    declared = head.split("DECLARE", 1)[1] if re.search(r"\bDECLARE\b", head, re.I) else ""
    loose = [f"{name} {kind}" for name, kind in _DECLARED.findall(declared) if "." not in kind]
    if loose:
        return f"variables of unqualified types ({', '.join(loose)}): qualify them (pg_catalog.text, ...)"
    if not rest.lstrip().startswith(PIN):
        return f"its first statement is not {PIN}"
    for end in _END_OF_TRANSACTION.finditer(rest):
        if not rest[end.end() :].lstrip().startswith(PIN):
            return f"no {PIN} right after its {end.group(0).rstrip(';')}"
    return None


def unpinned_routines(rows: list[tuple[object, ...]]) -> list[str]:
    """The rule of the module docstring, one line per routine that breaks it."""
    found = []
    for routine, kind, language, standard_body, source, pinned in rows:
        if kind == "p":
            why = unpinned_procedure(str(source))
            if why:
                found.append(
                    f"{routine}: error: a procedure must set search_path to pg_catalog, pg_temp itself, first and "
                    f"after every COMMIT, with variables of qualified types: {why}"
                )
        elif not pinned and not (language == "sql" and standard_body):
            found.append(
                f"{routine}: error: neither `{PINNED}` nor a SQL-standard body: it resolves names through its "
                "caller's search_path"
            )
    return found


# Every PL/pgSQL idem routine's body with its own parameters' types, and every idem routine's
# parameters (IN and INOUT, in order) as the calls name them.
BODIES = """
SELECT p.oid::regprocedure::text, p.prosrc,
       COALESCE((SELECT pg_catalog.json_object_agg(a.name, pg_catalog.format_type(a.type, NULL))
                   FROM ROWS FROM (pg_catalog.unnest(p.proargnames),
                                  pg_catalog.unnest(COALESCE(p.proallargtypes, p.proargtypes::oid[])))
                        AS a(name, type)), '{}')
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\\_%' AND l.lanname = 'plpgsql'
 ORDER BY 1
"""
SIGNATURES = """
SELECT p.proname,
       COALESCE(pg_catalog.json_agg(pg_catalog.json_build_array(a.name, pg_catalog.format_type(a.type, NULL))
                                    ORDER BY a.n)
                FILTER (WHERE a.type IS NOT NULL AND COALESCE(a.mode, 'i') IN ('i', 'b')), '[]')
  FROM pg_catalog.pg_proc p
 CROSS JOIN LATERAL ROWS FROM (
           pg_catalog.unnest(COALESCE(p.proallargtypes, p.proargtypes::oid[])),
           pg_catalog.unnest(p.proargnames),
           pg_catalog.unnest(p.proargmodes)) WITH ORDINALITY AS a(type, name, mode, n)
 WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\\_%'
 GROUP BY p.oid, p.proname
"""


def body_findings(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """The text rules (lint_sql_calls.py) on every PL/pgSQL idem routine's body."""
    signatures = {
        str(name): [(str(n).lower(), str(t)) for n, t in params]  # type: ignore[attr-defined]
        for name, params in conn.execute(SIGNATURES).fetchall()
    }
    found = []
    for routine, source, own in conn.execute(BODIES).fetchall():
        own_types = {str(k): str(v) for k, v in own.items()}  # type: ignore[attr-defined]
        found += [f"{routine}: error: {why}" for why in untyped_calls(str(source), own_types, signatures)]
        found += [
            f"{routine}: error: backslash in the plain literal {literal}: write it E'...' (or without a backslash),"
            " which reads the same under either standard_conforming_strings"
            for literal in backslash_literals(str(source))
        ]
    return found


# Findings that are the point of the code, each with its reason. plpgsql_check 2.3 has no
# in-comment pragma, so they are listed here, matched exactly (routine, statement, message).
EXPECTED = {
    # idem_cleanup's guard tries a COMMIT inside a sub-block on purpose: the error it gets tells
    # a transaction block (atomic context) from a plain CALL (sql/functions/080_idem_cleanup.sql).
    ("idem_cleanup(integer,bigint,integer,integer)", "COMMIT", "cannot commit while a subtransaction is active"),
}
# The same in every routine that has it: the collation guard is a constant's initializer, so that
# it runs before the other declarations (which read text parameters), and is never read after.
EXPECTED_ANYWHERE = {'never read variable "v_uncollated"'}


def tool_sql_findings(conn: psycopg.Connection[tuple[object, ...]]) -> tuple[int, list[str]]:
    """Run each of the schema tool's SQL files (rolled back) and plpgsql_check its DO blocks."""
    from idem_shim.schema import GUARD_WAIT_TIMEOUT_S, LOCK_KEY
    from idem_shim.schema.preflight import preflight_settings

    files, found = sorted(TOOL_SQL.glob("*.sql")), []
    for path in files:
        text = path.read_text(encoding="utf-8")
        try:
            with conn.transaction(force_rollback=True):
                # what preflight.sql, guard_wait.sql and migrate_lock.sql read
                settings = {
                    **preflight_settings("lint"),
                    "idem.guard_wait_timeout": str(GUARD_WAIT_TIMEOUT_S),
                    "idem.lock_key": str(LOCK_KEY),
                }
                for name, value in settings.items():
                    conn.execute("SELECT pg_catalog.set_config(%s, %s, true)", (name, value))
                conn.execute(text.encode())
                for n, (_tag, body) in enumerate(DO_BLOCK.findall(text)):
                    conn.execute(
                        f"CREATE FUNCTION pg_temp.idem_lint_do_{n}() RETURNS void LANGUAGE plpgsql AS $idem_lint$\n"
                        f"{body}\n$idem_lint$".encode()
                    )
                    for (line,) in conn.execute(
                        "SELECT * FROM public.plpgsql_check_function(%s::regprocedure, extra_warnings => true,"
                        " performance_warnings => true, security_warnings => true)",
                        (f"pg_temp.idem_lint_do_{n}()",),
                    ).fetchall():
                        found.append(f"{path.name} (DO block {n + 1}): {line}")
        except psycopg.Error as exc:
            found.append(f"{path.name}: does not run: {exc.diag.message_primary or exc}")
    if not files:
        found.append(f"no SQL file in {TOOL_SQL}: the scan is broken")
    return len(files), found


def main(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(COUNT).fetchone()
        assert row is not None  # a count always returns one row
        checked = row[0]
        findings = [
            f
            for f in conn.execute(QUERY).fetchall()
            if (f[0], f[4], f[2]) not in EXPECTED and f[2] not in EXPECTED_ANYWHERE
        ]
        unpinned = conn.execute(UNPINNED_DEFINERS).fetchall()
        loose = unpinned_routines(conn.execute(ROUTINES).fetchall())
        tool_files, tool_findings = tool_sql_findings(conn)
        bodies = body_findings(conn)
    for finding in tool_findings:
        print(finding)
    for routine, config in unpinned:
        print(
            f"{routine}: error: SECURITY DEFINER without `{PINNED}` (has {config}): "
            "a caller's pg_temp types would run as the owner"
        )
    for line in loose + bodies:
        print(line)
    for routine, level, message, lineno, statement, hint in findings:
        where = f" line {lineno} ({statement})" if lineno else ""
        print(f"{routine}{where}: {level}: {message}" + (f" [{hint}]" if hint else ""))
    if checked == 0:
        print("lint-sql: no idem_* PL/pgSQL routine found: is the database migrated?")
        return 1
    print(
        f"lint-sql: plpgsql_check: {checked} routines, {len(findings)} findings; {len(unpinned)} unpinned definers, "
        f"{len(loose)} other routines that resolve names through the caller's path; "
        f"{len(bodies)} untyped calls or backslash literals; "
        f"schema tool: {tool_files} SQL files, {len(tool_findings)} findings"
    )
    return 1 if findings or unpinned or loose or tool_findings or bodies else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
