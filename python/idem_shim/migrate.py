"""Bring a database to this package's SQL API: ``idem migrate``, ``idem sql``, ``idem status``.

``migrate(url)``:

1. checks, before writing anything, that the server answers, that the database's SQL API is not
   newer than this package's (``queries.EXPECTED_SCHEMA_VERSION``, the one constant), and that an
   ``idempotency_keys`` table found there is idem's own;
2. in ONE transaction: the cluster-wide role ``idem_app`` (NOLOGIN; app roles are made members),
   the pending yoyo migrations of ``sql/migrations/``, then every ``sql/functions/*.sql`` in
   file-name order. A signature-changing migration (its ``DROP FUNCTION``) and the function
   files that re-create the API commit together, so a database upgraded under traffic never
   shows its callers a missing function;
3. schedules the nightly cleanup with pg_cron: in this database through
   ``idem_schedule_cleanup()``, or, when ``cron.database_name`` is another database of the
   server, there with ``cron.schedule_in_database`` (job ``idem-cleanup:<database>``, one per
   store). A role that may not schedule gets the exact statement to run, and still succeeds.

``render_sql()`` prints the same install or upgrade as one script for ``psql -v ON_ERROR_STOP=1``
(guards, migrations recorded in yoyo's tables, functions, the schedule), idempotent.

The SQL is read from the installed package (``importlib.resources``: the wheel carries
``idem_shim/sql/``) or, in a source checkout or an editable install, from the repository's
``sql/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path
from typing import Any, LiteralString
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from .queries import EXPECTED_SCHEMA_VERSION

APP_ROLE = "idem_app"
#: The DBA's role (cleanup, rotation, inspect, health, scheduling: SPEC §3a); both NOLOGIN, cluster-wide.
ADMIN_ROLE = "idem_admin"
ROLES = (APP_ROLE, ADMIN_ROLE)
JOB_PREFIX = "idem-cleanup:"
LEGACY_JOB = "idempotency-cleanup"
SCHEDULE = "0 4 * * *"
CLEANUP_COMMAND = "CALL public.idem_cleanup()"
#: pg_advisory_xact_lock key shared by `idem migrate` and `idem sql` ("idem" in ASCII).
LOCK_KEY = 0x6964656D
STORE_MIGRATION = "0002.idempotency-keys"
CONNECT_TIMEOUT_S = 10

Echo = Callable[[str], None]


class MigrateError(Exception):
    """A refusal or a failure, said in one line; nothing of the migration was committed."""


def package_version() -> str:
    try:
        return metadata.version("idem-shim")
    except metadata.PackageNotFoundError:  # a bare checkout on PYTHONPATH
        return "0+checkout"


# -- where the SQL is --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SqlFiles:
    migrations: Path
    functions: Path

    def function_files(self) -> list[Path]:
        return sorted(self.functions.glob("*.sql"))


def sql_files() -> SqlFiles:
    """The package's SQL: inside the installed package first, else the repository's ``sql/``."""
    candidates: list[Path] = []
    packaged = resources.files("idem_shim") / "sql"
    if isinstance(packaged, Path):
        candidates.append(packaged)
    candidates.append(Path(__file__).resolve().parents[2] / "sql")  # checkout / editable install
    for base in candidates:
        migrations, functions = base / "migrations", base / "functions"
        if any(migrations.glob("0*.*")) and any(functions.glob("*.sql")):
            return SqlFiles(migrations, functions)
    raise MigrateError(
        "idem_shim carries no SQL (sql/migrations and sql/functions are missing from "
        f"{candidates[0]}): this installation of idem-shim is broken; reinstall it"
    )


# -- connections and messages ----------------------------------------------------------------------


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{netloc[-1]}"))


def url_for(base_url: str, dbname: str) -> str:
    """The same server, credentials and options as base_url, another database."""
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path="/" + quote(dbname)))


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    if primary and not isinstance(exc, psycopg.OperationalError):
        text = primary
    line = next((ln for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    line = re.sub(r"^connection failed:\s*", "", line)
    return re.sub(r"\s+", " ", line).strip()


def connect(url: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    if "://" not in url:  # a conninfo string would connect to libpq's defaults, not what was meant
        raise MigrateError(f"not a PostgreSQL URL: {redact(url)} (expected postgresql://user@host:port/dbname)")
    try:
        return psycopg.connect(url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        reason = _reason(exc)
        dbname = urlsplit(url).path.lstrip("/")
        hint = f"; create it first: CREATE DATABASE {dbname};" if "does not exist" in reason and dbname else ""
        raise MigrateError(f"cannot connect to {redact(url)}: {reason}{hint}") from exc
    except ValueError as exc:  # not a URL psycopg can parse
        raise MigrateError(f"not a PostgreSQL URL: {redact(url)} ({exc})") from exc


# -- what the database holds ----------------------------------------------------------------------

#: Differences between an existing public.idempotency_keys and idem's (migration 0002), one text
#: line each; no rows when it is idem's shape. Also run inside `idem sql`'s guard.
STORE_DIFFERENCES: LiteralString = """\
WITH expected(column_name, data_type, not_null) AS (VALUES
    ('id', 'bigint', true), ('idem_key', 'text', true), ('scope_user_id', 'integer', false),
    ('scope_endpoint', 'text', true), ('request_hash', 'text', true),
    ('response_code', 'smallint', false), ('response_body', 'jsonb', false),
    ('status', 'text', true), ('created_at', 'timestamp with time zone', true),
    ('locked_at', 'timestamp with time zone', true), ('expires_at', 'timestamp with time zone', true)),
