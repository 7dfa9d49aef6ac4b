-- Before anything reads or runs idem's objects, `idem migrate`, `idem status` and the `idem sql`
-- script check that what the store's owner runs, reads or writes is trusted: the store owner's,
-- a superuser's, or the running role's (another migrating role owns the routines its upgrade
-- added). A role that owns schema public (the database's owner, on PostgreSQL 15, through
-- pg_database_owner) may drop any object in it and create its own under the name, or rename
-- public, so public itself must be trusted; and a view named like yoyo's table, a function named
-- like idem's, or a trigger, default, rule or policy of a host table idem writes as the owner
-- (audit_log, a replay's row; users where it is idem's own: Citus's reserved user) would run as
-- whoever reads or calls it next. The store's owner is the owner of public.idempotency_keys, or
-- before the first migration the role running this. Reads idem.refusing ('this package', 'this
-- script') and idem.unchanged (how a refusal ends: schema/preflight.py) when set. Every session that runs it pins its path (pg_catalog, pg_temp).
DO $idem_owners$
DECLARE
    v_owner  constant oid := COALESCE(
        (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass('public.idempotency_keys')),
        (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user));
    v_me     constant oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user);
    v_marker constant text := 'idem: minimal host table';
    v_foreign text;
    v_fix     text;
    v_guarded boolean := false;
BEGIN
    -- Whether idem's DDL guard holds is idem_guard.idem_guard_holds()'s to say (sql/functions/986),
    -- asked only once it is found, in pg_catalog alone, to be a superuser's in a superuser's schema
    -- where no other role may create: the database's owner may make a schema idem_guard, and a
    -- look-alike in it, where no superuser migrated. Before the first superuser's migrate there is
    -- none, and the guard does not hold (a call never reached is never parsed).
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                 JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                 JOIN pg_catalog.pg_roles po ON po.oid = p.proowner
                 JOIN pg_catalog.pg_roles nso ON nso.oid = n.nspowner
                WHERE n.nspname = 'idem_guard' AND p.proname = 'idem_guard_holds' AND p.pronargs = 0
                  AND po.rolsuper AND nso.rolsuper
                  AND NOT EXISTS (SELECT 1 FROM pg_catalog.aclexplode(n.nspacl) a
                                    LEFT JOIN pg_catalog.pg_roles g ON g.oid = a.grantee
                                   WHERE a.privilege_type = 'CREATE' AND NOT COALESCE(g.rolsuper, false))) THEN
        v_guarded := idem_guard.idem_guard_holds();
    END IF;
    WITH trusted AS (
        SELECT r.oid FROM pg_catalog.pg_roles r
         WHERE r.oid = v_owner OR r.oid = v_me OR r.rolsuper),
    -- the host tables idem's owner-run code writes: audit_log always, users where it is idem's own,
    -- and their partitions, wherever they live (a row is written to one, with its triggers, indexes
    -- and owner); rel names one, qualified (the session's path holds no schema of tables)
    host AS (
        WITH RECURSIVE tree(oid) AS (
            SELECT c.oid FROM pg_catalog.pg_class c
             WHERE c.relnamespace = 'public'::regnamespace
               AND (c.relname = 'audit_log'
                    OR (c.relname = 'users'
                        AND pg_catalog.obj_description(c.oid, 'pg_class') = v_marker))
            UNION
            SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent = t.oid
             WHERE (SELECT k.relkind FROM pg_catalog.pg_class k WHERE k.oid = t.oid) IN ('p', 'P'))
        SELECT c.oid, c.oid::regclass::text AS rel, c.relowner FROM tree t JOIN pg_catalog.pg_class c ON c.oid = t.oid),
    -- what an INSERT there, or an ANALYZE of it (as the table's owner), runs: the triggers, rules,
    -- policies, defaults, CHECKs, indexes (their expressions and predicates) and statistics objects
    -- of a host table, through the routines, the operators (and their routines) and the domains
    -- they name; and the domains of its columns
    host_refs AS (
        SELECT h.rel, d.refclassid, d.refobjid
          FROM host h
          JOIN pg_catalog.pg_depend d
            ON (d.classid = 'pg_trigger'::regclass
                AND d.objid IN (SELECT t.oid FROM pg_catalog.pg_trigger t WHERE t.tgrelid = h.oid))
            OR (d.classid = 'pg_attrdef'::regclass
                AND d.objid IN (SELECT a.oid FROM pg_catalog.pg_attrdef a WHERE a.adrelid = h.oid))
            OR (d.classid = 'pg_constraint'::regclass
                AND d.objid IN (SELECT k.oid FROM pg_catalog.pg_constraint k WHERE k.conrelid = h.oid))
            OR (d.classid = 'pg_policy'::regclass
                AND d.objid IN (SELECT y.oid FROM pg_catalog.pg_policy y WHERE y.polrelid = h.oid))
            OR (d.classid = 'pg_rewrite'::regclass
                AND d.objid IN (SELECT w.oid FROM pg_catalog.pg_rewrite w WHERE w.ev_class = h.oid))
            OR (d.classid = 'pg_class'::regclass
                AND d.objid IN (SELECT i.indexrelid FROM pg_catalog.pg_index i WHERE i.indrelid = h.oid))
            OR (d.classid = 'pg_statistic_ext'::regclass
                AND d.objid IN (SELECT x.oid FROM pg_catalog.pg_statistic_ext x WHERE x.stxrelid = h.oid))),
    host_code AS (
        SELECT r.rel, p.oid::regprocedure::text AS what, p.proowner AS owner
          FROM host_refs r JOIN pg_catalog.pg_proc p ON r.refclassid = 'pg_proc'::regclass AND p.oid = r.refobjid
        UNION ALL
        SELECT r.rel, pg_catalog.format('operator %s', o.oid::regoperator), o.oprowner
          FROM host_refs r JOIN pg_catalog.pg_operator o ON r.refclassid = 'pg_operator'::regclass AND o.oid = r.refobjid
        UNION ALL
        SELECT r.rel, pg_catalog.format('%s, the function of operator %s', p.oid::regprocedure, o.oid::regoperator),
               p.proowner
          FROM host_refs r JOIN pg_catalog.pg_operator o ON r.refclassid = 'pg_operator'::regclass AND o.oid = r.refobjid
          JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode
        UNION ALL
        SELECT r.rel, pg_catalog.format('domain %s', t.oid::regtype), t.typowner
          FROM host_refs r JOIN pg_catalog.pg_type t ON r.refclassid = 'pg_type'::regclass AND t.oid = r.refobjid
         WHERE t.typtype = 'd'
        UNION ALL
        SELECT h.rel, pg_catalog.format('domain %s of column %I', a.atttypid::regtype, a.attname), t.typowner
          FROM host h
          JOIN pg_catalog.pg_attribute a ON a.attrelid = h.oid AND a.attnum > 0
          JOIN pg_catalog.pg_type t ON t.oid = a.atttypid AND t.typtype = 'd'),
    found(what, owner, fix) AS (
        -- the schema idem's objects live in
        SELECT 'schema public', s.owner,
               pg_catalog.format('ALTER SCHEMA public OWNER TO %I; GRANT USAGE, CREATE ON SCHEMA public TO %I; '
                                 '(CREATE only if that role''s own migrations create tables there)',
                                 pg_catalog.pg_get_userbyid(v_owner), pg_catalog.pg_get_userbyid(s.owner))
          FROM (SELECT CASE WHEN n.nspowner = 'pg_database_owner'::regrole::oid THEN db.datdba
                            ELSE n.nspowner END AS owner
                  FROM pg_catalog.pg_namespace n, pg_catalog.pg_database db
                 WHERE n.nspname = 'public'
                   AND db.datname = pg_catalog.current_database()) s
         -- unless idem's DDL guard holds its objects there (sql/functions/985), or a superuser runs
         -- this: idem migrate and the script then commit the guard first (and wait for the
         -- transactions older than it: schema/sql/guard_wait.sql)
         WHERE NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = v_me)
           AND NOT v_guarded
        UNION ALL
        -- pgcrypto, whose functions idem's definers call as the owner: the extension's owner (a
        -- trusted extension: the database's owner may create it) may drop it and plant its own
        SELECT 'extension pgcrypto', e.extowner,
               'a superuser drops it (DROP EXTENSION pgcrypto; CASCADE also drops what uses it) and idem migrate makes it again'
          FROM pg_catalog.pg_extension e
         WHERE e.extname = 'pgcrypto'
        UNION ALL
        -- idem's and yoyo's objects: every relation under one of idem's names, those a later
        -- migration makes too (before the first install no DDL guard holds them: a view named
        -- public.idem_host_users, which idem status reads, ran its functions as the reader)
        SELECT pg_catalog.format('%s public.%I', CASE c.relkind WHEN 'v' THEN 'view' WHEN 'S' THEN 'sequence'
                                                                ELSE 'relation' END, c.relname),
               c.relowner, 'a superuser drops it (idem migrate makes its own)'
          FROM pg_catalog.pg_class c
         WHERE c.relnamespace = 'public'::regnamespace
           AND c.relkind <> 'i'  -- an index is its table's owner's
           AND (c.relname ~ '^(idem_|idempotency_(keys|events))'
                OR c.relname = ANY (ARRAY['_yoyo_migration', '_yoyo_log', '_yoyo_version', 'yoyo_lock']))
        UNION ALL
        -- a type or domain under one of idem's names (idem_user_id's CHECK runs in every cast to it)
        SELECT pg_catalog.format('type public.%I', t.typname), t.typowner,
               'a superuser drops it (idem migrate makes its own)'
          FROM pg_catalog.pg_type t
         WHERE t.typnamespace = 'public'::regnamespace AND t.typrelid = 0
           AND t.typcategory <> 'A'  -- an array type is its element type's, named with it
           AND t.typname ~ '^idem_'
        UNION ALL
        -- a routine under an idem_ name, or under the name of one of pgcrypto's, which idem's
        -- definers call in public (those they call, before the first migration makes pgcrypto): an
        -- overload with one more, defaulted argument is as fatal as a replacement (42725)
        SELECT pg_catalog.format('routine %s', p.oid::regprocedure), p.proowner,
               'a superuser drops it (idem migrate makes idem''s own)'
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'public'::regnamespace
           AND (pg_catalog.starts_with(p.proname, 'idem_')
                OR p.proname = ANY (ARRAY['armor', 'dearmor', 'pgp_sym_encrypt', 'pgp_sym_decrypt'])
                OR p.proname IN (SELECT q.proname FROM pg_catalog.pg_proc q
                                   JOIN pg_catalog.pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = q.oid
                                                              AND d.deptype = 'e' AND d.refclassid = 'pg_extension'::regclass
                                   JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'pgcrypto'))
        UNION ALL
        -- the host tables idem writes as the owner, their code, and who may add triggers to them
        SELECT pg_catalog.format('table %s', h.rel), h.relowner,
               pg_catalog.format('ALTER TABLE %s OWNER TO %I; GRANT SELECT, INSERT, UPDATE, DELETE ON '
                                 '%s TO %I; (and a superuser drops what it runs of that role''s first: it keeps '
                                 'its triggers, indexes, statistics objects and constraints)',
                                 h.rel, pg_catalog.pg_get_userbyid(v_owner), h.rel,
                                 pg_catalog.pg_get_userbyid(h.relowner))
          FROM host h
        UNION ALL
        SELECT pg_catalog.format('%s, run by an INSERT into %s or its ANALYZE', c.what, c.rel), c.owner,
               'a superuser drops the trigger, default, rule, policy, constraint, index or statistics object that runs it'
          FROM host_code c
        UNION ALL
        SELECT pg_catalog.format('the TRIGGER privilege on %s', h.rel), a.grantee,
               pg_catalog.format('REVOKE TRIGGER ON %s FROM %s;', h.rel,
                                 CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                      ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END)
          FROM host h
          JOIN pg_catalog.pg_class c ON c.oid = h.oid
         CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a
         WHERE a.privilege_type = 'TRIGGER')
    SELECT pg_catalog.string_agg(pg_catalog.format('%s (%s by %s)', f.what,
                                                   CASE WHEN f.what LIKE 'the TRIGGER privilege%' THEN 'held'
                                                        ELSE 'owned' END,
                                                   CASE WHEN f.owner = 0 THEN 'PUBLIC'
                                                        ELSE pg_catalog.pg_get_userbyid(f.owner) END),
                                 ', ' ORDER BY f.what),
           pg_catalog.string_agg(DISTINCT f.fix, ' ')
      INTO v_foreign, v_fix
      FROM found f
     WHERE f.owner NOT IN (SELECT t.oid FROM trusted t);
    IF v_foreign IS NOT NULL THEN
        -- a name is any text its maker picks: a control character of one shown as '?' (a newline
        -- would end the error's line, cut idem migrate's one-line error there, and start one of theirs)
        v_foreign := pg_catalog.regexp_replace(v_foreign, '[[:cntrl:]]', '?', 'g');
        v_fix := pg_catalog.regexp_replace(v_fix, '[[:cntrl:]]', '?', 'g');
        RAISE EXCEPTION 'database %: % not made by the store''s owner %: a role that owns schema public, or a table '
            'idem writes as its owner, may have replaced them, and % would run their code with the owner''s '
            'rights; fix, as a superuser: % then run idem again (docs/operations.md#the-schema-and-host-tables-idem-trusts); '
            '%',
            pg_catalog.current_database(), v_foreign, pg_catalog.pg_get_userbyid(v_owner),
            COALESCE(NULLIF(pg_catalog.current_setting('idem.refusing', true), ''), 'idem'), v_fix,
            COALESCE(NULLIF(pg_catalog.current_setting('idem.unchanged', true), ''), 'nothing was changed');
    END IF;
END
$idem_owners$;
