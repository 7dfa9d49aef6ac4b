-- 017_idem_user_id_type: the user scope's type, the base of the domain public.idem_user_id.
-- Cases: the default install's is integer (public.users, migration 0001's); the columns and
-- p_user_id take the domain; a value of another type is refused by the domain's base type; no
-- role but the owner may execute it. (A uuid store: tests/python/sql/test_host_users.py.)
BEGIN;
SELECT plan(5);
SELECT is(public.idem_user_id_type(), 'integer'::regtype, 'the default install''s user scope is integer');
SELECT is((SELECT t.typbasetype::regtype FROM pg_type t WHERE t.oid = 'public.idem_user_id'::regtype),
          public.idem_user_id_type(), 'it is the base type of the domain public.idem_user_id');
-- On Citus the scope is the distribution column: the users' integer itself (colocation).
SELECT is((SELECT atttypid::regtype FROM pg_attribute
            WHERE attrelid = 'public.idempotency_events'::regclass AND attname = 'scope_user_id'),
          CASE WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN 'integer'::regtype
               ELSE 'public.idem_user_id'::regtype END,
          'idempotency_events.scope_user_id takes the domain too (Citus: its integer base)');
SELECT throws_ok($$SELECT '6f1e7a64-4e8c-4d1a-9b7e-0c3f5d2a1b00'::public.idem_user_id$$, '22P02', NULL,
                 'a UUID is no user of an integer store');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_user_id_type()', 'EXECUTE'), 'idem_app may not execute it');
SELECT * FROM finish();
ROLLBACK;