actual AS (
    SELECT a.attname::text AS column_name, pg_catalog.format_type(a.atttypid, a.atttypmod) AS data_type,
           a.attnotnull AS not_null
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = pg_catalog.to_regclass('public.idempotency_keys') AND a.attnum > 0
       AND NOT a.attisdropped),
checks(conname, what) AS (VALUES
    ('ck_idem_key_canonical', 'keys in canonical lower-case UUID form'),
    ('ck_idem_retention_cap', 'the 7-day retention cap'))
SELECT line FROM (
    SELECT 1 AS o, pg_catalog.format('column %s is missing', e.column_name) AS line
      FROM expected e LEFT JOIN actual a USING (column_name) WHERE a.column_name IS NULL
    UNION ALL
    SELECT 2, pg_catalog.format('column %s is %s%s, idem has %s%s', e.column_name, a.data_type,
                                CASE WHEN a.not_null THEN ' NOT NULL' ELSE '' END, e.data_type,
                                CASE WHEN e.not_null THEN ' NOT NULL' ELSE '' END)
      FROM expected e JOIN actual a USING (column_name)
     WHERE a.data_type <> e.data_type OR a.not_null <> e.not_null
    UNION ALL
    SELECT 3, pg_catalog.format('column %s is not idem''s', a.column_name)
      FROM actual a LEFT JOIN expected e USING (column_name)
     WHERE e.column_name IS NULL
       -- added by a later migration (0006): idem's own, in the shape that migration gives it
       AND NOT (a.column_name = 'response_headers' AND a.data_type = 'jsonb' AND NOT a.not_null)
    UNION ALL
    SELECT 4, 'no UNIQUE NULLS NOT DISTINCT (idem_key, scope_user_id, scope_endpoint): calls without a user '
              'would not dedupe' || CASE WHEN EXISTS (
                  SELECT 1 FROM pg_catalog.pg_index i
                   WHERE i.indrelid = pg_catalog.to_regclass('public.idempotency_keys') AND i.indisunique
                     AND i.indkey::text = (SELECT pg_catalog.string_agg(a.attnum::text, ' ' ORDER BY k.o)
                                             FROM unnest(ARRAY['idem_key', 'scope_user_id', 'scope_endpoint'])
                                                  WITH ORDINALITY AS k(name, o)
                                             JOIN pg_catalog.pg_attribute a
                                               ON a.attrelid = i.indrelid AND a.attname = k.name))
                  THEN ' (the table has that UNIQUE with NULLs distinct, as in the ADR''s first DDL)' ELSE '' END
     WHERE NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_index i
         WHERE i.indrelid = pg_catalog.to_regclass('public.idempotency_keys')
           AND i.indisunique AND i.indnullsnotdistinct
           AND i.indkey::text = (SELECT pg_catalog.string_agg(a.attnum::text, ' ' ORDER BY k.o)
                                   FROM unnest(ARRAY['idem_key', 'scope_user_id', 'scope_endpoint'])
                                        WITH ORDINALITY AS k(name, o)
                                   JOIN pg_catalog.pg_attribute a
                                     ON a.attrelid = i.indrelid AND a.attname = k.name))
    UNION ALL
    SELECT 5, pg_catalog.format('no CHECK constraint %s (%s)', c.conname, c.what)
      FROM checks c
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint pc
                        WHERE pc.conrelid = pg_catalog.to_regclass('public.idempotency_keys')
                          AND pc.conname = c.conname AND pc.contype = 'c')
) d ORDER BY o, line"""

#: What the store needs of the host's own tables, where they exist (0001 creates minimal ones
#: where they do not): idempotency_keys.scope_user_id is an integer REFERENCES users(id), and a
#: replay inserts (user_id, action, context) into audit_log. One text line per problem.
HOST_DIFFERENCES: LiteralString = """\
WITH users_id AS (
    SELECT a.attnum, pg_catalog.format_type(a.atttypid, a.atttypmod) AS data_type
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = pg_catalog.to_regclass('public.users') AND a.attname = 'id' AND NOT a.attisdropped),
audit(column_name, accepted, needed) AS (VALUES
    ('user_id', ARRAY['integer', 'bigint'], 'integer'),
    ('action', ARRAY['text', 'character varying'], 'text'),
    ('context', ARRAY['jsonb'], 'jsonb')),
