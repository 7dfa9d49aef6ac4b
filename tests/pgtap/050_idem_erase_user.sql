-- 050_idem_erase_user: GDPR erasure (contract §3), and the users(id) cascade (contract §2).
-- Cases:
--   returns the number of the user's rows it deleted, whatever their status (in flight,
--     completed, failed, expired), on every endpoint;
--   leaves no row of that user, so no stored body or response header of theirs either; touches no other user's rows nor service (NULL-user) rows;
--   deletes the user's events too, and logs one erasure event with the count only (no user id, key, hash or body);
--   erasing again, or erasing a user without rows, returns 0 and logs no event;
--   the erased user's key can be claimed afresh;
--   a NULL user id raises IDM00 (NULL is no data subject) and deletes nothing;
--   deleting the user from users cascades to their idempotency rows and no one else's.
BEGIN;
SELECT plan(19);

INSERT INTO public.users (id, email) VALUES (5001, 'ivan@example.test'), (5002, 'judy@example.test'), (5003, 'mallory@example.test');

DO $$
BEGIN
    -- User 5001: one row in each state, on two endpoints, one of them expired.
    PERFORM public.idem_complete(key_id, 201, '{"order": 1}', p_response_headers => '{"Location": "/orders/ivan-1"}')
       FROM public.idem_claim('e0000000-0000-4000-8000-000000000001', 5001, 'orders', '{"q": 1}');
    PERFORM public.idem_fail(key_id, 502)
       FROM public.idem_claim('e0000000-0000-4000-8000-000000000002', 5001, 'orders', '{"q": 2}');
    PERFORM public.idem_claim('e0000000-0000-4000-8000-000000000003', 5001, 'checkout', '{"q": 3}');
    PERFORM public.idem_complete(key_id, 200, '{"old": true}')
       FROM public.idem_claim('e0000000-0000-4000-8000-000000000004', 5001, 'checkout', '{"q": 4}',
                              p_ttl => '1 hour', p_now => now() - interval '2 hours');
    -- User 5002 and a service call, with the same keys: they must survive.
    PERFORM public.idem_complete(key_id, 201, '{"order": 2}')
       FROM public.idem_claim('e0000000-0000-4000-8000-000000000001', 5002, 'orders', '{"q": 1}');
    PERFORM public.idem_claim('e0000000-0000-4000-8000-000000000005', 5002, 'orders', '{"q": 5}');
    PERFORM public.idem_claim('e0000000-0000-4000-8000-000000000001', NULL, 'orders', '{"q": 1}');
    -- Events that name user 5001 (a stale heal keeps the key, a lost claim the endpoint), and
    -- one of user 5002's, which must stay.
    INSERT INTO public.idempotency_events (event, key_id, scope_user_id, scope_endpoint, detail) VALUES
        ('stale_heal', 900001, 5001, 'orders', '{"idem_key": "e0000000-0000-4000-8000-000000000009"}'),
        ('lost_claim', 900001, 5001, 'orders', '{"reason": "healed_as_stale"}'),
        ('stale_heal', 900002, 5002, 'orders', '{"idem_key": "e0000000-0000-4000-8000-000000000008"}');
END
$$;
CREATE TEMP TABLE others_before AS
    SELECT * FROM public.idempotency_keys WHERE scope_user_id IS DISTINCT FROM 5001;
CREATE TEMP TABLE events_before AS SELECT count(*) - 2 AS n FROM public.idempotency_events;  -- less 5001's two

SELECT is(public.idem_erase_user(5001), 4::bigint,
    'erasing a user returns the count of their rows: in flight, completed, failed and expired alike');
SELECT is((SELECT count(*)::int FROM public.idempotency_keys WHERE response_headers::text LIKE '%ivan%'), 0,
    'the erased user''s stored response headers are gone with their rows');
SELECT results_eq($$SELECT count(*)::int FROM public.idempotency_keys WHERE scope_user_id = 5001$$, $$VALUES (0)$$,
    'no row of the erased user is left');
