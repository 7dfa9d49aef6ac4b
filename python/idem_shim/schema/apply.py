"""``idem migrate``: the preflight, then the install plan (schema/plan.py) run transaction by
transaction, its migrations applied and recorded by yoyo under yoyo's lock, then the pg_cron
schedule (cron.py) and the warnings.

A signature-changing migration (its ``DROP FUNCTION``) and the function files that re-create the
API commit together, so a database upgraded under traffic never shows a caller a missing
function. yoyo runs post-apply hooks only when a migration is pending, so the tool drives yoyo
itself rather than letting it load the functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg
from psycopg import errors as pg_errors

from ..errors import MigrateError, describe
from . import citus
from .connection import connect, pin_session, pinned_url
from .cron import schedule_cleanup
from .files import read_migrations, sql_files, tool_sql
from .plan import (
    CITUS,
    CITUS_SUPERUSER,
    GUARD_WAIT_TIMEOUT_S,
    LOCK_KEY,
    MIGRATIONS,
    SCHEDULE,
    SETTINGS,
    Step,
    Transaction,
    install_plan,
    lock,
)
from .preflight import GUARD_ONLY, ROLES, UNCHANGED, preflight
from .public_schema import writable_public
from .shadow_schemas import shadow_schemas

Echo = Callable[[str], None]
__all__ = ["GUARD_WAIT_TIMEOUT_S", "LOCK_KEY", "YOYO_LOCK_DDL", "MigrateResult", "backend", "migrate"]

#: yoyo's own DDL for its lock table, with IF NOT EXISTS (schema/sql/yoyo_tables.sql makes it in
#: the install; backend() where yoyo runs alone, a test's rollback).
YOYO_LOCK_DDL: LiteralString = (
    'CREATE TABLE IF NOT EXISTS public."yoyo_lock" ("locked" INT DEFAULT 1, "ctime" TIMESTAMP,'
    '"pid" INT NOT NULL,PRIMARY KEY ("locked"))'
)
#: The host tables idem made (migration 0001's marker), read before and after the migrations.
HOST_TABLES_MADE: LiteralString = (
    "SELECT c.oid::pg_catalog.regclass::pg_catalog.text FROM pg_catalog.pg_class c"
    " WHERE c.relkind OPERATOR(pg_catalog.=) 'r'"
    " AND pg_catalog.obj_description(c.oid, 'pg_class') OPERATOR(pg_catalog.=) 'idem: minimal host table'"
)
#: yoyo's own tables, which its statements name unqualified: named in public here, since the
#: session's path holds no schema a table may be created in (connection.PIN_SEARCH_PATH).
YOYO_TABLES = frozenset({"_yoyo_migration", "_yoyo_log", "_yoyo_version", "yoyo_lock"})


def _yoyo_url(url: str) -> str:
    """yoyo names the psycopg 3 driver in the scheme."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def backend(url: str, wait_timeout: float = GUARD_WAIT_TIMEOUT_S) -> Any:
    """yoyo's PostgreSQL backend on a session whose path is pinned (its tables named in public)
    and whose every lock wait is bounded by ``wait_timeout`` (yoyo's own statements run outside
    idem's transactions). Its tables are the plan's (schema/sql/yoyo_tables.sql), its lock table
    made here where absent: yoyo's ``init_database`` is never called, which would try a plain
    CREATE TABLE of it and probe for transactional DDL by dropping a table it rolled back, two
    ERROR lines in the server log on every run (PostgreSQL's DDL is transactional, yoyo's default)."""
    from yoyo.backends.base import DatabaseBackend
    from yoyo.backends.core.postgresql import PostgresqlPsycopgBackend
    from yoyo.connections import parse_uri
    from yoyo.migrations import default_migration_table

    class Backend(PostgresqlPsycopgBackend):  # type: ignore[misc]
        def init_connection(self, connection: Any) -> None:
            pin_session(connection)
            bound_lock_waits(connection, wait_timeout)

        def quote_identifier(self, s: str) -> str:
            quoted: str = super().quote_identifier(s)
            return f"public.{quoted}" if s in YOYO_TABLES else quoted

        def list_tables(self, **kwargs: Any) -> Any:
            # yoyo lists the current schema's, which is pg_catalog here
            return DatabaseBackend.list_tables(self, schema="public", **kwargs)

    yoyo = Backend(parse_uri(_yoyo_url(url)), default_migration_table)
    with yoyo.transaction():  # where yoyo runs alone (a test's rollback); the install made it already
        yoyo.execute(YOYO_LOCK_DDL)
    return yoyo