audit_cols AS (
    SELECT a.attname::text AS column_name, pg_catalog.format_type(a.atttypid, a.atttypmod) AS data_type,
           pg_catalog.format_type(a.atttypid, NULL) AS base_type, a.attnotnull AS not_null,
           a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '' AS has_default
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = pg_catalog.to_regclass('public.audit_log') AND a.attnum > 0 AND NOT a.attisdropped)
SELECT line FROM (
    SELECT 1 AS o, 'public.users has no id column (idempotency_keys.scope_user_id REFERENCES users(id))' AS line
     WHERE pg_catalog.to_regclass('public.users') IS NOT NULL AND NOT EXISTS (SELECT 1 FROM users_id)
    UNION ALL
    SELECT 2, pg_catalog.format('public.users.id is %s; the store''s scope_user_id is integer '
                                '(REFERENCES users(id)): it needs an integer or bigint users.id', u.data_type)
      FROM users_id u WHERE u.data_type NOT IN ('integer', 'bigint', 'smallint')
    UNION ALL
    SELECT 3, 'public.users.id is neither the primary key nor UNIQUE (scope_user_id REFERENCES users(id))'
      FROM users_id u
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                        WHERE i.indrelid = pg_catalog.to_regclass('public.users') AND i.indisunique
                          AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indkey::text = u.attnum::text)
    UNION ALL
    SELECT 4, pg_catalog.format('public.audit_log has no column %s (%s): a replay writes (user_id, action, context)',
                                x.column_name, x.needed)
      FROM audit x
     WHERE pg_catalog.to_regclass('public.audit_log') IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM audit_cols c WHERE c.column_name = x.column_name)
    UNION ALL
    SELECT 5, pg_catalog.format('public.audit_log.%s is %s; a replay writes %s there', x.column_name, c.data_type,
                                x.needed)
      FROM audit x JOIN audit_cols c USING (column_name)
     WHERE c.base_type <> ALL (x.accepted)
    UNION ALL
    SELECT 6, pg_catalog.format('public.audit_log.%s is NOT NULL without a default; a replay writes only '
                                '(user_id, action, context)', c.column_name)
      FROM audit_cols c
     WHERE c.not_null AND NOT c.has_default AND c.column_name NOT IN ('user_id', 'action', 'context')
) d ORDER BY o, line"""

_STATE = """\
SELECT pg_catalog.current_database() AS dbname, current_user AS username,
       pg_catalog.to_regclass('public.idempotency_keys') IS NOT NULL AS has_store,
       pg_catalog.to_regclass('public._yoyo_migration') IS NOT NULL AS has_yoyo,
       pg_catalog.to_regprocedure('public.idem_schema_version()') IS NOT NULL AS has_version,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_roles WHERE rolname = ANY (%s)) = %s AS has_role"""


@dataclass(slots=True)
class DatabaseState:
    dbname: str
    username: str
    has_store: bool
    has_role: bool
    api_version: int | None
    applied: dict[str, str] = field(default_factory=dict)  # migration id -> applied at (UTC)


def read_state(conn: psycopg.Connection[Any]) -> DatabaseState:
    row = conn.execute(_STATE, (list(ROLES), len(ROLES))).fetchone()
    assert row is not None
    dbname, username, has_store, has_yoyo, has_version, has_role = row
    version: int | None = None
    if has_version:
        try:
            with conn.transaction():
                got = conn.execute("SELECT public.idem_schema_version()").fetchone()
            version = int(got[0]) if got and got[0] is not None else None
        except pg_errors.InsufficientPrivilege:
            version = None
    applied: dict[str, str] = {}
    if has_yoyo:
        for mid, when in conn.execute(
            "SELECT migration_id, applied_at_utc::text FROM public._yoyo_migration ORDER BY applied_at_utc"
        ):
            applied[str(mid)] = str(when)
    return DatabaseState(str(dbname), str(username), bool(has_store), bool(has_role), version, applied)


def store_differences(conn: psycopg.Connection[Any]) -> list[str]:
    return [str(r[0]) for r in conn.execute(STORE_DIFFERENCES).fetchall()]


#: Where pgcrypto lives. The functions call it as public.pgp_sym_encrypt, public.armor, ...: in
#: any other schema those names are free, and a role that may create in public (any role, on a
#: cluster made before PostgreSQL 15) could plant them and read IDEM_RESPONSE_KEY as the owner.
PGCRYPTO_SCHEMA = "SELECT extnamespace::regnamespace::text FROM pg_catalog.pg_extension WHERE extname = 'pgcrypto'"
PGCRYPTO_FIX = "ALTER EXTENSION pgcrypto SET SCHEMA public;"


def pgcrypto_refusal(dbname: str, schema: str) -> str:
    return (
        f"database {dbname}: pgcrypto is installed in schema {schema}, but idem's functions call it as "
        "public.pgp_sym_encrypt (and armor, dearmor), names that any role allowed to create in public "
        f"could plant; move it with: {PGCRYPTO_FIX} then run idem migrate again; nothing was changed"
    )


def preflight(conn: psycopg.Connection[Any]) -> DatabaseState:
    """Refuse, before anything is written, what `idem migrate` must not touch."""
    state = read_state(conn)
    pgcrypto = conn.execute(PGCRYPTO_SCHEMA).fetchone()
    if pgcrypto is not None and pgcrypto[0] != "public":
        raise MigrateError(pgcrypto_refusal(state.dbname, str(pgcrypto[0])))
    if state.api_version is not None and state.api_version > EXPECTED_SCHEMA_VERSION:
        raise MigrateError(
            f"database {state.dbname} has idem SQL API version {state.api_version}, newer than the "
            f"version {EXPECTED_SCHEMA_VERSION} of this package (idem-shim {package_version()}): install "
            "the newer idem-shim to migrate it; nothing was changed"
        )
    if state.has_store and STORE_MIGRATION not in state.applied:
        diff = store_differences(conn)
        what = "; ".join(diff) if diff else "its shape matches idem's, but idem adopts no table it did not create"
        raise MigrateError(
            f"database {state.dbname} already has a public.idempotency_keys that idem did not create "
            f"(migration {STORE_MIGRATION} is not recorded): {what}; nothing was changed"
        )
    if STORE_MIGRATION not in state.applied:  # the store is not built yet: can it be, here?
        host = [str(r[0]) for r in conn.execute(HOST_DIFFERENCES).fetchall()]
        if host:
            raise MigrateError(
                f"database {state.dbname}: the host's tables do not fit the idempotency store: "
                + "; ".join(host)
                + "; nothing was changed (see docs/adopting.md)"
            )
    return state


# -- yoyo ---------------------------------------------------------------------------------------


def _yoyo_url(url: str) -> str:
    """yoyo names the psycopg 3 driver in the scheme."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


