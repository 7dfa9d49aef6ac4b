"""``idem sql``: the same install or upgrade as ``idem migrate``, as one idempotent script for
``psql -v ON_ERROR_STOP=1 -f``, in three transactions: the preflight (schema/sql/owners.sql and
preflight.sql, the very files ``idem migrate`` runs) and idem's DDL guard, committed; the wait for
the transactions begun before it (schema/sql/guard_wait.sql, as ``idem migrate`` waits); then the
preflight again, the roles, yoyo's tables, each migration applied once and recorded as yoyo records
it, every function file, and the schedule."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..errors import MigrateError
from ..queries import EXPECTED_SCHEMA_VERSION
from . import citus
from .apply import GUARD_WAIT_TIMEOUT_S, LOCK_KEY
from .connection import NOT_DEFERRABLE, UNDO_DATABASE_ROLE
from .files import GUARD_FILE, package_version, read_migrations, sql_files, tool_sql
from .preflight import GUARD_ONLY, ROLES, UNCHANGED, preflight_settings


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
    """The SQL of one migration: the file itself, or a .py migration's SQL rendering."""
    path = Path(migration.path)
    if path.suffix == ".sql":
        return path.read_text(encoding="utf-8")
    migration.load()  # yoyo executes the module (its `step` works only then)
    rendered = getattr(migration.module, "SQL", None)
    if not isinstance(rendered, str) or not rendered.strip():
        raise MigrateError(f"migration {migration.id} (Python) has no SQL rendering (a module-level SQL string)")
    return rendered


