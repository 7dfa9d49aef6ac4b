-- 130_idem_record_lost_claim: the shim reports a lost claim after its rollback; the reason
-- comes from the database, not the caller.
-- Cases:
--   a token that still holds its key: false, nothing written;
--   a completed / failed token: true, one lost_claim event with reason already_completed /
--     already_failed and the row's scope; reported again: false (once per token);
--   a healed token: reason healed_as_stale, with the scope and request hash of the heal event;
--   a token without row or heal (erased, cleaned up): reason gone, the caller's endpoint kept
--     as reported_endpoint and as the event's endpoint;
--   a NULL, zero or negative key_id raises IDM00. (The owner reports without a claim token, as
--   here; any other caller needs the claim's: tests/pgtap/990_privileges.sql and test_sec_boundary.py.)
BEGIN;
SELECT plan(11);

SET LOCAL client_min_messages = error;

INSERT INTO public.users (id) VALUES (13001);
CREATE TEMP TABLE tok (name text PRIMARY KEY, id bigint);
INSERT INTO tok SELECT 'live', key_id FROM public.idem_claim('a1300000-0000-4000-8000-000000000001', 13001, 'ep:130', '{}');
INSERT INTO tok SELECT 'done', key_id FROM public.idem_claim('a1300000-0000-4000-8000-000000000002', 13001, 'ep:130', '{}');
SELECT public.idem_complete((SELECT id FROM tok WHERE name = 'done'), 201, '{}');
INSERT INTO tok SELECT 'failed', key_id FROM public.idem_claim('a1300000-0000-4000-8000-000000000003', 13001, 'ep:130', '{}');
SELECT public.idem_fail((SELECT id FROM tok WHERE name = 'failed'));
INSERT INTO tok SELECT 'healed', key_id FROM public.idem_claim('a1300000-0000-4000-8000-000000000004', 13001, 'ep:130', '{"n": 4}',
                                                               p_now => now() - interval '1 minute');
SELECT outcome FROM public.idem_claim('a1300000-0000-4000-8000-000000000004', 13001, 'ep:130', '{"n": 4}');

-- PL/pgSQL, not SQL: Citus plans no SQL function whose parameters reach a distributed table (and
-- no join of one with a temporary table), so the token is read first.
CREATE FUNCTION pg_temp.lost(p_name text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint := (SELECT id FROM pg_temp.tok WHERE name = p_name);
    v_service constant integer := public.idem_scope(NULL);  -- NULL on a single node, 0 on Citus
    v_got jsonb;
BEGIN
    SELECT jsonb_build_object('endpoint', e.scope_endpoint, 'user', NULLIF(e.scope_user_id, v_service)) || e.detail INTO v_got
      FROM public.idempotency_events e
     WHERE e.event = 'lost_claim' AND e.key_id = v_id;
    RETURN v_got;
END
$$;

SELECT is(public.idem_record_lost_claim((SELECT id FROM tok WHERE name = 'live'), 'ep:130'), false,
    'a token that still holds its key: nothing was lost');
SELECT is(pg_temp.lost('live'), NULL, 'and nothing is written');
SELECT is(public.idem_record_lost_claim((SELECT id FROM tok WHERE name = 'done'), 'ep:130'), true, 'a completed token is recorded');
SELECT is(pg_temp.lost('done') - 'request_hash',
    '{"endpoint": "ep:130", "user": 13001, "reason": "already_completed", "reported_endpoint": "ep:130"}'::jsonb,
    'with reason already_completed and the row''s scope');
SELECT is(public.idem_record_lost_claim((SELECT id FROM tok WHERE name = 'done'), 'ep:130'), false,
    'reported again: false, recorded once per token');
SELECT is(public.idem_record_lost_claim((SELECT id FROM tok WHERE name = 'failed')), true, 'a failed token is recorded');
SELECT is(pg_temp.lost('failed') ->> 'reason', 'already_failed', 'with reason already_failed');
SELECT public.idem_record_lost_claim((SELECT id FROM tok WHERE name = 'healed'), 'reported:elsewhere');
SELECT is(pg_temp.lost('healed') - 'reported_endpoint',
    jsonb_build_object('endpoint', 'ep:130', 'user', 13001, 'reason', 'healed_as_stale',
                       'request_hash', (SELECT detail ->> 'request_hash' FROM public.idempotency_events
                                         WHERE event = 'stale_heal' AND key_id = (SELECT id FROM tok WHERE name = 'healed'))),
    'a healed token: healed_as_stale, with the heal''s scope and request hash (not the caller''s endpoint)');
INSERT INTO tok VALUES ('gone', 987654321);
SELECT public.idem_record_lost_claim(987654321, 'ep:reported');
SELECT is(pg_temp.lost('gone'),
    '{"endpoint": "ep:reported", "user": null, "reason": "gone", "reported_endpoint": "ep:reported", "request_hash": null}'::jsonb,
    'a token without row or heal: gone, under the endpoint the caller reported');
SELECT throws_ok($$SELECT public.idem_record_lost_claim(NULL)$$, 'IDM00', NULL, 'a NULL key_id raises IDM00');
SELECT throws_ok($$SELECT public.idem_record_lost_claim(0)$$, 'IDM00', NULL, 'a zero key_id raises IDM00');

SELECT * FROM finish();
ROLLBACK;