#: yoyo's own DDL for its lock table, with IF NOT EXISTS: yoyo tries a plain CREATE TABLE on
#: every run and swallows the error, which leaves an ERROR line in the server log each time
#: (its probe for transactional DDL left another; see _backend).
YOYO_LOCK_DDL: LiteralString = (
    'CREATE TABLE IF NOT EXISTS "yoyo_lock" ("locked" INT DEFAULT 1, "ctime" TIMESTAMP,'
    '"pid" INT NOT NULL,PRIMARY KEY ("locked"))'
)


def _backend(url: str) -> Any:
    from yoyo.backends.core.postgresql import PostgresqlPsycopgBackend
    from yoyo.connections import parse_uri
    from yoyo.migrations import default_migration_table

    class Backend(PostgresqlPsycopgBackend):  # type: ignore[misc]
        create_lock_table_sql = YOYO_LOCK_DDL.replace('"yoyo_lock"', "{0.lock_table_quoted}")

        def create_lock_table(self) -> None:
            with contextlib.suppress(self.DatabaseError), self.transaction():
                self.execute(self.format_sql(self.create_lock_table_sql))

        def _check_transactional_ddl(self) -> bool:
            # yoyo probes by dropping a table it rolled back (an ERROR line in the server log
            # on every run); PostgreSQL's DDL is transactional, which idem relies on anyway.
            return True

    backend = Backend(parse_uri(_yoyo_url(url)), default_migration_table)
    backend.init_database()
    return backend


def read_migrations(files: SqlFiles | None = None) -> Any:
    from yoyo import read_migrations as yoyo_read
    from yoyo.migrations import topological_sort

    files = files or sql_files()
    migrations = yoyo_read(str(files.migrations))
    return migrations.__class__(topological_sort(migrations), migrations.post_apply)


# -- migrate ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class MigrateResult:
    applied: list[str]
    function_files: int
    cleanup: str
    messages: list[str]


def _ensure_roles(cursor: Any) -> None:
    for role in ROLES:
        cursor.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (role,))
        if cursor.fetchone():
            continue
        cursor.execute("SAVEPOINT idem_role")
        try:
            cursor.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        except (pg_errors.DuplicateObject, pg_errors.UniqueViolation):
            cursor.execute("ROLLBACK TO SAVEPOINT idem_role")  # another migrate created it meanwhile
        except pg_errors.InsufficientPrivilege as exc:
            raise MigrateError(
                f"role {role} does not exist and this role may not create it: a superuser runs "
                f"CREATE ROLE {role} NOLOGIN; then run idem migrate again; nothing was changed"
            ) from exc


def migrate(url: str, *, echo: Echo | None = None, cron_database: str | None = None) -> MigrateResult:
    """Preflight, then role + pending migrations + functions in one transaction, then the schedule."""
    from yoyo.exceptions import LockTimeout

    try:
        return _migrate(url, echo, cron_database)
    except LockTimeout as exc:
        raise MigrateError(
            f"another migration holds yoyo's lock on this database ({exc}); nothing was changed"
        ) from exc
    except psycopg.Error as exc:  # the server went away between the preflight and the work
        raise MigrateError(f"{_reason(exc)}; nothing was changed") from exc


