"""Who besides the store's owner may create in ``public``, for ``idem migrate`` and ``idem status``.

A role that *owns* ``public`` (the app's role where it owns the database) could drop idem's objects
and make its own under their names: idem's DDL guard (sql/functions/985, made when a superuser
migrates) refuses that, and without it schema/sql/owners.sql refuses such a ``public``. A role that
may only create there cannot replace them, and every idem routine pins its path, qualifies its names
and types its calls exactly (so no overload wins), so what it plants is never used; both verbs
still say so, in one line with the statement that closes the door, when ``PUBLIC`` or a member of
``idem_app`` may create in ``public`` (contract §3a).
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
              ORDER BY 1) AS members,
       (SELECT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(
                   CASE WHEN n.nspowner = 'pg_database_owner'::pg_catalog.regrole::pg_catalog.oid THEN d.datdba
                        ELSE n.nspowner END))
          FROM pg_catalog.pg_namespace n, pg_catalog.pg_database d
         WHERE n.nspname = 'public' AND d.datname = pg_catalog.current_database()) AS owner,
       (SELECT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(c.relowner)) FROM pg_catalog.pg_class c
         WHERE c.oid = pg_catalog.to_regclass('public.idempotency_keys')) AS store_owner"""


def writable_public(conn: psycopg.Connection[Any]) -> str | None:
    """The warning line, or None when only the migrating role and superusers may create in public."""
    row = conn.execute(_WHO, {"app": APP_ROLE}).fetchone()
    if row is None:
        return None
    by_public, members, owner, store_owner = row
    members = [] if by_public else members
    if not by_public and not members:
        return None
    who = (["PUBLIC (every role)"] if by_public else []) + [f"{m} (a member of {APP_ROLE})" for m in members]
    # the owner of public cannot be revoked from: it is handed over instead
    revoke = ", ".join((["PUBLIC"] if by_public else []) + [m for m in members if m != owner])
    fixes = [f"REVOKE CREATE ON SCHEMA public FROM {revoke};"] if revoke else []
    if owner in members and store_owner:
        fixes.insert(0, f"ALTER SCHEMA public OWNER TO {store_owner}; GRANT USAGE ON SCHEMA public TO {owner};")
    return (
        f"idem: WARNING: schema public is writable by {'; '.join(who)}: it may plant objects beside idem's "
        "(none of idem's routines uses them, and idem's DDL guard keeps its own from being dropped or "
        "replaced, but a host's own code may use them); unless its own migrations create tables there: "
        f"{' '.join(fixes)} (docs/security.md)"
    )
