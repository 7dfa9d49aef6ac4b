"""``idem status``: the database against this package (SQL API, migrations, roles) and the
cleanup's pg_cron job with its last runs; current or not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg import errors as pg_errors

from ..errors import CONTROL, MigrateError, describe
from ..queries import CLEANUP_PLAN, EXPECTED_SCHEMA_VERSION
from . import citus
from .apply import bound_lock_waits
from .connection import connect, redact, url_for
from .cron import CleanupJob, cleanup_job, cron_database, recorded_oid, stale_jobs
from .files import package_version, read_migrations, sql_files
from .preflight import PLAIN_TABLE, ROLES, read_state, trusted_routine
from .public_schema import writable_public
from .shadow_schemas import shadow_schemas

#: Who holds a lock that a read waits for: only ACCESS EXCLUSIVE conflicts with the ACCESS SHARE
#: every statement of the report takes (a DBA's LOCK TABLE, a migration's ALTER TABLE), here or
#: in a prepared transaction (no pid).
_LOCK_HOLDERS = """
SELECT l.pid, a.usename, a.application_name, a.state, a.xact_start::text, p.gid,
       pg_catalog.string_agg(l.relation::regclass::text, ', ' ORDER BY l.relation::regclass::text)
  FROM pg_catalog.pg_locks l
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
  LEFT JOIN pg_catalog.pg_locks x  -- a prepared transaction's own xid, under the same virtual xid
         ON l.pid IS NULL AND x.pid IS NULL AND x.locktype = 'transactionid'
        AND x.virtualtransaction = l.virtualtransaction
  LEFT JOIN pg_catalog.pg_prepared_xacts p ON p.transaction = x.transactionid
 WHERE l.granted AND l.mode = 'AccessExclusiveLock' AND l.locktype = 'relation'
   AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
   AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
 GROUP BY l.pid, a.usename, a.application_name, a.state, a.xact_start, p.gid
 ORDER BY a.xact_start NULLS LAST, l.pid
"""


def status(url: str, cron_hint: str | None = None, wait_timeout: float = 10.0) -> tuple[list[str], bool]:
    """Lines describing the database against this package; True when it is current.

    Every lock a statement of the report waits for is bounded by ``wait_timeout`` seconds: a
    DBA's open ``LOCK TABLE`` hung the report, silently, for as long as it was held."""
    files = sql_files()
    known = [m.id for m in read_migrations(files)]
    lines = [
        f"idem-shim {package_version()} (SQL API {EXPECTED_SCHEMA_VERSION}, {len(known)} migrations)",
        f"database: {redact(url)}",
    ]
    with connect(url) as conn:
        bound_lock_waits(conn, wait_timeout)
        try:
            current = _database_lines(conn, known, lines, wait_timeout)
            cron_db = cron_database(url, conn, cron_hint)
            job = cleanup_job(conn, current.dbname)
        except pg_errors.LockNotAvailable as exc:  # past the lines that can say it for themselves
            raise MigrateError(f"idem status: {_waited(conn, wait_timeout)}") from exc
    lines += _cron_status(url, job, cron_db, wait_timeout)
    return lines, current.verdict == "current"


@dataclass(frozen=True)
class _Current:
    dbname: str
    verdict: str


def _database_lines(conn: psycopg.Connection[Any], known: list[str], lines: list[str], wait_timeout: float) -> _Current:
    """Appends the database's lines (versions, migrations, roles, Citus, the cleanup's pace)."""
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
    lines.append(_users_table(conn))
    warning = writable_public(conn)
    if warning:
        lines.append(warning)
    lines += shadow_schemas(conn)
    lines += citus.status_lines(conn, state.has_store)
    lines.append(_cleanup_pace(conn, wait_timeout))
    return _Current(state.dbname, verdict)


#: The users table the user scope references (migration 0017's record), and its id type.
USERS_TABLE: LiteralString = (
    "SELECT h.users_table::pg_catalog.text, h.id_type::pg_catalog.text FROM public.idem_host_users h"
)


def _users_table(conn: psycopg.Connection[Any]) -> str:
    if conn.execute("SELECT pg_catalog.to_regclass('public.idem_host_users') IS NOT NULL").fetchone() != (True,):
        return "users table: not recorded yet (migration 0017 records it)"
    try:
        with conn.transaction():
            # a plain table only, locked first: a view's functions would run as this role
            conn.execute("LOCK TABLE public.idem_host_users IN ACCESS SHARE MODE")
            if conn.execute(PLAIN_TABLE, ("public.idem_host_users",)).fetchone() != (True,):
                return "users table: public.idem_host_users is not a table (not read: a view's code would run)"
            row = conn.execute(USERS_TABLE).fetchone()
    except pg_errors.InsufficientPrivilege:  # the store owner's record: a role that may not read it
        return "users table: this role may not read public.idem_host_users (the store owner's)"
    return f"users table: {row[0]} (id {row[1]}), fixed at install" if row else "users table: not recorded"


