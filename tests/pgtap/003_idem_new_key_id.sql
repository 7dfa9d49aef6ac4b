-- 003_idem_new_key_id: the id a new claim's row gets (the Citus routing helper).
-- Cases (a single node): the next value of the table's own sequence, increasing, whatever the
-- scope; no role may execute it.
BEGIN;
SELECT plan(3);
SELECT public.idem_new_key_id(42) AS first \gset
SELECT ok(public.idem_new_key_id(NULL) > :first, 'each call takes the next value of idempotency_keys_id_seq');
SELECT is(pg_catalog.currval('public.idempotency_keys_id_seq'), (:first + 1)::bigint, 'the sequence is the table''s own');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_new_key_id(integer)', 'EXECUTE'), 'idem_app may not execute it');
SELECT * FROM finish();
ROLLBACK;
