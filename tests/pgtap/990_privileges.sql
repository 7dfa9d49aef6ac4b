-- 990_privileges: least privilege (contract §3a).
-- Cases:
--   idem_app is a NOLOGIN role without superuser, CREATEROLE, CREATEDB or BYPASSRLS, and cannot
--     CREATE in schema public (no search_path hijack);
--   idem_app holds no privilege on idempotency_keys, idempotency_events or their sequences, and
--     really cannot SELECT, INSERT, UPDATE, DELETE or TRUNCATE them (42501 as the role);
--   PUBLIC holds no privilege on those tables and cannot EXECUTE any idem_* routine (no NULL acl,
--     which would mean the default grant to PUBLIC); an unrelated role cannot execute any either;
--   idem_app can EXECUTE exactly the request path's API (claim, complete, fail, heartbeat, downstream key,
--     lost-claim report) and nothing else; idem_dsr exactly export and erasure; idem_monitor exactly
--     health (function and view); idem_admin adds to the app's cleanup, rotation, inspect, health,
--     scheduling, export and erasure and the version and key helpers; the token's and encryption's
--     internals are granted to none;
--   as idem_app, the whole flow works through the functions alone (claim, complete, replay with
--     its audit row, fail, heartbeat), and export and erasure are refused (another user's raw keys,
--     and freeing them for a forged answer); as idem_dsr they work;
--   the attacks on the privilege boundary from idem_app (a claim completed, failed, renewed or reported by key_id
--     alone or with another claim's token, p_now, cleanup, re-encryption, health) are refused and
--     change nothing; idem_admin runs cleanup and health and may omit tokens, not pass p_now;
--   every SECURITY DEFINER idem_* function pins search_path to pg_catalog, pg_temp, and every other
--     function pins it too or is a SQL-standard body (resolved when created); the API's writers and
--     readers are SECURITY DEFINER; idem_cleanup (a procedure that commits) and the pure helpers are
--     not; no idem_* routine is owned by idem_app.
BEGIN;
SELECT plan(77);

-- On a Citus coordinator (make test-citus) the role and schema created below must go over one
-- connection per worker; a no-op setting on a single node (no citus extension loaded).
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

SET LOCAL client_min_messages = error;

SELECT has_role('idem_app', 'the application role idem_app exists');
SELECT ok((SELECT NOT rolcanlogin AND NOT rolsuper AND NOT rolcreaterole AND NOT rolcreatedb AND NOT rolbypassrls
             FROM pg_catalog.pg_roles WHERE rolname = 'idem_app'),
    'idem_app cannot log in and has no superuser, CREATEROLE, CREATEDB or BYPASSRLS (app roles are members of it)');
SELECT ok((SELECT pg_catalog.count(*) = 3 AND pg_catalog.bool_and(NOT rolcanlogin AND NOT rolsuper AND NOT rolcreaterole
                                                                  AND NOT rolcreatedb AND NOT rolbypassrls)
             FROM pg_catalog.pg_roles WHERE rolname IN ('idem_admin', 'idem_dsr', 'idem_monitor')),
    'idem_admin, idem_dsr and idem_monitor exist, cannot log in and hold no attribute');
SELECT ok(NOT has_schema_privilege('idem_app', 'public', 'CREATE'),
    'idem_app cannot create objects in schema public (no shadowing of the functions'' names)');

-- the tables ------------------------------------------------------------------------------------
SELECT table_privs_are('public', 'idempotency_keys', 'idem_app', ARRAY[]::text[],
    'idem_app holds no privilege on idempotency_keys');
SELECT table_privs_are('public', 'idempotency_events', 'idem_app', ARRAY[]::text[],
    'idem_app holds no privilege on idempotency_events');
SELECT ok(NOT has_sequence_privilege('idem_app', 'public.idempotency_keys_id_seq', 'USAGE, SELECT, UPDATE')
          AND NOT has_sequence_privilege('idem_app', 'public.idempotency_events_id_seq', 'USAGE, SELECT, UPDATE'),
    'idem_app holds no privilege on the tables'' sequences');
SELECT is_empty(
    $$SELECT c.relname FROM pg_catalog.pg_class c, LATERAL pg_catalog.aclexplode(c.relacl) a
       WHERE c.oid IN ('public.idempotency_keys'::regclass, 'public.idempotency_events'::regclass)
         AND a.grantee = 0$$,
    'PUBLIC holds no privilege on idempotency_keys or idempotency_events');

-- The fixtures the role will try to read and write, made before switching to it.
INSERT INTO public.users (id, email) VALUES (9901, 'app@example.test');
CREATE TEMP TABLE tok (name text PRIMARY KEY, id bigint, token text);
GRANT ALL ON tok TO idem_app, idem_admin;  -- the test's own scratch table, not the store
INSERT INTO tok SELECT 'fixture', key_id, claim_token FROM public.idem_claim('99000000-0000-4000-8000-000000000001', 9901, 'ep', '{}');
-- Another user's claim, in flight: the attacker knows its (sequential) key_id, not its token.
INSERT INTO public.users (id, email) VALUES (9902, 'victim@example.test');
INSERT INTO tok SELECT 'victim', key_id, claim_token FROM public.idem_claim('99000000-0000-4000-8000-000000000009', 9902, 'ep', '{}');
CREATE TEMP TABLE victim_before AS SELECT * FROM public.idempotency_keys WHERE scope_user_id = 9902;
CREATE TEMP TABLE events_before AS SELECT count(*) AS n FROM public.idempotency_events;

SET LOCAL ROLE idem_app;
SELECT throws_ok('SELECT * FROM public.idempotency_keys', '42501', NULL,
    'as idem_app, SELECT on idempotency_keys is denied');
SELECT throws_ok($$INSERT INTO public.idempotency_keys (idem_key, scope_endpoint, request_hash, expires_at)
                   VALUES ('99000000-0000-4000-8000-000000000002', 'ep', 'h', now() + interval '1 hour')$$, '42501', NULL,
    'as idem_app, INSERT into idempotency_keys is denied');
SELECT throws_ok($$UPDATE public.idempotency_keys SET status = 'completed'$$, '42501', NULL,
    'as idem_app, UPDATE of idempotency_keys is denied');
SELECT throws_ok('DELETE FROM public.idempotency_keys', '42501', NULL,
    'as idem_app, DELETE from idempotency_keys is denied');
SELECT throws_ok('TRUNCATE public.idempotency_keys', '42501', NULL,
    'as idem_app, TRUNCATE of idempotency_keys is denied');
SELECT throws_ok('SELECT * FROM public.idempotency_events', '42501', NULL,
    'as idem_app, SELECT on idempotency_events is denied');
SELECT throws_ok($$INSERT INTO public.idempotency_events (event) VALUES ('erasure')$$, '42501', NULL,
    'as idem_app, INSERT into idempotency_events is denied (the event log cannot be forged)');
SELECT throws_ok('UPDATE public.idempotency_events SET detail = ''{}''', '42501', NULL,
    'as idem_app, UPDATE of idempotency_events is denied');
SELECT throws_ok('DELETE FROM public.idempotency_events', '42501', NULL,
    'as idem_app, DELETE from idempotency_events is denied (the event log cannot be erased)');

-- the whole flow through the functions, as the app role -----------------------------------------
INSERT INTO tok SELECT 'app', key_id, claim_token FROM public.idem_claim('99000000-0000-4000-8000-000000000003', 9901, 'ep', '{"a": 1}');
SELECT isnt((SELECT token FROM tok WHERE name = 'app'), NULL, 'as idem_app, idem_claim claims a key and returns its token');
SELECT lives_ok(format('SELECT public.idem_heartbeat(%s, p_claim_token => %L)', id, token),
    'as idem_app, idem_heartbeat renews the lease with the claim''s token') FROM tok WHERE name = 'app';
SELECT lives_ok(format('SELECT public.idem_complete(%s, 201, %L, p_claim_token => %L)', id, '{"ok": 1}', token),
    'as idem_app, idem_complete completes the claim with its token') FROM tok WHERE name = 'app';
SELECT is((SELECT outcome FROM public.idem_claim('99000000-0000-4000-8000-000000000003', 9901, 'ep', '{"a": 1}')),
    'replay', 'as idem_app, a duplicate replays (its audit row written by the definer, not the role)');
SELECT lives_ok(format('SELECT public.idem_fail(%s, 500, p_claim_token => %L)', id, token),
    'as idem_app, idem_fail fails a claim with its token') FROM tok WHERE name = 'fixture';
SELECT throws_ok('SELECT * FROM public.idem_export_user(9902)', '42501', NULL,
    'as idem_app, exporting a user''s rows (another user''s raw keys, hashes and answers) is denied');
SELECT throws_ok('SELECT public.idem_erase_user(9902)', '42501', NULL,
    'as idem_app, erasing a user''s rows (which frees their keys for a forged answer) is denied');
RESET ROLE;
SET LOCAL ROLE idem_dsr;
SELECT is((SELECT count(*) FROM public.idem_export_user(9901)), 2::bigint, 'as idem_dsr, idem_export_user exports the user''s rows');
SELECT is(public.idem_erase_user(9901), 2::bigint, 'as idem_dsr, idem_erase_user erases them');
SELECT throws_ok($$SELECT * FROM public.idem_claim('99000000-0000-4000-8000-00000000000b', 9901, 'ep', '{}')$$, '42501', NULL,
    'as idem_dsr, the request path is denied');
RESET ROLE;
SET LOCAL ROLE idem_monitor;
SELECT lives_ok('SELECT * FROM public.idem_health', 'as idem_monitor, the idem_health view answers');
SELECT throws_ok($$SELECT * FROM public.idem_inspect('99000000-0000-4000-8000-000000000003')$$, '42501', NULL,
    'as idem_monitor, idem_inspect (keys and bodies) is denied');
RESET ROLE;
SET LOCAL ROLE idem_app;
SELECT throws_ok('SELECT public.idem_schema_version()', '42501', NULL,
    'as idem_app, idem_schema_version is not granted (nothing beyond the request path; the shim reads the catalog)');

-- the attacks on the privilege boundary, from the app role: each refused, and nothing changed (checked below)
SELECT throws_ok(format('SELECT public.idem_complete(%s, 201, %L, p_response_headers => %L)', id,
                        '{"forged": true}', '{"Location": "/evil"}'),
    'IDM00', NULL, 'as idem_app, completing another request''s claim by its key_id alone is refused (IDM00)')
  FROM tok WHERE name = 'victim';
SELECT throws_ok(format('SELECT public.idem_complete(%s, 201, %L, p_claim_token => %L)', v.id, '{"forged": true}', f.token),
    'IDM01', NULL, 'as idem_app, completing it with a token of another claim is refused (IDM01)')
  FROM tok v, tok f WHERE v.name = 'victim' AND f.name = 'fixture';
SELECT throws_ok(format('SELECT public.idem_fail(%s)', id), 'IDM00', NULL,
    'as idem_app, failing another request''s claim by its key_id alone is refused') FROM tok WHERE name = 'victim';
SELECT throws_ok(format('SELECT public.idem_heartbeat(%s, p_claim_token => %L)', id, repeat('0', 32)), 'IDM01', NULL,
    'as idem_app, renewing another request''s claim with a guessed token is refused') FROM tok WHERE name = 'victim';
SELECT throws_ok(format('SELECT public.idem_record_lost_claim(%s, %L)', id, 'POST /made-up'), 'IDM00', NULL,
    'as idem_app, reporting a made-up lost claim is refused (no forged events in idem_health)') FROM tok WHERE name = 'victim';
SELECT throws_ok($$SELECT * FROM public.idem_claim('99000000-0000-4000-8000-00000000000a', 9901, 'ep', '{}',
                                                   p_now => now() + interval '50 years')$$,
    'IDM00', 'idem_claim: p_now is for tests: only the functions'' owner may pass it',
    'as idem_app, a claim with p_now (a row the retention cap would never remove) is refused');
SELECT throws_ok('SELECT public.idem_cleanup_batch(10)', '42501', NULL,
    'as idem_app, idem_cleanup_batch (which could delete live keys) is denied');
SELECT throws_ok('CALL public.idem_cleanup()', '42501', NULL, 'as idem_app, CALL idem_cleanup is denied');
SELECT throws_ok(format('SELECT * FROM public.idem_reencrypt_responses(NULL, %L, 0, 10)', repeat('attacker-key-', 4)),
    '42501', NULL, 'as idem_app, re-encrypting the stored bodies under a key of its own is denied');
SELECT throws_ok('SELECT * FROM public.idem_health()', '42501', NULL, 'as idem_app, idem_health is denied (idem_admin''s)');
SELECT throws_ok($$SELECT * FROM public.idem_inspect('99000000-0000-4000-8000-000000000003')$$, '42501', NULL,
    'as idem_app, the DBA''s idem_inspect (keys and bodies) is denied');
RESET ROLE;
SELECT set_eq('SELECT * FROM public.idempotency_keys WHERE scope_user_id = 9902', 'SELECT * FROM victim_before',
    'the victim''s in-flight claim is untouched by every attack');
SELECT is((SELECT count(*) FROM public.idempotency_events), (SELECT n + 1 FROM events_before),
    'the attacks wrote no event (the one new event is the erasure of user 9901)');
SELECT is((SELECT count(*)::int FROM public.idempotency_keys WHERE idem_key = '99000000-0000-4000-8000-00000000000a'), 0,
    'the refused p_now claim stored nothing');

-- idem_admin: the DBA's role -----------------------------------------------------------------------
SET LOCAL ROLE idem_admin;
SELECT lives_ok('SELECT public.idem_cleanup_batch(10)', 'as idem_admin, idem_cleanup_batch runs');
SELECT lives_ok('SELECT * FROM public.idem_health', 'as idem_admin, the idem_health view answers');
SELECT lives_ok(format('SELECT public.idem_heartbeat(%s)', id),
    'as idem_admin, a DBA may act on a claim by its key_id alone (named-argument calls in psql)') FROM tok WHERE name = 'victim';
SELECT throws_ok('SELECT public.idem_cleanup_batch(10, p_now => ''infinity'')', 'IDM00', NULL,
    'as idem_admin too, p_now is refused: only the owner moves the clock');
RESET ROLE;

SELECT results_eq($$SELECT count(*)::int FROM public.audit_log WHERE user_id = 9901 AND action = 'idempotency_replay'$$, $$VALUES (1)$$,
    'the replay made as idem_app wrote its audit row');

-- routines --------------------------------------------------------------------------------------
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
         AND (p.proacl IS NULL
              OR EXISTS (SELECT 1 FROM pg_catalog.aclexplode(p.proacl) a WHERE a.grantee = 0))$$,
    'PUBLIC cannot EXECUTE any idem_* routine (none keeps the default grant)');
