"""
Bring a database to the current schema: `python scripts/migrate.py [--database-url URL]`.

1. ensures the cluster-wide role `idem_app` exists (NOLOGIN; app roles are made members);
2. applies pending yoyo migrations from sql/migrations/ (tables, indexes, types);
3. re-applies every sql/functions/*.sql in file-name order (CREATE OR REPLACE, privileges);
4. schedules the nightly cleanup with pg_cron where it can (`idem_schedule_cleanup()`; a
   NOTICE says what to do where it cannot).

Step 3 runs on every call, not only when a migration is pending: yoyo 9 runs post-apply
hooks only when something is pending, so `yoyo apply` alone would leave edited functions
stale. Everything runs under yoyo's lock, so two deploys cannot interleave.

`--rollback-all` takes the database back to zero (the migrations' rollbacks), for tests.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from yoyo import get_backend, read_migrations

ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS = ROOT / "sql" / "migrations"
FUNCTIONS = ROOT / "sql" / "functions"
APP_ROLE = "idem_app"


def yoyo_url(url: str) -> str:
    """yoyo names the psycopg 3 driver in the scheme."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def ensure_app_role(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,)).fetchone()
        if not exists:
            try:
                conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(APP_ROLE)))
            except psycopg.errors.DuplicateObject:
                pass  # another migrate created it between our check and our CREATE


def apply_functions(url: str) -> int:
    files = sorted(FUNCTIONS.glob("*.sql"))
    with psycopg.connect(url) as conn:  # one transaction: all functions or none
        for path in files:
            try:
                conn.execute(path.read_text())  # no parameters: sent as a simple query
            except psycopg.Error as exc:
                raise SystemExit(f"migrate: {path.relative_to(ROOT)}: {exc}") from exc
    return len(files)


def schedule_cleanup(url: str, quiet: bool) -> str:
    """Upsert the pg_cron cleanup job (or learn why not); its NOTICEs are printed."""
    with psycopg.connect(url, autocommit=True) as conn:
        if not quiet:
            conn.add_notice_handler(lambda diag: print(
                f"migrate: {diag.message_primary}"
                + (f"\n         hint: {diag.message_hint}" if diag.message_hint else "")))
        row = conn.execute("SELECT public.idem_schedule_cleanup()").fetchone()
    return str(row[0]) if row else "absent"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--rollback-all", action="store_true")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args()
    if not args.database_url:
        parser.error("no database: pass --database-url or set DATABASE_URL")
    if not args.database_url.startswith(("postgresql://", "postgres://")):
        raise SystemExit("migrate: the database URL must be a postgresql:// URL "
                         "(e.g. postgresql://postgres@127.0.0.1:54329/idem)")
    try:
        return migrate(args)
    except psycopg.OperationalError as exc:
        raise SystemExit(connect_error(args.database_url, exc)) from None


def connect_error(url: str, exc: psycopg.OperationalError) -> str:
    """One line for a database that cannot be reached (issue 14: no traceback)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text.rsplit("failed: ", 1)[-1]  # libpq repeats host and port before the reason
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        info = {}
    where = f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
    hint = ""
    if "does not exist" in text and info.get("dbname"):
        hint = f"; create it first: CREATE DATABASE {info['dbname']};"
    return f"migrate: cannot connect to {where}: {text}{hint}"


def migrate(args: argparse.Namespace) -> int:
    backend = get_backend(yoyo_url(args.database_url))
    migrations = read_migrations(str(MIGRATIONS))
    if args.rollback_all:
        with backend.lock():
            backend.rollback_migrations(backend.to_rollback(migrations))
        if not args.quiet:
            print("migrate: rolled back to zero")
        return 0

    ensure_app_role(args.database_url)
    with backend.lock():
        pending = backend.to_apply(migrations)
        backend.apply_migrations_only(pending)
        count = apply_functions(args.database_url)
        cleanup = schedule_cleanup(args.database_url, args.quiet)
    if not args.quiet:
        print(f"migrate: {len(pending)} migration(s) applied, {count} function file(s) loaded, "
              f"cleanup schedule: {cleanup}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
