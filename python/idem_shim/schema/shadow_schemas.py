"""Schemas that shadow a role's ``"$user"``, for ``idem migrate`` and ``idem status``.

Every session starts with ``search_path = "$user", public``: a schema named like a role comes first
on that role's path. Where another role owns it (the database's owner, who made ``CREATE SCHEMA
postgres``), what that role makes there runs in place of what the first role meant: an unqualified
name its DBA types finds the owner's object first, with the DBA's rights. idem's DDL guard refuses
idem's names there (sql/functions/985), but not every name a DBA types is idem's. One warning line
per such schema, with the statements that close it; the verbs' exit codes are unchanged. A schema
a superuser owns, or a role that may already act as the named role, is no one's way up.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

from ..errors import CONTROL

_SHADOWS: Final = """
SELECT pg_catalog.quote_ident(n.nspname), pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(w.owner)),
       pg_catalog.quote_ident(n.nspname OPERATOR(pg_catalog.||) '_' OPERATOR(pg_catalog.||)
                              pg_catalog.pg_get_userbyid(w.owner))
  FROM pg_catalog.pg_namespace n
  JOIN pg_catalog.pg_roles r ON r.rolname OPERATOR(pg_catalog.=) n.nspname
  CROSS JOIN LATERAL (  -- public's, and a schema handed to pg_database_owner: the database's owner
       SELECT CASE WHEN n.nspowner OPERATOR(pg_catalog.=) 'pg_database_owner'::pg_catalog.regrole::pg_catalog.oid
                   THEN (SELECT d.datdba FROM pg_catalog.pg_database d
                          WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                   ELSE n.nspowner END AS owner) w
  JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) w.owner
 WHERE w.owner OPERATOR(pg_catalog.<>) r.oid AND NOT o.rolsuper
   AND NOT pg_catalog.pg_has_role(w.owner, r.oid, 'MEMBER')
 ORDER BY n.nspname COLLATE "C"
"""


def shadow_schemas(conn: psycopg.Connection[Any]) -> list[str]:
    """One warning line per schema named like a role that another (not a superuser) owns."""
    return [
        # names are their makers' text: a control character would start a line of the report's own
        CONTROL.sub(
            "?",
            f'idem: WARNING: schema {schema} is named like role {schema} and owned by {owner}: "$user" puts it '
            f"first on {schema}'s search_path, so an unqualified name {schema} types may run {owner}'s code with "
            f"{schema}'s rights; as a superuser: ALTER SCHEMA {schema} RENAME TO {renamed}; "
            f"(or ALTER ROLE {schema} SET search_path = pg_catalog, public;) (docs/security.md)",
        )
        for schema, owner, renamed in conn.execute(_SHADOWS).fetchall()
    ]