CREATE ROLE idem_pgtap_stranger NOLOGIN;
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
         AND pg_catalog.has_function_privilege('idem_pgtap_stranger', p.oid, 'EXECUTE')$$,
    'a role that was granted nothing cannot execute any idem_* routine');
SELECT ok(NOT has_table_privilege('idem_pgtap_stranger', 'public.idem_health', 'SELECT'),
    'a role that was granted nothing cannot read the idem_health view');

SELECT ok(has_function_privilege('idem_app', name::regproc, 'EXECUTE'), format('idem_app can EXECUTE %s', name))
  FROM unnest(ARRAY[
    'public.idem_claim',
    'public.idem_complete',
    'public.idem_fail',
    'public.idem_heartbeat',
    'public.idem_downstream_key',
    'public.idem_record_lost_claim']) name;
-- A new routine must be a conscious decision: granted to the app, or kept for DBAs/internal use.
SELECT results_eq(
    $$SELECT p.proname::text COLLATE "default" FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
         AND pg_catalog.has_function_privilege('idem_app', p.oid, 'EXECUTE')
       ORDER BY 1$$,
    -- on a distributed store (Citus) also idem_complete_in_scope: idem_complete delegated to the
    -- claim's worker (sql/citus/021), the completion the shim calls there
    $$SELECT n FROM (VALUES ('idem_claim'), ('idem_complete'), ('idem_downstream_key'),
             ('idem_fail'), ('idem_heartbeat'), ('idem_record_lost_claim')) v(n)
      UNION ALL SELECT 'idem_complete_in_scope' WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus')
      ORDER BY 1$$,
    'idem_app can EXECUTE exactly the request path''s API and the lost-claim report (contract §3a)');
