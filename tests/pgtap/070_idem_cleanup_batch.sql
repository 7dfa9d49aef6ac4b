-- 070_idem_cleanup_batch: one batch of the expiry cleanup (contract §3). The procedure
-- idem_cleanup COMMITs between batches, so it cannot run inside this transaction: it is tested
-- from Python; here we only check that it refuses to run inside one.
-- Fixture (expiry relative to now()): completed C1 (-3 h), completed C2 (-2 h 30 min),
-- failed F1 (-1 h), orphaned in-flight I1 (-2 h); kept: completed C3 and failed F2 (future),
-- live in-flight I2, and I3 in flight for 10 minutes (stale, but not expired).
-- Cases:
--   expiry is judged at p_now: before anything expired, nothing is deleted;
--   deletes at most p_batch_size rows and returns how many; finished rows go first, oldest
--     expiry first, and orphaned in-flight rows fill what is left of a batch;
--   returns 0 once nothing has expired; never deletes an unexpired row (finished, live, or
--     stale-but-unexpired in flight), nor changes one;
--   trims events older than 7 days and keeps recent ones;
--   a batch size of 0, negative, NULL or above 1 000 000 raises IDM00;
--   CALL idem_cleanup() inside a transaction block fails with 2D000.
BEGIN;
SELECT plan(16);

SET LOCAL client_min_messages = error;

CREATE TEMP TABLE fx (name text PRIMARY KEY, id bigint);
DO $$
BEGIN
    INSERT INTO fx SELECT 'C1', key_id FROM public.idem_claim('10000000-0000-4000-8000-000000000001', NULL, 'ep', '{}',
                                                              p_ttl => '2 hours', p_now => now() - interval '5 hours');
    INSERT INTO fx SELECT 'C2', key_id FROM public.idem_claim('10000000-0000-4000-8000-000000000002', NULL, 'ep', '{}',
                                                              p_ttl => '2 hours', p_now => now() - interval '4 hours 30 minutes');
    INSERT INTO fx SELECT 'F1', key_id FROM public.idem_claim('10000000-0000-4000-8000-000000000003', NULL, 'ep', '{}',
                                                              p_ttl => '2 hours', p_now => now() - interval '3 hours');
    INSERT INTO fx SELECT 'I1', key_id FROM public.idem_claim('10000000-0000-4000-8000-000000000004', NULL, 'ep', '{}',
                                                              p_ttl => '1 hour', p_now => now() - interval '3 hours');
    INSERT INTO fx SELECT 'C3', key_id FROM public.idem_claim('10000000-0000-4000-8000-000000000005', NULL, 'ep', '{}',
                                                              p_now => now() - interval '2 hours');
    INSERT INTO fx SELECT 'F2', key_id FROM public.idem_claim('10000000-0000-4000-8000-000000000006', NULL, 'ep', '{}',
                                                              p_now => now() - interval '2 hours');
    INSERT INTO fx SELECT 'I2', key_id FROM public.idem_claim('10000000-0000-4000-8000-000000000007', NULL, 'ep', '{}');
    INSERT INTO fx SELECT 'I3', key_id FROM public.idem_claim('10000000-0000-4000-8000-000000000008', NULL, 'ep', '{}',
                                                              p_now => now() - interval '10 minutes');
    PERFORM public.idem_complete(id, 200, '{"c": 1}') FROM fx WHERE name IN ('C1', 'C2', 'C3');
    PERFORM public.idem_fail(id, 500) FROM fx WHERE name IN ('F1', 'F2');
    INSERT INTO public.idempotency_events (occurred_at, event, scope_user_id, detail)
    VALUES (now() - interval '8 days', 'erasure', 1, '{"rows": 0, "fixture": "old"}'),
           (now() - interval '6 days', 'erasure', 1, '{"rows": 0, "fixture": "recent"}');
END
$$;
CREATE TEMP TABLE kept_before AS
    SELECT k.* FROM public.idempotency_keys k JOIN fx USING (id) WHERE fx.name IN ('C3', 'F2', 'I2', 'I3');
CREATE FUNCTION pg_temp.left_over() RETURNS text[] LANGUAGE sql AS $$
    SELECT array_agg(fx.name ORDER BY fx.name) FROM fx JOIN public.idempotency_keys k USING (id)
$$;

SELECT is(public.idem_cleanup_batch(100, now() - interval '4 hours'), 0,
    'expiry is judged at p_now: four hours ago nothing had expired, so nothing is deleted');
SELECT is(public.idem_cleanup_batch(1, now()), 1, 'a batch of one deletes one row and says so');
SELECT is(pg_temp.left_over(), ARRAY['C2', 'C3', 'F1', 'F2', 'I1', 'I2', 'I3'],
    'the first row to go is the finished row that expired first');
SELECT is(public.idem_cleanup_batch(2, now()), 2, 'a batch of two deletes two rows');
SELECT is(pg_temp.left_over(), ARRAY['C3', 'F2', 'I1', 'I2', 'I3'],
    'finished rows go before orphaned in-flight ones, even one that expired earlier');
SELECT is(public.idem_cleanup_batch(10, now()), 1,
    'a batch with room left deletes the orphaned in-flight row and returns the key count only');
SELECT is(pg_temp.left_over(), ARRAY['C3', 'F2', 'I2', 'I3'],
    'only unexpired rows remain: finished ones, a live holder and a stale-but-unexpired holder');
SELECT is(public.idem_cleanup_batch(10, now()), 0, 'once nothing has expired a batch returns 0');
SELECT is(public.idem_cleanup_batch(), 0, 'with its defaults (5000 rows, the clock) it finds nothing more');
SELECT set_eq(
    $$SELECT k.* FROM public.idempotency_keys k JOIN fx USING (id) WHERE fx.name IN ('C3', 'F2', 'I2', 'I3')$$,
    'SELECT * FROM kept_before',
    'the rows that were kept are unchanged');
SELECT results_eq(
    $$SELECT detail->>'fixture' FROM public.idempotency_events WHERE detail ? 'fixture' ORDER BY occurred_at$$,
    $$VALUES ('recent')$$,
    'events older than 7 days are trimmed, a 6-day-old one is kept');

SELECT throws_ok('SELECT public.idem_cleanup_batch(0)',
    'IDM00', 'idem_cleanup_batch: p_batch_size must be between 1 and 1000000 (got 0)', 'a batch size of 0 raises IDM00');
SELECT throws_ok('SELECT public.idem_cleanup_batch(-5)',
    'IDM00', 'idem_cleanup_batch: p_batch_size must be between 1 and 1000000 (got -5)', 'a negative batch size raises IDM00');
SELECT throws_ok('SELECT public.idem_cleanup_batch(NULL)',
    'IDM00', NULL, 'a NULL batch size raises IDM00');
SELECT throws_ok('SELECT public.idem_cleanup_batch(1000001)',
    'IDM00', 'idem_cleanup_batch: p_batch_size must be between 1 and 1000000 (got 1000001)',
    'a batch size above a million raises IDM00 (a batch must stay small)');

SELECT throws_ok('CALL public.idem_cleanup()',
    '2D000', NULL, 'CALL idem_cleanup() inside a transaction block fails with 2D000: it commits between batches');

SELECT * FROM finish();
ROLLBACK;