def render_sql(wait_timeout: float = GUARD_WAIT_TIMEOUT_S, users_table: str | None = None) -> str:
    """The whole install or upgrade as one idempotent script for `psql -v ON_ERROR_STOP=1 -f`;
    ``wait_timeout``: how long it waits for transactions begun before the DDL guard (seconds);
    ``users_table``: the host's users table (``--users-table``), as idem migrate takes it."""
    files = sql_files()
    # The script is text by nature; what it interpolates are the package's constants and its own
    # file names and SQL, quoted by _literal or dollar-quoted, never input.
    roles = [
        line
        for role in ROLES
        for line in (
            f"    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = {_literal(role)}) THEN",  # noqa: S608
            f"        CREATE ROLE {role} NOLOGIN;",
            "    END IF;",
        )
    ]

    # Each of the guard's and the install's transactions begins so: the pinned path, the lock,
    # the preflight's arguments (how a refusal ends: the install's follows the guard's commit)
    # and the preflight itself.
    def preamble(after_guard: bool) -> list[str]:
        return [
            "BEGIN;",
            "-- The owner's session: no name resolves to what a role may create (contract §3a).",
            "SET LOCAL search_path = pg_catalog, pg_temp;",
            "SET LOCAL standard_conforming_strings = on;  -- the literals below read as written",
            "",
            "-- One migration at a time (the lock `idem migrate` takes too, until COMMIT; waited for",
            "-- up to the timeout: schema/sql/migrate_lock.sql), the preflight's arguments, then the",
            "-- preflight itself (schema/sql/preflight.sql).",
            f"SET LOCAL idem.lock_key = {_literal(str(LOCK_KEY))};",
            f"SET LOCAL idem.guard_wait_timeout = {_literal(str(wait_timeout))};",
            tool_sql("migrate_lock.sql").rstrip(),
            "DO $idem_arguments$",
            "BEGIN",
            *[
                f"    PERFORM pg_catalog.set_config({_literal(name)}, {_literal(value)}, true);"
                for name, value in {
                    **preflight_settings("this script", GUARD_ONLY if after_guard else UNCHANGED),
                    # always set: a database default for it never picks the users table (apply.py)
                    "idem.users_table": users_table or "",
                }.items()
            ],
            *(
                [  # the guard is made only where a superuser runs this
                    "    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN",
                    f"        PERFORM pg_catalog.set_config('idem.unchanged', {_literal(UNCHANGED)}, true);",
                    "    END IF;",
                ]
                if after_guard
                else []
            ),
            "END",
            "$idem_arguments$;",
            "",
            tool_sql("owners.sql").rstrip(),
            "",
            tool_sql("preflight.sql").rstrip(),
            "",
        ]

    out: list[str] = [
        f"-- idem-shim {package_version()}: the idempotency store, SQL API version {EXPECTED_SCHEMA_VERSION}.",
        "-- Generated by `idem sql`: the same as `idem migrate`, for review or a DBA's own tooling.",
        "-- Apply with: psql -v ON_ERROR_STOP=1 -f this.sql <database URL>",
        "-- Three transactions: the DDL guard, the wait for transactions older than it, then the",
        "-- install; safe to re-apply (applied migrations are skipped, functions are CREATE OR",
        "-- REPLACE). Migrations are recorded in yoyo's tables, as `idem migrate` does.",
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
        "-- 1. idem's DDL guard, committed on its own (made only where a superuser runs this), so that",
        "-- every DDL after it is judged.",
        *preamble(False),
        f"-- sql/functions/{GUARD_FILE}",
        files.guard_file().read_text(encoding="utf-8").rstrip(),
        "COMMIT;",
        "-- The same guard on every Citus worker, once committed here (schema/citus.py's WORKER_GUARD):",
        "-- made only where a superuser runs this; a worker that refuses it stops the script.",
        "SELECT (EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')",
        "        AND (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user))",
        "       AS idem_citus_guard \\gset",
        "\\if :idem_citus_guard",
        "BEGIN;",
        "SET LOCAL search_path = pg_catalog, pg_temp;",
        "SET LOCAL citus.node_connection_timeout = 5000;",
        "CREATE TEMPORARY TABLE idem_worker_guard ON COMMIT DROP AS",
        citus.worker_guard_statement(files.guard_file().read_text(encoding="utf-8")) + ";",
        "DO $idem_worker_guard_check$",
        "BEGIN",
        "    IF EXISTS (SELECT 1 FROM pg_temp.idem_worker_guard) THEN",
        f"        RAISE EXCEPTION 'idem: sql/functions/% on the Citus workers: %; %', {_literal(GUARD_FILE)},",
        "            (SELECT pg_catalog.string_agg(g.node || ': ' || g.result, '; ')",
        "               FROM pg_temp.idem_worker_guard g),",
        f"            {_literal(GUARD_ONLY)};",
        "    END IF;",
        "END",
        "$idem_worker_guard_check$;",
        "COMMIT;",
        "\\endif",
        "",
        "-- 2. The wait for every transaction begun before the guard (schema/sql/guard_wait.sql).",
        "BEGIN;",
        "SET LOCAL search_path = pg_catalog, pg_temp;",
        f"SET LOCAL idem.guard_wait_timeout = {_literal(str(wait_timeout))};",
        "SET LOCAL statement_timeout = 0;  -- bounded by its own timeout, not by the database's setting",
        tool_sql("guard_wait.sql").rstrip(),
        "COMMIT;",
        "",
        "-- 3. The install or upgrade, in one transaction: the preflight again (it now sees what a",
        "-- transaction older than the guard made), then the rest.",
        *preamble(True),
        "-- The cluster-wide roles: idem_app, which the app's login role joins (the request path),",
        "-- idem_admin, which DBAs, pg_cron and the CLI's admin verbs join (cleanup, rotation, health),",
        "-- idem_dsr, the GDPR job's (export, erasure), and idem_monitor, a metrics exporter's (health).",
        "DO $idem_role$",
        "BEGIN",
        *roles,
        "END",
        "$idem_role$;",
        "",
        tool_sql("yoyo_tables.sql").rstrip(),
        "",
        "-- Again, now that yoyo's tables exist: one another role made (the guard judges no new table)",
        "-- is refused before anything writes or reads it (schema/sql/owners.sql).",
        tool_sql("owners.sql").rstrip(),
        "",
        tool_sql("yoyo_version.sql").rstrip(),
        "",
    ]
    for migration in read_migrations(files):
        body = migration_sql(migration)
        inner = _dollar_tag(body, "idem_migration_sql")
        outer = _dollar_tag(body + inner, "idem_migration")
        mid, mhash = _literal(migration.id), _literal(hashlib.sha256(migration.id.encode()).hexdigest())
        out += [
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
    out += [tool_sql("host_users.sql").rstrip(), ""]
    for path in files.function_files():
        out += [f"-- sql/functions/{path.name}", path.read_text(encoding="utf-8").rstrip(), ""]
    out += [
        "-- On a database with the citus extension: the store distributed (sql/citus/), once the",
        "-- host's own tables are (the guard names the statements to run otherwise).",
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') AS idem_citus \\gset",
        "\\if :idem_citus",
        "SET LOCAL citus.node_connection_timeout = 5000;",
        "DO $idem_citus_guard$",
        "DECLARE",
        "    v_todo text;",
        "    v_line text;",
        "    v_host_users boolean;",
        "BEGIN",
        "    SELECT too_old.line INTO v_todo FROM (",
        citus.TOO_OLD,
        "    ) AS too_old;",
        "    IF v_todo IS NULL THEN",
        "    SELECT pg_catalog.string_agg(line, '; ') INTO v_todo FROM (",
        citus.PROBLEMS,
        "    ) AS problems;",
        "    EXECUTE 'SELECT (' || $q$" + citus.HOST_USERS + "$q$ || ')' INTO v_host_users;",
        "    END IF;",
        "    IF v_host_users THEN",
        "        EXECUTE $q$" + citus.RESERVED_USER + "$q$ INTO v_line;",
        "        v_todo := concat_ws('; ', v_todo, v_line);",
        "    END IF;",
        "    IF v_todo IS NOT NULL AND v_todo <> '' THEN",
        "        RAISE EXCEPTION 'idem: database % has the citus extension, and the store cannot be distributed "
        "yet: %; %', pg_catalog.current_database(), v_todo, pg_catalog.current_setting('idem.unchanged');",
        "    END IF;",
        "END",
        "$idem_citus_guard$;",
    ]
    for path in files.citus_files():
        out += [f"-- sql/citus/{path.name}", path.read_text(encoding="utf-8").rstrip(), ""]
    out += ["\\endif", ""]
    out += [
        "-- Once more, last: migration 0004 (pgcrypto) and 0001 (users, audit_log) keep what exists,",
        "-- and another role may have made one since the check above (schema/sql/owners.sql).",
        tool_sql("owners.sql").rstrip(),
        "",
    ]
    out += [
        "-- The nightly cleanup: scheduled here when this is pg_cron's database; elsewhere a NOTICE",
        "-- gives the statement to run in pg_cron's database (`idem migrate` does that itself).",
        "SELECT public.idem_schedule_cleanup();",
        "",
        "COMMIT;",
        "",
    ]
    return "\n".join(out)