SELECT results_eq(
    $$SELECT p.proname::text COLLATE "default" FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
         AND pg_catalog.has_function_privilege('idem_dsr', p.oid, 'EXECUTE') ORDER BY 1$$,
    $$VALUES ('idem_erase_user'), ('idem_export_user')$$,
    'idem_dsr can EXECUTE exactly a data subject''s export and erasure');
SELECT results_eq(
    $$SELECT p.proname::text COLLATE "default" FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
         AND pg_catalog.has_function_privilege('idem_monitor', p.oid, 'EXECUTE') ORDER BY 1$$,
    $$VALUES ('idem_health')$$,
    'idem_monitor can EXECUTE exactly idem_health (aggregates only), and read its view');
SELECT results_eq(
    $$SELECT p.proname::text COLLATE "default" FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
         AND pg_catalog.has_function_privilege('idem_admin', p.oid, 'EXECUTE')
         AND NOT pg_catalog.has_function_privilege('idem_app', p.oid, 'EXECUTE')
       ORDER BY 1$$,
    $$VALUES ('idem_canonical_key'), ('idem_cleanup'), ('idem_cleanup_batch'), ('idem_cleanup_job'), ('idem_cleanup_plan'),
             ('idem_erase_user'), ('idem_export_user'), ('idem_health'), ('idem_inspect'),
             ('idem_reencrypt_responses'), ('idem_refuse_key'), ('idem_response_key_census'), ('idem_schedule_cleanup'),
             ('idem_schema_version')$$,
    'idem_admin holds, beyond the app''s API, exactly cleanup (and its job''s spec), rotation, inspect, health, scheduling, export and erasure and the version and key helpers');
