-- 030_idem_fail: failing a claim, fenced by its token (contract §3).
-- Cases:
--   fails an in_flight claim with a response code (stored) or without one (p_response_code
--     defaults to NULL); the next claim of that key is previous_failed with the code.
--   a lost token raises IDM01 and changes nothing, when the claim was: already failed, completed
--     (the completion is not overwritten), healed as stale (the winner is untouched), erased,
--     or never existed.
--   a response code outside 100..599 raises IDM00 and leaves the claim in flight.
--   a 7-day claim made in UTC fails from a session whose TimeZone springs forward that week.
--   p_release => true frees the key (row gone, one "released" event with the code), the next claim
--     of the key is claimed under a new token, and the released token is lost: idem_complete,
--     idem_heartbeat and a second release raise IDM01 naming the release and the new holder, and
--     leave the new holder's row alone. A released token that was healed first raises IDM01 too.
--     p_release NULL raises IDM00.
BEGIN;
SELECT plan(31);

SET LOCAL client_min_messages = error;  -- the heal below raises a WARNING (asserted in 010)

INSERT INTO public.users (id, email) VALUES (3001, 'erin@example.test'), (3002, 'frank@example.test');
CREATE TEMP TABLE tok (name text PRIMARY KEY, id bigint);
CREATE FUNCTION pg_temp.row_of(p_id bigint) RETURNS TABLE (status text, response_code smallint, response_body jsonb)
-- PL/pgSQL, not SQL: Citus plans no SQL function whose parameters reach a distributed table.
LANGUAGE plpgsql AS $$ BEGIN RETURN QUERY SELECT k.status, k.response_code, k.response_body
                                         FROM public.idempotency_keys k WHERE k.id = p_id; END $$;

-- failing -------------------------------------------------------------------------------------
INSERT INTO tok SELECT 'coded', key_id FROM public.idem_claim('c0000000-0000-4000-8000-000000000001', 3001, 'ep', '{"n": 1}');
SELECT lives_ok(format('SELECT public.idem_fail(%s, 502)', (SELECT id FROM tok WHERE name = 'coded')),
    'idem_fail fails an in-flight claim with a response code');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', (SELECT id FROM tok WHERE name = 'coded')),
    $$VALUES ('failed'::text, 502::smallint, NULL::jsonb)$$,
    'the row is failed with the code and no body');
SELECT is((SELECT c FROM public.idem_claim('c0000000-0000-4000-8000-000000000001', 3001, 'ep', '{"n": 1}',
                                           p_now => now() + interval '1 minute') c),
    ROW('previous_failed', (SELECT id FROM tok WHERE name = 'coded'),
        encode(sha256(convert_to('{"n": 1}', 'UTF8')), 'hex'), 502, NULL, NULL, NULL, NULL, NULL, NULL)::public.idem_claim_result,
    'the next claim of a failed key is previous_failed with the failure''s code');

INSERT INTO tok SELECT 'uncoded', key_id FROM public.idem_claim('c0000000-0000-4000-8000-000000000002', 3001, 'ep', '{}');
SELECT lives_ok(format('SELECT public.idem_fail(%s)', (SELECT id FROM tok WHERE name = 'uncoded')),
    'idem_fail without a response code (an exception, not an HTTP answer) works');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', (SELECT id FROM tok WHERE name = 'uncoded')),
    $$VALUES ('failed'::text, NULL::smallint, NULL::jsonb)$$,
    'the row is failed with no code');

-- lost tokens -----------------------------------------------------------------------------------
SELECT throws_ok(format('SELECT public.idem_fail(%s, 500)', (SELECT id FROM tok WHERE name = 'coded')),
    'IDM01', format('idem_fail: claim lost: key_id %s is no longer in flight for this holder; it is failed now', (SELECT id FROM tok WHERE name = 'coded')),
    'failing an already failed claim raises IDM01 naming the key_id');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', (SELECT id FROM tok WHERE name = 'coded')),
    $$VALUES ('failed'::text, 502::smallint, NULL::jsonb)$$,
    'the second failure changed nothing: the first code stays');

