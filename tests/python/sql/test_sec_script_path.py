"""The ``idem sql`` script through psql, where the database's owner set the path its sessions
start with (``ALTER DATABASE ... SET search_path = public, pg_catalog``) and planted an ``=`` of
its own for ``name`` in ``public``: every statement of the script that names an operator, a
function or a type runs inside one of the plan's transactions, after its ``SET LOCAL
search_path = pg_catalog, pg_temp`` (the psql ``\\gset`` queries that decide the Citus steps
among them, which ran before it and resolved ``extname = 'citus'`` and ``rolname =
current_user`` through the owner's path, as the superuser applying the script)."""

from __future__ import annotations

import re
import subprocess

from psycopg import sql

from idem_shim.schema import render_sql
from tests.python.support.owned import attacker_session, idem, pinned

#: What the script runs outside the plan's transactions: settings, no name resolved.
OUTSIDE = ["SET default_transaction_deferrable = off;", "SET client_min_messages = notice;"]


def outside_statements(script: str) -> list[str]:
    """Each line of the script outside its BEGIN … COMMIT (a line of its own, unindented: a body's
    COMMIT is indented), its comment cut."""
    depth, found = 0, []
    for line in script.splitlines():
        text = line.split("--", 1)[0].strip()
        if line == "BEGIN;":
            depth += 1
        elif line == "COMMIT;":
            depth -= 1
        elif depth == 0 and text:
            found.append(text)
    return found


def test_the_script_resolves_nothing_outside_the_plans_pinned_transactions() -> None:
    script = render_sql()
    assert outside_statements(script) == OUTSIDE
    # and inside each, the path is pinned before any statement
    for block in re.findall(r"^BEGIN;\n(.*?)^COMMIT;", script, re.M | re.S):
        first = next(ln for ln in block.splitlines() if ln.strip() and not ln.startswith("--"))
        assert first == "SET LOCAL search_path = pg_catalog, pg_temp;", block[:200]


PLANT = """
CREATE TABLE public.ran (who text, what text);
GRANT INSERT ON public.ran TO PUBLIC;
CREATE FUNCTION public.name_eq(pg_catalog.name, pg_catalog.name) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ran VALUES (current_user, 'public.=(name, name)');
    RETURN pg_catalog.nameeq($1, $2);
END $$;
CREATE OPERATOR public.= (FUNCTION = public.name_eq, LEFTARG = pg_catalog.name, RIGHTARG = pg_catalog.name);
"""


def test_an_operator_the_owner_planted_for_its_path_never_runs_in_the_script(owned: dict[str, str]) -> None:
    with attacker_session(owned) as attacker:
        attacker.execute(PLANT)
        attacker.execute(
            sql.SQL("ALTER DATABASE {} SET search_path = public, pg_catalog").format(sql.Identifier(owned["db"]))
        )
    script = idem("sql")
    assert script.returncode == 0, script.stderr
    done = subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", owned["url"]],
        input=script.stdout,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    with pinned(owned["url"]) as conn:
        ran = conn.execute(
            "SELECT who, what FROM public.ran WHERE who OPERATOR(pg_catalog.<>) %s", (owned["role"],)
        ).fetchall()
        installed = conn.execute("SELECT pg_catalog.to_regclass('public.idempotency_keys') IS NOT NULL").fetchone()
    assert ran == [], f"ran as another role than the owner's: {ran}"
    assert installed == (True,)
