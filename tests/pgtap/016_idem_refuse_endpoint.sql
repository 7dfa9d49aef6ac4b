-- idem_refuse_endpoint: the IDM00 of an endpoint scope the shim would never send (issue 39, F5),
-- raised by idem_claim, idem_downstream_key and idem_record_lost_claim before they write.
-- Cases: its two messages (length, control character with its code point and place); idem_claim
-- refuses 201 characters and a C1 character and stores nothing, takes 200; idem_downstream_key
-- refuses a line separator; idem_record_lost_claim a reported endpoint of 10,000 characters.
BEGIN;
SELECT plan(8);

SELECT throws_ok($$SELECT public.idem_refuse_endpoint('idem_claim', repeat('x', 201))$$, 'IDM00',
    'idem_claim: p_endpoint must be at most 200 characters (got 201)', 'it names the routine and the length');
SELECT throws_like($$SELECT public.idem_refuse_endpoint('idem_claim', 'POST /a' || chr(8232) || 'b')$$,
    'idem_claim: p_endpoint must not contain control characters', 'it refuses a line separator');

SELECT throws_ok($$SELECT * FROM public.idem_claim('a0160000-0000-4000-8000-000000000001', NULL, 'POST /' || repeat('x', 195), '{}')$$,
    'IDM00', 'idem_claim: p_endpoint must be at most 200 characters (got 201)', 'idem_claim refuses 201 characters');
SELECT throws_ok($$SELECT * FROM public.idem_claim('a0160000-0000-4000-8000-000000000001', NULL, 'POST /a' || chr(133), '{}')$$,
    'IDM00', 'idem_claim: p_endpoint must not contain control characters', 'idem_claim refuses a C1 character (NEL)');
SELECT is((SELECT count(*)::integer FROM public.idempotency_keys WHERE idem_key = 'a0160000-0000-4000-8000-000000000001'), 0,
    'nothing was claimed');
SELECT is((SELECT outcome FROM public.idem_claim('a0160000-0000-4000-8000-000000000001', NULL, 'POST /' || repeat('x', 194), '{}')),
    'claimed', 'idem_claim takes 200 characters');
SELECT throws_ok($$SELECT public.idem_downstream_key('a0160000-0000-4000-8000-000000000001', NULL, 'POST /a' || chr(8232), 'broker')$$,
    'IDM00', 'idem_downstream_key: p_endpoint must not contain control characters', 'idem_downstream_key refuses it too');
SELECT throws_ok($$SELECT public.idem_record_lost_claim(1, repeat('x', 10000))$$,
    'IDM00', 'idem_record_lost_claim: p_endpoint must be at most 200 characters (got 10000)',
    'idem_record_lost_claim refuses a reported endpoint of 10,000 characters');

SELECT * FROM finish();
ROLLBACK;
