"""Before anything is written: what the database holds (``read_state``) and the refusals of
``schema/sql/preflight.sql``, the one preflight ``idem migrate`` runs and ``idem sql`` embeds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg
from psycopg import errors as pg_errors

from ..errors import MigrateError
from ..queries import EXPECTED_SCHEMA_VERSION, SCHEMA_VERSION
from . import citus
from .files import package_version, tool_sql
from .shape import store_shape

APP_ROLE = "idem_app"
#: The DBA's role (cleanup, rotation, inspect, health, scheduling: contract §3a).
ADMIN_ROLE = "idem_admin"
#: The GDPR job's role (a data subject's export and erasure) and a metrics exporter's (the health
#: aggregates); all four NOLOGIN, cluster-wide.
DSR_ROLE = "idem_dsr"
MONITOR_ROLE = "idem_monitor"
ROLES = (APP_ROLE, ADMIN_ROLE, DSR_ROLE, MONITOR_ROLE)
#: The migration that creates the store: recorded means the table is idem's own.
STORE_MIGRATION = "0002.idempotency-keys"

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


def refuse_foreign_objects(conn: psycopg.Connection[Any], unchanged: str | None = None) -> None:
    """Refuse a database where an object under one of idem's names was made by another role than
    the store's owner (schema/sql/owners.sql), before anything reads or calls one of them;
    ``unchanged``: how a refusal ends, set for the transaction (else the caller set it)."""
    try:
        with conn.transaction():
            if unchanged is not None:
                for name, value in preflight_settings("this package", unchanged).items():
                    conn.execute("SELECT pg_catalog.set_config(%s, %s, true)", (name, value))
            conn.execute(tool_sql("owners.sql"))
    except pg_errors.RaiseException as exc:
        raise MigrateError(str(exc.diag.message_primary)) from exc


#: Whether ``public`` has a routine of that name and every one so named is one this session may
#: call: the store owner's (of public.idempotency_keys), a superuser's or this role's, as
#: owners.sql trusts (by name: a call picks among the overloads).
_TRUSTED_ROUTINE: LiteralString = """\
WITH named AS (
  SELECT r.rolsuper OR r.rolname OPERATOR(pg_catalog.=) current_user
         OR r.oid OPERATOR(pg_catalog.=) (SELECT c.relowner FROM pg_catalog.pg_class c
                                            WHERE c.oid OPERATOR(pg_catalog.=)
                                                  pg_catalog.to_regclass('public.idempotency_keys')) AS trusted
    FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner
   WHERE p.pronamespace OPERATOR(pg_catalog.=) 'public'::pg_catalog.regnamespace
     AND p.proname OPERATOR(pg_catalog.=) %s)
SELECT EXISTS (SELECT 1 FROM named) AND NOT EXISTS (SELECT 1 FROM named WHERE named.trusted IS NOT TRUE)"""


def trusted_routine(conn: psycopg.Connection[Any], name: str) -> bool:
    """Whether ``public.<name>`` may be called: it exists, and only trusted roles made routines
    under that name. Asked right before the call, not only by owners.sql earlier: before the
    first install no DDL guard holds idem's names, and one the database's owner committed after
    that check ran as the caller (tests/python/sql/test_sec_check_then_call.py). Once asked, only
    their owner or a superuser may drop or replace them, so the call finds one of them."""
    row = conn.execute(_TRUSTED_ROUTINE, (name,)).fetchone()
    return bool(row and row[0])


#: Who owns yoyo's record of the migrations, and whether the session's role is the app's.
_YOYO_OWNER = """\
SELECT pg_catalog.pg_get_userbyid(c.relowner) AS owner,
       pg_catalog.pg_has_role(session_user, %s, 'MEMBER') AS is_app
  FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) 'public._yoyo_migration'::pg_catalog.regclass"""


def _not_the_owner(conn: psycopg.Connection[Any], username: str, unchanged: str | None) -> MigrateError:
    """The one line for a role that may not read yoyo's record (the app's, typically): the role
    these verbs need, not the server's ``permission denied for table _yoyo_migration``."""
    row = conn.execute(_YOYO_OWNER, (APP_ROLE,)).fetchone()
    owner, is_app = (str(row[0]), bool(row[1])) if row else ("the store's owner", False)
    who = f"{username} (a member of {APP_ROLE}: the app's role, which may only call the request path)"
    return MigrateError(
        f"role {who if is_app else username} may not read public._yoyo_migration: idem migrate and idem status "
        f"run as the store's owner, {owner} (or a superuser); pass --database-url with its URL"
        + (f"; {unchanged}" if unchanged else "")
    )


#: Whether that relation is a plain table (reading one runs no code of its owner's).
PLAIN_TABLE: LiteralString = """SELECT c.relkind OPERATOR(pg_catalog.=) 'r' FROM pg_catalog.pg_class c
 WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(%s)"""


