-- 120_idem_inspect: one key in every scope it exists in, for a DBA.
-- Fixture: key K in three scopes: user 12001 on 'ep:a' (completed with body and a Location
-- header), a service call (no user) on 'ep:b' (in flight), and user 12002 on 'ep:a' (completed
-- with an encrypted body, then reported as a lost claim); key X expired.
-- Cases:
--   every scope of the key, ordered by endpoint then user (service calls first); narrowed by
--     p_user_id and by p_endpoint; the key in upper case finds the same rows;
--   without p_with_body: body_stored / headers_stored say what is kept, the body stays hidden;
--     with it: the stored body and headers; an encrypted body stays ciphertext;
--   lease_age and is_expired; the row's events (a lost_claim) as JSON;
--   an opaque key is found as sent with p_key_format => 'opaque' (not in another case), and is
--     malformed under the default;
--   an unknown key gives no row; a malformed one raises 22023; the app role may not run it.
BEGIN;
SELECT plan(15);

INSERT INTO public.users (id) VALUES (12001), (12002);
SELECT public.idem_complete(key_id, 201, '{"order_id": 7}', p_response_headers => '{"Location": "/orders/7"}')
  FROM public.idem_claim('a1200000-0000-4000-8000-0000000000aa', 12001, 'ep:a', '{}');
SELECT outcome FROM public.idem_claim('a1200000-0000-4000-8000-0000000000aa', NULL, 'ep:b', '{}', p_now => now() - interval '10 seconds');
CREATE TEMP TABLE tok AS SELECT key_id AS id FROM public.idem_claim('a1200000-0000-4000-8000-0000000000aa', 12002, 'ep:a', '{}');
SELECT public.idem_complete((SELECT id FROM tok), 201, '{"order_id": 8}', 'inspect-key-0123456789abcdefghijklmnop');
SELECT public.idem_record_lost_claim((SELECT id FROM tok), 'ep:a');
SELECT public.idem_complete(key_id, 200, '{}')
  FROM public.idem_claim('a1200000-0000-4000-8000-0000000000bb', 12001, 'ep:a', '{}', p_ttl => '1 hour', p_now => now() - interval '2 hours');

SELECT results_eq(
    $$SELECT scope_endpoint, scope_user_id::integer, status FROM public.idem_inspect('a1200000-0000-4000-8000-0000000000aa')$$,
    $$VALUES ('ep:a', 12001, 'completed'), ('ep:a', 12002, 'completed'), ('ep:b', NULL::integer, 'in_flight')$$,
    'every scope of the key, by endpoint then user');
SELECT results_eq(
    $$SELECT scope_endpoint, scope_user_id::integer FROM public.idem_inspect('A1200000-0000-4000-8000-0000000000AA', p_user_id => 12002)$$,
    $$VALUES ('ep:a', 12002)$$, 'narrowed by p_user_id; the key in upper case is the same key');
SELECT results_eq(
    $$SELECT scope_endpoint, scope_user_id::integer FROM public.idem_inspect('a1200000-0000-4000-8000-0000000000aa', p_endpoint => 'ep:b')$$,
    $$VALUES ('ep:b', NULL::integer)$$, 'narrowed by p_endpoint');
SELECT results_eq(
    $$SELECT body_stored, body_encrypted, response_body, headers_stored, response_headers, response_code
        FROM public.idem_inspect('a1200000-0000-4000-8000-0000000000aa', 12001)$$,
    $$VALUES (true, false, NULL::jsonb, true, NULL::jsonb, 201::smallint)$$,
    'without p_with_body the body and headers stay hidden; the flags say they are kept');
SELECT results_eq(
    $$SELECT response_body, response_headers FROM public.idem_inspect('a1200000-0000-4000-8000-0000000000aa', 12001, p_with_body => true)$$,
    $$VALUES ('{"order_id": 7}'::jsonb, '{"Location": "/orders/7"}'::jsonb)$$,
    'with p_with_body: the stored body and headers');
SELECT results_eq(
    $$SELECT body_encrypted, response_body ->> 'idem_enc', response_body::text LIKE '%order_id%'
        FROM public.idem_inspect('a1200000-0000-4000-8000-0000000000aa', 12002, p_with_body => true)$$,
    $$VALUES (true, 'pgp-sym-v1', false)$$,
    'an encrypted body stays ciphertext, even with p_with_body');
SELECT results_eq(
    $$SELECT e ->> 'event', e -> 'detail' ->> 'reason'
        FROM public.idem_inspect('a1200000-0000-4000-8000-0000000000aa', 12002), jsonb_array_elements(events) e$$,
    $$VALUES ('lost_claim', 'already_completed')$$,
    'the row''s events, as JSON');
SELECT ok((SELECT lease_age BETWEEN interval '9 seconds' AND interval '10 seconds' AND NOT is_expired
             FROM public.idem_inspect('a1200000-0000-4000-8000-0000000000aa', p_endpoint => 'ep:b')),
    'lease_age is the age of the holder''s lease; a live row is not expired');
SELECT is((SELECT is_expired FROM public.idem_inspect('a1200000-0000-4000-8000-0000000000bb')), true,
    'an expired row is shown, marked is_expired');
SELECT is_empty($$SELECT * FROM public.idem_inspect('a1200000-0000-4000-8000-0000000000cc')$$, 'an unknown key gives no row');
SELECT throws_ok($$SELECT * FROM public.idem_inspect('order-1')$$, '22023', 'Idempotency-Key must be a UUID string',
    'a malformed key raises 22023');
SELECT public.idem_claim('Order-2026-0001-ABCD', 12001, 'ep:op', '{}', p_key_format => 'opaque');
SELECT results_eq(
    $$SELECT idem_key, scope_endpoint, status FROM public.idem_inspect('Order-2026-0001-ABCD', p_key_format => 'opaque')$$,
    $$VALUES ('Order-2026-0001-ABCD'::text, 'ep:op'::text, 'in_flight'::text)$$,
    'an opaque key is found as sent under p_key_format => ''opaque''');
SELECT is_empty($$SELECT * FROM public.idem_inspect('ORDER-2026-0001-ABCD', p_key_format => 'opaque')$$,
    'an opaque key in another case is another key');
SELECT throws_ok($$SELECT * FROM public.idem_inspect('Order-2026-0001-ABCD')$$, '22023', 'Idempotency-Key must be a UUID string',
    'an opaque key is malformed under the default format');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_inspect(text, public.idem_user_id, text, boolean, text)', 'EXECUTE'),
    'the app role may not run it (it shows keys and bodies)');

SELECT * FROM finish();
ROLLBACK;
