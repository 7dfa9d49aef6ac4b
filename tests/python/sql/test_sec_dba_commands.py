"""The DBA's documented commands, typed as written, run idem's routines and nothing the database's
owner planted (contract §3a: what a person types is as safe as a routine; issue 39, F1).

A DBA's psql starts with ``search_path = "$user", public``. The database's owner (a member of
``idem_app``, ``CREATE DATABASE app OWNER web``) makes a schema named like the DBA's role, lets
PUBLIC use it, and puts there a look-alike of every idem routine (same name and arguments) and of
every idem relation, each of which logs who ran it and makes the owner a superuser when a
superuser does. Every command of the DBA's documents that names idem's request, GDPR, health or
cleanup routines then runs, as written, in psql as the superuser who migrated the store: none
may reach the look-alikes.

The look-alikes are made by the test's superuser session and handed to the owner (the owner's
code, the owner's objects): this test is about the commands' names, whatever idem's DDL guard
lets the owner create itself.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.python.support import docrunner
from tests.python.support.owned import pinned

ROOT = Path(__file__).resolve().parents[3]

#: Where a DBA reads the commands it types.
DOCUMENTS = ("docs/operations.md", "sql/README.md", "README.md")
#: The routines whose documented commands run here (request path, GDPR, health, cleanup).
ROUTINES = ("idem_claim", "idem_complete", "idem_erase_user", "idem_export_user", "idem_health", "idem_cleanup")
_NAMES = re.compile(r"\b(" + "|".join(ROUTINES) + r")\b")
_STATEMENT = re.compile(r"^\s*(SELECT|CALL)\b", re.I)
_CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
#: psql variables (`:'key'`, `:key_id`) and \gset: a statement that needs an earlier one's state
_NEEDS_STATE = re.compile(r"(?<![:\w]):['\"]?\w|\\gset")

TRAPDOOR = """
CREATE FUNCTION {schema}.trapdoor(p_what text) RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    INSERT INTO {schema}.ran (who, what) VALUES (current_user, p_what);
    IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
        EXECUTE {escalate};
    END IF;
END $f$"""


def _plant(conn: psycopg.Connection[Any], schema: str, owner: str) -> None:
    """In ``schema`` (the DBA's role name, the owner's), a look-alike of each idem routine and
    relation in public that calls the trapdoor first."""
    s, o = sql.Identifier(schema), sql.Identifier(owner)
    conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(s, o))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO PUBLIC").format(s))
    conn.execute(sql.SQL("CREATE TABLE {}.ran (who text, what text)").format(s))
    conn.execute(sql.SQL("GRANT INSERT, SELECT ON {}.ran TO PUBLIC").format(s))
    escalate = sql.SQL("ALTER ROLE {} SUPERUSER").format(o).as_string(conn)
    conn.execute(sql.SQL(TRAPDOOR).format(schema=s, escalate=sql.Literal(escalate)))
    routines = conn.execute(
        """SELECT p.proname, p.prokind, pg_catalog.pg_get_function_arguments(p.oid),
                  pg_catalog.pg_get_function_result(p.oid), p.proretset,
                  p.prorettype = 'pg_catalog.void'::pg_catalog.regtype, p.proallargtypes IS NOT NULL
             FROM pg_catalog.pg_proc p
            WHERE p.pronamespace = 'public'::pg_catalog.regnamespace AND p.proname LIKE 'idem\\_%'"""
    ).fetchall()
    assert routines, "no idem routine in public: the store is not migrated"
    for name, kind, arguments, result, returns_set, returns_void, has_out in routines:
        ends = "" if kind == "p" or returns_void else ("RETURN;" if returns_set or has_out else "RETURN NULL;")
        head = (
            "CREATE PROCEDURE {schema}.{name}(" + arguments + ")"
            if kind == "p"
            else "CREATE FUNCTION {schema}.{name}(" + arguments + ") RETURNS " + result
        )
        conn.execute(
            sql.SQL(head + " LANGUAGE plpgsql AS {body}").format(
                schema=s,
                name=sql.Identifier(name),
                body=sql.Literal(f"BEGIN PERFORM {schema}.trapdoor({name!r}); {ends} END"),
            )
        )
        what = "PROCEDURE" if kind == "p" else "FUNCTION"
        conn.execute(sql.SQL("ALTER " + what + " {}.{} OWNER TO {}").format(s, sql.Identifier(name), o))
    relations = conn.execute(
        """SELECT c.relname FROM pg_catalog.pg_class c
            WHERE c.relnamespace = 'public'::pg_catalog.regnamespace AND c.relkind IN ('r', 'v', 'p')"""
    ).fetchall()
    for (relation,) in relations:
        rel = sql.Identifier(relation)
        conn.execute(
            sql.SQL(
                "CREATE VIEW {s}.{rel} WITH (security_invoker = true) AS "
                "SELECT t.* FROM public.{rel} t, LATERAL (SELECT {s}.trapdoor({name})) trap"
            ).format(s=s, rel=rel, name=sql.Literal(relation))
        )
        conn.execute(sql.SQL("ALTER VIEW {}.{} OWNER TO {}").format(s, rel, o))


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) for each command of the DBA's documents that names one of ROUTINES and
    runs on its own: inline `SELECT …`/`CALL …` spans, the statements typed in psql blocks, and
    the psql command lines of console blocks."""
    found: list[tuple[str, str]] = []
    for doc in DOCUMENTS:
        text = (ROOT / doc).read_text()
        fenced: set[int] = set()
        for block in docrunner.parse(text):
            fenced.update(range(block.line_no, block.line_no + len(block.lines) + 2))
            where = f"{doc}:{block.line_no}"
            if block.kind == "psql":
                where += ":psql"
                typed = [docrunner.PROMPT.sub("", ln, count=1) for ln in block.lines if docrunner.PROMPT.match(ln)]
                statement: list[str] = []
                for line in typed:
                    statement.append(line)
                    if line.rstrip().endswith(";") or line.lstrip().startswith("\\"):
                        found.append((where, "\n".join(statement)))
                        statement = []
            elif block.kind == "console":
                found.extend((where, ln[2:]) for ln in block.lines if ln.startswith("$ psql "))
        for number, line in enumerate(text.splitlines(), 1):
            if number not in fenced:
                found.extend(
                    (f"{doc}:{number}", span)
                    for span in _CODE_SPAN.findall(line)
                    if _STATEMENT.match(span) and span.rstrip().endswith((")", ";"))
                )
    return [
        (where, command)
        for where, command in found
        # a placeholder (`p_deleted => …`) or another variable: not a command to type as is
        if _NAMES.search(command) and not _NEEDS_STATE.search(command) and "$IDEM" not in command and "…" not in command
    ]