def _waited(conn: psycopg.Connection[Any], wait_timeout: float) -> str:
    """What a read that gave up on a lock after ``wait_timeout`` s says: who holds which table."""
    holders = [
        f"prepared transaction {gid or '(gid unknown)'} holds {tables} (COMMIT PREPARED or ROLLBACK PREPARED it)"
        if pid is None
        else f"pid {pid} ({user}, application '{app}', {state} since {since}) holds {tables}"
        for pid, user, app, state, since, gid, tables in conn.execute(_LOCK_HOLDERS).fetchall()
    ]
    held = "; ".join(holders) if holders else "its holder has let it go since"
    # Every name here is its maker's text: a control character would end the line and start one
    # of the report's own (a forged verdict); it shows as '?', as in the migrate's refusals.
    return CONTROL.sub("?", f"waited {wait_timeout:g} s for a lock (--wait-timeout): {held}")


def _cleanup_pace(conn: psycopg.Connection[Any], wait_timeout: float) -> str:
    """Whether the cleanup's default pace (pg_cron's and the CLI's) deletes what has expired
    before the next daily run (idem_cleanup_plan)."""
    if not trusted_routine(conn, "idem_cleanup_plan"):
        return "cleanup pace: unknown (public.idem_cleanup_plan() is missing, or not the store owner's)"
    try:
        with conn.transaction():
            row = conn.execute(CLEANUP_PLAN).fetchone()
    except pg_errors.UndefinedFunction:
        return "cleanup pace: unknown (public.idem_cleanup_plan() is missing, or not the store owner's)"
    except pg_errors.LockNotAvailable:
        return f"cleanup pace: unknown ({_waited(conn, wait_timeout)})"
    except psycopg.Error as exc:
        return f"cleanup pace: unknown ({describe(exc)})"
    assert row is not None
    expired, rate, takes, every, fits = row
    verdict = "fits before the next run" if fits else "does NOT finish before the next run: raise p_max_rows_per_second"
    takes_s = "?" if takes is None else f"{takes.total_seconds():,.0f} s"
    every_h = f"{every.total_seconds() / 3600:g} h"
    return f"cleanup pace: {rate:,} rows/s; {expired:,} expired rows take {takes_s} (runs every {every_h}): {verdict}"


def _cron_status(url: str, job: CleanupJob | None, cron_db: str | None, wait_timeout: float) -> list[str]:
    if cron_db is None:
        return ["pg_cron: not found on this server (or in no database this role may connect to)"]
    try:
        conn = connect(url_for(url, cron_db))
    except MigrateError as exc:
        return [f"pg_cron: in database {cron_db}, not reachable: {exc}"]
    with conn:
        bound_lock_waits(conn, wait_timeout)
        try:
            with conn.transaction():
                stale = stale_jobs(conn, cron_db)
                found = (
                    None
                    if job is None
                    else conn.execute(
                        "SELECT jobid, schedule, command, database, username, active FROM cron.job "
                        "WHERE jobname = %s ORDER BY jobid LIMIT 1",
                        (job.name,),
                    ).fetchone()
                )
                runs = (
                    []
                    if found is None
                    else conn.execute(
                        "SELECT start_time::text, status, return_message FROM cron.job_run_details "
                        "WHERE jobid = %s ORDER BY runid DESC LIMIT 5",
                        (found[0],),
                    ).fetchall()
                )
        except (pg_errors.InsufficientPrivilege, pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
            return [f"pg_cron: in database {cron_db}; this role may not read cron.job"]
        except pg_errors.LockNotAvailable:
            return [f"pg_cron: in database {cron_db}; {_waited(conn, wait_timeout)}"]
    if job is None:
        return [f"pg_cron: in database {cron_db}; no job (idem is not installed here: run idem migrate)", *stale]
    if found is None:
        return [f"pg_cron: in database {cron_db}; no job '{job.name}' (run idem migrate)", *stale]
    # The declared command is long (its check of the database's identity): shown by what it does.
    oid = recorded_oid(str(found[2]))
    command = (
        f"CALL public.idem_cleanup() in database {found[3]} (oid {oid})"
        if found[2] == job.command and oid is not None
        else f"{found[2]} in database {found[3]}"
    )
    lines = [
        CONTROL.sub(
            "?",
            f"pg_cron: job '{job.name}' (jobid {found[0]}) in database {cron_db}: '{found[1]}' {command} "
            f"as {found[4]}{'' if found[5] else ' (INACTIVE)'}",
        )
    ]
    lines += [CONTROL.sub("?", f"  run {start}  {st}  {msg}") for start, st, msg in runs] or ["  no runs yet"]
    return [*lines, *stale]
