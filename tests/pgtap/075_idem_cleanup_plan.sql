-- 075_idem_cleanup_plan: whether a cleanup's pace deletes what has expired before the next run.
-- Fixture: 3 expired rows (two finished, one orphaned in flight) and 2 live ones.
-- Cases:
--   counts only the expired rows, whatever their status;
--   at the default pace (2500 rows/s) 3 rows take 1.2 ms and fit in the day;
--   at 1 row an hour they take 3 hours: fits in a day, not in 2 hours (p_every);
--   NULL (unpaced) has no estimate and always fits;
--   a pace of 0 or below raises IDM00 naming p_max_rows_per_second; a non-positive p_every too;
--   its defaults are idem_cleanup's (one number, two declarations).
BEGIN;
SELECT plan(9);

SET LOCAL client_min_messages = error;
DO $$
DECLARE v_id bigint;
BEGIN
    SELECT key_id INTO v_id FROM public.idem_claim('20000000-0000-4000-8000-000000000001', NULL, 'ep', '{}',
                                                   p_ttl => '1 hour', p_now => now() - interval '3 hours');
    PERFORM public.idem_complete(v_id, 200, '{}');
    SELECT key_id INTO v_id FROM public.idem_claim('20000000-0000-4000-8000-000000000002', NULL, 'ep', '{}',
                                                   p_ttl => '1 hour', p_now => now() - interval '2 hours');
    PERFORM public.idem_fail(v_id);
    PERFORM public.idem_claim('20000000-0000-4000-8000-000000000003', NULL, 'ep', '{}',
                              p_ttl => '1 hour', p_now => now() - interval '2 hours');
    PERFORM public.idem_claim('20000000-0000-4000-8000-000000000004', NULL, 'ep', '{}');
    SELECT key_id INTO v_id FROM public.idem_claim('20000000-0000-4000-8000-000000000005', NULL, 'ep', '{}');
    PERFORM public.idem_complete(v_id, 200, '{}');
END
$$;

SELECT is((SELECT expired FROM public.idem_cleanup_plan()), 3::bigint,
    'the plan counts the three expired rows (completed, failed, orphaned in flight) and not the live ones');
SELECT results_eq($$SELECT max_rows_per_second, takes, every, fits FROM public.idem_cleanup_plan()$$,
    $$VALUES (2500, interval '0.0012 seconds', interval '1 day', true)$$,
    'at the default 2500 rows a second, three rows take 1.2 ms and fit before the next daily run');
SELECT results_eq($$SELECT takes, fits FROM public.idem_cleanup_plan(p_max_rows_per_second => 1)$$,
    $$VALUES (interval '3 seconds', true)$$,
    'at one row a second they take 3 seconds');
SELECT results_eq(
    $$SELECT takes, fits FROM public.idem_cleanup_plan(p_max_rows_per_second => 1, p_every => '2 seconds')$$,
    $$VALUES (interval '3 seconds', false)$$,
    'a pace that cannot delete them before the next run (p_every) does not fit');
SELECT results_eq($$SELECT takes, fits FROM public.idem_cleanup_plan(p_max_rows_per_second => NULL)$$,
    $$VALUES (NULL::interval, true)$$,
    'unpaced (NULL) has no estimate and always fits');
SELECT throws_ok($$SELECT * FROM public.idem_cleanup_plan(p_max_rows_per_second => 0)$$, 'IDM00',
    'idem_cleanup_plan: p_max_rows_per_second must be positive (got 0); NULL runs unpaced',
    'a pace of 0 raises IDM00 naming the parameter');
SELECT throws_ok($$SELECT * FROM public.idem_cleanup_plan(p_max_rows_per_second => -5)$$, 'IDM00',
    'idem_cleanup_plan: p_max_rows_per_second must be positive (got -5); NULL runs unpaced',
    'a negative pace raises IDM00 naming the parameter');
SELECT throws_ok($$SELECT * FROM public.idem_cleanup_plan(p_every => '0 seconds')$$, 'IDM00',
    'idem_cleanup_plan: p_every must be a positive interval',
    'a non-positive interval to the next run raises IDM00');
SELECT is(
    (SELECT split_part(split_part(pg_catalog.pg_get_function_arguments('public.idem_cleanup_plan'::regproc),
                                  'DEFAULT ', 2), ',', 1)),
    (SELECT split_part(split_part(pg_catalog.pg_get_function_arguments('public.idem_cleanup'::regproc),
                                  'p_max_rows_per_second integer DEFAULT ', 2), ',', 1)),
    'idem_cleanup_plan''s default pace is idem_cleanup''s');

SELECT * FROM finish();
ROLLBACK;
