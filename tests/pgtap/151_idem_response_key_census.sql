-- 151_idem_response_key_census: stored bodies per response key id, for a rotation's report.
-- Cases:
--   counts completed rows with a body per kid (NULL: in clear); rows without a body, in flight
--   or failed are not counted; is_current marks p_current_key's kid (or clear without a key);
--   a weak p_current_key raises IDM00; idem_admin may run it, idem_app may not.
BEGIN;
SELECT plan(5);

INSERT INTO public.users (id) VALUES (15101);
CREATE TEMP TABLE tok (name text PRIMARY KEY, id bigint);
INSERT INTO tok SELECT 'plain', key_id FROM public.idem_claim('a1510000-0000-4000-8000-000000000001', 15101, 'ep', '{}');
SELECT public.idem_complete((SELECT id FROM tok WHERE name = 'plain'), 201, '{"a": 1}');
INSERT INTO tok SELECT 'enc1', key_id FROM public.idem_claim('a1510000-0000-4000-8000-000000000002', 15101, 'ep', '{}');
SELECT public.idem_complete((SELECT id FROM tok WHERE name = 'enc1'), 201, '{"a": 2}', 'census-key-one-0123456789abcdefghijklmnop');
INSERT INTO tok SELECT 'enc2', key_id FROM public.idem_claim('a1510000-0000-4000-8000-000000000003', 15101, 'ep', '{}');
SELECT public.idem_complete((SELECT id FROM tok WHERE name = 'enc2'), 201, '{"a": 3}', 'census-key-one-0123456789abcdefghijklmnop');
INSERT INTO tok SELECT 'nobody', key_id FROM public.idem_claim('a1510000-0000-4000-8000-000000000004', 15101, 'ep', '{}');
SELECT public.idem_complete((SELECT id FROM tok WHERE name = 'nobody'), 201, NULL);
INSERT INTO tok SELECT 'live', key_id FROM public.idem_claim('a1510000-0000-4000-8000-000000000005', 15101, 'ep', '{}');

SELECT results_eq('SELECT kid, bodies, is_current FROM public.idem_response_key_census()',
    format($$VALUES (NULL::text, 1::bigint, true), (%L, 2::bigint, false)$$,
           public.idem_response_key_id('census-key-one-0123456789abcdefghijklmnop')),
    'without a key: bodies per kid (clear first), clear is current; no-body, in-flight rows not counted');
SELECT results_eq($$SELECT kid IS NULL, bodies, is_current FROM public.idem_response_key_census('census-key-one-0123456789abcdefghijklmnop')$$,
    $$VALUES (true, 1::bigint, false), (false, 2::bigint, true)$$,
    'with the key: its kid is current, clear is not');
SELECT is((SELECT count(*)::int FROM public.idem_response_key_census('census-key-two-0123456789abcdefghijklmnop') WHERE is_current), 0,
    'with a key nothing is stored under, nothing is current');
SELECT throws_ok($$SELECT * FROM public.idem_response_key_census('weak')$$, 'IDM00', NULL,
    'a weak key raises IDM00');
SELECT ok(has_function_privilege('idem_admin', 'public.idem_response_key_census(text)', 'EXECUTE')
          AND NOT has_function_privilege('idem_app', 'public.idem_response_key_census(text)', 'EXECUTE'),
    'the admin role (which drives the rotation) may run the census; the app role may not');

SELECT * FROM finish();
ROLLBACK;
