-- 040_idem_heartbeat: renewing a live holder's lease (contract §3).
-- idem_heartbeat stamps locked_at with clock_timestamp(), so the holders below are claimed
-- 25 s in the past (p_now) and the later duplicates come 10 s in the future: 35 s after the
-- original lease (stale without a heartbeat), about 10 s after the renewed one.
-- Cases:
--   returns the new locked_at, which is the row's locked_at, taken from the clock;
--   keeps a slow holder from going stale: with a heartbeat -> in_flight with retry_after_ms from
--     the renewed lease (5000 while long, the time left near its end); without -> stale;
--   changes only locked_at (status, created_at, expires_at kept);
--   never moves a lease backwards (GREATEST with the current locked_at);
--   a lost token raises IDM01 and changes nothing: completed, failed, healed, erased, never existed;
--   a 7-day claim made in UTC is renewed from a session whose TimeZone springs forward that week.
BEGIN;
SELECT plan(19);

SET LOCAL client_min_messages = error;  -- the heals below raise WARNINGs (asserted in 010)

INSERT INTO public.users (id, email) VALUES (4001, 'grace@example.test'), (4002, 'heidi@example.test');
CREATE TEMP TABLE tok (name text PRIMARY KEY, id bigint);
CREATE TEMP TABLE beat (name text PRIMARY KEY, at timestamptz);

INSERT INTO tok SELECT 'slow', key_id FROM public.idem_claim('d0000000-0000-4000-8000-000000000001', 4001, 'ep', '{}',
                                                             p_now => now() - interval '25 seconds');
INSERT INTO tok SELECT 'dead', key_id FROM public.idem_claim('d0000000-0000-4000-8000-000000000002', 4001, 'ep', '{}',
                                                             p_now => now() - interval '25 seconds');
CREATE TEMP TABLE slow_before AS SELECT * FROM public.idempotency_keys WHERE id = (SELECT id FROM tok WHERE name = 'slow');

INSERT INTO beat SELECT 'slow', public.idem_heartbeat((SELECT id FROM tok WHERE name = 'slow'));
SELECT cmp_ok((SELECT at FROM beat WHERE name = 'slow'), '>=', now(),
    'a heartbeat stamps the lease with the current clock (not the claim''s p_now)');
SELECT is((SELECT locked_at FROM public.idempotency_keys WHERE id = (SELECT id FROM tok WHERE name = 'slow')),
    (SELECT at FROM beat WHERE name = 'slow'),
    'idem_heartbeat returns the row''s new locked_at');
SELECT results_eq(
    format('SELECT status, created_at, expires_at FROM public.idempotency_keys WHERE id = %s', (SELECT id FROM tok WHERE name = 'slow')),
    'SELECT status, created_at, expires_at FROM slow_before',
    'a heartbeat changes only the lease: status, created_at and expires_at are kept');

SELECT is((SELECT outcome FROM public.idem_claim('d0000000-0000-4000-8000-000000000001', 4001, 'ep', '{}',
                                                 p_now => now() + interval '10 seconds')),
    'in_flight', 'a duplicate 35 s after the claim finds the heartbeating holder in flight, not stale');
SELECT is((SELECT outcome FROM public.idem_claim('d0000000-0000-4000-8000-000000000002', 4001, 'ep', '{}',
                                                 p_now => now() + interval '10 seconds')),
    'stale', 'the same duplicate against a holder that never beat finds it stale');
SELECT is((SELECT retry_after_ms FROM public.idem_claim('d0000000-0000-4000-8000-000000000001', 4001, 'ep', '{}',
                                                        p_now => now() + interval '10 seconds')),
    5000, 'with about 20 s left on the renewed lease, retry_after_ms is capped at 5000');
-- The claim's clock runs on from p_now while it works (its own elapsed time), so the lease it
-- sees is shorter than the one computed here by at most the time the call took: that time is
-- bracketed by the clock read before and after it, however loaded the machine (no fixed window).
-- Above it only by a worker's clock on Citus (a few ms).
CREATE TEMP TABLE near (t0 timestamptz, retry integer, t1 timestamptz);
INSERT INTO near (t0) VALUES (pg_catalog.clock_timestamp());
UPDATE near SET retry = (SELECT c.retry_after_ms
                           FROM public.idem_claim('d0000000-0000-4000-8000-000000000001', 4001, 'ep', '{}',
                                                  p_now => now() + interval '27 seconds') c);
UPDATE near SET t1 = pg_catalog.clock_timestamp();
SELECT ok((SELECT n.retry BETWEEN e.ms - ceil(extract(epoch FROM (n.t1 - n.t0)) * 1000) - 1 AND e.ms + 50
             FROM (SELECT ceil(extract(epoch FROM (k.locked_at + interval '30 seconds' - (now() + interval '27 seconds'))) * 1000) AS ms
                     FROM public.idempotency_keys k WHERE k.id = (SELECT id FROM tok WHERE name = 'slow')) e,
                  near n),
    'near the end of the renewed lease, retry_after_ms is the time left on it (about 3 s, less the call''s own time), not on the original');
