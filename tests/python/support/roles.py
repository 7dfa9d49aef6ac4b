"""Which role a test's URL connects as: the names say it (``admin_url``, ``app_role_url``...)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo


def as_role_option(url: str, role: str) -> str:
    """The same database seen as ``role``: ``SET ROLE`` at start-up (the ``options`` parameter),
    so no password is needed: ``url`` must be a superuser's (an ``admin_url``)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-c role={role}')}"


def as_app_role(url: str) -> str:
    """The same database seen as the least-privileged ``idem_app`` role (the request path)."""
    return as_role_option(url, "idem_app")


def as_admin_role(url: str) -> str:
    """The same database seen as ``idem_admin`` (a DBA's, pg_cron's and the CLI's admin verbs'
    role, contract §3a): cleanup, health, inspect, rotation, but not the tables nor ``p_now``."""
    return as_role_option(url, "idem_admin")


@contextmanager
def login_role(admin_url: str, member_of: str, prefix: str = "web") -> Iterator[tuple[str, str]]:
    """A real login role that is a member of ``member_of`` (a handler's role, a DBA's), and its URL:
    unlike ``as_role_option``, its session user is that role, as an attacker's would be. Dropped
    after, with whatever it left behind."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(sql.Identifier(name), sql.Identifier(member_of))
        )
    try:
        yield name, make_conninfo(admin_url, user=name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
