"""The nightly cleanup's pg_cron job, wherever pg_cron lives.

In the store's own database ``public.idem_schedule_cleanup()`` upserts it; when ``cron.database_name``
is another database of the server, the job is written there with ``cron.schedule_in_database``
(one per store). Its name, schedule and command come from ``public.idem_cleanup_job()``, the one place
they are declared. A role that may not schedule gets the exact statement to run, and still
succeeds: the store is migrated; the schedule is a separate matter.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from ..errors import CONTROL, MigrateError, describe
from .connection import connect, url_for
from .preflight import trusted_routine

Echo = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CleanupJob:
    """One store's job, as ``public.idem_cleanup_job(database)`` declares it."""

    name: str
    schedule: str
    command: str
    legacy_name: str


def cleanup_job(conn: psycopg.Connection[Any], store_db: str) -> CleanupJob | None:
    """The job of ``store_db``, read from the store (None where idem is not installed, or its
    idem_cleanup_job is not one a trusted role made: preflight.trusted_routine)."""
    if not trusted_routine(conn, "idem_cleanup_job"):
        return None
    try:
        with conn.transaction():
            row = conn.execute(
                "SELECT jobname, schedule, command, legacy_jobname FROM public.idem_cleanup_job(%s)", (store_db,)
            ).fetchone()
    except (pg_errors.UndefinedFunction, pg_errors.InsufficientPrivilege):
        return None
    return CleanupJob(*map(str, row)) if row else None


#: Where idem_cleanup_job()'s command records the oid of the database it may run in.
_RECORDED_OID = re.compile(r"d\.oid OPERATOR\(pg_catalog\.=\) '(\d+)'::pg_catalog\.oid")

#: Every job of idem's pg_cron can see: by its name (or the old one), or by what it calls.
_IDEM_JOBS = r"""
SELECT j.jobid, j.jobname, j.database, j.command, d.oid::bigint
  FROM cron.job j
  LEFT JOIN pg_catalog.pg_database d ON d.datname OPERATOR(pg_catalog.=) j.database
 WHERE pg_catalog.starts_with(j.jobname, 'idem-cleanup:') OR j.jobname OPERATOR(pg_catalog.=) 'idempotency-cleanup'
    OR j.command OPERATOR(pg_catalog.~) 'idem_cleanup\s*\('
 ORDER BY j.jobid
"""


def recorded_oid(command: str) -> int | None:
    """The database oid a job's command checks before it runs anything (None: it checks none)."""
    match = _RECORDED_OID.search(command)
    return int(match.group(1)) if match else None


def stale_jobs(conn: psycopg.Connection[Any], cron_db: str) -> list[str]:
    """One warning line for each job of idem's (on ``conn``, in pg_cron's database) that may
    run in a database idem did not install: pg_cron finds a job's database by its name, which a
    database dropped (its job stays), re-created or renamed gives to another; with the fix."""
    rows = conn.execute(_IDEM_JOBS).fetchall()
    recorded = {int(jid): recorded_oid(str(command)) for jid, _n, _d, command, _o in rows}
    wanted = [oid for oid in recorded.values() if oid is not None]
    names = dict(
        conn.execute(
            "SELECT oid::bigint, datname FROM pg_catalog.pg_database WHERE oid OPERATOR(pg_catalog.=) ANY (%s::oid[])",
            (wanted,),
        ).fetchall()
        if wanted
        else []
    )
    lines = []
    for jobid, name, database, _command, current in rows:
        unschedule = f"SELECT cron.unschedule({jobid}); in database {cron_db}"
        migrate = (
            f"if {database} is idem's store now (restored), re-run idem migrate there (it replaces the command); else "
        )
        head = f"pg_cron: WARNING: job '{name}' (jobid {jobid})"
        rec = recorded[int(jobid)]
        if current is None:
            lines.append(
                f"{head} runs in database {database}, which no longer exists: pg_cron keeps the job, and runs it in "
                f"whichever database is next made with that name, as its role: {unschedule}"
            )
        elif rec is None:
            lines.append(
                f"{head} runs its command in database {database} without checking that it is the database idem "
                f"installed (a command from an older idem, or typed by hand): whoever owns a database of that name "
                f"decides what it calls; {migrate}{unschedule}"
            )
        elif rec != current:
            now = f"database {names[rec]} now" if rec in names else "no database now"
            lines.append(
                f"{head} was scheduled for the database of oid {rec} ({now}), but database {database} is oid "
                f"{current} (dropped and re-created, or renamed): its runs fail and clean nothing; "
                f"{migrate}{unschedule}"
            )
    return [CONTROL.sub("?", line) for line in lines]  # a database's name is its maker's text


def _notice_text(diag: Any) -> str:
    text = (
        f"idem: {diag.message_primary}"
        if not str(diag.message_primary).startswith("idem:")
        else str(diag.message_primary)
    )
    text = CONTROL.sub("?", text)  # a database's name is its maker's text
    if diag.message_hint:
        text += "\n      hint: " + CONTROL.sub("?", str(diag.message_hint))
    return text


def schedule_statement(
    conn: psycopg.Connection[Any], job: CleanupJob, store_db: str, username: str, *, grant_usage: bool
) -> str:
    """The exact statement a superuser runs in pg_cron's database to schedule this store's job."""
    stmt = sql.SQL("SELECT cron.schedule_in_database({}, {}, {}, {}, {});").format(
        sql.Literal(job.name),
        sql.Literal(job.schedule),
        sql.Literal(job.command),
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
        job = cleanup_job(conn, str(store_db))
        cron_db = None
        if outcome == "other_database" or (outcome == "not_permitted" and not (here and here[0])):
            cron_db = cron_database(url, conn, cron_hint)
    if cron_db is None or cron_db == store_db or job is None:
        for notice in notices:
            echo(notice)
        return outcome
    try:
        return _schedule_in_cron_database(url, job, str(store_db), cron_db, str(username), notices, echo)
    except psycopg.Error as exc:  # the store is migrated; the schedule is a separate matter
        echo(f"idem: the cleanup is not scheduled in database {cron_db}: {describe(exc)}")
        return "error"


def _schedule_in_cron_database(
    url: str, job: CleanupJob, store_db: str, cron_db: str, username: str, notices: list[str], echo: Echo
) -> str:
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
            + schedule_statement(conn, job, store_db, username, grant_usage=not usage)
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
            (job.schedule, job.command, store_db, job.name, job.legacy_name, store_db),
        ).fetchall()
        keep = next((jid for jid, jname, same in jobs if jname == job.name and same), None)
        drop = [jid for jid, _jname, _same in jobs if jid != keep]
        try:
            with conn.transaction():
                for jid in drop:
                    conn.execute("SELECT cron.unschedule(%s::bigint)", (jid,))
                if keep is None:
                    got = conn.execute(
                        "SELECT cron.schedule_in_database(%s, %s, %s, %s)",
                        (job.name, job.schedule, job.command, store_db),
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
        f"idem: pg_cron job '{job.name}' (jobid {keep}) in database {cron_db} runs '{job.command}' "
        f"at '{job.schedule}' in database {store_db}"
    )
    return "scheduled"