INSERT INTO tok SELECT 'completed', key_id FROM public.idem_claim('c0000000-0000-4000-8000-000000000003', 3001, 'ep', '{}');
SELECT public.idem_complete((SELECT id FROM tok WHERE name = 'completed'), 201, '{"ok": true}');
SELECT throws_ok(format('SELECT public.idem_fail(%s, 500)', (SELECT id FROM tok WHERE name = 'completed')),
    'IDM01', NULL, 'failing a completed claim raises IDM01');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', (SELECT id FROM tok WHERE name = 'completed')),
    $$VALUES ('completed'::text, 201::smallint, '{"ok": true}'::jsonb)$$,
    'the completion is not overwritten by a late failure');

INSERT INTO tok SELECT 'zombie', key_id FROM public.idem_claim('c0000000-0000-4000-8000-000000000004', 3001, 'ep', '{}');
SELECT is((SELECT outcome FROM public.idem_claim('c0000000-0000-4000-8000-000000000004', 3001, 'ep', '{}',
                                                 p_now => now() + interval '31 seconds')),
    'stale', 'setup: the holder is healed as stale');
INSERT INTO tok SELECT 'winner', key_id FROM public.idem_claim('c0000000-0000-4000-8000-000000000004', 3001, 'ep', '{}',
                                                               p_now => now() + interval '32 seconds');
SELECT throws_ok(format('SELECT public.idem_fail(%s, 500)', (SELECT id FROM tok WHERE name = 'zombie')),
    'IDM01', NULL, 'a zombie''s idem_fail after a heal raises IDM01');
SELECT results_eq(
    $$SELECT id, status FROM public.idempotency_keys WHERE idem_key = 'c0000000-0000-4000-8000-000000000004'$$,
    $$SELECT id, 'in_flight'::text FROM tok WHERE name = 'winner'$$,
    'the zombie''s failure did not touch the winner''s row');

INSERT INTO tok SELECT 'erased', key_id FROM public.idem_claim('c0000000-0000-4000-8000-000000000005', 3002, 'ep', '{}');
SELECT is(public.idem_erase_user(3002), 1::bigint, 'setup: the user''s claim is erased');
SELECT throws_ok(format('SELECT public.idem_fail(%s)', (SELECT id FROM tok WHERE name = 'erased')),
    'IDM01', NULL, 'failing an erased claim raises IDM01');
SELECT throws_ok('SELECT public.idem_fail(-1)',
    'IDM01', 'idem_fail: claim lost: key_id -1 is no longer in flight for this holder; no row has this key_id (erased, cleaned up after expiry, or never claimed)',
    'failing a token that never existed raises IDM01');

-- response code validation -------------------------------------------------------------------------
INSERT INTO tok SELECT 'codes', key_id FROM public.idem_claim('c0000000-0000-4000-8000-000000000006', 3001, 'ep', '{}');
SELECT throws_ok(format('SELECT public.idem_fail(%s, 99)', (SELECT id FROM tok WHERE name = 'codes')),
    'IDM00', 'idem_fail: p_response_code must be an HTTP status 100..599 (got 99)',
    'a response code below 100 raises IDM00');
SELECT throws_ok(format('SELECT public.idem_fail(%s, 600)', (SELECT id FROM tok WHERE name = 'codes')),
    'IDM00', 'idem_fail: p_response_code must be an HTTP status 100..599 (got 600)',
    'a response code above 599 raises IDM00');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', (SELECT id FROM tok WHERE name = 'codes')),
    $$VALUES ('in_flight'::text, NULL::smallint, NULL::jsonb)$$,
    'after the refused codes the claim is still in flight');

-- the caller's TimeZone ------------------------------------------------------------------------------
SET LOCAL TimeZone = 'UTC';
INSERT INTO tok SELECT 'dst', key_id FROM public.idem_claim('c0000000-0000-4000-8000-000000000007', 3001, 'ep', '{}',
                                                            p_ttl => '7 days', p_now => '2026-03-25 12:00:00+00');
