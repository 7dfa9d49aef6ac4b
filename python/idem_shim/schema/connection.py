"""The schema tool's connections: a URL checked before libpq sees it, one line when it fails,
the same server's other databases (pg_cron's), and a pinned search_path.

Every session of the schema tool runs as the store's owner, often a superuser, in a database
whose ``public`` (and whose default ``search_path``: ``ALTER DATABASE ... SET``) may belong to
the app's role: each one pins its path to ``pg_catalog, pg_temp`` before its first statement, so
no operator, function or type it names resolves to a look-alike planted there (contract §3a). Its
own statements therefore qualify every object of ``public``."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg

from ..errors import MigrateError, describe

CONNECT_TIMEOUT_S = 10
#: The owner's sessions' path: nothing a role may create in, pg_temp last (PostgreSQL searches a
#: session's temporary schema first for types and relations unless the path names it).
#: And the literals of the SQL it runs read as written: a database's or role's
#: ``standard_conforming_strings = off`` would turn ``'\\s'`` into ``'s'`` in the function files;
#: and its answers as psycopg reads them, whatever the database's owner set there: text came back
#: as bytes under ``client_encoding = SQL_ASCII`` (every migration pending), and another
#: IntervalStyle or DateStyle cannot be parsed (a traceback); and what the server tells the DBA
#: (a NOTICE, a WARNING: a migration applied, a pace too slow) is heard, whatever
#: ``client_min_messages`` the owner set.
PIN_SEARCH_PATH = (
    "SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false),"
    " pg_catalog.set_config('standard_conforming_strings', 'on', false),"
    " pg_catalog.set_config('client_encoding', 'UTF8', false),"
    " pg_catalog.set_config('IntervalStyle', 'postgres', false),"
    " pg_catalog.set_config('DateStyle', 'ISO', false),"
    " pg_catalog.set_config('client_min_messages', 'notice', false)"
)
#: First, alone: a transaction READ ONLY DEFERRABLE (the database owner's defaults, with
#: SERIALIZABLE) waits before its first snapshot, holding no lock (so no lock_timeout bounds it),
#: until every serializable transaction open then has ended: one the owner keeps open hung every
#: session. A SET takes no snapshot.
NOT_DEFERRABLE = "SET default_transaction_deferrable = off"
#: Then, on the pinned path, the role the database's default names, undone: ``ALTER DATABASE ...
#: SET role``, which its owner may set, started every session there as that role, a superuser's
#: too (a member of every role): idem migrate made the store, idem_secret and every routine the
#: owner's, and no DDL guard. Only that default: a role the URL or the login role's own settings
#: chose stays, unless it is the very role the database's default names.
UNDO_DATABASE_ROLE = """DO $idem_session_role$
BEGIN
    IF pg_catalog.concat('role=', pg_catalog.current_setting('role')) = ANY (
        SELECT pg_catalog.unnest(s.setconfig) FROM pg_catalog.pg_db_role_setting s
         WHERE s.setrole = 0
           AND s.setdatabase = (SELECT d.oid FROM pg_catalog.pg_database d
                                 WHERE d.datname = pg_catalog.current_database()))
    THEN
        PERFORM pg_catalog.set_config('role', 'none', false);
    END IF;
END
$idem_session_role$"""


def pin_session(conn: Any) -> None:
    """What every session of the DBA's tools runs first (connect(), yoyo's, the CLI's admin verbs;
    the ``idem sql`` script says the same in SQL): in this order, each above says why."""
    conn.execute(NOT_DEFERRABLE)
    conn.execute(PIN_SEARCH_PATH)  # committed: it stays for the session
    conn.execute(UNDO_DATABASE_ROLE)


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


def connect(url: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    if not url.startswith(("postgresql://", "postgres://")):  # a conninfo string would reach libpq defaults
        raise MigrateError(f"not a PostgreSQL URL: {redact(url)} (expected postgresql://user@host:port/dbname)")
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        pin_session(conn)
        conn.autocommit = autocommit
        return conn
    except psycopg.Error as exc:
        reason = describe(exc)
        dbname = urlsplit(url).path.lstrip("/")
        missing = dbname and f'database "{dbname}" does not exist' in reason
        hint = f"; create it first: CREATE DATABASE {dbname};" if missing else ""
        raise MigrateError(f"cannot connect to {redact(url)}: {reason}{hint}") from exc
    except ValueError as exc:  # not a URL psycopg can parse
        raise MigrateError(f"not a PostgreSQL URL: {redact(url)} ({exc})") from exc


def pinned_url(url: str, conn: psycopg.Connection[Any]) -> str:
    """``url`` with its host list replaced by the one server ``conn`` reached.

    libpq's multi-host URL (``host1:p1,host2:p2/db?target_session_attrs=read-write``) picks the
    primary; yoyo cannot parse a host list, and every later connection of the migration must reach
    the same server the preflight judged, not whichever answers first next time."""
    parts = urlsplit(url)
    if "," not in parts.netloc:
        return url
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    host = conn.info.host
    host = f"[{host}]" if ":" in host else host
    return urlunsplit(parts._replace(netloc=f"{userinfo}{host}:{conn.info.port}"))