def _migrate(url: str, echo: Echo | None, cron_database: str | None) -> MigrateResult:
    files = sql_files()
    with connect(url) as conn:
        preflight(conn)
        conn.execute(YOYO_LOCK_DDL)
    migrations = read_migrations(files)
    backend = _backend(url)
    try:
        with backend.lock():
            backend.ensure_internal_schema_updated()
            pending = backend.to_apply(migrations)
            current: str = "(preflight)"
            try:
                with backend.transaction():
                    cursor = backend.cursor()
                    cursor.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                    preflight(backend.connection)  # again, now that no other migrate runs
                    current = f"roles {', '.join(ROLES)}"
                    _ensure_roles(cursor)
                    for migration in pending:
                        current = f"migration {migration.id}"
                        migration.process_steps(backend, "apply")
                        backend.log_migration(migration, "apply")
                        backend.mark_one(migration, log=False)
                    for path in files.function_files():
                        current = f"sql/functions/{path.name}"
                        cursor.execute(path.read_text(encoding="utf-8"))  # no parameters: a simple query
                    current = "the SQL API version check"
                    cursor.execute("SELECT public.idem_schema_version()")
                    got = cursor.fetchone()
                    if not got or got[0] != EXPECTED_SCHEMA_VERSION:
                        raise MigrateError(
                            f"sql/functions/ defines SQL API version {got[0] if got else None}, but this "
                            f"package expects {EXPECTED_SCHEMA_VERSION}: a broken build; nothing was changed"
                        )
            except MigrateError:
                raise
            except psycopg.Error as exc:
                raise MigrateError(f"{current}: {_reason(exc)}; nothing was changed") from exc
    finally:
        backend.connection.close()
    messages: list[str] = []
    cleanup = schedule_cleanup(url, messages.append, cron_database)
    if echo:
        for line in messages:
            echo(line)
    return MigrateResult([m.id for m in pending], len(files.function_files()), cleanup, messages)


def rollback_all(url: str) -> None:
    """Every migration's rollback, newest first (for tests): the database back to zero."""
    with connect(url) as conn:
        conn.execute(YOYO_LOCK_DDL)
    backend = _backend(url)
    try:
        with backend.lock():
            backend.rollback_migrations(backend.to_rollback(read_migrations()))
    finally:
        backend.connection.close()


# -- the pg_cron schedule -----------------------------------------------------------------------------


def job_name(dbname: str) -> str:
    return JOB_PREFIX + dbname


def _notice_text(diag: Any) -> str:
    text = (
        f"idem: {diag.message_primary}"
        if not str(diag.message_primary).startswith("idem:")
        else str(diag.message_primary)
    )
    if diag.message_hint:
        text += f"\n      hint: {diag.message_hint}"
    return text


def schedule_statement(conn: psycopg.Connection[Any], store_db: str, username: str, *, grant_usage: bool) -> str:
    """The exact statement a superuser runs in pg_cron's database to schedule this store's job."""
    stmt = sql.SQL("SELECT cron.schedule_in_database({}, {}, {}, {}, {});").format(
        sql.Literal(job_name(store_db)),
        sql.Literal(SCHEDULE),
        sql.Literal(CLEANUP_COMMAND),
        sql.Literal(store_db),
        sql.Literal(username),
    )
    if grant_usage:  # lets the migrating role see its job (cron.job shows each role its own)
        stmt = sql.SQL("GRANT USAGE ON SCHEMA cron TO {}; ").format(sql.Identifier(username)) + stmt
    return stmt.as_string(conn)


def _has_pg_cron(url: str) -> bool:
    try:
        with connect(url) as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron')"
            ).fetchone()
    except MigrateError:
        return False
    return bool(row and row[0])


def locate_cron_database(url: str, conn: psycopg.Connection[Any], hint: str | None = None) -> str | None:
    """pg_cron's database, for a role that may not read cron.database_name (superuser-only):
    the one named (--cron-database), else 'postgres' (managed servers' default), else the first
    other database this role may connect to whose pg_cron extension exists (pg_cron can only be
    created in cron.database_name)."""
    if hint:
        return hint if _has_pg_cron(url_for(url, hint)) else None
    rows = conn.execute(
        "SELECT datname FROM pg_catalog.pg_database WHERE datallowconn AND NOT datistemplate "
        "   AND datname <> current_database() AND has_database_privilege(datname, 'CONNECT') "
        " ORDER BY datname <> 'postgres', datname LIMIT 50"
    ).fetchall()
    return next((str(r[0]) for r in rows if _has_pg_cron(url_for(url, str(r[0])))), None)


