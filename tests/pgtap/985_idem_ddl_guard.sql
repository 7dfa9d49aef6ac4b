-- 985_idem_ddl_guard: the event triggers a superuser's migrate makes (contract §3a).
-- Cases:
--   both event triggers exist, fire ALWAYS (also under session_replication_role = replica) and
--     call idem_guard.idem_ddl_guard, in a schema a superuser owns where PUBLIC may not create;
--   as a role that owns schema public (the app's role where it owns its database): DROP of an
--     idem function, of idem's table (CASCADE), of the schema, and ALTER SCHEMA public RENAME /
--     OWNER TO are refused with 42501 and change nothing;
--   idem_guard_routine fires always too; that role may not make an overload of an idem routine in
--     public (a definer's call would have to choose between them: 42725 in every session after),
--     nor of pgcrypto's, nor a routine under an idem_ name idem has not made (yet), nor a range
--     type whose constructors PostgreSQL names so;
--   idem_guard_object fires always too; in any schema (one of its own, pg_temp) that role may not
--     make, rename into or move a routine, type, domain or view under one of idem's names, nor an
--     operator on one of idem's types, and a superuser still may;
--   that role still drops its own objects in public, and a superuser still drops an idem_-named one.
BEGIN;
SELECT plan(29);

-- On a Citus coordinator the roles created below go over one connection per worker (990 does
-- the same); a no-op setting on a single node.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
SET LOCAL client_min_messages = error;

SELECT is((SELECT pg_catalog.count(*)::int FROM pg_catalog.pg_event_trigger e
            JOIN pg_catalog.pg_proc p ON p.oid = e.evtfoid
            JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
           WHERE e.evtname IN ('idem_guard_drop', 'idem_guard_schema') AND e.evtenabled = 'A'
             AND n.nspname = 'idem_guard' AND p.proname = 'idem_ddl_guard'),
    2, 'idem_guard_drop and idem_guard_schema fire always, through idem_guard.idem_ddl_guard');
SELECT is((SELECT e.evtenabled::text FROM pg_catalog.pg_event_trigger e
            WHERE e.evtname = 'idem_guard_routine' AND e.evtfoid = 'idem_guard.idem_ddl_guard'::regproc),
    'A', 'idem_guard_routine fires always, through idem_guard.idem_ddl_guard');
SELECT is((SELECT e.evtenabled::text FROM pg_catalog.pg_event_trigger e
            WHERE e.evtname = 'idem_guard_object' AND e.evtevent = 'ddl_command_end'
              AND e.evtfoid = 'idem_guard.idem_ddl_guard'::regproc
              AND e.evttags @> ARRAY['CREATE DOMAIN', 'CREATE OPERATOR', 'ALTER OPERATOR', 'CREATE VIEW', 'ALTER TABLE']),
    'A', 'idem_guard_object fires always on domains, operators and relations, through idem_guard.idem_ddl_guard');
SELECT ok((SELECT r.rolsuper FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner
            WHERE n.nspname = 'idem_guard'),
    'schema idem_guard is a superuser''s');
SELECT ok(NOT pg_catalog.has_schema_privilege('public', 'idem_guard', 'CREATE'),
    'PUBLIC may not create in schema idem_guard');

-- a role that owns public, as PostgreSQL 15 makes the database's owner
CREATE ROLE idem_tap_schema_owner NOLOGIN;
CREATE ROLE idem_tap_heir NOLOGIN;
GRANT idem_tap_heir TO idem_tap_schema_owner;  -- so only the guard stands in the way of a hand-over
DO $$ BEGIN EXECUTE pg_catalog.format('GRANT CREATE ON DATABASE %I TO idem_tap_schema_owner', pg_catalog.current_database()); END $$;
ALTER SCHEMA public OWNER TO idem_tap_schema_owner;
CREATE FUNCTION public.idem_tap_superusers() RETURNS integer LANGUAGE sql RETURN 1;

SET LOCAL ROLE idem_tap_schema_owner;
SELECT throws_like($$DROP FUNCTION public.idem_scope(public.idem_user_id) CASCADE$$,
    'idem_ddl_guard: DROP FUNCTION refused: idem''s objects (function public.idem_scope(public.idem_user_id)%',
    'the schema''s owner may not drop an idem routine');
-- On Citus a distributed table's DROP reaches the workers as this role before the guard fires
-- at the command's end (rolling it all back), and a role made inside this transaction is unknown there.
SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')
            THEN skip('on Citus: the workers do not know a role made inside this transaction', 1)
            ELSE throws_like($$DROP TABLE public.idempotency_keys CASCADE$$,
                             'idem_ddl_guard: DROP TABLE refused: idem''s objects (table public.idempotency_keys%',
                             'nor idem''s table') END;
SELECT throws_like($$DROP SCHEMA public CASCADE$$, 'idem_ddl_guard: DROP SCHEMA refused%', 'nor the schema');
SELECT throws_like($$ALTER SCHEMA public RENAME TO idem_tap_elsewhere$$,
    'idem_ddl_guard: ALTER SCHEMA refused: idem''s objects (schema idem_tap_elsewhere)%',
    'nor rename it (and make a public of its own)');
SELECT throws_like($$ALTER SCHEMA public OWNER TO idem_tap_heir$$, 'idem_ddl_guard: ALTER SCHEMA refused%',
    'nor hand it over');
SELECT throws_like($$CREATE FUNCTION public.idem_key_scope(p_key_id bigint, p_pad integer DEFAULT 0) RETURNS integer
                        LANGUAGE sql RETURN 0$$,
    'idem_ddl_guard: CREATE FUNCTION refused: idem''s objects (function public.idem_key_scope(bigint,integer))%',
    'nor make an overload of an idem routine');
SELECT throws_like($$CREATE FUNCTION public.armor(bytea, p_pad integer DEFAULT 0) RETURNS text LANGUAGE sql RETURN 'x'$$,
    'idem_ddl_guard: CREATE FUNCTION refused: idem''s objects (function public.armor(%',
    'nor of pgcrypto''s, which idem''s definers call');
SELECT throws_like($$CREATE FUNCTION public.idem_tap_next(integer) RETURNS integer LANGUAGE sql RETURN 0$$,
    'idem_ddl_guard: CREATE FUNCTION refused: idem''s objects (function public.idem_tap_next(integer))%',
    'nor a routine under an idem_ name idem has not made (the next upgrade''s)');
SELECT throws_like($$CREATE TYPE public.tap_span AS RANGE (subtype = integer, multirange_type_name = public.idem_cleanup)$$,
    'idem_ddl_guard: CREATE TYPE refused: idem''s objects (function public.idem_cleanup(), function public.idem_cleanup(public.tap_span), function public.idem_cleanup(public.tap_span[])) %',
    'nor a range type whose constructors overload one (CALL public.idem_cleanup() would be 42725), named in one order on every node');
SELECT lives_ok($$CREATE TABLE public.tap_own_t (a integer); DROP TABLE public.tap_own_t$$,
    'it drops what it made itself (not under idem''s or yoyo''s names)');
RESET ROLE;

-- every schema: one of the role's own, named like a DBA's role ("$user" puts it first on that path)
CREATE SCHEMA idem_tap_dba AUTHORIZATION idem_tap_schema_owner;
CREATE SCHEMA idem_tap_other AUTHORIZATION idem_tap_schema_owner;
CREATE FUNCTION idem_tap_dba.tap_mine(integer) RETURNS integer LANGUAGE sql RETURN 0;
CREATE TYPE idem_tap_dba.tap_mine_t AS (a integer);
CREATE FUNCTION idem_tap_dba.idem_tap_planted(integer) RETURNS integer LANGUAGE sql RETURN 0;
CREATE FUNCTION idem_tap_dba.tap_same(public.idem_claim_result, public.idem_claim_result) RETURNS boolean
    LANGUAGE sql RETURN true;
ALTER FUNCTION idem_tap_dba.tap_mine(integer) OWNER TO idem_tap_schema_owner;
ALTER TYPE idem_tap_dba.tap_mine_t OWNER TO idem_tap_schema_owner;
ALTER FUNCTION idem_tap_dba.idem_tap_planted(integer) OWNER TO idem_tap_schema_owner;
ALTER FUNCTION idem_tap_dba.tap_same(public.idem_claim_result, public.idem_claim_result) OWNER TO idem_tap_schema_owner;
SET LOCAL ROLE idem_tap_schema_owner;
SELECT throws_like($$CREATE FUNCTION idem_tap_dba.idem_erase_user(p_user_id integer) RETURNS integer LANGUAGE sql RETURN 0$$,
    'idem_ddl_guard: CREATE FUNCTION refused: idem''s objects (function idem_tap_dba.idem_erase_user(integer)) %in any schema%',
    'that role may not make a look-alike of an idem routine in a schema of its own');
SELECT throws_like($$CREATE FUNCTION pg_temp.idem_health() RETURNS integer LANGUAGE sql RETURN 0$$,
    'idem_ddl_guard: CREATE FUNCTION refused%', 'nor in pg_temp');
SELECT throws_like($$CREATE TYPE idem_tap_dba.idem_claim_result AS (a integer)$$,
    'idem_ddl_guard: CREATE TYPE refused: idem''s objects (type idem_tap_dba.idem_claim_result)%', 'nor a type');
SELECT throws_like($$CREATE DOMAIN idem_tap_dba.idem_key AS text$$,
    'idem_ddl_guard: CREATE DOMAIN refused: idem''s objects (type idem_tap_dba.idem_key)%', 'nor a domain');
SELECT throws_like($$CREATE VIEW idem_tap_dba.idempotency_keys AS SELECT 1 AS id$$,
    'idem_ddl_guard: CREATE VIEW refused: idem''s objects (view idem_tap_dba.idempotency_keys)%',
    'nor a view (its row type) named like idem''s table');
SELECT throws_like($$CREATE OPERATOR idem_tap_dba.= (leftarg = public.idem_claim_result, rightarg = public.idem_claim_result,
                                                    function = idem_tap_dba.tap_same)$$,
    'idem_ddl_guard: CREATE OPERATOR refused%', 'nor an operator on one of idem''s types');
SELECT throws_like($$ALTER FUNCTION idem_tap_dba.tap_mine(integer) RENAME TO idem_export_user$$,
    'idem_ddl_guard: ALTER FUNCTION refused%', 'nor rename a routine of its own into one of idem''s names');
SELECT throws_like($$ALTER TYPE idem_tap_dba.tap_mine_t RENAME TO idem_claim_result$$,
    'idem_ddl_guard: ALTER TYPE refused%', 'nor a type');
SELECT throws_like($$ALTER FUNCTION idem_tap_dba.idem_tap_planted(integer) SET SCHEMA idem_tap_other$$,
    'idem_ddl_guard: ALTER FUNCTION refused%', 'nor move one planted before the guard');
RESET ROLE;
SELECT lives_ok($$CREATE FUNCTION idem_tap_dba.idem_tap_tool() RETURNS integer LANGUAGE sql RETURN 1;
                  CREATE DOMAIN idem_tap_dba.idem_tap_key AS text$$,
    'a superuser still makes idem''s names in any schema');

SELECT ok(pg_catalog.to_regprocedure('public.idem_scope(public.idem_user_id)') IS NOT NULL
          AND pg_catalog.to_regclass('public.idempotency_keys') IS NOT NULL
          AND (SELECT n.nspname FROM pg_catalog.pg_namespace n
                WHERE n.oid = (SELECT c.relnamespace FROM pg_catalog.pg_class c
                                WHERE c.oid = 'public.idempotency_keys'::regclass)) = 'public',
    'nothing was dropped or renamed');
SELECT is((SELECT pg_catalog.pg_get_userbyid(n.nspowner)::text FROM pg_catalog.pg_namespace n WHERE n.nspname = 'public'),
    'idem_tap_schema_owner', 'and public is still the role''s');
SELECT lives_ok($$DROP FUNCTION public.idem_tap_superusers()$$, 'a superuser still drops an idem_-named routine');
SELECT lives_ok($$ALTER SCHEMA public OWNER TO pg_database_owner$$, 'and hands public back (the DBA''s fix)');

SELECT * FROM finish();
ROLLBACK;
