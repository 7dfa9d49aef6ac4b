"""``idem status``: the database against this package (SQL API, migrations, roles) and the
cleanup's pg_cron job with its last runs; current or not."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import errors as pg_errors

from ..errors import MigrateError, describe
from ..queries import CLEANUP_PLAN, EXPECTED_SCHEMA_VERSION
from . import citus
from .connection import connect, redact, url_for
from .cron import CleanupJob, cleanup_job, cron_database
from .files import package_version, read_migrations, sql_files
from .preflight import ROLES, read_state
from .public_schema import writable_public


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
        warning = writable_public(conn)
        if warning:
            lines.append(warning)
        lines += citus.status_lines(conn, state.has_store)
        lines.append(_cleanup_pace(conn))
        cron_db = cron_database(url, conn, cron_hint)
        job = cleanup_job(conn, state.dbname)
    lines += _cron_status(url, job, cron_db)
    return lines, verdict == "current"


def _cleanup_pace(conn: psycopg.Connection[Any]) -> str:
    """Whether the cleanup's default pace (pg_cron's and the CLI's) deletes what has expired
    before the next daily run (idem_cleanup_plan)."""
    try:
        with conn.transaction():
            row = conn.execute(CLEANUP_PLAN).fetchone()
    except pg_errors.UndefinedFunction:
        return "cleanup pace: unknown (idem_cleanup_plan() is missing: an older SQL API)"
    except psycopg.Error as exc:
        return f"cleanup pace: unknown ({describe(exc)})"
    assert row is not None
    expired, rate, takes, every, fits = row
    verdict = "fits before the next run" if fits else "does NOT finish before the next run: raise p_max_rows_per_second"
    takes_s = "?" if takes is None else f"{takes.total_seconds():,.0f} s"
    every_h = f"{every.total_seconds() / 3600:g} h"
    return f"cleanup pace: {rate:,} rows/s; {expired:,} expired rows take {takes_s} (runs every {every_h}): {verdict}"


def _cron_status(url: str, job: CleanupJob | None, cron_db: str | None) -> list[str]:
    if cron_db is None:
        return ["pg_cron: not found on this server (or in no database this role may connect to)"]
    if job is None:
        return [f"pg_cron: in database {cron_db}; no job (idem is not installed here: run idem migrate)"]
    try:
        conn = connect(url_for(url, cron_db))
    except MigrateError as exc:
        return [f"pg_cron: in database {cron_db}, not reachable: {exc}"]
    with conn:
        try:
            with conn.transaction():
                found = conn.execute(
                    "SELECT jobid, schedule, command, database, username, active FROM cron.job "
                    "WHERE jobname = %s ORDER BY jobid LIMIT 1",
                    (job.name,),
                ).fetchone()
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
    if found is None:
        return [f"pg_cron: in database {cron_db}; no job '{job.name}' (run idem migrate)"]
    lines = [
        f"pg_cron: job '{job.name}' (jobid {found[0]}) in database {cron_db}: '{found[1]}' {found[2]} "
        f"in database {found[3]} as {found[4]}{'' if found[5] else ' (INACTIVE)'}"
    ]
    lines += [f"  run {start}  {st}  {msg}" for start, st, msg in runs] or ["  no runs yet"]
    return lines
