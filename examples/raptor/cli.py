"""Raptor's operator commands, as `flask --app examples.raptor raptor …` or, without building
the app (no database check at start-up), `python -m examples.raptor …`.

    init-db     create Raptor's tables and its login role raptor_web (needs the project's
                migrations first: `make migrate`); prints the URL the app should use
    seed-user   create a user with cash (and an LCC leg); prints a bearer token
    set-mode    switch a user between paper and live trading
    app-url     print the app's URL (raptor_web) for an admin DATABASE_URL
    credit-cash credit a user's cash exactly once per --key (idem_shim.idempotent(), contract §4c)

Every command takes --database-url (default: RAPTOR_ADMIN_DATABASE_URL, then DATABASE_URL),
a role allowed to create tables and roles.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import click
import psycopg
from psycopg import sql

from .settings import APP_ROLE

SCHEMA = Path(__file__).with_name("schema.sql")
TOKEN_DAYS = 30


def _admin_url(url: str | None) -> str:
    url = url or os.environ.get("RAPTOR_ADMIN_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if not url:
        raise click.UsageError("no database: pass --database-url or set DATABASE_URL")
    return url


def app_url(admin_url: str, password: str | None = None) -> str:
    """The same server and database, logged in as raptor_web."""
    parts = urlsplit(admin_url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise click.UsageError("--database-url must be a postgresql:// URL")
    host = parts.netloc.rpartition("@")[2]
    user = APP_ROLE if password is None else f"{APP_ROLE}:{quote(password, safe='')}"
    return urlunsplit((parts.scheme, f"{user}@{host}", parts.path, parts.query, parts.fragment))


database_option = click.option(
    "--database-url", "database_url", default=None, help="admin URL (default: RAPTOR_ADMIN_DATABASE_URL, DATABASE_URL)"
)


@click.group("raptor")
def raptor_cli() -> None:
    """Raptor: database set-up and users."""


def init_db(admin_url: str, password: str | None = None) -> None:
    with psycopg.connect(admin_url) as conn:
        missing = conn.execute(
            "SELECT array_agg(n) FROM unnest(ARRAY['public.users', 'public.audit_log', "
            "'public.idempotency_keys']) AS n WHERE to_regclass(n) IS NULL"
        ).fetchone()[0]
        roles = conn.execute(
            "SELECT count(*) = 2 FROM pg_roles WHERE rolname IN ('idem_app', 'idem_monitor')"
        ).fetchone()[0]
        if missing or not roles:
            raise click.ClickException(
                f"the idem migrations are not applied here (missing: {missing or ['idem_app', 'idem_monitor']}):"
                " run `idem migrate` (make migrate) first"
            )
        # Roles are cluster-wide: serialise concurrent init-db runs on one server.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('raptor init-db'))")
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,)).fetchone():
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(APP_ROLE)))
        conn.execute(sql.SQL("GRANT idem_app TO {}").format(sql.Identifier(APP_ROLE)))
        # /metrics' store gauges read idem_health (aggregates: no key, user, hash or body), which
        # idem_app may not (contract §3a): the monitoring role holds that and nothing more.
        conn.execute(sql.SQL("GRANT idem_monitor TO {}").format(sql.Identifier(APP_ROLE)))
        # Bind parameters can carry the response key (IDEM_RESPONSE_KEY), and the server logs
        # them beside a slow or failed statement unless told not to. Superuser-only settings.
        if conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]:
            for setting in ("log_parameter_max_length", "log_parameter_max_length_on_error"):
                conn.execute(
                    sql.SQL("ALTER ROLE {} SET {} = 0").format(sql.Identifier(APP_ROLE), sql.Identifier(setting))
                )
        else:
            click.echo(
                f"init-db: not a superuser; have one run: ALTER ROLE {APP_ROLE} SET "
                "log_parameter_max_length = 0 (and log_parameter_max_length_on_error = 0)",
                err=True,
            )
        if password is not None:
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(APP_ROLE), sql.Literal(password)))
        conn.execute(SCHEMA.read_text())


@raptor_cli.command("init-db")
@database_option
@click.option(
    "--password",
    envvar="RAPTOR_DB_PASSWORD",
    default=None,
    help="set raptor_web's password (default: none; env RAPTOR_DB_PASSWORD)",
)
def init_db_command(database_url: str | None, password: str | None) -> None:
    """Create Raptor's schema and the raptor_web role; print the app's URL."""
    url = _admin_url(database_url)
    init_db(url, password)
    click.echo(app_url(url, password))


def seed_user(
    admin_url: str, email: str | None = None, cash_cents: int = 10_000_000, mode: str = "paper", with_leg: bool = True
) -> dict:
    from .auth import new_token

    token, digest = new_token()
    with psycopg.connect(admin_url) as conn:
        (user_id,) = conn.execute("INSERT INTO public.users (email) VALUES (%s) RETURNING id", (email,)).fetchone()
        conn.execute(
            "INSERT INTO raptor.accounts (user_id, trading_mode, cash_cents) VALUES (%s, %s, %s)",
            (user_id, mode, cash_cents),
        )
        conn.execute(
            "INSERT INTO raptor.sessions (token_sha256, user_id, expires_at) "
            "VALUES (%s, %s, now() + %s * interval '1 day')",
            (digest, user_id, TOKEN_DAYS),
        )
        leg_id = None
        if with_leg:
            expiry = dt.date.today() + dt.timedelta(days=30)
            (leg_id,) = conn.execute(
                "INSERT INTO raptor.lcc_legs (user_id, underlying, expiry, strike_cents, "
                "contracts, status) VALUES (%s, 'AAPL', %s, 20000, 1, 'open') RETURNING id",
                (user_id, expiry),
            ).fetchone()
    return {"user_id": user_id, "token": token, "lcc_leg_id": leg_id, "cash_cents": cash_cents}


@raptor_cli.command("seed-user")
@database_option
@click.option("--email", default=None, help="the user's email (default: none)")
@click.option("--cash-cents", default=10_000_000, show_default=True, type=int)
@click.option("--mode", type=click.Choice(["paper", "live"]), default="paper", show_default=True)
@click.option("--leg/--no-leg", default=True, show_default=True, help="open one LCC leg")
@click.option("--json", "as_json", is_flag=True, help="print user id, token and leg id as JSON")
def seed_user_command(
    database_url: str | None, email: str | None, cash_cents: int, mode: str, leg: bool, as_json: bool
) -> None:
    """Create a user with a paper account; print a bearer token for it."""
    user = seed_user(_admin_url(database_url), email, cash_cents, mode, leg)
    if as_json:
        click.echo(json.dumps(user))
    else:
        click.echo(f"user {user['user_id']} (LCC leg {user['lcc_leg_id']}); token:", err=True)
        click.echo(user["token"])


def set_mode(admin_url: str, user_id: int, mode: str) -> None:
    with psycopg.connect(admin_url) as conn:
        cur = conn.execute("UPDATE raptor.accounts SET trading_mode = %s WHERE user_id = %s", (mode, user_id))
        if cur.rowcount != 1:
            raise click.ClickException(f"no account for user {user_id}")


@raptor_cli.command("set-mode")
@database_option
@click.argument("user_id", type=int)
@click.argument("mode", type=click.Choice(["paper", "live"]))
def set_mode_command(database_url: str | None, user_id: int, mode: str) -> None:
    """Switch USER_ID to paper or live trading (live orders are refused by the gate)."""
    set_mode(_admin_url(database_url), user_id, mode)
    click.echo(f"user {user_id}: {mode}")


@raptor_cli.command("app-url")
@database_option
@click.option("--password", envvar="RAPTOR_DB_PASSWORD", default=None)
def app_url_command(database_url: str | None, password: str | None) -> None:
    """Print the URL the app connects with (raptor_web on the same database)."""
    click.echo(app_url(_admin_url(database_url), password))


# -- operator tooling through idem_shim.idempotent(): the same exactly-once as a request -------------

CREDIT = """
WITH c AS (
    UPDATE raptor.accounts SET cash_cents = cash_cents + %(cents)s
     WHERE user_id = %(user_id)s
    RETURNING cash_cents
), a AS (
    INSERT INTO public.audit_log (user_id, action, context)
    SELECT %(user_id)s, 'cash_credited',
           jsonb_build_object('cents', %(cents)s::bigint, 'reason', %(reason)s::text, 'ticket', %(key)s::text)
      FROM c
)
SELECT cash_cents FROM c
"""


def credit_cash(url: str, key: str, user_id: int, cents: int, reason: str) -> dict:
    """Credit a user's cash once per KEY (an operator's ticket id): a re-run, a double click or a
    script retried after a timeout gets the first run's result and credits nothing more.

    on_failure="release": the work is one statement in this database, so a failed run (no such
    account) leaves nothing behind and may be re-run with the same key once fixed."""
    from idem_shim import connection, idempotent

    if cents <= 0:
        raise click.BadParameter("must be positive", param_hint="--cents")
    with psycopg.connect(url) as conn:

        @idempotent(scope="raptor.cash_credit", db=conn, key="key", user="user_id", on_failure="release")
        def credit(key: str, user_id: int, cents: int, reason: str) -> dict:
            row = (
                connection()
                .execute(CREDIT, {"key": key, "user_id": user_id, "cents": cents, "reason": reason})
                .fetchone()
            )
            if row is None:
                raise click.ClickException(f"no account for user {user_id}")
            return {"user_id": user_id, "credited_cents": cents, "cash_cents": row[0], "ticket": key}

        return credit(key=key, user_id=user_id, cents=cents, reason=reason)


@raptor_cli.command("credit-cash")
@database_option
@click.option("--key", required=True, help="the operation's idempotency key (a UUID: the ticket's)")
@click.option("--user-id", required=True, type=int)
@click.option("--cents", required=True, type=int)
@click.option("--reason", default="operator credit", show_default=True)
def credit_cash_command(database_url: str | None, key: str, user_id: int, cents: int, reason: str) -> None:
    """Credit USER's cash by CENTS exactly once per --key; print the (first) result as JSON."""
    from idem_shim import DuplicateError

    try:
        result = credit_cash(_admin_url(database_url), key, user_id, cents, reason)
    except (DuplicateError, ValueError, TypeError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(result))