SET LOCAL TimeZone = 'Europe/Paris';
SELECT lives_ok(format('SELECT public.idem_fail(%s, 503)', (SELECT id FROM tok WHERE name = 'dst')),
    'a 7-day claim made in UTC fails cleanly from a session whose TimeZone springs forward that week');
SET LOCAL TimeZone = 'UTC';

-- release (on_failure="release") ---------------------------------------------------------------------
INSERT INTO tok SELECT 'released', key_id FROM public.idem_claim('c0000000-0000-4000-8000-000000000008', 3001, 'ep', '{"r": 1}');
SELECT lives_ok(format('SELECT public.idem_fail(%s, 500, p_release => true)', (SELECT id FROM tok WHERE name = 'released')),
    'idem_fail with p_release frees an in-flight claim');
SELECT is((SELECT count(*) FROM public.idempotency_keys WHERE idem_key = 'c0000000-0000-4000-8000-000000000008'), 0::bigint,
    'a released key has no row');
SELECT results_eq(format($$SELECT event, scope_user_id::integer, scope_endpoint, (detail ->> 'response_code')::int
                             FROM public.idempotency_events WHERE key_id = %s$$, (SELECT id FROM tok WHERE name = 'released')),
    $$VALUES ('released'::text, 3001, 'ep'::text, 500)$$,
    'the release is recorded as one "released" event with its scope and the response code');
INSERT INTO tok SELECT 'reclaimed', key_id FROM public.idem_claim('c0000000-0000-4000-8000-000000000008', 3001, 'ep', '{"r": 1}');
SELECT isnt((SELECT id FROM tok WHERE name = 'reclaimed'), NULL, 'the next claim of a released key is claimed');
SELECT isnt((SELECT id FROM tok WHERE name = 'reclaimed'), (SELECT id FROM tok WHERE name = 'released'),
    'under a new token');
SELECT throws_ok(format('SELECT public.idem_complete(%s, 201, ''{}'')', (SELECT id FROM tok WHERE name = 'released')),
    'IDM01', format('idem_complete: claim lost: key_id %s is no longer in flight for this holder; it was released after a failure and the key is in flight under key_id %s now (another claim)',
                    (SELECT id FROM tok WHERE name = 'released'), (SELECT id FROM tok WHERE name = 'reclaimed')),
    'the released holder cannot complete: IDM01 names the release and the new holder');
SELECT throws_ok(format('SELECT public.idem_heartbeat(%s)', (SELECT id FROM tok WHERE name = 'released')),
    'IDM01', NULL, 'the released holder cannot heartbeat');
SELECT throws_ok(format('SELECT public.idem_fail(%s, p_release => true)', (SELECT id FROM tok WHERE name = 'released')),
    'IDM01', NULL, 'releasing a released token again raises IDM01');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', (SELECT id FROM tok WHERE name = 'reclaimed')),
    $$VALUES ('in_flight'::text, NULL::smallint, NULL::jsonb)$$,
    'the new holder''s row is untouched by the released holder''s calls');

INSERT INTO tok SELECT 'healed', key_id FROM public.idem_claim('c0000000-0000-4000-8000-000000000009', 3001, 'ep', '{}');
SELECT is((SELECT outcome FROM public.idem_claim('c0000000-0000-4000-8000-000000000009', 3001, 'ep', '{}',
                                                 p_now => now() + interval '31 seconds')),
    'stale', 'setup: a holder about to release is healed first');
SELECT throws_ok(format('SELECT public.idem_fail(%s, 500, p_release => true)', (SELECT id FROM tok WHERE name = 'healed')),
    'IDM01', NULL, 'a healed holder''s release raises IDM01 (fenced like a failure)');
SELECT throws_ok(format('SELECT public.idem_fail(%s, 500, p_release => NULL)', (SELECT id FROM tok WHERE name = 'reclaimed')),
    'IDM00', 'idem_fail: p_release must be true or false', 'p_release NULL raises IDM00');

SELECT * FROM finish();
ROLLBACK;
