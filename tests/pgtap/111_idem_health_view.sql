-- 111_idem_health_view: `SELECT * FROM idem_health;`, the DBA's short form of idem_health().
-- Cases:
--   the view is idem_health() with its defaults (30 s stale window, 24 h of events), row for row;
--   a holder older than 30 s shows as stale in it, one younger does not;
--   idem_admin may read it (aggregates only) and not write it; idem_app may not read it.
BEGIN;
SELECT plan(5);

SET LOCAL client_min_messages = error;

INSERT INTO public.users (id) VALUES (11101);
SELECT outcome FROM public.idem_claim('a1110000-0000-4000-8000-000000000001', 11101, 'ep:111', '{}', p_now => now() - interval '31 seconds');
SELECT outcome FROM public.idem_claim('a1110000-0000-4000-8000-000000000002', 11101, 'ep:111', '{}', p_now => now() - interval '20 seconds');
SELECT public.idem_complete(key_id, 200, '{}') FROM public.idem_claim('a1110000-0000-4000-8000-000000000003', 11101, 'ep:111', '{}');

SELECT has_view('public', 'idem_health', 'the view exists');
SELECT set_eq('SELECT kind, scope_endpoint, state, total, stale, expired FROM public.idem_health',
              'SELECT kind, scope_endpoint, state, total, stale, expired FROM public.idem_health()',
    'the view is the function with its defaults');
SELECT results_eq($$SELECT state, total, stale FROM public.idem_health WHERE scope_endpoint = 'ep:111'$$,
    $$VALUES ('completed', 1::bigint, 0::bigint), ('in_flight', 2::bigint, 1::bigint)$$,
    'the 31-second holder is stale under the 30-second default, the 20-second one is not');
SELECT ok(has_table_privilege('idem_admin', 'public.idem_health', 'SELECT')
          AND NOT has_table_privilege('idem_admin', 'public.idem_health', 'INSERT,UPDATE,DELETE'),
    'the DBA''s role may read it, and not write it');
SELECT ok(NOT has_table_privilege('idem_app', 'public.idem_health', 'SELECT'), 'the app role may not read it (contract §3a)');

SELECT * FROM finish();
ROLLBACK;
