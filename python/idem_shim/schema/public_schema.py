"""Who besides the store's owner may create in ``public``, for ``idem migrate`` and ``idem status``.

A role that *owns* ``public`` is refused before anything runs (schema/sql/owners.sql): it may drop
and replace idem's objects. A role that may only create there cannot replace them, and every idem
routine pins its path, qualifies its names and types its calls exactly (so no overload wins), so
what it plants is never used; both verbs still say so, in one line with the statement that
closes the door, when ``PUBLIC`` or a member of ``idem_app`` may create in ``public`` (SPEC §3a).
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

from .preflight import APP_ROLE

_WHO: Final = """
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
                WHERE n.nspname = 'public' AND a.grantee = 0 AND a.privilege_type = 'CREATE') AS by_public,
       ARRAY(SELECT pg_catalog.quote_ident(r.rolname) FROM pg_catalog.pg_roles r
              WHERE NOT r.rolsuper AND r.rolname OPERATOR(pg_catalog.<>) current_user
                AND pg_catalog.pg_has_role(r.oid, pg_catalog.to_regrole(%(app)s)::pg_catalog.oid, 'MEMBER')
                AND pg_catalog.has_schema_privilege(r.oid, 'public', 'CREATE')
              ORDER BY 1) AS members"""


def writable_public(conn: psycopg.Connection[Any]) -> str | None:
    """The warning line, or None when only the migrating role and superusers may create in public."""
    row = conn.execute(_WHO, {"app": APP_ROLE}).fetchone()
    if row is None:
        return None
    by_public, members = row
    members = [] if by_public else members
    if not by_public and not members:
        return None
    who = (["PUBLIC (every role)"] if by_public else []) + [f"{m} (a member of {APP_ROLE})" for m in members]
    revoke = ", ".join((["PUBLIC"] if by_public else []) + members)
    return (
        f"idem: WARNING: schema public is writable by {'; '.join(who)}: it may plant objects beside idem's "
        "(none of idem's routines uses them, but a host's own code may); unless its own migrations create "
        f"tables there: REVOKE CREATE ON SCHEMA public FROM {revoke}; (docs/security.md)"
    )
