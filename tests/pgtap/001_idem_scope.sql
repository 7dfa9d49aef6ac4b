-- 001_idem_scope: the scope a claim's row is stored under (the Citus routing helper).
-- Cases (a single node: sql/functions/; the distributed form is sql/citus/001, tested by
-- tests/python/sql/test_citus.py):
--   the user id is the scope, NULL (a service call) stays NULL;
--   neither idem_app nor idem_admin may execute it (the definers call it).
BEGIN;
SELECT plan(4);
-- Where the citus extension exists (make test-citus) the distributed forms of sql/citus/ are
-- installed, and the same number of checks asserts them instead.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') AS distributed \gset
SELECT is(public.idem_scope(42)::integer, 42, 'a user''s scope is the user id');
\if :distributed
SELECT is(public.idem_scope(NULL)::integer, 0, 'a service call is stored under the reserved user 0 on Citus (no NULL distribution value)');
\else
SELECT is(public.idem_scope(NULL)::integer, NULL::integer, 'a service call keeps the NULL scope on a single node');
\endif
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_scope(public.idem_user_id)', 'EXECUTE'), 'idem_app may not execute it');
SELECT ok(NOT has_function_privilege('idem_admin', 'public.idem_scope(public.idem_user_id)', 'EXECUTE'), 'idem_admin may not execute it');
SELECT * FROM finish();
ROLLBACK;