SELECT lives_ok(format('SELECT public.idem_complete(%s, 200, %L)', (SELECT id FROM tok WHERE name = 'slow'), '{"slow": "done"}'),
    'the slow holder that kept beating completes its own claim');

INSERT INTO beat SELECT 'again', public.idem_heartbeat(key_id)
  FROM public.idem_claim('d0000000-0000-4000-8000-000000000003', 4001, 'ep', '{}');
SELECT cmp_ok(public.idem_heartbeat((SELECT id FROM public.idempotency_keys WHERE idem_key = 'd0000000-0000-4000-8000-000000000003')),
    '>=', (SELECT at FROM beat WHERE name = 'again'),
    'repeated heartbeats never move the lease backwards');
INSERT INTO tok SELECT 'future', key_id FROM public.idem_claim('d0000000-0000-4000-8000-000000000004', 4001, 'ep', '{}',
                                                               p_now => now() + interval '1 hour');
SELECT is(public.idem_heartbeat((SELECT id FROM tok WHERE name = 'future')),
    (SELECT locked_at FROM public.idempotency_keys WHERE id = (SELECT id FROM tok WHERE name = 'future')),
    'a lease already later than the clock is kept, not shortened');

-- lost tokens ----------------------------------------------------------------------------------
CREATE TEMP TABLE slow_done AS SELECT * FROM public.idempotency_keys WHERE id = (SELECT id FROM tok WHERE name = 'slow');
SELECT throws_ok(format('SELECT public.idem_heartbeat(%s)', (SELECT id FROM tok WHERE name = 'slow')),
    'IDM01', format('idem_heartbeat: claim lost: key_id %s is no longer in flight for this holder; it is completed now', (SELECT id FROM tok WHERE name = 'slow')),
    'a heartbeat on a completed claim raises IDM01');
SELECT results_eq(
    format('SELECT status, locked_at, response_body FROM public.idempotency_keys WHERE id = %s', (SELECT id FROM tok WHERE name = 'slow')),
    'SELECT status, locked_at, response_body FROM slow_done',
    'the refused heartbeat changed nothing on the completed row');

INSERT INTO tok SELECT 'failed', key_id FROM public.idem_claim('d0000000-0000-4000-8000-000000000005', 4001, 'ep', '{}');
SELECT public.idem_fail((SELECT id FROM tok WHERE name = 'failed'));
SELECT throws_ok(format('SELECT public.idem_heartbeat(%s)', (SELECT id FROM tok WHERE name = 'failed')),
    'IDM01', NULL, 'a heartbeat on a failed claim raises IDM01');

SELECT throws_ok(format('SELECT public.idem_heartbeat(%s)', (SELECT id FROM tok WHERE name = 'dead')),
    'IDM01', format('idem_heartbeat: claim lost: key_id %s is no longer in flight for this holder; it was healed as stale and the key has no row now (free for the next claim)', (SELECT id FROM tok WHERE name = 'dead')),
    'a heartbeat from a holder that was healed as stale raises IDM01 (it must stop working), saying the key is free');
SELECT is((SELECT count(*)::int FROM public.idempotency_keys WHERE idem_key = 'd0000000-0000-4000-8000-000000000002'), 0,
    'the late heartbeat did not bring the healed row back');

INSERT INTO tok SELECT 'erased', key_id FROM public.idem_claim('d0000000-0000-4000-8000-000000000006', 4002, 'ep', '{}');
SELECT is(public.idem_erase_user(4002), 1::bigint, 'setup: the user''s claim is erased');
SELECT throws_ok(format('SELECT public.idem_heartbeat(%s)', (SELECT id FROM tok WHERE name = 'erased')),
    'IDM01', NULL, 'a heartbeat on an erased claim raises IDM01');
SELECT throws_ok('SELECT public.idem_heartbeat(-1)',
    'IDM01', 'idem_heartbeat: claim lost: key_id -1 is no longer in flight for this holder; no row has this key_id (erased, cleaned up after expiry, or never claimed)',
    'a heartbeat on a token that never existed raises IDM01');

-- the caller's TimeZone ------------------------------------------------------------------------------
SET LOCAL TimeZone = 'UTC';
INSERT INTO tok SELECT 'dst', key_id FROM public.idem_claim('d0000000-0000-4000-8000-000000000007', 4001, 'ep', '{}',
                                                            p_ttl => '7 days', p_now => '2026-03-25 12:00:00+00');
SET LOCAL TimeZone = 'Europe/Paris';
SELECT lives_ok(format('SELECT public.idem_heartbeat(%s)', (SELECT id FROM tok WHERE name = 'dst')),
    'a 7-day claim made in UTC is renewed from a session whose TimeZone springs forward that week');
SET LOCAL TimeZone = 'UTC';

SELECT * FROM finish();
ROLLBACK;
