"""The schema tool's connections: a URL checked before libpq sees it, one line when it fails,
and the same server's other databases (pg_cron's)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg

from ..errors import MigrateError, describe

CONNECT_TIMEOUT_S = 10


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
        return psycopg.connect(url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S)
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