SELECT set_eq('SELECT * FROM public.idempotency_keys', 'SELECT * FROM others_before',
    'every other user''s rows and the service call''s row are untouched');
SELECT results_eq(
    -- the scope is idem_anonymous_scope's: NULL on a single node, on a distributed store a
    -- negative value (no user's id) on the erased user's shard
    $$SELECT event, scope_user_id IS NOT DISTINCT FROM public.idem_anonymous_scope(5001)
                    AND COALESCE(scope_user_id, -1) < 0, key_id, scope_endpoint, detail
        FROM public.idempotency_events WHERE event = 'erasure'$$,
    $$VALUES ('erasure'::text, true, NULL::bigint, NULL::text, '{"rows": 4}'::jsonb)$$,
    'one erasure event records the count, and neither the user id nor anything of the erased content');
SELECT results_eq($$SELECT count(*)::int FROM public.idempotency_events
            WHERE scope_user_id = 5001 OR detail::text LIKE '%e0000000-0000-4000-8000-000000000009%'$$, $$VALUES (0)$$,
    'no event of the erased user is left (their stale heal and lost claim went with their keys)');
SELECT results_eq($$SELECT count(*)::int FROM public.idempotency_events WHERE scope_user_id = 5002$$, $$VALUES (1)$$,
    'another user''s events stay');
SELECT is((SELECT count(*) FROM public.idempotency_events) - (SELECT n FROM events_before), 1::bigint,
    'the erasure wrote exactly one event');

SELECT is(public.idem_erase_user(5001), 0::bigint, 'erasing the same user again returns 0');
SELECT is(public.idem_erase_user(5003), 0::bigint, 'erasing a user who has no rows returns 0');
SELECT is(public.idem_erase_user(424242), 0::bigint, 'erasing an unknown user id returns 0');
SELECT is((SELECT count(*) FROM public.idempotency_events) - (SELECT n FROM events_before), 1::bigint,
    'erasures that found no rows log no erasure event (idem_health counts erasures that erased something)');

SELECT is((SELECT outcome FROM public.idem_claim('e0000000-0000-4000-8000-000000000001', 5001, 'orders', '{"q": 1}')),
    'claimed', 'after erasure the user''s old key is claimed afresh (nothing to replay)');

CREATE TEMP TABLE all_before AS SELECT count(*) AS n FROM public.idempotency_keys;
SELECT throws_ok('SELECT public.idem_erase_user(NULL)',
    'IDM00', 'idem_erase_user: p_user_id must not be NULL',
    'a NULL user id raises IDM00 instead of meaning "every service call"');
SELECT is((SELECT count(*) FROM public.idempotency_keys), (SELECT n FROM all_before),
    'the refused erasure deleted nothing');
-- service calls are stored under idem_scope(NULL): NULL on a single node, 0 on a distributed store
SELECT isnt((SELECT count(*)::int FROM public.idempotency_keys WHERE scope_user_id IS NOT DISTINCT FROM public.idem_scope(NULL)), 0,
    'service-call rows survive a NULL erasure attempt');

-- the host's user deletion cascades --------------------------------------------------------------
CREATE TEMP TABLE not_5002 AS SELECT * FROM public.idempotency_keys WHERE scope_user_id IS DISTINCT FROM 5002;
SELECT lives_ok('DELETE FROM public.users WHERE id = 5002', 'the host app can delete a user who has idempotency rows');
SELECT results_eq($$SELECT count(*)::int FROM public.idempotency_keys WHERE scope_user_id = 5002$$, $$VALUES (0)$$,
    'deleting the user cascaded to their idempotency rows');
SELECT set_eq('SELECT * FROM public.idempotency_keys', 'SELECT * FROM not_5002',
    'the cascade touched no other user''s rows');

SELECT * FROM finish();
ROLLBACK;