def _run(command: str, url: str) -> subprocess.CompletedProcess[str]:
    env = docrunner.base_env(url)
    if command.startswith("psql "):  # a console line: the shell runs it as the reader would
        return subprocess.run(["bash", "-c", command], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", url],
        input=command + "\n",
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_documents_commands_are_found() -> None:
    """The extraction finds the commands the issue names (so the test below runs something)."""
    commands = [c for _, c in documented_commands()]
    for routine in ("idem_erase_user", "idem_export_user", "idem_health", "idem_cleanup", "idem_claim"):
        assert any(routine in c for c in commands), f"no documented command of {routine} found"
    assert any(c.startswith("psql ") for c in commands) and any(not c.startswith("psql ") for c in commands)


def test_no_documented_command_runs_the_owners_code(migrated: dict[str, str]) -> None:
    """Each command, typed as written by the superuser who migrated the store, in the database
    whose owner planted the look-alikes: none of them runs. A command typed on its own (an inline
    one, a console line) must also succeed; a psql block's statements are the docs test's to check
    in order (tests/python/ops/test_docs.py), some of them show an error on purpose."""
    dba, web = migrated["dba"], migrated["role"]
    ran_table = sql.SQL("{}.ran").format(sql.Identifier(dba))
    with pinned(migrated["url"]) as conn:
        _plant(conn, dba, web)
        conn.execute("INSERT INTO public.users (id) SELECT g FROM pg_catalog.unnest(ARRAY[7, 8, 42, 43, 90]) g")
    commands = documented_commands()
    assert len(commands) > 10, commands
    reached, failed = [], []
    for where, command in commands:
        done = _run(command, migrated["url"])
        with pinned(migrated["url"]) as conn:
            ran = conn.execute(sql.SQL("SELECT DISTINCT what FROM {}").format(ran_table)).fetchall()
            row = conn.execute("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = %s", (web,)).fetchone()
            if ran or row != (False,):
                reached.append(f"{where}: {command!r} ran {sorted(w for (w,) in ran)}, owner superuser: {row}")
                conn.execute(sql.SQL("TRUNCATE {}").format(ran_table))
                conn.execute(sql.SQL("ALTER ROLE {} NOSUPERUSER").format(sql.Identifier(web)))
        if done.returncode != 0 and not where.endswith(":psql"):
            failed.append(f"{where}: {command!r} failed: {(done.stdout + done.stderr).strip()[-300:]}")
    assert not reached, (
        f'typed by {dba} (search_path "$user", public), {len(reached)} of {len(commands)} documented '
        "commands ran the look-alikes of the owner's schema " + repr(dba) + ":\n" + "\n".join(reached)
    )
    assert not failed, "\n".join(failed)


def test_the_look_alikes_do_catch_an_unqualified_command(migrated: dict[str, str]) -> None:
    """The set-up catches what it should: the unqualified call of before reaches the look-alike."""
    dba, web = migrated["dba"], migrated["role"]
    with pinned(migrated["url"]) as conn:
        _plant(conn, dba, web)
    done = _run("SELECT * FROM idem_health();", migrated["url"])
    assert done.returncode == 0, done.stderr
    with pinned(migrated["url"]) as conn:
        ran = conn.execute(sql.SQL("SELECT what FROM {}.ran").format(sql.Identifier(dba))).fetchall()
        row = conn.execute("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = %s", (web,)).fetchone()
    assert ran == [("idem_health",)] and row == (True,)
    with pinned(migrated["url"]) as conn:
        conn.execute(sql.SQL("ALTER ROLE {} NOSUPERUSER").format(sql.Identifier(web)))
