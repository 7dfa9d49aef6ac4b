-- 045_idem_lost_claim_state: what the IDM01 message says became of a lost claim's row.
-- Cases:
--   a completed or failed row: 'it is completed now' / 'it is failed now';
--   an in-flight row (the token still holds it): 'it is in_flight now';
--   a healed row whose key was claimed again: names the new key_id and says it is another claim;
--   a healed row whose key has no row: says the key is free;
--   no row and no heal on record: says no row has this key_id.
BEGIN;
SELECT plan(6);

INSERT INTO public.users (id) VALUES (4501);
CREATE TEMP TABLE tok (name text PRIMARY KEY, id bigint);
INSERT INTO tok SELECT 'done', key_id FROM public.idem_claim('a4500000-0000-4000-8000-000000000001', 4501, 'ep', '{}');
SELECT public.idem_complete((SELECT id FROM tok WHERE name = 'done'), 201, '{}');
INSERT INTO tok SELECT 'failed', key_id FROM public.idem_claim('a4500000-0000-4000-8000-000000000002', 4501, 'ep', '{}');
SELECT public.idem_fail((SELECT id FROM tok WHERE name = 'failed'));
INSERT INTO tok SELECT 'live', key_id FROM public.idem_claim('a4500000-0000-4000-8000-000000000003', 4501, 'ep', '{}');
INSERT INTO tok SELECT 'healed', key_id FROM public.idem_claim('a4500000-0000-4000-8000-000000000004', 4501, 'ep', '{}');
SELECT outcome FROM public.idem_claim('a4500000-0000-4000-8000-000000000004', 4501, 'ep', '{}', p_now => now() + interval '1 minute');
INSERT INTO tok SELECT 'next', key_id FROM public.idem_claim('a4500000-0000-4000-8000-000000000004', 4501, 'ep', '{}', p_now => now() + interval '61 seconds');
INSERT INTO tok SELECT 'free', key_id FROM public.idem_claim('a4500000-0000-4000-8000-000000000005', NULL, 'ep', '{}');
SELECT outcome FROM public.idem_claim('a4500000-0000-4000-8000-000000000005', NULL, 'ep', '{}', p_now => now() + interval '1 minute');

SELECT is(public.idem_lost_claim_state((SELECT id FROM tok WHERE name = 'done')), 'it is completed now',
    'a completed row says it is completed now');
SELECT is(public.idem_lost_claim_state((SELECT id FROM tok WHERE name = 'failed')), 'it is failed now',
    'a failed row says it is failed now');
SELECT is(public.idem_lost_claim_state((SELECT id FROM tok WHERE name = 'live')), 'it is in_flight now',
    'a row still in flight says so');
SELECT is(public.idem_lost_claim_state((SELECT id FROM tok WHERE name = 'healed')),
    format('it was healed as stale and the key is in flight under key_id %s now (another claim)', (SELECT id FROM tok WHERE name = 'next')),
    'a healed row whose key was claimed again names the claim that holds it now');
SELECT is(public.idem_lost_claim_state((SELECT id FROM tok WHERE name = 'free')),
    'it was healed as stale and the key has no row now (free for the next claim)',
    'a healed service-call row (no user) whose key nobody claimed again says the key is free');
SELECT is(public.idem_lost_claim_state(-5), 'no row has this key_id (erased, cleaned up after expiry, or never claimed)',
    'a token without row or heal says no row has it');

SELECT * FROM finish();
ROLLBACK;
