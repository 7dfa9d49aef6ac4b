"""Who besides the store's owner may create in ``public``, for ``idem migrate`` and ``idem status``.

idem's routines live in ``public`` and every one of them pins its path (or resolves its names
when it is created), so what a role plants there is never used by them. What no path can stop is
a role that *owns* ``public`` (on PostgreSQL 15, the database's owner does, through
``pg_database_owner``): it may drop any object in it and create its own under the same name,
which the store's owner, pg_cron and a DBA then run with their rights. So both verbs say, in one
line with the statements that fix it, when ``public`` is owned by a role other than the migrating one
(and no superuser), or writable by ``PUBLIC`` or by a member of ``idem_app`` (SPEC §3a).
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

from .preflight import APP_ROLE

_WHO: Final = """
WITH s AS (
    SELECT CASE WHEN n.nspowner = 'pg_database_owner'::pg_catalog.regrole THEN d.datdba
                ELSE n.nspowner END AS owner,
           n.nspowner = 'pg_database_owner'::pg_catalog.regrole AS through_database,
           EXISTS (SELECT 1 FROM pg_catalog.aclexplode(n.nspacl) a
                    WHERE a.grantee = 0 AND a.privilege_type = 'CREATE') AS by_public
      FROM pg_catalog.pg_namespace n, pg_catalog.pg_database d
     WHERE n.nspname = 'public' AND d.datname = pg_catalog.current_database())
SELECT (SELECT pg_catalog.quote_ident(r.rolname) FROM pg_catalog.pg_roles r
         WHERE r.oid = s.owner AND NOT r.rolsuper AND r.rolname OPERATOR(pg_catalog.<>) current_user) AS owner,
       s.through_database,
       s.by_public,
       ARRAY(SELECT pg_catalog.quote_ident(r.rolname) FROM pg_catalog.pg_roles r
              WHERE NOT r.rolsuper AND r.rolname OPERATOR(pg_catalog.<>) current_user
                AND pg_catalog.pg_has_role(r.oid, pg_catalog.to_regrole(%(app)s)::pg_catalog.oid, 'MEMBER')
                AND pg_catalog.has_schema_privilege(r.oid, 'public', 'CREATE')
              ORDER BY 1) AS members,
       pg_catalog.quote_ident(current_user) AS me
  FROM s"""


def writable_public(conn: psycopg.Connection[Any]) -> str | None:
    """The warning line, or None when only the migrating role and superusers may create in public."""
    row = conn.execute(_WHO, {"app": APP_ROLE}).fetchone()
    if row is None:
        return None
    owner, through_database, by_public, members, me = row
    members = [] if by_public else [m for m in members if m != owner]
    if owner is None and not by_public and not members:
        return None
    who: list[str] = []
    if owner is not None:
        where = "the database, and so public" if through_database else "public"
        who.append(f"{owner} (it owns {where}, so it may drop and replace idem's functions)")
    if by_public:
        who.append("PUBLIC (every role)")
    who += [f"{m} (a member of {APP_ROLE})" for m in members]
    fix = f"ALTER SCHEMA public OWNER TO {me}; " if owner is not None else ""
    revoke = ", ".join((["PUBLIC"] if by_public else []) + ([owner] if owner is not None else []) + members)
    return (
        f"idem: WARNING: schema public is writable by {'; '.join(who)}: the store's owner, pg_cron and a DBA "
        f"run idem's functions from it; fix: {fix}REVOKE CREATE ON SCHEMA public FROM {revoke}; (docs/security.md)"
    )
