-- idem_guard_holds
-- The one home of "idem's DDL guard holds" (985's event triggers): schema/sql/owners.sql and
-- idem_cleanup ask it before they accept a public another role owns. Its drop and schema
-- triggers exist, fire always and call a function of schema idem_guard, which a superuser owns.
-- A SQL-standard body: every name and operator is bound when it is made (the install's pinned
-- search_path), never by a caller's; the function's own search_path is pinned all the same.
-- Made only where a superuser migrates, in the guard's schema (which 985 has just checked is a
-- superuser's; no other role may create there): its callers first check, in pg_catalog alone,
-- that this function and its schema are a superuser's and that no other role may create there,
-- because where no superuser migrated the database's owner may make a schema idem_guard and a
-- look-alike in it. Before the first superuser's migrate there is none: the guard does not hold.
DO $idem_guard_holds$
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user)
       OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n, pg_catalog.pg_roles r
                       WHERE n.nspname OPERATOR(pg_catalog.=) 'idem_guard' AND r.oid OPERATOR(pg_catalog.=) n.nspowner
                         AND r.rolsuper) THEN
        RETURN;
    END IF;
    CREATE OR REPLACE FUNCTION idem_guard.idem_guard_holds()
    RETURNS pg_catalog.bool
    LANGUAGE sql
    STABLE
    SET search_path = pg_catalog, pg_temp
    RETURN (SELECT pg_catalog.count(*) >= 2
              FROM pg_catalog.pg_event_trigger e
              JOIN pg_catalog.pg_proc p ON p.oid = e.evtfoid
              JOIN pg_catalog.pg_namespace gn ON gn.oid = p.pronamespace
              JOIN pg_catalog.pg_roles gr ON gr.oid = gn.nspowner
             WHERE (e.evtname, e.evtevent) IN (('idem_guard_drop', 'sql_drop'), ('idem_guard_schema', 'ddl_command_end'))
               AND e.evtenabled = 'A' AND gn.nspname = 'idem_guard' AND gr.rolsuper);
    REVOKE ALL ON FUNCTION idem_guard.idem_guard_holds() FROM PUBLIC;
    GRANT EXECUTE ON FUNCTION idem_guard.idem_guard_holds() TO PUBLIC;  -- whoever migrates or cleans up asks it
    COMMENT ON FUNCTION idem_guard.idem_guard_holds IS
        'idem: whether idem''s DDL guard holds (its event triggers idem_guard_drop and idem_guard_schema fire always, '
        'through a function of this superuser''s schema): a public another role owns is then safe for '
        'schema/sql/owners.sql and idem_cleanup, which trust this function only if a superuser owns it and its schema, '
        'where no other role may create. Errors: none.';
END
$idem_guard_holds$;
