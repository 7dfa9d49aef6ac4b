"""``idem migrate``: the preflight; where a superuser migrates, idem's DDL guard committed in a
transaction of its own and a wait for the transactions begun before it (schema/sql/guard_wait.sql);
then in ONE transaction the roles, the pending yoyo migrations and every function file (the
preflight again first), then the pg_cron schedule (cron.py).

A signature-changing migration (its ``DROP FUNCTION``) and the function files that re-create the
API commit together, so a database upgraded under traffic never shows a caller a missing
function. yoyo runs post-apply hooks only when a migration is pending, so the tool drives yoyo
itself rather than letting it load the functions.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from ..errors import MigrateError, describe
from ..queries import EXPECTED_SCHEMA_VERSION
from . import citus
from .connection import connect, pin_session, pinned_url
from .cron import schedule_cleanup
from .files import GUARD_FILE, SqlFiles, read_migrations, sql_files, tool_sql
from .preflight import GUARD_ONLY, ROLES, UNCHANGED, preflight, refuse_foreign_objects
from .public_schema import writable_public
from .shadow_schemas import shadow_schemas

Echo = Callable[[str], None]
#: pg_advisory_xact_lock key shared by `idem migrate` and `idem sql` ("idem" in ASCII).
LOCK_KEY = 0x6964656D
#: How long `idem migrate` waits, once the DDL guard is committed, for the transactions of the
#: database begun before it (seconds; ``--wait-timeout``).
GUARD_WAIT_TIMEOUT_S = 60.0

#: yoyo's own DDL for its lock table, with IF NOT EXISTS: yoyo tries a plain CREATE TABLE on
#: every run and swallows the error, which leaves an ERROR line in the server log each time
#: (its probe for transactional DDL left another; see backend()).
YOYO_LOCK_DDL: LiteralString = (
    'CREATE TABLE IF NOT EXISTS public."yoyo_lock" ("locked" INT DEFAULT 1, "ctime" TIMESTAMP,'
    '"pid" INT NOT NULL,PRIMARY KEY ("locked"))'
)
#: A database an older yoyo migrated (no version table yet), whose tables yoyo upgrades itself.
YOYO_BEFORE_ITS_VERSIONS: LiteralString = (
    "SELECT pg_catalog.to_regclass('public._yoyo_migration') IS NOT NULL"
    " AND pg_catalog.to_regclass('public._yoyo_version') IS NULL"
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
    """yoyo's PostgreSQL backend, minus the two ERROR lines it leaves in the server log, on a
    session whose path is pinned (its tables named in public) and whose every lock wait is bounded
    by ``wait_timeout`` (yoyo's own statements run outside idem's transactions)."""
    from yoyo.backends.base import DatabaseBackend
    from yoyo.backends.core.postgresql import PostgresqlPsycopgBackend
    from yoyo.connections import parse_uri
    from yoyo.migrations import default_migration_table

    class Backend(PostgresqlPsycopgBackend):  # type: ignore[misc]
        create_lock_table_sql = YOYO_LOCK_DDL.replace('public."yoyo_lock"', "{0.lock_table_quoted}")

        def init_connection(self, connection: Any) -> None:
            pin_session(connection)
            bound_lock_waits(connection, wait_timeout)

        def quote_identifier(self, s: str) -> str:
            quoted: str = super().quote_identifier(s)
            return f"public.{quoted}" if s in YOYO_TABLES else quoted

        def list_tables(self, **kwargs: Any) -> Any:
            # yoyo lists the current schema's, which is pg_catalog here
            return DatabaseBackend.list_tables(self, schema="public", **kwargs)

        def create_lock_table(self) -> None:
            with contextlib.suppress(self.DatabaseError), self.transaction():
                self.execute(self.format_sql(self.create_lock_table_sql))

        def _check_transactional_ddl(self) -> bool:
            # yoyo probes by dropping a table it rolled back (an ERROR line in the server log
            # on every run); PostgreSQL's DDL is transactional, which idem relies on anyway.
            return True

    yoyo = Backend(parse_uri(_yoyo_url(url)), default_migration_table)
    yoyo.init_database()
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


def _ensure_roles(cursor: Any, unchanged: str) -> None:
    """Create idem's roles where missing; a role that may not create them is told every missing
    one in one line (one at a time, a DBA ran the migrate four times)."""
    missing = []
    for role in ROLES:
        cursor.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (role,))
        if not cursor.fetchone():
            missing.append(role)
    for role in missing:
        cursor.execute("SAVEPOINT idem_role")
        try:
            cursor.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        except (pg_errors.DuplicateObject, pg_errors.UniqueViolation):
            cursor.execute("ROLLBACK TO SAVEPOINT idem_role")  # another migrate created it meanwhile
        except pg_errors.InsufficientPrivilege as exc:
            left = missing[missing.index(role) :]
            names = ", ".join(left)
            creates = " ".join(f"CREATE ROLE {name} NOLOGIN;" for name in left)
            raise MigrateError(
                f"{'roles' if len(left) > 1 else 'role'} {names} {'do' if len(left) > 1 else 'does'} not exist "
                f"and this role may not create {'them' if len(left) > 1 else 'it'}: a superuser runs "
                f"{creates} then run idem migrate again; {unchanged}"
            ) from exc


def take_lock(cursor: Any, wait_timeout: float) -> None:
    """idem's advisory lock, one migrate at a time, for the transaction; waited for up to
    ``wait_timeout`` seconds, then refused naming who holds it (schema/sql/migrate_lock.sql)."""
    cursor.execute(
        "SELECT pg_catalog.set_config('idem.lock_key', %s, true),"
        " pg_catalog.set_config('idem.guard_wait_timeout', %s, true)",
        (str(LOCK_KEY), str(wait_timeout)),
    )
    cursor.execute(tool_sql("migrate_lock.sql"))


def commit_guard(conn: psycopg.Connection[Any], files: SqlFiles, wait_timeout: float) -> str:
    """idem's DDL guard in a transaction of its own (985 makes it only where a superuser runs it),
    committed, so that every DDL after it is judged; then the wait for every transaction of the
    database begun before that commit, whose DDL no guard judged (guard_wait.sql). Returns how a
    refusal after it ends (GUARD_ONLY where the guard was committed)."""
    try:
        with conn.transaction():
            take_lock(conn, wait_timeout)
            conn.execute(files.guard_file().read_text(encoding="utf-8"))
            row = conn.execute("SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user").fetchone()
    except pg_errors.RaiseException as exc:  # the lock's wait timed out
        raise MigrateError(f"{exc.diag.message_primary}; nothing was changed") from exc
    except psycopg.Error as exc:
        raise MigrateError(f"sql/functions/{GUARD_FILE}: {said(exc, wait_timeout)}; nothing was changed") from exc
    unchanged = GUARD_ONLY if row and row[0] else UNCHANGED  # what any error from here on says
    if row and row[0] and citus.has_citus(conn):  # the same guard on every worker, once it is committed
        guard = files.guard_file().read_text(encoding="utf-8")
        try:
            with conn.transaction():
                conn.execute("SELECT pg_catalog.set_config('citus.node_connection_timeout', '5000', true)")
                refused = conn.execute(citus.WORKER_GUARD, (citus.worker_guard_command(guard),)).fetchall()
        except psycopg.Error as exc:
            where = f"sql/functions/{GUARD_FILE} on the Citus workers"
            raise MigrateError(f"{where}: {said(exc, wait_timeout)}; {unchanged}") from exc
        if refused:
            raise MigrateError(
                f"sql/functions/{GUARD_FILE} on the Citus workers: "
                + "; ".join(f"{node}: {describe(result)}" for node, result in refused)
                + f"; {unchanged}"
            )
    try:
        with conn.transaction():
            # bounded by its own timeout, never cut short by a statement_timeout the database's
            # owner set for its database (the wait would say nothing of what it waited for)
            conn.execute(
                "SELECT pg_catalog.set_config('idem.guard_wait_timeout', %s, true),"
                " pg_catalog.set_config('statement_timeout', '0', true)",
                (str(wait_timeout),),
            )
            conn.execute(tool_sql("guard_wait.sql"))
    except pg_errors.RaiseException as exc:
        raise MigrateError(str(exc.diag.message_primary)) from exc
    except psycopg.Error as exc:  # the server went away
        raise MigrateError(f"{said(exc, wait_timeout)}; {unchanged}") from exc
    return unchanged


def migrate(
    url: str,
    *,
    echo: Echo | None = None,
    cron_database: str | None = None,
    wait_timeout: float = GUARD_WAIT_TIMEOUT_S,
    users_table: str | None = None,
) -> MigrateResult:
    """Preflight, the DDL guard committed and the wait for older transactions, then roles + pending
    migrations + functions in one transaction, then the schedule. ``users_table``: the host's users
    table as ``schema.table`` (``--users-table``), for a new store; an installed one keeps its own."""
    from yoyo.exceptions import LockTimeout

    files = sql_files()
    try:
        with connect(url) as conn:
            # its lock waits bounded too: the database's owner may hold idem's tables (its DROP SCHEMA
            # public CASCADE, refused by the guard only once it has locked all they hold, made to
            # wait for a lock of its own)
            bound_lock_waits(conn, wait_timeout)
            set_users_table(conn, users_table)
            preflight(conn)
            url = pinned_url(url, conn)
            unchanged = commit_guard(conn, files, wait_timeout)
    except psycopg.Error as exc:  # the server went away during the preflight, or a lock was held past the timeout
        raise MigrateError(f"{said(exc, wait_timeout)}; nothing was changed") from exc
    try:  # from here on the guard may be committed: every refusal says what was changed
        pending, made = _install(url, files, unchanged, wait_timeout, users_table)
    except LockTimeout as exc:
        raise MigrateError(f"another migration holds yoyo's lock on this database ({exc}); {unchanged}") from exc
    except psycopg.Error as exc:  # the server went away after the guard, or a lock was held past the timeout
        raise MigrateError(f"{said(exc, wait_timeout)}; {unchanged}") from exc
    messages: list[str] = []
    try:
        cleanup = schedule_cleanup(url, messages.append, cron_database)
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
        [m.id for m in pending],
        len(files.function_files()),
        cleanup,
        messages,
        ([warning] if warning else []) + shadows,
        made,
    )


def set_users_table(conn: psycopg.Connection[Any], users_table: str | None) -> None:
    """``idem.users_table``, which preflight.sql, migrations 0001 and 0017 and host_users.sql read:
    always set, to '' when none is named, so a default the database's owner gave the setting
    (ALTER DATABASE ... SET idem.users_table) never chooses the table the user scope references."""
    conn.execute("SELECT pg_catalog.set_config('idem.users_table', %s, %s)", (users_table or "", not conn.autocommit))


def _install(
    url: str, files: SqlFiles, unchanged: str, wait_timeout: float, users_table: str | None = None
) -> tuple[list[Any], list[str]]:
    """yoyo's tables, yoyo's lock, then roles + pending migrations + functions in one transaction,
    each under idem's migration lock; the pending migrations it applied, and the host tables made."""
    # yoyo's tables made under idem's migration lock, by one install at a time: CREATE TABLE IF NOT
    # EXISTS is no guard against another install's made meanwhile (two begun together, idem sql's
    # among them: a duplicate key in pg_type for the second); all of them as yoyo makes them, but
    # where an older yoyo's are there for yoyo to upgrade itself. IF NOT EXISTS keeps one another
    # role made, and the guard judges no new table: the database's owner may have made one since
    # the first preflight (while the wait ran), with a trigger, or as a view over its function. So
    # owners.sql refuses it now, before yoyo's version row, yoyo's lock or yoyo itself writes or
    # reads one (a superuser's INSERT runs the owner's trigger as that superuser).
    with connect(url) as conn, conn.transaction():
        take_lock(conn, wait_timeout)
        row = conn.execute(YOYO_BEFORE_ITS_VERSIONS).fetchone()
        older = bool(row and row[0])
        conn.execute(YOYO_LOCK_DDL if older else tool_sql("yoyo_tables.sql"))
        refuse_foreign_objects(conn, unchanged)
        if not older:
            conn.execute(tool_sql("yoyo_version.sql"))
    migrations = read_migrations(files)
    yoyo = backend(url, wait_timeout)
    try:
        with yoyo.lock():
            yoyo.ensure_internal_schema_updated()
            current: str = "(preflight)"
            try:
                with yoyo.transaction():
                    cursor = yoyo.cursor()
                    current = "idem's migration lock"
                    take_lock(cursor, wait_timeout)
                    # read under idem's lock: the idem sql script takes no yoyo lock, and may have
                    # applied (and recorded) some since yoyo's lock was taken
                    pending = yoyo.to_apply(migrations)
                    current = "(preflight)"
                    set_users_table(yoyo.connection, users_table)
                    # again, now that no other migrate runs and what was planted before the guard is committed
                    preflight(yoyo.connection, unchanged)
                    cursor.execute(HOST_TABLES_MADE)
                    before = {str(row[0]) for row in cursor.fetchall()}
                    current = f"roles {', '.join(ROLES)}"
                    _ensure_roles(cursor, unchanged)
                    for migration in pending:
                        current = f"migration {migration.id}"
                        migration.process_steps(yoyo, "apply")
                        yoyo.log_migration(migration, "apply")
                        yoyo.mark_one(migration, log=False)
                    current = "the users table (schema/sql/host_users.sql)"
                    cursor.execute(tool_sql("host_users.sql"))
                    cursor.execute(HOST_TABLES_MADE)
                    made = sorted({str(row[0]) for row in cursor.fetchall()} - before)
                    for path in files.function_files():
                        current = f"sql/functions/{path.name}"
                        cursor.execute(path.read_text(encoding="utf-8"))  # no parameters: a simple query
                    if citus.has_citus(yoyo.connection):
                        for path in files.citus_files():
                            current = f"sql/citus/{path.name}"
                            cursor.execute(path.read_text(encoding="utf-8"))
                    # once more, last: a migration makes pgcrypto, users and audit_log where absent
                    # and keeps them where present, and the database's owner may have made one since
                    # the preflight (the guard judges no table, nor CREATE EXTENSION), holding the
                    # install up meanwhile with a lock of its own (migration 0002's foreign key
                    # waits for its users table): refused now, all of this rolled back
                    current = "(preflight)"
                    refuse_foreign_objects(yoyo.connection, unchanged)
                    current = "the SQL API version check"
                    cursor.execute("SELECT public.idem_schema_version()")
                    got = cursor.fetchone()
                    if not got or got[0] != EXPECTED_SCHEMA_VERSION:
                        raise MigrateError(
                            f"sql/functions/ defines SQL API version {got[0] if got else None}, but this "
                            f"package expects {EXPECTED_SCHEMA_VERSION}: a broken build; {unchanged}"
                        )
            except MigrateError:
                raise
            except psycopg.Error as exc:
                raise MigrateError(f"{current}: {said(exc, wait_timeout)}; {unchanged}") from exc
    finally:
        yoyo.connection.close()
    return list(pending), made