def cron_database(url: str, conn: psycopg.Connection[Any], hint: str | None = None) -> str | None:
    """cron.database_name if this role may read it, else where pg_cron is found; None without it."""
    try:
        with conn.transaction():
            row = conn.execute("SELECT current_setting('cron.database_name', true)").fetchone()
        return str(row[0]) if row and row[0] else None
    except pg_errors.InsufficientPrivilege:
        return locate_cron_database(url, conn, hint)


def schedule_cleanup(url: str, echo: Echo, cron_hint: str | None = None) -> str:
    """Schedule the cleanup wherever pg_cron lives; return what happened (never raises)."""
    try:
        conn = connect(url)
    except MigrateError as exc:
        echo(f"idem: the cleanup is not scheduled: {exc}")
        return "error"
    notices: list[str] = []  # as text at once: a notice's diag is gone after the handler returns
    with conn:
        conn.add_notice_handler(lambda diag: notices.append(_notice_text(diag)))
        row = conn.execute("SELECT public.idem_schedule_cleanup()").fetchone()
        outcome = str(row[0]) if row else "absent"
        store_db, username = conn.execute("SELECT current_database(), current_user").fetchone() or ("", "")
        here = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron')"
        ).fetchone()
        cron_db = None
        if outcome == "other_database" or (outcome == "not_permitted" and not (here and here[0])):
            cron_db = cron_database(url, conn, cron_hint)
    if cron_db is None or cron_db == store_db:
        for notice in notices:
            echo(notice)
        return outcome
    try:
        return _schedule_in_cron_database(url, str(store_db), cron_db, str(username), notices, echo)
    except psycopg.Error as exc:  # the store is migrated; the schedule is a separate matter
        echo(f"idem: the cleanup is not scheduled in database {cron_db}: {_reason(exc)}")
        return "error"


def _schedule_in_cron_database(
    url: str, store_db: str, cron_db: str, username: str, notices: list[str], echo: Echo
) -> str:
    name = job_name(store_db)
    try:
        conn = connect(url_for(url, cron_db))
    except MigrateError as exc:
        echo(
            f"idem: pg_cron runs in database {cron_db}, which this role cannot reach ({exc}); "
            "the cleanup is not scheduled"
        )
        for notice in notices:
            echo(notice)
        return "other_database"
    with conn:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron'), "
            "       to_regnamespace('cron') IS NOT NULL AND has_schema_privilege('cron', 'USAGE')"
        ).fetchone()
        has_cron, usage = (bool(row[0]), bool(row[1])) if row else (False, False)
        if not has_cron:
            echo(
                f"idem: pg_cron is loaded for database {cron_db} but its extension is not created there; "
                "the cleanup is not scheduled\n      hint: a superuser runs CREATE EXTENSION pg_cron in "
                f"database {cron_db}, then idem migrate again (or run `flask idempotency cleanup` daily)"
            )
            return "absent"
        hint = (
            f"\n      hint: as a superuser, in database {cron_db} run: "
            + schedule_statement(conn, store_db, username, grant_usage=not usage)
            + "\n            (or run `flask idempotency cleanup` daily at 04:00 UTC)"
        )
        if not usage:
            echo(
                f"idem: {username} may not use pg_cron in database {cron_db}; the cleanup of {store_db} "
                "is not scheduled" + hint
            )
            return "not_permitted"
        jobs = conn.execute(
            "SELECT jobid, jobname, schedule = %s AND command = %s AND database = %s AND active AS same"
            "  FROM cron.job WHERE jobname = %s OR (jobname = %s AND database = %s) ORDER BY jobid",
            (SCHEDULE, CLEANUP_COMMAND, store_db, name, LEGACY_JOB, store_db),
        ).fetchall()
        keep = next((jid for jid, jname, same in jobs if jname == name and same), None)
        drop = [jid for jid, _jname, _same in jobs if jid != keep]
        try:
            with conn.transaction():
                for jid in drop:
                    conn.execute("SELECT cron.unschedule(%s::bigint)", (jid,))
                if keep is None:
                    got = conn.execute(
                        "SELECT cron.schedule_in_database(%s, %s, %s, %s)", (name, SCHEDULE, CLEANUP_COMMAND, store_db)
                    ).fetchone()
                    keep = int(got[0]) if got else None
        except pg_errors.InsufficientPrivilege:
            echo(
                f"idem: {username} may not schedule pg_cron jobs in database {cron_db}; the cleanup of "
                f"{store_db} is not scheduled" + hint
            )
            return "not_permitted"
    if not drop and keep is not None and any(jid == keep for jid, _n, _s in jobs):
        return "unchanged"
    echo(
        f"idem: pg_cron job '{name}' (jobid {keep}) in database {cron_db} runs '{CLEANUP_COMMAND}' "
        f"at '{SCHEDULE}' in database {store_db}"
    )
    return "scheduled"


# -- idem sql ---------------------------------------------------------------------------------------


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


