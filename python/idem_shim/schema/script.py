"""``idem sql``: the install plan (schema/plan.py), the very steps ``idem migrate`` runs, printed
as one idempotent script for ``psql -v ON_ERROR_STOP=1 -f``: each of the plan's transactions
between BEGIN and COMMIT on the pinned path, a step for Citus under psql's ``\\if``, each migration
applied once and recorded in yoyo's tables as yoyo records it, and the schedule."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..errors import MigrateError
from ..queries import EXPECTED_SCHEMA_VERSION
from .connection import NOT_DEFERRABLE, UNDO_DATABASE_ROLE
from .files import package_version, read_migrations, sql_files
from .plan import (
    CITUS,
    CITUS_SUPERUSER,
    GUARD_WAIT_TIMEOUT_S,
    MIGRATIONS,
    SCHEDULE,
    SETTINGS,
    Step,
    install_plan,
)

#: psql's variable each `when` of the plan is tested by, and the query that sets it (\gset).
_CONDITIONS = {
    CITUS: "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') AS idem_citus \\gset",
    CITUS_SUPERUSER: "SELECT (EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')"
    " AND (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user))"
    " AS idem_citus_superuser \\gset",
}


def _dollar_tag(text: str, base: str) -> str:
    tag = f"${base}$"
    n = 0
    while tag in text:
        n += 1
        tag = f"${base}{n}$"
    return tag


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def migration_sql(migration: Any) -> str:
    """The SQL of one migration: the file itself, or a .py migration's module-level SQL (which
    its step runs)."""
    path = Path(migration.path)
    if path.suffix == ".sql":
        return path.read_text(encoding="utf-8")
    migration.load()  # yoyo executes the module (its `step` works only then)
    rendered = getattr(migration.module, "SQL", None)
    if not isinstance(rendered, str) or not rendered.strip():
        raise MigrateError(f"migration {migration.id} (Python) has no SQL (a module-level SQL string its step runs)")
    return rendered


def _migration(migration: Any) -> list[str]:
    """One migration, applied once and recorded as yoyo records it (its hash: the id's sha256)."""
    body = migration_sql(migration)
    inner = _dollar_tag(body, "idem_migration_sql")
    outer = _dollar_tag(body + inner, "idem_migration")
    mid, mhash = _literal(migration.id), _literal(hashlib.sha256(migration.id.encode()).hexdigest())
    return [
        f"-- migration {migration.id} ({Path(migration.path).name}), applied once",
        f"DO {outer}",
        "BEGIN",
        f"    IF EXISTS (SELECT 1 FROM public._yoyo_migration WHERE migration_hash = {mhash}) THEN",  # noqa: S608
        "        RETURN;",
        "    END IF;",
        f"    EXECUTE {inner}",
        body.rstrip(),
        f"{inner};",
        "    INSERT INTO public._yoyo_migration (migration_hash, migration_id, applied_at_utc)",
        f"    VALUES ({mhash}, {mid}, now() AT TIME ZONE 'UTC');",
        "    INSERT INTO public._yoyo_log (id, migration_hash, migration_id, operation, username, hostname,",
        "                                  comment, created_at_utc)",
        f"    VALUES (gen_random_uuid()::text, {mhash}, {mid}, 'apply', current_user, 'idem sql',",
        "            NULL, now() AT TIME ZONE 'UTC');",
        f"    RAISE NOTICE 'idem: applied migration %', {mid};",
        "END",
        f"{outer};",
        "",
    ]


def _step(step: Step, migrations: Any) -> list[str]:
    out = [f"-- {step.note}"] if step.note else []
    if step.label:
        out.append(f"-- {step.label}")
    if step.kind == SETTINGS:
        # the values are this package's constants, its file names and --users-table, quoted, in a
        # dollar quote none of them holds
        body = [
            f"    PERFORM pg_catalog.set_config({_literal(name)}, {_literal(value)}, true);"
            for name, value in step.settings.items()
        ]
        tag = _dollar_tag("\n".join(body), "idem_arguments")
        out += [f"DO {tag}", "BEGIN", *body, "END", f"{tag};"]
    elif step.kind == MIGRATIONS:
        out += [line for migration in migrations for line in _migration(migration)]
    elif step.kind == SCHEDULE:
        out.append("SELECT public.idem_schedule_cleanup();")
    else:
        out.append(step.sql.rstrip())
    return [*out, ""]


def render_sql(wait_timeout: float = GUARD_WAIT_TIMEOUT_S, users_table: str | None = None) -> str:
    """The whole install or upgrade as one idempotent script for `psql -v ON_ERROR_STOP=1 -f`;
    ``wait_timeout``: how long it waits for transactions begun before the DDL guard (seconds);
    ``users_table``: the host's users table (``--users-table``), as idem migrate takes it."""
    files = sql_files()
    migrations = read_migrations(files)
    out: list[str] = [
        f"-- idem-shim {package_version()}: the idempotency store, SQL API version {EXPECTED_SCHEMA_VERSION}.",
        "-- Generated by `idem sql`: the install plan `idem migrate` runs, for review or a DBA's own tooling.",
        "-- Apply with: psql -v ON_ERROR_STOP=1 -f this.sql <database URL>",
        "-- Five transactions: the DDL guard, the same on the Citus workers, the wait for transactions",
        "-- older than it, yoyo's tables, then the install; safe to re-apply (applied migrations are",
        "-- skipped, functions are CREATE OR REPLACE). Migrations are recorded in yoyo's tables, as",
        "-- `idem migrate` does.",
        "",
        "-- The database's owner sets what its sessions start with: a SERIALIZABLE READ ONLY DEFERRABLE",
        "-- default would make this session's first transaction wait, holding no lock, for every",
        "-- serializable transaction open then (schema/connection.py's NOT_DEFERRABLE). A SET takes no snapshot.",
        f"{NOT_DEFERRABLE};",
        "SET client_min_messages = notice;  -- what the install tells you, whatever the owner's setting",
        "-- Its default role too (ALTER DATABASE ... SET role): this session runs as the role that",
        "-- applies this script, not as the one the database's owner named (schema/connection.py).",
        "BEGIN;",
        "SET LOCAL search_path = pg_catalog, pg_temp;",
        f"{UNDO_DATABASE_ROLE};",
        "COMMIT;",
        "",
    ]
    for txn in install_plan(files, refusing="this script", wait_timeout=wait_timeout, users_table=users_table):
        out += [
            f"-- {txn.note}",
            "BEGIN;",
            "-- The owner's session: no name resolves to what a role may create (contract §3a).",
            "SET LOCAL search_path = pg_catalog, pg_temp;",
            "SET LOCAL standard_conforming_strings = on;  -- the literals below read as written",
            "",
        ]
        when = ""
        for step in txn.steps:
            if step.when != when:
                out += ["\\endif"] if when else []
                out += [_CONDITIONS[step.when], f"\\if :idem_{step.when}"] if step.when else []
                when = step.when
            out += _step(step, migrations)
        out += [*(["\\endif"] if when else []), "COMMIT;", ""]
    return "\n".join(out)
