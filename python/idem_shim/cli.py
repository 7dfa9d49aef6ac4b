"""The command lines: ``idem migrate|sql|status`` (the console script, no app needed) and
``flask idempotency ...`` (the same three verbs, plus the DBA's operations through the SQL API).

The operations open one autocommit connection. ``erase-user`` and ``export-user`` (the app's
GDPR sweep) use the app's URL (``IDEM_DATABASE_URL``), whose role is a member of ``idem_app``. The
admin verbs, ``cleanup``, ``stats`` and ``rotate-response-key``, call functions only ``idem_admin``
may execute (SPEC §3a): they use ``IDEM_ADMIN_DATABASE_URL`` (config, then environment, default
the app's URL), and a role refused there is told in one line which role it needs.
``migrate`` needs a role that owns the schema (``--database-url``, default ``DATABASE_URL``).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, NoReturn

import click
import psycopg
from flask.cli import AppGroup
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from . import migrate as migration
from . import queries
from .state import get_state

#: The role the admin verbs need (SPEC §3a), and what each verb does, for its one-line refusal.
ADMIN_ROLE = "idem_admin"
_ADMIN_TASKS = {
    "cleanup": "run the cleanup",
    "stats": "read the store's health",
    "rotate-response-key": "re-encrypt the stored responses",
}


def _url(admin: bool) -> str:
    settings = get_state().settings
    return settings.admin_database_url if admin else settings.database_url


def _connect(admin: bool = False) -> psycopg.Connection[dict[str, Any]]:
    """One autocommit connection: the admin verbs' URL (``IDEM_ADMIN_DATABASE_URL``), else the app's."""
    store = get_state().store
    kwargs = store.connect_kwargs()
    kwargs.pop("options", None)  # maintenance may legitimately run longer than a request
    return psycopg.connect(_url(admin), row_factory=dict_row, **kwargs)


def _refused_role(verb: str, role: str | None) -> NoReturn:
    """The admin verb's one line when its role may not call the function: which role it needs.

    The login role is named only when IDEM_ADMIN_DATABASE_URL was set apart from the app's URL
    (a DBA's role that lacks the grant): on the app's own URL, advising to grant idem_admin to
    the app's role would hand the request path the DBA's powers (SPEC §3a)."""
    settings = get_state().settings
    if settings.admin_database_url == settings.database_url:
        role = None
    click.echo(
        f"flask idempotency {verb}: this role may not {_ADMIN_TASKS[verb]}: "
        f"it needs {ADMIN_ROLE} (GRANT {ADMIN_ROLE} TO {role or '<role>'}), "
        "or set IDEM_ADMIN_DATABASE_URL to a DBA's URL",
        err=True,
    )
    sys.exit(1)


def _current_role(conn: psycopg.Connection[Any]) -> str | None:
    """The login role of a refused statement's session (usable again: autocommit); the login
    role, not current_user, which a ``-c role=`` option may have set to a group role."""
    try:
        row = conn.execute("SELECT session_user AS role").fetchone()
    except psycopg.Error:
        return None
    return None if row is None else str(next(iter(row.values())) if isinstance(row, dict) else row[0])


def _fail(exc: psycopg.Error, admin: bool = False) -> NoReturn:
    """One line for the operator: what the server said, never a traceback."""
    if isinstance(exc, psycopg.OperationalError) and exc.diag.message_primary is None:
        # connect failure: libpq's text, first line, without the host/port preamble repeated
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = first.rsplit("failed: ", 1)[-1]  # libpq repeats host and port before the reason
        try:
            info = conninfo_to_dict(_url(admin) or "")
            where = f" at {info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
        except (psycopg.Error, RuntimeError):
            where = ""
        settings = "IDEM_DATABASE_URL / DATABASE_URL"
        if admin:
            settings = f"IDEM_ADMIN_DATABASE_URL / {settings}"
        raise click.ClickException(
            f"cannot connect to the idempotency store{where}: {reason} (check {settings})"
        ) from exc
    diag = exc.diag.message_primary or str(exc).strip()
    raise click.ClickException(f"{type(exc).__name__}: {diag}") from exc


@contextlib.contextmanager
def _admin_connection(verb: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """``_connect(admin=True)`` for an admin verb; any error ends the command in one line, and a
    privilege refusal (42501) names the role it needs instead of the server's text."""
    role: str | None = None
    try:
        with _connect(admin=True) as conn:
            try:
                yield conn
            except psycopg.errors.InsufficientPrivilege:
                role = _current_role(conn)
                raise
    except psycopg.errors.InsufficientPrivilege:
        _refused_role(verb, role)
    except psycopg.Error as exc:
        _fail(exc, admin=True)


idempotency_cli = AppGroup("idempotency", help="Operate the Idempotency-Key store.")


# -- migrate | sql | status: shared by `idem` and `flask idempotency` ------------------------------


def _refuse(verb: str, exc: migration.MigrateError) -> None:
    click.echo(f"idem {verb}: {exc}", err=True)
    sys.exit(1)


def run_migrate(
    database_url: str | None, quiet: bool = False, rollback_all: bool = False, cron_database: str | None = None
) -> None:
    if not database_url:
        raise click.UsageError("no database: pass --database-url or set DATABASE_URL")
    try:
        if rollback_all:
            migration.rollback_all(database_url)
            if not quiet:
                click.echo("idem migrate: rolled back to zero")
            return
        result = migration.migrate(database_url, echo=None if quiet else click.echo, cron_database=cron_database)
    except migration.MigrateError as exc:
        _refuse("migrate", exc)
        return
    if not quiet:
        click.echo(
            f"idem migrate: {len(result.applied)} migration(s) applied"
            f"{' (' + ', '.join(result.applied) + ')' if result.applied else ''}, "
            f"{result.function_files} function file(s) loaded, cleanup schedule: {result.cleanup}"
        )


def run_sql() -> None:
    try:
        click.echo(migration.render_sql(), nl=False)
    except migration.MigrateError as exc:
        _refuse("sql", exc)


def run_status(database_url: str | None, cron_database: str | None = None) -> None:
    if not database_url:
        raise click.UsageError("no database: pass --database-url or set DATABASE_URL")
    try:
        lines, current = migration.status(database_url, cron_database)
    except migration.MigrateError as exc:
        _refuse("status", exc)
        return
    for line in lines:
        click.echo(line)
    sys.exit(0 if current else 1)


_database_url = click.option(
    "--database-url",
    envvar="DATABASE_URL",
    show_envvar=True,
    help="The store's database, as a role that may create in its schema (default: DATABASE_URL).",
)
_quiet = click.option("-q", "--quiet", is_flag=True, help="Print errors only.")
_cron_database = click.option(
    "--cron-database",
    envvar="IDEM_CRON_DATABASE",
    show_envvar=True,
    help="pg_cron's database, for a role that may not read cron.database_name "
    "(default: found: 'postgres', else the database where pg_cron is created).",
)
_rollback_all = click.option(
    "--rollback-all", is_flag=True, hidden=True, help="Take the database back to zero (tests)."
)


@click.group(name="idem", help="The idempotency store: install or upgrade its SQL, print it, report on it.")
@click.version_option(migration.package_version(), prog_name="idem-shim")
def main() -> None:
    """The `idem` console script."""


@main.command("migrate")
@_database_url
@_cron_database
@_quiet
@_rollback_all
def migrate_command(database_url: str | None, cron_database: str | None, quiet: bool, rollback_all: bool) -> None:
    """Role idem_app, migrations and functions (one transaction), then the pg_cron schedule."""
    run_migrate(database_url, quiet, rollback_all, cron_database)


@main.command("sql")
def sql_command() -> None:
    """Print the whole install or upgrade as one script for psql -v ON_ERROR_STOP=1 -f."""
    run_sql()


@main.command("status")
@_database_url
@_cron_database
def status_command(database_url: str | None, cron_database: str | None) -> None:
    """Applied migrations, SQL API versions, idem_app, the pg_cron job (exit 1 unless current)."""
    run_status(database_url, cron_database)


def _app_database_url(database_url: str | None) -> str | None:
    return database_url or get_state().settings.database_url


@idempotency_cli.command("migrate")
@_database_url
@_cron_database
@_quiet
def flask_migrate(database_url: str | None, cron_database: str | None, quiet: bool) -> None:
    """Same as `idem migrate` (default: DATABASE_URL, else the app's IDEM_DATABASE_URL)."""
    run_migrate(_app_database_url(database_url), quiet, cron_database=cron_database)


@idempotency_cli.command("sql")
def flask_sql() -> None:
    """Same as `idem sql`."""
    run_sql()


@idempotency_cli.command("status")
@_database_url
@_cron_database
def flask_status(database_url: str | None, cron_database: str | None) -> None:
    """Same as `idem status` (default: DATABASE_URL, else the app's IDEM_DATABASE_URL)."""
    run_status(_app_database_url(database_url), cron_database)


@idempotency_cli.command("cleanup")
@click.option(
    "--batch-size",
    default=5000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Rows deleted (and committed) per batch.",
)
def cleanup(batch_size: int) -> None:
    """Delete expired keys in committed batches (CALL idem_cleanup); same job as pg_cron's."""
    with _admin_connection("cleanup") as conn:
        row = conn.execute(queries.CLEANUP, {"batch_size": batch_size}).fetchone()
    deleted = next(iter(row.values())) if row else 0
    click.echo(f"deleted {deleted} expired idempotency keys")


@idempotency_cli.command("erase-user")
@click.argument("user_id", type=int)
def erase_user(user_id: int) -> None:
    """Delete every key of USER_ID (GDPR erasure)."""
    try:
        with _connect() as conn:
            row = conn.execute(queries.ERASE_USER, {"user_id": user_id}).fetchone()
    except psycopg.Error as exc:
        _fail(exc)
    count = next(iter(row.values())) if row else 0
    click.echo(f"erased {count} idempotency keys of user {user_id}")


@idempotency_cli.command("export-user")
@click.argument("user_id", type=int)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the JSON here instead of standard output.",
)
def export_user(user_id: int, out: str | None) -> None:
    """Print (or write) every key of USER_ID as JSON (GDPR access and portability)."""
    try:
        with _connect() as conn:
            rows = get_state().store.export_user(conn, user_id)
    except psycopg.Error as exc:
        _fail(exc)
    text = json.dumps(rows if rows is not None else [], indent=2, sort_keys=True, default=str)
    if out is None:
        click.echo(text)
    else:
        with open(out, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
        click.echo(f"wrote {len(rows or [])} idempotency keys of user {user_id} to {out}", err=True)


@idempotency_cli.command("stats")
@click.option(
    "--recent", default="24 hours", show_default=True, help="Window of the event counts (a PostgreSQL interval)."
)
def stats(recent: str) -> None:
    """Show the store's health: rows per endpoint and status, stale holders, expired rows, and
    the stale heals, lost claims and erasures of the recent window (aggregates only)."""
    settings = get_state().settings
    with _admin_connection("stats") as conn:
        exists = conn.execute(queries.HEALTH_FUNCTION_EXISTS).fetchone()
        if not exists or not next(iter(exists.values())):
            click.echo(
                "this database has no idem_health() yet (added by the operations "
                "migration): run the migrations, then try again",
                err=True,
            )
            sys.exit(1)
        rows = conn.execute(
            queries.HEALTH,
            {"stale_after": timedelta(seconds=settings.stale_after_seconds), "recent": recent},
        ).fetchall()
    if not rows:
        click.echo("the idempotency store is empty")
        return
    columns = list(rows[0])
    cells = [[("" if row[c] is None else str(row[c])) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for line in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())


@idempotency_cli.command("rotate-response-key")
@click.option(
    "--batch-size",
    default=500,
    show_default=True,
    type=click.IntRange(1, 100000),
    help="Rows examined (and committed) per batch.",
)
@click.option(
    "--from-plain",
    is_flag=True,
    help="Encrypt the bodies stored in clear under IDEM_RESPONSE_KEY (switching encryption on).",
)
def rotate_response_key(batch_size: int, from_plain: bool) -> None:
    """Re-encrypt stored bodies from IDEM_RESPONSE_KEY_FALLBACK to IDEM_RESPONSE_KEY.

    Run it once every app process has both keys. With IDEM_RESPONSE_KEY unset it stores the
    fallback key's bodies in clear (switching encryption off). The keys are read from the app's
    configuration and sent as bound parameters; they are never printed.
    """
    settings = get_state().settings
    new_key = settings.response_key
    old_key = None if from_plain else settings.response_key_fallback
    if from_plain and new_key is None:
        raise click.UsageError("--from-plain needs IDEM_RESPONSE_KEY (the key to encrypt under)")
    if not from_plain and old_key is None:
        raise click.UsageError(
            "set IDEM_RESPONSE_KEY_FALLBACK to the key to rotate away from "
            "(or pass --from-plain to encrypt bodies stored in clear)"
        )
    after_id, rewritten, batches = 0, 0, 0
    with _admin_connection("rotate-response-key") as conn:
        while True:
            row = conn.execute(
                queries.REENCRYPT_RESPONSES,
                {"old_key": old_key, "new_key": new_key, "after_id": after_id, "batch_size": batch_size},
            ).fetchone()
            if row is None or row["last_id"] is None:
                break
            after_id, rewritten, batches = row["last_id"], rewritten + row["rewritten"], batches + 1
        census = conn.execute(queries.RESPONSE_KEY_CENSUS, {"key": new_key}).fetchall()
    source = "clear" if old_key is None else "fallback key"
    target = "clear" if new_key is None else "current key"
    # The direction only when something went that way: "0 … (fallback key -> clear)" misleads.
    click.echo(
        f"re-encrypted {rewritten} stored responses in {batches} batches"
        + (f" ({source} -> {target})" if rewritten else "")
    )
    # What is left under another key id is what neither key opened: a wrong fallback, or a key
    # older than the fallback. Say so and fail, so a script notices.
    left = [(row["kid"], row["bodies"]) for row in census if not row["is_current"]]
    if not left:
        where = "in clear" if new_key is None else "under the current key"
        click.echo(f"every stored response is {where}")
        return
    total = sum(n for _, n in left)
    parts = [f"{n} in clear" if kid is None else f"{n} under key id {kid}" for kid, n in left]
    where = parts[0].split(" ", 1)[1] if len(parts) == 1 else f"under other keys ({', '.join(parts)})"
    raise click.ClickException(
        f"{total} stored responses are still {where}: the keys given do not open them. "
        "Set IDEM_RESPONSE_KEY_FALLBACK to the key they were stored under (its id is the kid shown) and run this again"
        + ("; for bodies in clear, use --from-plain" if any(kid is None for kid, _ in left) else "")
    )
