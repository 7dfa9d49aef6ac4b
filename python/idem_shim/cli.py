"""The command lines: ``idem migrate|sql|status`` (the console script, no app needed) and
``flask idempotency ...`` (the same three verbs, plus the DBA's operations through the SQL API;
registered through the package's ``flask.commands`` entry point, so the extension never loads
this module).

The operations open one autocommit connection, its path pinned (a DBA's session: nothing a role
may create in is on it). None runs as the app: the admin verbs, ``cleanup``, ``stats`` and
``rotate-response-key``, call functions only ``idem_admin`` may execute (contract §3a) and use
``IDEM_ADMIN_DATABASE_URL`` (config, then environment, default the app's URL); the data-subject
verbs, ``erase-user`` and ``export-user``, call functions of ``idem_dsr`` (the GDPR job's; idem_admin
holds them too) and use ``IDEM_DSR_DATABASE_URL`` (default the admin verbs' URL). A role refused
there is told in one line which role it needs.
``stats`` reads ``idem_health``, which ``idem_monitor`` (an exporter's role) may call too.
``migrate`` and ``status`` need the store's owner (``--database-url``, default ``DATABASE_URL``,
else ``IDEM_DATABASE_URL``); run as the app's role they say so in one line.
The schema tool is imported when one of its verbs runs, not before.

One failure style for both: ``Error: <one line>`` on stderr, exit 1 (2 for a usage mistake: an
unknown verb or option, a missing argument) — never a traceback for a configuration mistake.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO, TypeVar
from uuid import UUID

import click
import psycopg
from flask.cli import AppGroup, ScriptInfo
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from . import queries
from .errors import CONTROL, IdemError, describe
from .state import get_state, schema_check_deferred


class Refused(click.ClickException):
    """The one way a command fails: ``Error: <message>`` and ``exit_code`` (1, or 2 for usage)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it per class; ours is per refusal


class _OneLineErrors(click.Group):
    """A group whose commands (and the loading of the app they need) fail in one line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # an unknown verb or option: click would print the usage too
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            raise Refused(f"{exc.format_message()} (see {where} --help)", exit_code=2) from exc
        except IdemError as exc:
            raise Refused(describe(exc)) from exc
        except psycopg.Error as exc:
            raise Refused(f"{type(exc).__name__}: {describe(exc)}") from exc


class _IdemGroup(_OneLineErrors):
    pass


class _FlaskGroup(_OneLineErrors, AppGroup):
    pass


def _schema() -> ModuleType:
    """The schema tool, loaded by the verbs that need it (the request path never does)."""
    from . import schema

    return schema


#: The roles the verbs need (contract §3a), and what each verb does, for its one-line refusal.
ADMIN_ROLE = "idem_admin"
DSR_ROLE = "idem_dsr"
#: ``stats`` reads ``idem_health``, which idem_monitor (an exporter's role) executes too: the least
#: a role needs for it.
MONITOR_ROLE = "idem_monitor"
_ADMIN_TASKS = {
    "cleanup": "run the cleanup",
    "stats": "read the store's health",
    "rotate-response-key": "re-encrypt the stored responses",
}
_DSR_TASKS = {"erase-user": "erase a user's keys", "export-user": "export a user's keys"}


def _url(verb: str | None) -> str:
    settings = get_state().settings
    if verb in _DSR_TASKS:
        return settings.dsr_database_url
    return settings.admin_database_url if verb in _ADMIN_TASKS else settings.database_url


def _connect(verb: str | None = None) -> psycopg.Connection[dict[str, Any]]:
    """One autocommit connection, its path pinned: the verb's URL (IDEM_ADMIN_DATABASE_URL or
    IDEM_DSR_DATABASE_URL), else the app's."""
    store = get_state().store
    kwargs = store.connect_kwargs()
    kwargs.pop("options", None)  # maintenance may legitimately run longer than a request
    try:
        conn = psycopg.connect(_url(verb), row_factory=dict_row, **kwargs)
        # Pinned as the schema tool's sessions are (schema/connection.py says why): often a DBA's
        # session, in a database whose defaults its owner sets.
        from .schema.connection import pin_session

        pin_session(conn)
        return conn
    except psycopg.OperationalError as exc:
        try:
            info = conninfo_to_dict(_url(verb) or "")
            where = f" at {info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
        except psycopg.Error:
            where = ""
        settings = ["IDEM_DATABASE_URL", "DATABASE_URL"]  # the URL each default falls back to, last
        if verb in _ADMIN_TASKS or verb in _DSR_TASKS:
            settings.insert(0, "IDEM_ADMIN_DATABASE_URL")
        if verb in _DSR_TASKS:
            settings.insert(0, "IDEM_DSR_DATABASE_URL")
        raise Refused(
            f"cannot connect to the idempotency store{where}: {describe(exc)} (check {' / '.join(settings)})"
        ) from exc


