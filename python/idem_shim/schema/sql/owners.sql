-- Before anything reads or runs idem's objects, `idem migrate`, `idem status` and the `idem sql`
-- script check that they are the store owner's, a superuser's, or the running role's (another
-- migrating role owns the routines its upgrade added). A role that owns schema public (the
-- database's owner, on PostgreSQL 15) may drop any object in it and create its own under the
-- name, and a view named like yoyo's table, a table with a trigger, a default or a policy there,
-- or a function named like idem's, would run as whoever reads or calls it next. The store's owner
-- is the owner of public.idempotency_keys, or before the first migration the role running this.
-- Reads idem.refusing ('this package', 'this script') when set.
DO $idem_owners$
DECLARE
    v_owner  constant oid := COALESCE(
        (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass('public.idempotency_keys')),
        (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user));
    v_foreign text;
BEGIN
    SELECT pg_catalog.string_agg(pg_catalog.format('%s (owned by %s)', f.what, pg_catalog.pg_get_userbyid(f.owner)),
                                 ', ' ORDER BY f.what)
      INTO v_foreign
      FROM (SELECT pg_catalog.format('%s public.%I', CASE c.relkind WHEN 'v' THEN 'view' WHEN 'S' THEN 'sequence'
                                                                    ELSE 'relation' END, c.relname) AS what,
                   c.relowner AS owner
              FROM pg_catalog.pg_class c
             WHERE c.relnamespace = 'public'::regnamespace
               AND c.relname = ANY (ARRAY['idempotency_keys', 'idempotency_events', 'idem_secret', 'idem_health',
                                          'idempotency_keys_id_seq', 'idempotency_events_id_seq',
                                          '_yoyo_migration', '_yoyo_log', '_yoyo_version', 'yoyo_lock'])
            UNION ALL
            SELECT pg_catalog.format('routine %s', p.oid::regprocedure), p.proowner
              FROM pg_catalog.pg_proc p
             WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%') f
     WHERE f.owner <> v_owner
       AND f.owner <> (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)
       AND NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = f.owner);
    IF v_foreign IS NOT NULL THEN
        RAISE EXCEPTION 'database %: % not made by the store''s owner %: a role that owns schema public may have '
            'replaced them, and % would run them with its rights; a superuser drops them and makes public the '
            'store owner''s (ALTER SCHEMA public OWNER TO %; docs/security.md); nothing was changed',
            pg_catalog.current_database(), v_foreign, pg_catalog.pg_get_userbyid(v_owner),
            COALESCE(NULLIF(pg_catalog.current_setting('idem.refusing', true), ''), 'idem'),
            pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(v_owner));
    END IF;
END
$idem_owners$;
