-- 003_idem_new_key_id: the id a new claim's row gets (the Citus routing helper).
-- Cases (a single node): the next value of the table's own sequence, increasing, whatever the
-- scope; no role may execute it.
BEGIN;
SELECT plan(3);
-- Where the citus extension exists (make test-citus) the distributed forms of sql/citus/ are
-- installed, and the same number of checks asserts them instead.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') AS distributed \gset
SELECT public.idem_new_key_id(42) AS first \gset
\if :distributed
SELECT is(public.idem_new_key_id(42) >> 31, 42::bigint, 'on Citus the scope is the key_id''s high bits (it routes to its shard)');
SELECT is(pg_catalog.currval('public.idempotency_keys_id_seq') & 2147483647, (:first + 1) & 2147483647,
    'and the low 31 bits are the next value of the table''s own sequence');
\else
SELECT ok(public.idem_new_key_id(NULL) > :first, 'each call takes the next value of idempotency_keys_id_seq');
SELECT is(pg_catalog.currval('public.idempotency_keys_id_seq'), (:first + 1)::bigint, 'the sequence is the table''s own');
\endif
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_new_key_id(public.idem_user_id)', 'EXECUTE'), 'idem_app may not execute it');
SELECT * FROM finish();
ROLLBACK;