@dataclass(slots=True)
class MigrateResult:
    applied: list[str]
    function_files: int
    cleanup: str
    messages: list[str]
    #: What the operator must fix even when nothing failed: a writable public (public_schema.py).
    warnings: list[str]
    #: The host tables this migrate made (migration 0001), qualified: each said in one line.
    host_tables: list[str] = field(default_factory=list)


def lock_timeout(wait_timeout: float) -> str:
    """``wait_timeout`` seconds as a lock_timeout: whole milliseconds, at least one (0 is no bound);
    schema/sql/migrate_lock.sql computes the same for the install's transactions."""
    return str(max(1, min(2147483647, math.ceil(wait_timeout * 1000))))


def bound_lock_waits(conn: Any, wait_timeout: float) -> None:
    """Every lock the session waits for, from now on, for at most ``wait_timeout`` seconds."""
    conn.execute("SELECT pg_catalog.set_config('lock_timeout', %s, false)", (lock_timeout(wait_timeout),))


def said(exc: psycopg.Error, wait_timeout: float) -> str:
    """describe(exc), and for a lock waited for past ``wait_timeout`` (lock_timeout: the install's
    transactions set it to that, schema/sql/migrate_lock.sql) what to do."""
    if isinstance(exc, pg_errors.LockNotAvailable):
        return (
            f"{describe(exc)} (another session or a prepared transaction held a lock it needs for {wait_timeout} s, "
            "--wait-timeout: pg_locks and pg_prepared_xacts name it; end it, then run idem migrate again)"
        )
    return describe(exc)


def run_step(execute: Any, step: Step, unchanged: str, wait_timeout: float) -> None:
    """One SQL or SETTINGS step of the plan, in the caller's transaction; a failure said in one
    line: a whole-line refusal of idem's SQL as it is, anything else after the step's label."""
    try:
        if step.kind == SETTINGS:
            for name, value in step.settings.items():
                execute("SELECT pg_catalog.set_config(%s, %s, true)", (name, value))
        else:
            execute(step.sql)  # no parameters: a simple query, its statements all run
    except psycopg.Error as exc:
        if step.whole and isinstance(exc, pg_errors.RaiseException):
            raise MigrateError(str(exc.diag.message_primary)) from exc
        raise MigrateError(f"{step.label + ': ' if step.label else ''}{said(exc, wait_timeout)}; {unchanged}") from exc


def _runs(step: Step, on_citus: bool, superuser: bool) -> bool:
    return {CITUS: on_citus, CITUS_SUPERUSER: on_citus and superuser}.get(step.when, True)


def _run_transaction(conn: psycopg.Connection[Any], txn: Transaction, unchanged: str, wait_timeout: float) -> None:
    superuser = _is_superuser(conn)
    with conn.transaction():
        on_citus = citus.has_citus(conn)
        for step in txn.steps:
            if _runs(step, on_citus, superuser):
                run_step(conn.execute, step, unchanged, wait_timeout)


def _is_superuser(conn: Any) -> bool:
    row = conn.execute("SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user").fetchone()
    return bool(row and row[0])


def _ensure_roles(cursor: Any, unchanged: str) -> None:
    """The plan's roles step alone (schema/plan.py's roles_sql), in the caller's transaction."""
    cursor.execute(
        "SELECT pg_catalog.set_config('idem.unchanged', %s, true), pg_catalog.set_config('idem.roles', %s, true)",
        (unchanged, ",".join(ROLES)),
    )
    try:
        cursor.execute(tool_sql("roles.sql"))
    except pg_errors.RaiseException as exc:
        raise MigrateError(str(exc.diag.message_primary)) from exc


def take_lock(cursor: Any, wait_timeout: float) -> None:
    """idem's advisory lock, one migrate at a time, for the transaction; waited for up to
    ``wait_timeout`` seconds, then refused naming who holds it (schema/sql/migrate_lock.sql)."""
    for step in lock(wait_timeout):
        run_step(cursor.execute, step, UNCHANGED, wait_timeout)