def _refused_role(verb: str, role: str | None) -> Refused:
    """A verb's one line when its role may not call the function: which role it needs.

    The login role is named only when the verb's URL was set apart from the app's URL (a DBA's
    role that lacks the grant): on the app's own URL, advising to grant idem_admin or idem_dsr to
    the app's role would hand the request path those powers (contract §3a)."""
    settings = get_state().settings
    if _url(verb) == settings.database_url:
        role = None
    if verb in _DSR_TASKS:
        return Refused(
            f"this role may not {_DSR_TASKS[verb]}: it needs {DSR_ROLE} (GRANT {DSR_ROLE} TO {role or '<role>'}), "
            "or set IDEM_DSR_DATABASE_URL to the GDPR job's URL"
        )
    needed = MONITOR_ROLE if verb == "stats" else ADMIN_ROLE
    return Refused(
        f"this role may not {_ADMIN_TASKS[verb]}: it needs {needed} (GRANT {needed} TO {role or '<role>'}"
        + (f"; {ADMIN_ROLE} holds it too" if needed != ADMIN_ROLE else "")
        + "), or set IDEM_ADMIN_DATABASE_URL to a DBA's URL"
    )


def _current_role(conn: psycopg.Connection[Any]) -> str | None:
    """The login role of a refused statement's session (usable again: autocommit); the login
    role, not current_user, which a ``-c role=`` option may have set to a group role."""
    try:
        row = conn.execute("SELECT session_user AS role").fetchone()
    except psycopg.Error:
        return None
    return None if row is None else str(next(iter(row.values())) if isinstance(row, dict) else row[0])