_YOYO_TABLES = """\
-- yoyo-migrations' bookkeeping, exactly as yoyo creates it, so a later `idem migrate` sees what
-- this script applied.
CREATE TABLE IF NOT EXISTS public."yoyo_lock" (
    "locked" INT DEFAULT 1, "ctime" TIMESTAMP,"pid" INT NOT NULL,PRIMARY KEY ("locked"));
CREATE TABLE IF NOT EXISTS public."_yoyo_migration" (
    "migration_hash" VARCHAR(64),
    "migration_id" VARCHAR(255),
    "applied_at_utc" TIMESTAMP,
    PRIMARY KEY ("migration_hash")
);
CREATE TABLE IF NOT EXISTS public."_yoyo_log" (
    "id" VARCHAR(36),
    "migration_hash" VARCHAR(64),
    "migration_id" VARCHAR(255),
    "operation" VARCHAR(10),
    "username" VARCHAR(255),
    "hostname" VARCHAR(255),
    "comment" VARCHAR(255),
    "created_at_utc" TIMESTAMP,
    PRIMARY KEY ("id")
);
CREATE TABLE IF NOT EXISTS public."_yoyo_version" (
    "version" INT NOT NULL PRIMARY KEY,
    "installed_at_utc" TIMESTAMP
);
INSERT INTO public."_yoyo_version" ("version", "installed_at_utc")
SELECT 2, now() AT TIME ZONE 'UTC'
 WHERE NOT EXISTS (SELECT 1 FROM public."_yoyo_version" WHERE "version" = 2);
"""