SELECT is_empty(
    $$SELECT p.proname FROM pg_catalog.pg_proc p
       WHERE p.proname IN ('idem_caller_is', 'idem_claim_token', 'idem_token_claimed_at', 'idem_check_token', 'idem_token_fits',
                           'idem_credential_name', 'idem_encrypt_response', 'idem_decrypt_response',
                           'idem_raise_claim_lost', 'idem_delete_expired', 'idem_scope_join', 'idem_reencrypt_range')
         AND (pg_catalog.has_function_privilege('idem_app', p.oid, 'EXECUTE')
              OR pg_catalog.has_function_privilege('idem_admin', p.oid, 'EXECUTE')
              OR pg_catalog.has_function_privilege('idem_dsr', p.oid, 'EXECUTE')
              OR pg_catalog.has_function_privilege('idem_monitor', p.oid, 'EXECUTE'))$$,
    'the token''s and the encryption''s internals, the lost-claim guard and the steps sql/citus/ replaces are granted to no role');
SELECT ok(NOT has_table_privilege('idem_app', 'public.idem_secret', 'SELECT')
          AND NOT has_table_privilege('idem_admin', 'public.idem_secret', 'SELECT'),
    'no role but the owner can read the secret behind the claim tokens');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_inspect'::regproc, 'EXECUTE')
          AND NOT has_function_privilege('idem_app', 'public.idem_schedule_cleanup'::regproc, 'EXECUTE')
          AND NOT has_function_privilege('idem_app', 'public.idem_decrypt_response'::regproc, 'EXECUTE'),
    'the DBA-only idem_inspect and idem_schedule_cleanup and the internal decrypt helper are not granted to idem_app');

SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%' AND p.prosecdef
         AND NOT COALESCE(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false)$$,
    'every SECURITY DEFINER idem_* function pins search_path to pg_catalog, pg_temp (pg_temp last: no planted type runs)');
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%' AND p.prokind = 'f'
         AND NOT COALESCE(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false)
         AND p.prosqlbody IS NULL$$,
    'every other idem_* function pins it too, or is a SQL-standard body whose names were resolved when it was created');
SELECT is_definer('public', 'idem_claim',
    'idem_claim is SECURITY DEFINER');
SELECT is_definer('public', 'idem_complete', 'idem_complete is SECURITY DEFINER');
SELECT is_definer('public', 'idem_fail', 'idem_fail is SECURITY DEFINER');
SELECT is_definer('public', 'idem_downstream_key', 'idem_downstream_key is SECURITY DEFINER (it reads the owner-only secret)');
SELECT is_definer('public', 'idem_heartbeat', 'idem_heartbeat is SECURITY DEFINER');
SELECT is_definer('public', 'idem_erase_user', 'idem_erase_user is SECURITY DEFINER');
SELECT is_definer('public', 'idem_export_user', 'idem_export_user is SECURITY DEFINER');
SELECT is_definer('public', 'idem_cleanup_batch', 'idem_cleanup_batch is SECURITY DEFINER (the procedure''s privileged work)');
SELECT isnt_definer('public', 'idem_cleanup', 'idem_cleanup is not SECURITY DEFINER: a procedure that commits cannot be');
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'idem\_%'
         AND p.proowner = 'idem_app'::regrole$$,
    'no idem_* routine is owned by idem_app (a definer owned by the app role would grant it nothing)');

SELECT * FROM finish();
ROLLBACK;
