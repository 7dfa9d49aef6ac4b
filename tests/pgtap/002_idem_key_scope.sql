-- 002_idem_key_scope: the shard a key_id names (the Citus routing helper).
-- Cases (a single node): no key_id names a shard (NULL), so the request path's WHERE clauses
-- reduce to the key_id alone; no role may execute it.
BEGIN;
SELECT plan(3);
-- Where the citus extension exists (make test-citus) the distributed forms of sql/citus/ are
-- installed, and the same number of checks asserts them instead.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') AS distributed \gset
\if :distributed
SELECT is(public.idem_key_scope(42::bigint * 2147483648 + 5)::integer, 42, 'on Citus a key_id names its scope in its high bits');
SELECT is(public.idem_key_scope(9223372036854775807)::integer, NULL::integer, 'a key_id whose high bits are no integer names none');
\else
SELECT is(public.idem_key_scope(1)::integer, NULL::integer, 'on a single node a key_id names no shard');
SELECT is(public.idem_key_scope(9223372036854775807)::integer, NULL::integer, 'not even the largest key_id');
\endif
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_key_scope(bigint)', 'EXECUTE'), 'idem_app may not execute it');
SELECT * FROM finish();
ROLLBACK;