def render_sql() -> str:
    """The whole install or upgrade as one idempotent script for `psql -v ON_ERROR_STOP=1 -f`."""
    files = sql_files()
    out: list[str] = [
        f"-- idem-shim {package_version()}: the idempotency store, SQL API version {EXPECTED_SCHEMA_VERSION}.",
        "-- Generated by `idem sql`: the same as `idem migrate`, for review or a DBA's own tooling.",
        "-- Apply with: psql -v ON_ERROR_STOP=1 -f this.sql <database URL>",
        "-- One transaction; safe to re-apply (applied migrations are skipped, functions are",
        "-- CREATE OR REPLACE). Migrations are recorded in yoyo's tables, as `idem migrate` does.",
        "BEGIN;",
        "",
        "-- Refuse a database whose SQL API is newer than this script's, or whose idempotency_keys",
        "-- table idem did not create. Nothing is changed then.",
        "DO $idem_guard$",
        "DECLARE",
        "    v_version integer;",
        "    v_ours boolean := false;",
        "    v_diff text;",
        "BEGIN",
        "    -- one migration at a time (the lock `idem migrate` takes too), until COMMIT",
        f"    PERFORM pg_catalog.pg_advisory_xact_lock({LOCK_KEY});",
        "    IF pg_catalog.to_regprocedure('public.idem_schema_version()') IS NOT NULL THEN",
        "        EXECUTE 'SELECT public.idem_schema_version()' INTO v_version;",
        f"        IF v_version > {EXPECTED_SCHEMA_VERSION} THEN",
        "            RAISE EXCEPTION 'idem: database % has idem SQL API version %, newer than the version "
        f"{EXPECTED_SCHEMA_VERSION} of this script (idem-shim {package_version()}); nothing was changed',",
        "                pg_catalog.current_database(), v_version;",
        "        END IF;",
        "    END IF;",
        "    IF pg_catalog.to_regclass('public.idempotency_keys') IS NOT NULL THEN",
        "        IF pg_catalog.to_regclass('public._yoyo_migration') IS NOT NULL THEN",
        "            EXECUTE 'SELECT EXISTS (SELECT 1 FROM public._yoyo_migration WHERE migration_id = $1)'",
        f"               INTO v_ours USING {_literal(STORE_MIGRATION)}::text;",
        "        END IF;",
        "        IF NOT v_ours THEN",
        "            SELECT pg_catalog.string_agg(line, '; ') INTO v_diff FROM (",
        STORE_DIFFERENCES,
        "            ) AS differences;",
        "            RAISE EXCEPTION 'idem: database % already has a public.idempotency_keys that idem did not "
        f"create (migration {STORE_MIGRATION} is not recorded): %; nothing was changed',",
        "                pg_catalog.current_database(),",
        "                coalesce(v_diff, 'its shape matches idem''s, but idem adopts no table it did not create');",
        "        END IF;",
        "    END IF;",
        "    -- pgcrypto, where it exists, must be in public: the functions name it there",
        "    SELECT e.extnamespace::regnamespace::text INTO v_diff",
        "      FROM pg_catalog.pg_extension e WHERE e.extname = 'pgcrypto';",
        "    IF v_diff IS NOT NULL AND v_diff <> 'public' THEN",
        # pgcrypto_refusal's own text, with RAISE's placeholders for the two names.
        f"        RAISE EXCEPTION {_literal('idem: ' + pgcrypto_refusal('%', '%'))},",
        "            pg_catalog.current_database(), v_diff;",
        "    END IF;",
        "    v_diff := NULL;",
        "    -- the host's own users and audit_log, where they exist, must fit the store",
        "    IF pg_catalog.to_regclass('public.idempotency_keys') IS NULL THEN",
        "        SELECT pg_catalog.string_agg(line, '; ') INTO v_diff FROM (",
        HOST_DIFFERENCES,
        "        ) AS differences;",
        "        IF v_diff IS NOT NULL THEN",
        "            RAISE EXCEPTION 'idem: database %: the host''s tables do not fit the idempotency store: %; "
        "nothing was changed', pg_catalog.current_database(), v_diff;",
        "        END IF;",
        "    END IF;",
        "END",
        "$idem_guard$;",
        "",
        "-- The cluster-wide roles: idem_app, which the app's login role joins (the request path), and",
        "-- idem_admin, which DBAs, pg_cron and the CLI's admin verbs join (cleanup, rotation, health).",
        "DO $idem_role$",
        "BEGIN",
        # The script is text by nature; what it interpolates are the package's constants and its
        # own migration file names, quoted by _literal, never input.
        *(
            line
            for role in ROLES
            for line in (
                f"    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = {_literal(role)}) THEN",  # noqa: S608
                f"        CREATE ROLE {role} NOLOGIN;",
                "    END IF;",
            )
        ),
        "END",
        "$idem_role$;",
        "",
        _YOYO_TABLES,
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
    for path in files.function_files():
        out += [f"-- sql/functions/{path.name}", path.read_text(encoding="utf-8").rstrip(), ""]
    out += [
        "-- The nightly cleanup: scheduled here when this is pg_cron's database; elsewhere a NOTICE",
        "-- gives the statement to run in pg_cron's database (`idem migrate` does that itself).",
        "SELECT public.idem_schedule_cleanup();",
        "",
        "COMMIT;",
        "",
    ]
    return "\n".join(out)


# -- idem status ------------------------------------------------------------------------------------


def status(url: str, cron_hint: str | None = None) -> tuple[list[str], bool]:
    """Lines describing the database against this package; True when it is current."""
    files = sql_files()
    known = [m.id for m in read_migrations(files)]
    lines = [
        f"idem-shim {package_version()} (SQL API {EXPECTED_SCHEMA_VERSION}, {len(known)} migrations)",
        f"database: {redact(url)}",
    ]
    with connect(url) as conn:
        state = read_state(conn)
        pending = [m for m in known if m not in state.applied]
        version = "none (idem is not installed)" if state.api_version is None else str(state.api_version)
        verdict = (
            "current"
            if state.api_version == EXPECTED_SCHEMA_VERSION and not pending
            else "newer than this package"
            if (state.api_version or 0) > EXPECTED_SCHEMA_VERSION
            else "behind: run idem migrate"
        )
        lines.append(f"SQL API: database {version}, package {EXPECTED_SCHEMA_VERSION} ({verdict})")
        lines.append(f"migrations: {len(state.applied)} applied, {len(pending)} pending")
        lines += [f"  applied {mid}  {when}" for mid, when in state.applied.items()]
        lines += [f"  pending {mid}" for mid in pending]
        lines.append(f"roles {', '.join(ROLES)}: {'exist' if state.has_role else 'missing'}")
        cron_db = cron_database(url, conn, cron_hint)
    lines += _cron_status(url, state.dbname, cron_db)
    return lines, verdict == "current"


def _cron_status(url: str, store_db: str, cron_db: str | None) -> list[str]:
    if cron_db is None:
        return ["pg_cron: not found on this server (or in no database this role may connect to)"]
    name = job_name(store_db)
    try:
        conn = connect(url_for(url, cron_db))
    except MigrateError as exc:
        return [f"pg_cron: in database {cron_db}, not reachable: {exc}"]
    with conn:
        try:
            with conn.transaction():
                job = conn.execute(
                    "SELECT jobid, schedule, command, database, username, active FROM cron.job "
                    "WHERE jobname = %s ORDER BY jobid LIMIT 1",
                    (name,),
                ).fetchone()
                runs = (
                    []
                    if job is None
                    else conn.execute(
                        "SELECT start_time::text, status, return_message FROM cron.job_run_details "
                        "WHERE jobid = %s ORDER BY runid DESC LIMIT 5",
                        (job[0],),
                    ).fetchall()
                )
        except (pg_errors.InsufficientPrivilege, pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
            return [f"pg_cron: in database {cron_db}; this role may not read cron.job"]
    if job is None:
        return [f"pg_cron: in database {cron_db}; no job '{name}' (run idem migrate)"]
    lines = [
        f"pg_cron: job '{name}' (jobid {job[0]}) in database {cron_db}: '{job[1]}' {job[2]} "
        f"in database {job[3]} as {job[4]}{'' if job[5] else ' (INACTIVE)'}"
    ]
    lines += [f"  run {start}  {st}  {msg}" for start, st, msg in runs] or ["  no runs yet"]
    return lines
