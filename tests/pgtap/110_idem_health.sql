-- 110_idem_health: the store's health in aggregates (the function; 111 is the view over it).
-- Fixture on endpoint 'ep:110' (now() is fixed in this transaction): A completed now, B
-- completed two days ago (expired), C in flight for a minute (stale under the default 30 s),
-- D in flight now (live), and E, claimed a minute ago and healed by a duplicate now (a
-- stale_heal event; its row is gone).
-- Cases:
--   keys rows per (endpoint, status): total, stale (in flight past p_stale_after, unexpired),
--     expired, oldest (age of the oldest row) and oldest_lease (in flight only);
--   a longer p_stale_after counts fewer stale holders;
--   event rows count the events of the last p_recent, and none outside it;
--   keys rows come before event rows; non-positive or NULL windows raise IDM00;
--   no key, user id, hash or body is among its columns (so the app role may call it);
--   bounded rows (issue 39, F5): with p_scopes the endpoints named are those, every other one
--   (two made-up ones here, 'ep:110x1' and 'ep:110x2') is summed in rows whose endpoint is NULL;
--   without, the p_top busiest are named (p_top 0: none); p_top outside 0..1000 or more than
--   1000 scopes raise IDM00.
BEGIN;
SELECT plan(17);

SET LOCAL client_min_messages = error;  -- the heal's WARNING

INSERT INTO public.users (id) VALUES (11001);
SELECT public.idem_complete(key_id, 201, '{}')
  FROM public.idem_claim('a1100000-0000-4000-8000-00000000000a', 11001, 'ep:110', '{}');
SELECT public.idem_complete(key_id, 201, '{}')
  FROM public.idem_claim('a1100000-0000-4000-8000-00000000000b', 11001, 'ep:110', '{}', p_now => now() - interval '2 days');
SELECT outcome FROM public.idem_claim('a1100000-0000-4000-8000-00000000000c', 11001, 'ep:110', '{}', p_now => now() - interval '1 minute');
SELECT outcome FROM public.idem_claim('a1100000-0000-4000-8000-00000000000d', 11001, 'ep:110', '{}');
SELECT outcome FROM public.idem_claim('a1100000-0000-4000-8000-00000000000e', 11001, 'ep:110', '{}', p_now => now() - interval '1 minute');
SELECT outcome FROM public.idem_claim('a1100000-0000-4000-8000-00000000000e', 11001, 'ep:110', '{}');

SELECT outcome FROM public.idem_claim('a1100000-0000-4000-8000-0000000000f1', 11001, 'ep:110x1', '{}');
SELECT outcome FROM public.idem_claim('a1100000-0000-4000-8000-0000000000f2', 11001, 'ep:110x2', '{}', p_now => now() - interval '1 minute');

SELECT results_eq(
    $$SELECT state, total, stale, expired FROM public.idem_health() WHERE kind = 'keys' AND scope_endpoint = 'ep:110'$$,
    $$VALUES ('completed', 2::bigint, 0::bigint, 1::bigint), ('in_flight', 2::bigint, 1::bigint, 0::bigint)$$,
    'keys rows: totals per status, the stale holder, the expired row');
SELECT ok((SELECT oldest BETWEEN interval '2 days' - interval '1 second' AND interval '2 days'
             FROM public.idem_health() WHERE kind = 'keys' AND scope_endpoint = 'ep:110' AND state = 'completed'),
    'oldest is the age of the oldest row (two days)');
SELECT ok((SELECT oldest_lease BETWEEN interval '59 seconds' AND interval '1 minute'
             FROM public.idem_health() WHERE kind = 'keys' AND scope_endpoint = 'ep:110' AND state = 'in_flight'),
    'oldest_lease is the age of the oldest in-flight lease (a minute)');
SELECT is((SELECT oldest_lease FROM public.idem_health() WHERE kind = 'keys' AND scope_endpoint = 'ep:110' AND state = 'completed'),
    NULL, 'finished rows have no lease');
SELECT is((SELECT stale FROM public.idem_health(p_stale_after => '2 minutes')
            WHERE kind = 'keys' AND scope_endpoint = 'ep:110' AND state = 'in_flight'),
    0::bigint, 'a longer p_stale_after sees no stale holder');
SELECT results_eq(
    $$SELECT state, total FROM public.idem_health() WHERE kind = 'event' AND scope_endpoint = 'ep:110'$$,
    $$VALUES ('stale_heal', 1::bigint)$$,
    'event rows: the heal of the last 24 hours');
SELECT is((SELECT count(*)::int FROM public.idem_health(p_recent => '1 hour', p_now => now() + interval '2 hours')
            WHERE kind = 'event' AND scope_endpoint = 'ep:110'),
    0, 'an event older than p_recent is not counted');
SELECT is((SELECT array_agg(DISTINCT kind) FROM (SELECT kind FROM public.idem_health() LIMIT 2) k), ARRAY['keys'],
    'keys rows come first');
SELECT throws_ok($$SELECT * FROM public.idem_health(p_stale_after => '0 seconds')$$, 'IDM00',
    'idem_health: p_stale_after and p_recent must be positive intervals', 'a zero p_stale_after raises IDM00');
SELECT throws_ok($$SELECT * FROM public.idem_health(p_recent => NULL)$$, 'IDM00', NULL, 'a NULL p_recent raises IDM00');
SELECT is(pg_get_function_result('public.idem_health'::regproc),
    'TABLE(kind text, scope_endpoint text, state text, total bigint, stale bigint, expired bigint, oldest interval, oldest_lease interval, latest timestamp with time zone)',
    'aggregates only: no key, user id, hash or body among the columns');
SELECT results_eq(
    $$SELECT scope_endpoint, state, total, stale FROM public.idem_health(p_scopes => ARRAY['ep:110', 'ep:110', 'never-used'])
       WHERE kind = 'keys' AND (scope_endpoint IS NULL OR scope_endpoint LIKE 'ep:110%') AND state = 'in_flight'$$,
    $$VALUES ('ep:110', 'in_flight', 2::bigint, 1::bigint), (NULL, 'in_flight', 2::bigint, 1::bigint)$$,
    'p_scopes: the scope named has its rows, the two other endpoints are one row with a NULL endpoint, a scope without rows none');
SELECT is((SELECT oldest_lease >= interval '59 seconds' FROM public.idem_health(p_scopes => ARRAY['ep:110'])
            WHERE kind = 'keys' AND scope_endpoint IS NULL AND state = 'in_flight'),
    true, 'the other row keeps the oldest lease of the endpoints it sums');
SELECT is((SELECT count(*)::int FROM public.idem_health(p_top => 0) WHERE scope_endpoint IS NOT NULL), 0,
    'p_top 0 names no endpoint');
SELECT is((SELECT array_agg(DISTINCT scope_endpoint) FROM public.idem_health(p_top => 1) WHERE kind = 'keys'),
    ARRAY['ep:110', NULL], 'p_top 1 names the endpoint holding the most rows, the rest is the NULL row');
SELECT throws_ok($$SELECT * FROM public.idem_health(p_top => -1)$$, 'IDM00', NULL, 'a negative p_top raises IDM00');
SELECT throws_ok($$SELECT * FROM public.idem_health(p_scopes => array_fill('x'::text, ARRAY[1001]))$$, 'IDM00',
    'idem_health: p_top must be between 0 and 1000 and p_scopes hold at most 1000 scopes (got p_top 50, 1001 scopes)',
    'more than 1000 scopes raise IDM00');
SELECT * FROM finish();
ROLLBACK;
