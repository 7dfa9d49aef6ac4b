-- idem_ddl_guard
-- idem's objects live in public, and a role that owns public (the app's login role where it
-- owns its database: PostgreSQL 15 gives public to the database's owner) may drop any object
-- there and create its own under the same name, or an overload beside it; the definers, the cleanup
-- and pg_cron would then run that code with the store owner's rights (or fail to choose, 42725).
-- And a role that owns any schema may make there what a person's unqualified name finds first: a
-- schema named like a DBA's role comes first on its path ("$user", public), so a look-alike of
-- idem_erase_user there runs with a superuser's rights.
-- Four event triggers, which only a superuser can create, alter or drop, refuse that DDL to every
-- role but superusers and the store's owner: dropping an object under one of idem's or yoyo's
-- names in public (idem_*, and the indexes and constraints named idx_idem_*, uq_idem_*, ck_idem_*;
-- or audit_log, which the replay writes as the owner), and renaming, handing over or dropping the
-- schema that holds the store; making, renaming or moving a routine into public under the name of
-- one of the store owner's or pgcrypto's routines there; and, in any schema (pg_temp too), making,
-- renaming or moving a routine, type, domain or relation (its row type) under one of idem's names
-- (idem_*, idempotency_keys*, idempotency_events*), or an operator on one of idem's types.
-- Installed whenever a superuser migrates, first and in a transaction of its own
-- (schema/sql/guard_wait.sql says why, and what follows); a non-superuser cannot create event
-- triggers, so without one schema/sql/owners.sql and idem_cleanup refuse a public another role owns.
DO $idem_guard$
BEGIN
    IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN
        RETURN;
    END IF;
    -- GUARD: the guard's own schema is a superuser's (a planted one would let its owner replace the guard)
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n, pg_catalog.pg_roles r
                WHERE n.nspname OPERATOR(pg_catalog.=) 'idem_guard' AND r.oid OPERATOR(pg_catalog.=) n.nspowner
                  AND NOT r.rolsuper) THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = 'idem_ddl_guard: schema idem_guard exists and is not a superuser''s: idem cannot trust the guard it would hold',
            HINT = 'as a superuser, remove schema idem_guard and what it holds; then idem migrate';
    END IF;
    CREATE SCHEMA IF NOT EXISTS idem_guard;
    -- Every role reads who the store's owner is (the guard runs as the role whose DDL it judges);
    -- only its superuser creates in this schema or writes that row.
    REVOKE ALL ON SCHEMA idem_guard FROM PUBLIC;
    GRANT USAGE ON SCHEMA idem_guard TO PUBLIC;
    -- The store's owner, besides superusers, may still drop and replace idem's objects (its own
    -- migrations and rollbacks do); recorded here because the store's table may be what is dropped.
    CREATE TABLE IF NOT EXISTS idem_guard.store_owner (owner pg_catalog.oid NOT NULL);
    REVOKE ALL ON idem_guard.store_owner FROM PUBLIC;
    GRANT SELECT ON idem_guard.store_owner TO PUBLIC;
    DELETE FROM idem_guard.store_owner WHERE true;
    INSERT INTO idem_guard.store_owner (owner)
    SELECT COALESCE((SELECT c.relowner FROM pg_catalog.pg_class c
                      WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('public.idempotency_keys')),
                    (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user));

    CREATE OR REPLACE FUNCTION idem_guard.idem_ddl_guard()
    RETURNS event_trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $f$
    DECLARE
        v_what pg_catalog.text;
        -- the names that are idem's in any schema: its routines', types', relations' (row types)
        v_names constant pg_catalog.text := '^(idem_|idempotency_(keys|events))';
    BEGIN
        IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)
           OR pg_catalog.pg_has_role(current_user, (SELECT s.owner FROM idem_guard.store_owner s), 'USAGE') THEN
            RETURN;
        END IF;
        IF TG_EVENT = 'sql_drop' THEN
            SELECT pg_catalog.format('%s%s', pg_catalog.string_agg(pg_catalog.format('%s %s', d.object_type, d.object_identity), ', ')
                                                   FILTER (WHERE d.n <= 3),
                                     CASE WHEN pg_catalog.count(*) > 3 THEN pg_catalog.format(' and %s more', pg_catalog.count(*) - 3) END)
              INTO v_what
              FROM (SELECT o.object_type, o.object_identity, pg_catalog.row_number() OVER () AS n
              FROM pg_catalog.pg_event_trigger_dropped_objects() o
             WHERE o.schema_name = 'public' AND o.object_type <> 'schema'
               AND EXISTS (SELECT 1 FROM pg_catalog.unnest(o.address_names[2:]) AS a(name)
                            WHERE a.name ~ '(^|_)idem' OR pg_catalog.starts_with(a.name, '_yoyo')
                               OR a.name = ANY (ARRAY['yoyo_lock', 'audit_log']))
                OR (o.object_type = 'schema' AND o.object_identity = 'public')) d
            HAVING pg_catalog.count(*) > 0;
        ELSE
            WITH made AS (
                -- the routines a command made, renamed or moved, and those PostgreSQL makes with a
                -- range type: constructors under the range's and the multirange's names, in their
                -- schemas, the bootstrap superuser's (multirange_type_name = public.idem_cleanup made
                -- a public.idem_cleanup() that CALL public.idem_cleanup() could not choose from)
                SELECT c.object_type, c.object_identity, p.oid, p.proname, p.pronamespace
                  FROM pg_catalog.pg_event_trigger_ddl_commands() c
                  JOIN pg_catalog.pg_proc p ON p.oid = c.objid
                 WHERE c.object_type IN ('function', 'procedure', 'aggregate')
                UNION ALL
                SELECT 'function', p.oid::pg_catalog.regprocedure::pg_catalog.text, p.oid, p.proname, p.pronamespace
                  FROM pg_catalog.pg_event_trigger_ddl_commands() c
                  JOIN pg_catalog.pg_range r ON c.objid IN (r.rngtypid, r.rngmultitypid)
                  JOIN pg_catalog.pg_proc p ON p.prorettype IN (r.rngtypid, r.rngmultitypid)
                 WHERE c.object_type = 'type')
            -- in one order (the message names the same objects alike on every node and run)
            SELECT pg_catalog.string_agg(pg_catalog.format('%s %s', w.object_type, w.object_identity), ', '
                                         ORDER BY w.object_type COLLATE "C", w.object_identity COLLATE "C")
              INTO v_what
              FROM (SELECT c.object_type, c.object_identity
                      FROM pg_catalog.pg_event_trigger_ddl_commands() c
                     WHERE c.object_type = 'schema'
                       AND EXISTS (SELECT 1 FROM pg_catalog.pg_class k
                                    WHERE k.relnamespace = c.objid AND k.relname = 'idempotency_keys')
                    UNION
                    -- in any schema, pg_temp included: a routine under one of idem's names, made yet
                    -- or not (owners.sql and idem_cleanup refuse such a routine of another role in
                    -- public; one the next upgrade adds, planted in a transaction held open across
                    -- it, would overload it unjudged; elsewhere, a schema first on a superuser's path
                    -- ("$user") would serve the superuser's unqualified call of it)
                    SELECT m.object_type, m.object_identity
                      FROM made m
                     WHERE m.proname ~ v_names
                    UNION
                    -- a type or domain under one of idem's names, and a relation's row type so named
                    -- (a look-alike of idem's table or view for a superuser's unqualified SELECT)
                    SELECT c.object_type, c.object_identity
                      FROM pg_catalog.pg_event_trigger_ddl_commands() c
                      JOIN pg_catalog.pg_type t ON t.oid = c.objid
                     WHERE c.classid = 'pg_catalog.pg_type'::pg_catalog.regclass
                       AND t.typname ~ v_names
                    UNION
                    SELECT c.object_type, c.object_identity
                      FROM pg_catalog.pg_event_trigger_ddl_commands() c
                      JOIN pg_catalog.pg_class k ON k.oid = c.objid
                     WHERE c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                       AND k.reltype <> 0 AND k.relname ~ v_names
                    UNION
                    -- an operator on one of idem's types (or an array of one): an exact match wins
                    -- over pg_catalog's polymorphic operators wherever it is on the path
                    SELECT c.object_type, c.object_identity
                      FROM pg_catalog.pg_event_trigger_ddl_commands() c
                      JOIN pg_catalog.pg_operator o ON o.oid = c.objid
                      JOIN pg_catalog.pg_type t ON t.oid IN (o.oprleft, o.oprright)
                     WHERE c.classid = 'pg_catalog.pg_operator'::pg_catalog.regclass
                       AND pg_catalog.regexp_replace(t.typname, '^_', '') ~ v_names  -- the type, or its array (_name)
                    UNION
                    -- a routine made, renamed or moved into public under the name of one of idem's or
                    -- of pgcrypto's (the definers call public.armor & co.; they are the bootstrap
                    -- superuser's, not the store owner's, where another role migrated over it): an
                    -- overload that a definer's call by name would have to choose between (42725, in
                    -- every session after, and then kept by this guard), or pick
                    SELECT m.object_type, m.object_identity
                      FROM made m
                     WHERE m.pronamespace = pg_catalog.to_regnamespace('public')
                       AND EXISTS (SELECT 1 FROM pg_catalog.pg_proc q
                                    WHERE q.pronamespace = m.pronamespace AND q.proname = m.proname
                                      AND q.oid NOT IN (SELECT o.oid FROM made o)  -- a range's own two
                                      AND (q.proowner = (SELECT s.owner FROM idem_guard.store_owner s)
                                           OR EXISTS (SELECT 1 FROM pg_catalog.pg_depend d, pg_catalog.pg_extension e
                                                       WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
                                                         AND d.objid = q.oid AND d.deptype = 'e'
                                                         AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
                                                         AND d.refobjid = e.oid AND e.extname = 'pgcrypto')))) w;
        END IF;
        IF v_what IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '42501',
                MESSAGE = pg_catalog.format('idem_ddl_guard: %s refused: idem''s objects (%s) are dropped, renamed, handed over or overloaded, and idem''s names taken in any schema, only by their owner or a superuser',
                                            TG_TAG, v_what),
                HINT = 'idem''s definers, its cleanup and pg_cron would run a replacement with the owner''s rights, and a DBA''s unqualified call a look-alike in a schema first on its search_path ("$user") with the DBA''s: name yours otherwise (docs/security.md)';
        END IF;
    END
    $f$;
    REVOKE ALL ON FUNCTION idem_guard.idem_ddl_guard() FROM PUBLIC;  -- fired, never called
    COMMENT ON FUNCTION idem_guard.idem_ddl_guard IS
        'idem: the event triggers idem_guard_drop, idem_guard_schema, idem_guard_routine and idem_guard_object: refuses (42501) every role but superusers and the store''s owner dropping idem''s objects in public, renaming, handing over or dropping the schema that holds them, making a routine in public under the name of one of the store owner''s or pgcrypto''s there (an overload), or making, renaming or moving into any schema a routine, type, domain or relation under one of idem''s names or an operator on one of idem''s types';

    -- made once (an event trigger has no CREATE OR REPLACE); a rerun finds them bound to the function above
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger e WHERE e.evtname OPERATOR(pg_catalog.=) 'idem_guard_drop') THEN
        CREATE EVENT TRIGGER idem_guard_drop ON sql_drop EXECUTE FUNCTION idem_guard.idem_ddl_guard();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger e WHERE e.evtname OPERATOR(pg_catalog.=) 'idem_guard_schema') THEN
        CREATE EVENT TRIGGER idem_guard_schema ON ddl_command_end WHEN TAG IN ('ALTER SCHEMA')
            EXECUTE FUNCTION idem_guard.idem_ddl_guard();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger e WHERE e.evtname OPERATOR(pg_catalog.=) 'idem_guard_routine') THEN
        CREATE EVENT TRIGGER idem_guard_routine ON ddl_command_end
            WHEN TAG IN ('CREATE FUNCTION', 'CREATE PROCEDURE', 'CREATE AGGREGATE', 'ALTER FUNCTION',
                         'ALTER PROCEDURE', 'ALTER ROUTINE', 'ALTER AGGREGATE', 'CREATE TYPE', 'ALTER TYPE')
            EXECUTE FUNCTION idem_guard.idem_ddl_guard();
    END IF;
    -- what idem_guard_routine's tags (made before this one) leave out: domains, operators, and the
    -- relations whose row types are named like idem's
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger e WHERE e.evtname OPERATOR(pg_catalog.=) 'idem_guard_object') THEN
        CREATE EVENT TRIGGER idem_guard_object ON ddl_command_end
            WHEN TAG IN ('CREATE DOMAIN', 'ALTER DOMAIN', 'CREATE OPERATOR', 'ALTER OPERATOR',
                         'CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE',
                         'CREATE VIEW', 'ALTER VIEW', 'CREATE MATERIALIZED VIEW', 'ALTER MATERIALIZED VIEW',
                         'CREATE FOREIGN TABLE', 'ALTER FOREIGN TABLE')
            EXECUTE FUNCTION idem_guard.idem_ddl_guard();
    END IF;
    -- ALWAYS: also in a session with session_replication_role = replica
    ALTER EVENT TRIGGER idem_guard_drop ENABLE ALWAYS;
    ALTER EVENT TRIGGER idem_guard_schema ENABLE ALWAYS;
    ALTER EVENT TRIGGER idem_guard_routine ENABLE ALWAYS;
    ALTER EVENT TRIGGER idem_guard_object ENABLE ALWAYS;
END
$idem_guard$;
