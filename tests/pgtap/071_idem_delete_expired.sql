-- 071_idem_delete_expired: idem_cleanup_batch's deletion (the step sql/citus/ replaces; its
-- guards are idem_cleanup_batch's, tested in 070). A single node only, like 070: on Citus each
-- shard deletes in a transaction of its own, which cannot see this file's rows
-- (tests/python/sql/test_citus.py tests the distributed form with committed rows).
-- Fixture (expiry relative to now()): finished F1 (-3 h), F2 (-2 h), F3 (-1 h); orphaned
-- in-flight O1 (-2 h 30 min); events of 8 and of 6 days ago.
-- Cases:
--   a full batch deletes p_batch_size finished rows, oldest expiry first, and leaves the events
--     for a batch that is not full;
--   the next batch deletes what is left, the orphan included, returns how many, and trims the
--     events past 7 days (keeping the recent one);
--   no role may execute it.
BEGIN;
SELECT plan(6);
SET LOCAL client_min_messages = error;

CREATE TEMP TABLE fx (name text PRIMARY KEY, id bigint);
-- each claimed an hour before it expires, so "claimed 4 hours ago" expired 3 hours ago
INSERT INTO fx
SELECT f.name, c.key_id
  FROM (VALUES ('F1', 1, interval '4 hours'), ('F2', 2, interval '3 hours'), ('F3', 3, interval '2 hours'),
               ('O1', 4, interval '3 hours 30 minutes')) f (name, n, ago),
       LATERAL public.idem_claim(pg_catalog.format('10710000-0000-4000-8000-00000000000%s', f.n), NULL, 'ep', '{}',
                                 p_ttl => '1 hour', p_now => now() - f.ago) c;
SELECT public.idem_complete(id, 200, '{}') FROM fx WHERE name IN ('F1', 'F3');
SELECT public.idem_fail(id, 500) FROM fx WHERE name = 'F2';
INSERT INTO public.idempotency_events (occurred_at, event, scope_user_id, detail)
SELECT now() - f.age, 'erasure', public.idem_scope(NULL), pg_catalog.jsonb_build_object('rows', 0, 'fixture', f.fixture)
  FROM (VALUES (interval '8 days', 'old'), (interval '6 days', 'recent')) f (age, fixture);
CREATE FUNCTION pg_temp.left_over() RETURNS text[] LANGUAGE sql
    AS $$ SELECT ARRAY(SELECT f.name FROM fx f JOIN public.idempotency_keys k ON k.id = f.id ORDER BY f.name) $$;
CREATE FUNCTION pg_temp.fixture_events() RETURNS text[] LANGUAGE sql
    AS $$ SELECT ARRAY(SELECT e.detail ->> 'fixture' FROM public.idempotency_events e WHERE e.detail ? 'fixture' ORDER BY e.occurred_at) $$;

SELECT is(public.idem_delete_expired(2, now()), 2, 'a full batch deletes p_batch_size rows and says so');
SELECT is(pg_temp.left_over(), ARRAY['F3', 'O1'], 'the finished rows that expired first');
SELECT is(pg_temp.fixture_events(), ARRAY['old', 'recent'], 'a full batch leaves the events for a batch that is not full');
SELECT is(public.idem_delete_expired(10, now()), 2, 'the next batch deletes what is left, the orphaned in-flight row too');
SELECT is(pg_temp.left_over() || pg_temp.fixture_events(), ARRAY['recent'],
    'no expired row is left, and the events past 7 days are trimmed (a 6-day-old one kept)');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_delete_expired(integer,timestamptz)', 'EXECUTE')
          AND NOT has_function_privilege('idem_admin', 'public.idem_delete_expired(integer,timestamptz)', 'EXECUTE'),
    'neither idem_app nor idem_admin may execute it: idem_cleanup_batch''s guards come first');
SELECT * FROM finish();
ROLLBACK;