@contextlib.contextmanager
def _admin_connection(verb: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """``_connect(verb)`` for an admin or data-subject verb; a privilege refusal (42501) names the
    role it needs instead of the server's text (any other error is the group's one line)."""
    with _connect(verb) as conn:
        try:
            yield conn
        except psycopg.errors.InsufficientPrivilege as exc:
            raise _refused_role(verb, _current_role(conn)) from exc


# -- migrate | sql | status: declared once, in both `idem` and `flask idempotency` ----------------


def _database_url(given: str | None) -> str:
    """``--database-url`` (or DATABASE_URL, else IDEM_DATABASE_URL), else under ``flask
    idempotency`` the app's URL, read with the schema check deferred: these verbs install or
    report on it."""
    if given:
        return given
    info = click.get_current_context().find_object(ScriptInfo)
    if info is not None:
        with schema_check_deferred():
            app = info.load_app()
        url = get_state(app).settings.database_url
        if url:
            return url
    raise Refused("no database: pass --database-url or set DATABASE_URL (or IDEM_DATABASE_URL)", exit_code=2)


_database_url_option = click.option(
    "--database-url",
    envvar=["DATABASE_URL", "IDEM_DATABASE_URL"],  # the first set wins; the app's own variable last
    show_envvar=True,
    help="The store's database, as its owner: the role that ran idem migrate first, or a superuser "
    "(default: DATABASE_URL, else IDEM_DATABASE_URL; under flask idempotency, else the app's).",
)
_cron_database = click.option(
    "--cron-database",
    envvar="IDEM_CRON_DATABASE",
    show_envvar=True,
    help="pg_cron's database, for a role that may not read cron.database_name "
    "(default: found: 'postgres', else the database where pg_cron is created).",
)


_F = TypeVar("_F", bound=Callable[..., Any])


def _finite(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    """click's FloatRange(min=0) takes inf and nan (nan < 0 is false): no lock_timeout is made of
    either (an OverflowError, a ValueError: a traceback)."""
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds")
    return value


def _wait_timeout_option(default: float, envvar: str, help_text: str) -> Callable[[_F], _F]:
    """``--wait-timeout``: seconds, finite, of the verb's own default and variable."""
    return click.option(
        "--wait-timeout",
        type=click.FloatRange(min=0),
        callback=_finite,
        default=default,
        show_default=True,
        envvar=envvar,
        show_envvar=True,
        help=help_text,
    )


#: the value is the schema tool's GUARD_WAIT_TIMEOUT_S (the tool itself is imported only when a verb runs)
_wait_timeout = _wait_timeout_option(
    60.0,
    "IDEM_MIGRATE_WAIT_TIMEOUT",
    "Seconds to wait, once idem's DDL guard is committed (a superuser migrating), for the database's "
    "transactions begun before it, whoever's (a DBA's, another migration's): DDL they made was judged by no "
    "guard. On the timeout, nothing but the "
    "guard is changed and the error names each one (pid, user, application; a prepared transaction's gid). "
    "Also how long each transaction waits for idem's migration lock (another migration's, or any session's: "
    "named too), and for any other lock it needs.",
)


_users_table = click.option(
    "--users-table",
    envvar="IDEM_USERS_TABLE",
    show_envvar=True,
    metavar="SCHEMA.TABLE",
    help="The host's users table the user scope references (its id integer, bigint or uuid), fixed when the "
    "store is installed [default: public.users, made empty where absent]. An installed store keeps its own: "
    "naming another is refused (moving it is not supported yet).",
)

#: What each host table idem makes is for, and how to use the host's own instead (one line each).
HOST_TABLE_LINES = {
    "public.users": "the user scope's foreign key (idempotency_keys.scope_user_id REFERENCES users(id)); it is "
    "empty: put your users there, or install with --users-table SCHEMA.TABLE (IDEM_USERS_TABLE) to use yours",
    "public.audit_log": "a replay writes one row there (user_id, action, context); make your own before the first "
    "migrate to use it instead",
}


def host_table_line(name: str) -> str:
    return f"idem migrate: made host table {name}: {HOST_TABLE_LINES.get(name, 'idem made it where absent')}"


@click.command("migrate")
@_database_url_option
@_cron_database
@_wait_timeout
@_users_table
@click.option("-q", "--quiet", is_flag=True, help="Print errors only.")
def migrate_command(
    database_url: str | None, cron_database: str | None, wait_timeout: float, users_table: str | None, quiet: bool
) -> None:
    """The DDL guard, committed (a superuser), the wait for older transactions, then role idem_app,
    migrations and functions (one transaction), then the pg_cron schedule."""
    url = _database_url(database_url)
    result = _schema().migrate(
        url,
        echo=None if quiet else click.echo,
        cron_database=cron_database,
        wait_timeout=wait_timeout,
        users_table=users_table,
    )
    for warning in result.warnings:  # even with --quiet: nothing failed, but it is a hole
        click.echo(warning, err=True)
    for name in result.host_tables:  # even with --quiet: never made silently (contract §4d)
        click.echo(host_table_line(name), err=quiet)
    if not quiet:
        click.echo(
            f"idem migrate: {len(result.applied)} migration(s) applied"
            f"{' (' + ', '.join(result.applied) + ')' if result.applied else ''}, "
            f"{result.function_files} function file(s) loaded, cleanup schedule: {result.cleanup}"
        )


@click.command("sql")
@_wait_timeout
@_users_table
def sql_command(wait_timeout: float, users_table: str | None) -> None:
    """Print the whole install or upgrade as one script for psql -v ON_ERROR_STOP=1 -f."""
    click.echo(_schema().render_sql(wait_timeout, users_table=users_table), nl=False)


@click.command("status")
@_database_url_option
@_cron_database
@_wait_timeout_option(
    10.0,
    "IDEM_STATUS_WAIT_TIMEOUT",
    "Seconds each read waits for a lock another session holds (a DBA's LOCK TABLE, a migration's ALTER "
    "TABLE). Past it, the line that needed the lock names who holds it, and the rest is printed.",
)
def status_command(database_url: str | None, cron_database: str | None, wait_timeout: float) -> None:
    """Applied migrations, SQL API versions, idem_app, the pg_cron job (exit 1 unless current)."""
    lines, current = _schema().status(_database_url(database_url), cron_database, wait_timeout)
    for line in lines:
        click.echo(line)
    sys.exit(0 if current else 1)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"idem-shim, version {_schema().package_version()}")
        ctx.exit()


@click.group(
    name="idem", cls=_IdemGroup, help="The idempotency store: install or upgrade its SQL, print it, report on it."
)
@click.option(
    "--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version, help="Show the version."
)
def main() -> None:
    """The `idem` console script."""


idempotency_cli = _FlaskGroup("idempotency", help="Operate the Idempotency-Key store.")
for _command in (migrate_command, sql_command, status_command):
    main.add_command(_command)
    idempotency_cli.add_command(_command)


@main.command("openapi")
@click.option(
    "--app",
    "app_spec",
    required=True,
    help="The Flask app as MODULE:APP, as flask --app takes it (e.g. 'examples.raptor:create_app()').",
)
def openapi_command(app_spec: str) -> None:
    """Print the OpenAPI 3.1 document of the app's idempotent routes (JSON)."""
    from flask.cli import locate_app, prepare_import

    module, _, name = app_spec.partition(":")
    try:
        with schema_check_deferred():  # the document needs the routes, not the database
            app = locate_app(prepare_import(module), name or None)
    except Exception as exc:  # an import error, a missing attribute, a factory that raised
        raise Refused(f"idem openapi: cannot load the app {app_spec!r}: {describe(exc)}") from exc
    _print_openapi(app)


def _print_openapi(app: Any) -> None:
    from .openapi import document

    spec = document(app)
    if not spec["paths"]:
        click.echo(f"idem openapi: {app.name} has no route decorated with @idempotency_key: empty paths", err=True)
    click.echo(json.dumps(spec, indent=2))


# -- the DBA's operations, under `flask idempotency` (they need the app: its URL and keys) -------


@idempotency_cli.command("openapi")
def flask_openapi() -> None:
    """Print the OpenAPI 3.1 document of this app's idempotent routes (JSON)."""
    from flask import current_app

    _print_openapi(current_app)


@idempotency_cli.command("cleanup")
@click.option(
    "--batch-size",
    default=None,
    type=click.IntRange(min=1),
    help="Rows deleted (and committed) per batch [default: the procedure's, 1000].",
)
@click.option(
    "--max-rows-per-second",
    default=None,
    type=int,
    help="The cleanup's pace [default: the procedure's, 2500]; must be positive.",
)
@click.option("--unpaced", is_flag=True, help="Delete as fast as the server can (p_max_rows_per_second => NULL).")
def cleanup(batch_size: int | None, max_rows_per_second: int | None, unpaced: bool) -> None:
    """Delete expired keys in committed batches (CALL public.idem_cleanup); same job and defaults as pg_cron's."""
    if unpaced and max_rows_per_second is not None:
        raise click.UsageError("--unpaced and --max-rows-per-second exclude each other")
    given: dict[str, int | None] = {}
    if batch_size is not None:
        given["batch_size"] = batch_size
    if max_rows_per_second is not None or unpaced:
        given["max_rows_per_second"] = max_rows_per_second
    with _admin_connection("cleanup") as conn:
        # The procedure's NOTICE (a pace too slow for the daily run) is for the operator.
        conn.add_notice_handler(
            lambda diag: click.echo(CONTROL.sub("?", f"{diag.severity}: {diag.message_primary}"), err=True)
        )
        row = conn.execute(queries.cleanup_call(given), given).fetchone()
    deleted = next(iter(row.values())) if row else 0
    click.echo(f"deleted {deleted} expired idempotency keys")


def _user_id(_ctx: click.Context, _param: click.Parameter, value: str) -> int | UUID:
    """USER_ID as the store's users table has it: an integer, or a UUID (a uuid users table)."""
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return UUID(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither an integer nor a UUID") from None


@idempotency_cli.command("erase-user")
@click.argument("user_id", callback=_user_id)
def erase_user(user_id: int | UUID) -> None:
    """Delete every key of USER_ID (GDPR erasure)."""
    with _admin_connection("erase-user") as conn:
        row = conn.execute(queries.ERASE_USER, {"user_id": user_id}).fetchone()
    erased = next(iter(row.values())) if row else 0
    click.echo(f"erased {erased} idempotency keys of user {user_id}")


@idempotency_cli.command("export-user")
@click.argument("user_id", callback=_user_id)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the JSON here instead of standard output.",
)
def export_user(user_id: int | UUID, out: str | None) -> None:
    """Print (or write) every key of USER_ID as JSON (GDPR access and portability)."""
    with (
        _admin_connection("export-user") as conn,
        contextlib.closing(get_state().store.export_user(conn, user_id)) as keys,
    ):
        if out is None:
            _write_json_array(sys.stdout, keys)
            sys.stdout.flush()
            return
        try:
            with open(out, "w", encoding="utf-8") as handle:
                written = _write_json_array(handle, keys)
        except BaseException:
            with contextlib.suppress(OSError):  # half an export is no export
                Path(out).unlink()
            raise
    click.echo(f"wrote {written} idempotency keys of user {user_id} to {out}", err=True)


_WRITE_SLICE = 1 << 20


def _write_json_array(handle: TextIO, items: Iterable[Any]) -> int:
    """Write ``items`` as ``json.dumps(list(items), indent=2, sort_keys=True)`` and a newline
    would, one item at a time (a user's keys together may not fit in memory); return how many."""
    encoder = json.JSONEncoder(indent=2, sort_keys=True, default=str)
    count = 0
    for item in items:
        handle.write(",\n  " if count else "[\n  ")
        for chunk in encoder.iterencode(item):  # a string value is one chunk, a body's size
            chunk = chunk.replace("\n", "\n  ")  # a newline inside a JSON string is escaped
            for start in range(0, len(chunk), _WRITE_SLICE):  # never encoded all at once
                handle.write(chunk[start : start + _WRITE_SLICE])
        count += 1
    handle.write("\n]\n" if count else "[]\n")
    return count


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
            raise Refused(
                "this database has no public.idem_health() yet (added by the operations migration): "
                "run the migrations, then try again"
            )
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
        raise Refused("--from-plain needs IDEM_RESPONSE_KEY (the key to encrypt under)", exit_code=2)
    if not from_plain and old_key is None:
        raise Refused(
            "set IDEM_RESPONSE_KEY_FALLBACK to the key to rotate away from "
            "(or pass --from-plain to encrypt bodies stored in clear)",
            exit_code=2,
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
    raise Refused(
        f"{total} stored responses are still {where}: the keys given do not open them. "
        "Set IDEM_RESPONSE_KEY_FALLBACK to the key they were stored under (its id is the kid shown) and run this again"
        + ("; for bodies in clear, use --from-plain" if any(kid is None for kid, _ in left) else "")
    )