def read_state(conn: psycopg.Connection[Any], unchanged: str | None = None) -> DatabaseState:
    """What the database holds; ``unchanged``: how a refusal ends (migrate's preflight)."""
    refuse_foreign_objects(conn)
    row = conn.execute(_STATE, (list(ROLES), len(ROLES))).fetchone()
    assert row is not None
    dbname, username, has_store, has_yoyo, has_version, has_role = row
    version: int | None = None
    if has_version:
        # from its body, never by calling it: a routine the database's owner committed after
        # owners.sql's check (before the first install no DDL guard holds idem's names) would
        # run as this role (tests/python/sql/test_sec_check_then_call.py)
        got = conn.execute(SCHEMA_VERSION).fetchone()
        version = int(got[0]) if got and got[0] is not None else None
    applied: dict[str, str] = {}
    if has_yoyo:
        try:
            with conn.transaction():
                # a plain table only, locked first: a view's functions would run as this role
                # (preflight.sql says why)
                conn.execute("LOCK TABLE public._yoyo_migration IN ACCESS SHARE MODE")
                if conn.execute(PLAIN_TABLE, ("public._yoyo_migration",)).fetchone() != (True,):
                    raise MigrateError(
                        f"database {dbname}: public._yoyo_migration is not a table: idem reads yoyo's record only "
                        "from a table (a view's code would run as this role); a superuser drops it"
                        + (f"; {unchanged}" if unchanged else "")
                    )
                rows = conn.execute(
                    "SELECT migration_id, applied_at_utc::text FROM public._yoyo_migration ORDER BY applied_at_utc"
                ).fetchall()
        except pg_errors.InsufficientPrivilege as exc:
            raise _not_the_owner(conn, str(username), unchanged) from exc
        for mid, when in rows:
            applied[str(mid)] = str(when)
    return DatabaseState(str(dbname), str(username), bool(has_store), bool(has_role), version, applied)


#: How a refusal ends: before anything is written, and once idem's DDL guard is committed (a
#: superuser migrating commits it in a transaction of its own before the install's).
UNCHANGED = "nothing was changed"
GUARD_ONLY = "nothing but idem's DDL guard (committed first) was changed"


def preflight_settings(refusing: str, unchanged: str = UNCHANGED) -> dict[str, str]:
    """The arguments preflight.sql, owners.sql and roles.sql read (``idem.*`` settings); ``refusing``: who
    says no; ``unchanged``: how their refusals end."""
    return {
        "idem.expected_version": str(EXPECTED_SCHEMA_VERSION),
        "idem.package": package_version(),
        "idem.refusing": refusing,
        "idem.unchanged": unchanged,
        "idem.store_migration": STORE_MIGRATION,
        "idem.store_shape": store_shape().as_json(),
        "idem.roles": ",".join(ROLES),  # roles.sql's
    }


def refuse_read_only(conn: psycopg.Connection[Any]) -> None:
    """A standby (in recovery) or a server that is read-only by default: nothing can be written
    there, so say so in one line before yoyo tries and fails half-way through its own tables."""
    row = conn.execute(
        "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_read_only') = 'on'"
    ).fetchone()
    if row and (row[0] or row[1]):
        where = f"{conn.info.host}:{conn.info.port}"
        what = "a standby in recovery" if row[0] else "default_transaction_read_only is on"
        raise MigrateError(
            f"{where} is a read-only server ({what}): point idem migrate at the primary (a multi-host "
            "URL with target_session_attrs=read-write finds it); nothing was changed"
        )


def preflight(conn: psycopg.Connection[Any], unchanged: str = UNCHANGED) -> DatabaseState:
    """Refuse, before anything is written, what `idem migrate` must not touch; ``unchanged``: how
    a refusal ends (GUARD_ONLY once the DDL guard is committed)."""
    for name, value in preflight_settings("this package", unchanged).items():
        # is_local inside a transaction (the migration's), for the session otherwise
        conn.execute("SELECT pg_catalog.set_config(%s, %s, %s)", (name, value, not conn.autocommit))
    refuse_read_only(conn)
    state = read_state(conn, unchanged)
    if citus.has_citus(conn):  # the store distributes: what the host must do first (said before
        # the host check of preflight.sql, whose complaints a distributed users table explains)
        todo = citus.problems(conn)
        if todo:
            raise MigrateError(
                f"database {state.dbname} has the citus extension, and the store cannot be distributed yet: "
                + "; ".join(todo)
                + f"; {unchanged} (see docs/scaling.md)"
            )
    try:
        with conn.transaction():
            conn.execute(tool_sql("preflight.sql"))
    except pg_errors.RaiseException as exc:
        raise MigrateError(str(exc.diag.message_primary)) from exc
    return state