def migrate(
    url: str,
    *,
    echo: Echo | None = None,
    cron_database: str | None = None,
    wait_timeout: float = GUARD_WAIT_TIMEOUT_S,
    users_table: str | None = None,
) -> MigrateResult:
    """Preflight, then the plan: the DDL guard committed, the wait for older transactions, yoyo's
    tables, roles + pending migrations + functions in one transaction; then the schedule.
    ``users_table``: the host's users table as ``schema.table`` (``--users-table``), for a new
    store; an installed one keeps its own."""
    from yoyo.exceptions import LockTimeout

    files = sql_files()
    guard, workers, wait, yoyo_tables, install = install_plan(
        files, refusing="this package", wait_timeout=wait_timeout, users_table=users_table
    )
    unchanged = UNCHANGED
    try:
        with connect(url) as conn:
            # its lock waits bounded too: the database's owner may hold idem's tables (its DROP SCHEMA
            # public CASCADE, refused by the guard only once it has locked all they hold, made to
            # wait for a lock of its own)
            bound_lock_waits(conn, wait_timeout)
            conn.execute("SELECT pg_catalog.set_config('idem.users_table', %s, false)", (users_table or "",))
            preflight(conn)
            url = pinned_url(url, conn)
            _run_transaction(conn, guard, unchanged, wait_timeout)
            unchanged = GUARD_ONLY if _is_superuser(conn) else UNCHANGED  # what any error from here on says
            for txn in (workers, wait, yoyo_tables):
                _run_transaction(conn, txn, unchanged, wait_timeout)
        pending, made = _install(url, install, unchanged, wait_timeout)
    except LockTimeout as exc:
        raise MigrateError(f"another migration holds yoyo's lock on this database ({exc}); {unchanged}") from exc
    except psycopg.Error as exc:  # the server went away, or a lock was held past the timeout
        raise MigrateError(f"{said(exc, wait_timeout)}; {unchanged}") from exc
    messages: list[str] = []
    try:
        cleanup = schedule_cleanup(url, messages.append, cron_database)  # the plan's SCHEDULE step
        with connect(url) as conn:
            warning = writable_public(conn)
            shadows = shadow_schemas(conn)
    except psycopg.Error as exc:  # the server went away after the install committed
        raise MigrateError(
            f"{describe(exc)}; the store is installed: run idem migrate again to schedule its cleanup"
        ) from exc
    if echo:
        for line in messages:
            echo(line)
    return MigrateResult(
        pending, len(files.function_files()), cleanup, messages, ([warning] if warning else []) + shadows, made
    )


def _install(url: str, install: Transaction, unchanged: str, wait_timeout: float) -> tuple[list[str], list[str]]:
    """The plan's last transaction, under yoyo's lock and in yoyo's transaction, its MIGRATIONS
    step applied and recorded by yoyo; the migrations it applied, and the host tables made."""
    migrations = read_migrations()
    yoyo = backend(url, wait_timeout)
    applied: list[str] = []
    made: list[str] = []
    try:
        with yoyo.lock():
            yoyo.ensure_internal_schema_updated()
            with yoyo.transaction():
                cursor = yoyo.cursor()
                on_citus, superuser = citus.has_citus(yoyo.connection), _is_superuser(cursor)
                for step in install.steps:
                    if step.kind == SCHEDULE or not _runs(step, on_citus, superuser):
                        continue  # the schedule: after the commit, in pg_cron's database (migrate)
                    if step.kind != MIGRATIONS:
                        run_step(cursor.execute, step, unchanged, wait_timeout)
                        continue
                    cursor.execute(HOST_TABLES_MADE)
                    before = {str(row[0]) for row in cursor.fetchall()}
                    # read under idem's lock: the idem sql script takes no yoyo lock, and may have
                    # applied (and recorded) some since yoyo's lock was taken
                    for migration in yoyo.to_apply(migrations):
                        try:
                            migration.process_steps(yoyo, "apply")
                            yoyo.log_migration(migration, "apply")
                            yoyo.mark_one(migration, log=False)
                        except psycopg.Error as exc:
                            what = f"migration {migration.id}: {said(exc, wait_timeout)}"
                            raise MigrateError(f"{what}; {unchanged}") from exc
                        applied.append(migration.id)
                    cursor.execute(HOST_TABLES_MADE)
                    made = sorted({str(row[0]) for row in cursor.fetchall()} - before)
    finally:
        yoyo.connection.close()
    return applied, made
