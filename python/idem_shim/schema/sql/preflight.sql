-- The preflight of `idem migrate` and of the `idem sql` script, written once: before anything is
-- written, refuse a database this package must not touch, in one line that says why and what to
-- do. A DO block (no temporary function: a DBA's role may lack TEMP), so it reads its arguments
-- from settings the caller sets first with set_config:
--   idem.expected_version  the SQL API version of this package
--   idem.package           idem-shim's version, for the messages
--   idem.refusing          'this package' (idem migrate) or 'this script' (idem sql)
--   idem.store_migration   the migration that creates the store (0002.idempotency-keys)
--   idem.unchanged         how a refusal ends ('nothing was changed', or that only the DDL guard was)
--   idem.store_shape       the store as the migrations declare it (schema/shape.py): JSON
--                          {"columns": [[name, type, not_null], ...], "unique": [...], "checks": [...]}
DO $idem_preflight$
DECLARE
    v_expected   constant integer := pg_catalog.current_setting('idem.expected_version')::integer;
    v_package    constant text := pg_catalog.current_setting('idem.package');
    v_refusing   constant text := pg_catalog.current_setting('idem.refusing');
    v_unchanged  constant text := pg_catalog.current_setting('idem.unchanged');
    v_migration  constant text := pg_catalog.current_setting('idem.store_migration');
    v_shape      constant jsonb := pg_catalog.current_setting('idem.store_shape')::jsonb;
    v_db         constant text := pg_catalog.current_database()::text;
    v_store      constant regclass := pg_catalog.to_regclass('public.idempotency_keys');
    v_schema     text;
    v_version    integer;
    v_ours       boolean := false;
    v_diff       text;
BEGIN
    -- GUARD: pgcrypto, where it exists, is in public. The functions call public.pgp_sym_encrypt
    -- (and armor, dearmor): in another schema those names are free, and a role that may create
    -- in public could plant them and read IDEM_RESPONSE_KEY as the owner.
    SELECT pg_catalog.regexp_replace(e.extnamespace::regnamespace::text, '[[:cntrl:]]', '?', 'g') INTO v_schema
      FROM pg_catalog.pg_extension e WHERE e.extname = 'pgcrypto';
    IF v_schema IS NOT NULL AND v_schema <> 'public' THEN
        RAISE EXCEPTION 'database %: pgcrypto is installed in schema %, but idem''s functions call it as '
            'public.pgp_sym_encrypt (and armor, dearmor), names that any role allowed to create in public '
            'could plant; move it with: ALTER EXTENSION pgcrypto SET SCHEMA public; then run idem migrate '
            'again; %', v_db, v_schema, v_unchanged;
    END IF;

    -- GUARD: the database's SQL API is not newer than this package's. Read from its body (`SELECT
    -- <n>`, sql/functions/000), never by calling it: before the first install no DDL guard holds
    -- idem's names, and a routine the database's owner committed after owners.sql's check (its
    -- snapshot is another statement's) would run here as the role migrating, a superuser.
    SELECT pg_catalog.substring(p.prosrc, '[0-9]+')::integer INTO v_version
      FROM pg_catalog.pg_proc p
     WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure('public.idem_schema_version()');
    IF v_version IS NOT NULL THEN
        IF v_version > v_expected THEN
            RAISE EXCEPTION 'database % has idem SQL API version %, newer than the version % of % (idem-shim %): '
                'install the newer idem-shim to migrate it; %',
                v_db, v_version, v_expected, v_refusing, v_package, v_unchanged;
        END IF;
    END IF;

    IF v_store IS NOT NULL THEN
        -- yoyo's record, read only where it is a plain table, locked first (then no other
        -- relation takes its name until COMMIT): a view's functions run as whoever reads it, and
        -- before the first install the database's owner may make one here, or commit one after
        -- owners.sql's check (tests/python/sql/test_sec_check_then_call.py)
        IF pg_catalog.to_regclass('public._yoyo_migration') IS NOT NULL THEN
            LOCK TABLE public._yoyo_migration IN ACCESS SHARE MODE;
            IF (SELECT c.relkind FROM pg_catalog.pg_class c
                 WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('public._yoyo_migration')) = 'r' THEN
                EXECUTE 'SELECT EXISTS (SELECT 1 FROM public._yoyo_migration WHERE migration_id = $1)'
                   INTO v_ours USING v_migration;
            END IF;
        END IF;
        -- GUARD: an idempotency_keys idem did not create: say how it differs from idem's
        IF NOT v_ours THEN
            WITH expected AS (
                SELECT c.value ->> 0 AS column_name,
                       -- a type idem makes itself (the user scope's domain) is its name until it exists
                       COALESCE(pg_catalog.format_type(pg_catalog.to_regtype(c.value ->> 1), NULL), c.value ->> 1)
                           AS data_type,
                       (c.value ->> 2)::boolean AS not_null
                  FROM pg_catalog.jsonb_array_elements(v_shape -> 'columns') c),
            actual AS (
                SELECT a.attname::text AS column_name, pg_catalog.format_type(a.atttypid, a.atttypmod) AS data_type,
                       a.attnotnull AS not_null
                  FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid = v_store AND a.attnum > 0 AND NOT a.attisdropped),
            unique_key AS (  -- the attnums of the UNIQUE key's columns, in order
                SELECT pg_catalog.string_agg(a.attnum::text, ' ' ORDER BY k.o) AS indkey,
                       pg_catalog.string_agg(k.name, ', ' ORDER BY k.o) AS names
                  FROM pg_catalog.jsonb_array_elements_text(v_shape -> 'unique') WITH ORDINALITY AS k(name, o)
                  LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = v_store AND a.attname = k.name),
            differences(o, line) AS (
                SELECT 1, pg_catalog.format('column %s is missing', e.column_name)
                  FROM expected e LEFT JOIN actual a USING (column_name) WHERE a.column_name IS NULL
                UNION ALL
                SELECT 2, pg_catalog.format('column %s is %s%s, idem has %s%s', e.column_name, a.data_type,
                                            CASE WHEN a.not_null THEN ' NOT NULL' ELSE '' END, e.data_type,
                                            CASE WHEN e.not_null THEN ' NOT NULL' ELSE '' END)
                  FROM expected e JOIN actual a USING (column_name)
                 WHERE a.data_type <> e.data_type OR a.not_null <> e.not_null
                UNION ALL
                SELECT 3, pg_catalog.format('column %s is not idem''s', a.column_name)
                  FROM actual a LEFT JOIN expected e USING (column_name) WHERE e.column_name IS NULL
                UNION ALL
                SELECT 4, pg_catalog.format('no UNIQUE NULLS NOT DISTINCT (%s): calls without a user would not dedupe',
                                            u.names)
                          || CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                                                WHERE i.indrelid = v_store AND i.indisunique
                                                  AND i.indkey::text = u.indkey)
                                  THEN ' (the table has that UNIQUE with NULLs distinct, as in the first design''s DDL)'
                                  ELSE '' END
                  FROM unique_key u
                 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                                    WHERE i.indrelid = v_store AND i.indisunique AND i.indnullsnotdistinct
                                      AND i.indkey::text = u.indkey)
                UNION ALL
                SELECT 5, pg_catalog.format('no CHECK constraint %s', c.conname)
                  FROM pg_catalog.jsonb_array_elements_text(v_shape -> 'checks') AS c(conname)
                 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint pc
                                    WHERE pc.conrelid = v_store AND pc.conname = c.conname AND pc.contype = 'c'))
            SELECT pg_catalog.string_agg(d.line, '; ' ORDER BY d.o, d.line) INTO v_diff FROM differences d;
            v_diff := pg_catalog.regexp_replace(v_diff, '[[:cntrl:]]', '?', 'g');  -- a column's name is its maker's
            RAISE EXCEPTION 'database % already has a public.idempotency_keys that idem did not create '
                '(migration % is not recorded): %; %', v_db, v_migration,
                COALESCE(v_diff, 'its shape matches idem''s, but idem adopts no table it did not create'), v_unchanged;
        END IF;
        RETURN;
    END IF;

    -- GUARD: the store is not built yet, and the host's own users and audit_log, where they exist,
    -- must fit it (migration 0001 creates minimal ones where they do not): scope_user_id
    -- REFERENCES users(id), of its type, and a replay inserts (user_id, action, context) into
    -- audit_log. A users table named elsewhere (idem.users_table) is judged by migration 0017.
    WITH users_id AS (
        SELECT a.attnum, pg_catalog.format_type(a.atttypid, a.atttypmod) AS data_type
          FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = pg_catalog.to_regclass('public.users') AND a.attname = 'id' AND NOT a.attisdropped
           AND COALESCE(NULLIF(pg_catalog.current_setting('idem.users_table', true), ''), 'public.users')
               IN ('public.users', 'users', '"public"."users"', 'public."users"', '"public".users')),
    audit(column_name, accepted, needed) AS (VALUES
        ('user_id', ARRAY['integer', 'bigint', 'uuid'], 'the users'' id type'),
        ('action', ARRAY['text', 'character varying'], 'text'),
        ('context', ARRAY['jsonb'], 'jsonb')),
    audit_cols AS (
        SELECT a.attname::text AS column_name, pg_catalog.format_type(a.atttypid, a.atttypmod) AS data_type,
               pg_catalog.format_type(a.atttypid, NULL) AS base_type, a.attnotnull AS not_null,
               a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '' AS has_default
          FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = pg_catalog.to_regclass('public.audit_log') AND a.attnum > 0 AND NOT a.attisdropped),
    problems(o, line) AS (
        SELECT 1, 'public.users has no id column (idempotency_keys.scope_user_id REFERENCES users(id))'
         WHERE pg_catalog.to_regclass('public.users') IS NOT NULL AND NOT EXISTS (SELECT 1 FROM users_id)
           AND COALESCE(NULLIF(pg_catalog.current_setting('idem.users_table', true), ''), 'public.users')
               IN ('public.users', 'users', '"public"."users"', 'public."users"', '"public".users')
        UNION ALL
        SELECT 2, pg_catalog.format('public.users.id is %s; the store''s scope_user_id takes its type '
                                    '(REFERENCES users(id)): it needs an integer, bigint or uuid users.id, or name '
                                    'your users table with --users-table SCHEMA.TABLE', u.data_type)
          FROM users_id u WHERE u.data_type NOT IN ('integer', 'bigint', 'uuid')
        UNION ALL
        SELECT 3, 'public.users.id is neither the primary key nor UNIQUE (scope_user_id REFERENCES users(id))'
          FROM users_id u
         WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                            WHERE i.indrelid = pg_catalog.to_regclass('public.users') AND i.indisunique
                              AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indkey::text = u.attnum::text)
        UNION ALL
        SELECT 4, pg_catalog.format('public.audit_log has no column %s (%s): a replay writes (user_id, action, context)',
                                    x.column_name, x.needed)
          FROM audit x
         WHERE pg_catalog.to_regclass('public.audit_log') IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM audit_cols c WHERE c.column_name = x.column_name)
        UNION ALL
        SELECT 5, pg_catalog.format('public.audit_log.%s is %s; a replay writes %s there', x.column_name, c.data_type,
                                    x.needed)
          FROM audit x JOIN audit_cols c USING (column_name)
         WHERE c.base_type <> ALL (x.accepted)
        UNION ALL
        SELECT 6, pg_catalog.format('public.audit_log.%s is NOT NULL without a default; a replay writes only '
                                    '(user_id, action, context)', c.column_name)
          FROM audit_cols c
         WHERE c.not_null AND NOT c.has_default AND c.column_name NOT IN ('user_id', 'action', 'context'))
    SELECT pg_catalog.string_agg(p.line, '; ' ORDER BY p.o, p.line) INTO v_diff FROM problems p;
    -- a column's or a type's name is any text its maker picks: a control character shown as '?' (a
    -- newline would end the error's line, cut idem migrate's one-line error there, and start one of theirs)
    v_diff := pg_catalog.regexp_replace(v_diff, '[[:cntrl:]]', '?', 'g');
    IF v_diff IS NOT NULL THEN
        RAISE EXCEPTION 'database %: the host''s tables do not fit the idempotency store: %; % '
            '(see docs/adopting.md)', v_db, v_diff, v_unchanged;
    END IF;
END
$idem_preflight$;
