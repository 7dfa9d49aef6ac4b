-- 995_no_search_path: the functions do not depend on the caller's search_path (pg_partman's
-- test_no_search_path). pgTAP itself needs its schema (public) on the path, so each block runs
-- the idem functions with the hostile or empty path, records what they answered in a temp table,
-- and asserts after the path is restored.
-- Cases:
--   with search_path = '': claim, duplicate (in_flight), heartbeat, complete, replay (its audit row),
--     mismatch, stale heal (event row), fail + previous_failed, quarantine, wait, export, erase,
--     cleanup batch, canonical key, schema version, the ops functions, an encrypted body stored
--     and replayed, and the errors (22023
--     malformed key, IDM01 lost claim) all behave as with the default path;
--   with a hostile schema first on the path (its own idempotency_keys, audit_log, users and
--     idempotency_events tables, and look-alike now(), lower() and sha256()), every write still
--     lands in public's tables, the hash is the real SHA-256, and the look-alikes are never used;
--   idem_canonical_key, which has no SET clause, is not fooled by a look-alike !~ operator.
BEGIN;
SELECT plan(29);

-- On a Citus coordinator (make test-citus) the role and schema created below must go over one
-- connection per worker; a no-op setting on a single node (no citus extension loaded).
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

SET LOCAL client_min_messages = error;  -- the stale heal raises a WARNING (asserted in 010)
INSERT INTO public.users (id, email) VALUES (9951, 'nopath@example.test');
CREATE TEMP TABLE seen (step text PRIMARY KEY, val text);

-- 1. an empty search_path ---------------------------------------------------------------------------
SET LOCAL search_path = '';
INSERT INTO pg_temp.seen SELECT 'claim', c.outcome || ' ' || c.key_id
  FROM public.idem_claim('95000000-0000-4000-8000-000000000001', 9951, 'ep', '{"a": 1}') c;
INSERT INTO pg_temp.seen SELECT 'dup', c.outcome || ' ' || c.retry_after_ms
  FROM public.idem_claim('95000000-0000-4000-8000-000000000001', 9951, 'ep', '{"a": 1}') c;
INSERT INTO pg_temp.seen SELECT 'wait', c.outcome
  FROM public.idem_claim('95000000-0000-4000-8000-000000000001', 9951, 'ep', '{"a": 1}', p_wait_ms => 20) c;
INSERT INTO pg_temp.seen SELECT 'heartbeat', (public.idem_heartbeat(pg_catalog.split_part(s.val, ' ', 2)::bigint) IS NOT NULL)::text
  FROM pg_temp.seen s WHERE s.step = 'claim';
INSERT INTO pg_temp.seen SELECT 'complete', public.idem_complete(pg_catalog.split_part(s.val, ' ', 2)::bigint, 201, '{"done": 1}')::text
  FROM pg_temp.seen s WHERE s.step = 'claim';
INSERT INTO pg_temp.seen SELECT 'replay', c.outcome || ' ' || c.response_code || ' ' || c.response_body::text
  FROM public.idem_claim('95000000-0000-4000-8000-000000000001', 9951, 'ep', '{"a": 1}') c;
INSERT INTO pg_temp.seen SELECT 'mismatch', c.outcome
  FROM public.idem_claim('95000000-0000-4000-8000-000000000001', 9951, 'ep', '{"a": 2}') c;
INSERT INTO pg_temp.seen SELECT 'stale-holder', c.key_id::text
  FROM public.idem_claim('95000000-0000-4000-8000-000000000002', 9951, 'ep', '{}') c;
INSERT INTO pg_temp.seen SELECT 'quarantine', c.outcome
  FROM public.idem_claim('95000000-0000-4000-8000-000000000002', 9951, 'ep', '{}', p_on_stale => 'quarantine',
                         p_now => pg_catalog.now() + '31 seconds'::pg_catalog.interval) c;
INSERT INTO pg_temp.seen SELECT 'stale', c.outcome
  FROM public.idem_claim('95000000-0000-4000-8000-000000000002', 9951, 'ep', '{}',
                         p_now => pg_catalog.now() + '31 seconds'::pg_catalog.interval) c;
INSERT INTO pg_temp.seen SELECT 'heal-event', pg_catalog.count(*)::text
  FROM public.idempotency_events e WHERE e.event = 'stale_heal' AND e.scope_user_id = 9951;
INSERT INTO pg_temp.seen SELECT 'fail', public.idem_fail(c.key_id, 503)::text
  FROM public.idem_claim('95000000-0000-4000-8000-000000000003', 9951, 'ep', '{}') c;
INSERT INTO pg_temp.seen SELECT 'previous_failed', c.outcome || ' ' || c.response_code
  FROM public.idem_claim('95000000-0000-4000-8000-000000000003', 9951, 'ep', '{}') c;
INSERT INTO pg_temp.seen SELECT 'export', pg_catalog.count(*)::text FROM public.idem_export_user(9951) x;
INSERT INTO pg_temp.seen SELECT 'canonical', public.idem_canonical_key('95000000-0000-4000-8000-00000000000A');
INSERT INTO pg_temp.seen SELECT 'version', public.idem_schema_version()::text;
INSERT INTO pg_temp.seen SELECT 'health', pg_catalog.count(*)::text FROM public.idem_health() h WHERE h.kind = 'keys';
INSERT INTO pg_temp.seen SELECT 'inspect', pg_catalog.count(*)::text FROM public.idem_inspect('95000000-0000-4000-8000-000000000001') i;
INSERT INTO pg_temp.seen SELECT 'lost-claim', public.idem_record_lost_claim(s.val::bigint)::text
  FROM pg_temp.seen s WHERE s.step = 'stale-holder';
DO $$
BEGIN
    PERFORM public.idem_claim('admin', 9951, 'ep', '{}');
EXCEPTION WHEN OTHERS THEN
    INSERT INTO pg_temp.seen VALUES ('bad-key', SQLSTATE || ' ' || SQLERRM);
END
$$;
DO $$
BEGIN
    PERFORM public.idem_complete(s.val::bigint, 200, '{}') FROM pg_temp.seen s WHERE s.step = 'stale-holder';
EXCEPTION WHEN OTHERS THEN
    INSERT INTO pg_temp.seen VALUES ('zombie', SQLSTATE);
END
$$;
-- On a distributed store (Citus) idem_cleanup_batch deletes shard by shard, each in its own
-- transaction on its worker (sql/citus/071), which cannot see this test's uncommitted rows: the
-- empty-search_path cleanup there is checked in tests/python/sql/test_citus.py with committed
-- rows. Here it is run (and asserted) on a single node only.
CREATE FUNCTION pg_temp.distributed() RETURNS boolean LANGUAGE sql
    AS $$ SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') $$;
INSERT INTO pg_temp.seen SELECT 'cleanup', public.idem_cleanup_batch(100, pg_catalog.now() + '8 days'::pg_catalog.interval)::text
 WHERE NOT pg_temp.distributed();
INSERT INTO pg_temp.seen SELECT 'late-claim', c.outcome
  FROM public.idem_claim('95000000-0000-4000-8000-000000000004', 9951, 'ep', '{}',
                         p_now => pg_catalog.now() + '8 days'::pg_catalog.interval) c;
INSERT INTO pg_temp.seen SELECT 'erase-expected', pg_catalog.count(*)::text
  FROM public.idempotency_keys k WHERE k.scope_user_id = 9951;
INSERT INTO pg_temp.seen SELECT 'erase', public.idem_erase_user(9951)::text;
INSERT INTO pg_temp.seen SELECT 'encrypted', public.idem_complete(c.key_id, 200, '{"secretive": false}',
                                                                   p_response_key => 'k1-Zq8xY2vN4bR7tL0wP5sD3fG6hJ9mK1cV')::text
  FROM public.idem_claim('95000000-0000-4000-8000-000000000005', NULL, 'ep', '{}') c;
INSERT INTO pg_temp.seen SELECT 'decrypted', c.response_body::text
  FROM public.idem_claim('95000000-0000-4000-8000-000000000005', NULL, 'ep', '{}',
                         p_response_key => 'k1-Zq8xY2vN4bR7tL0wP5sD3fG6hJ9mK1cV') c;
INSERT INTO pg_temp.seen SELECT 'path-still-empty', pg_catalog.current_setting('search_path');
SET LOCAL search_path = public, pg_catalog;

SELECT is((SELECT split_part(val, ' ', 1) FROM seen WHERE step = 'claim'), 'claimed',
    'with an empty search_path idem_claim claims a key');
SELECT is((SELECT val FROM seen WHERE step = 'dup'), 'in_flight 5000', 'with an empty search_path a duplicate is in_flight');
SELECT is((SELECT val FROM seen WHERE step = 'wait'), 'in_flight', 'with an empty search_path a waiting duplicate polls and answers');
SELECT is((SELECT val FROM seen WHERE step = 'heartbeat'), 'true', 'with an empty search_path idem_heartbeat renews the lease');
SELECT is((SELECT val FROM seen WHERE step = 'complete'), '', 'with an empty search_path idem_complete completes');
SELECT is((SELECT val FROM seen WHERE step = 'replay'), 'replay 201 {"done": 1}',
    'with an empty search_path a duplicate replays the stored response');
SELECT results_eq($$SELECT count(*)::int FROM audit_log WHERE user_id = 9951 AND action = 'idempotency_replay'$$, $$VALUES (1)$$,
    'with an empty search_path the replay wrote its audit row');
SELECT is((SELECT val FROM seen WHERE step = 'mismatch'), 'mismatch', 'with an empty search_path a different body is a mismatch');
SELECT is((SELECT val FROM seen WHERE step = 'quarantine'), 'in_flight', 'with an empty search_path quarantine keeps a stale holder');
SELECT is((SELECT val FROM seen WHERE step = 'stale'), 'stale', 'with an empty search_path a stale holder is healed');
SELECT is((SELECT val FROM seen WHERE step = 'heal-event'), '1',
    'with an empty search_path the heal recorded its event');
SELECT is((SELECT val FROM seen WHERE step = 'previous_failed'), 'previous_failed 503',
    'with an empty search_path idem_fail and previous_failed work');
SELECT is((SELECT val FROM seen WHERE step = 'export'), '2', 'with an empty search_path idem_export_user exports the user''s rows');
SELECT is((SELECT val FROM seen WHERE step = 'canonical'), '95000000-0000-4000-8000-00000000000a',
    'with an empty search_path idem_canonical_key canonicalises');
SELECT is((SELECT val FROM seen WHERE step = 'version'), public.idem_schema_version()::text, 'with an empty search_path idem_schema_version answers');
SELECT ok((SELECT val::int > 0 FROM seen WHERE step = 'health'), 'with an empty search_path idem_health reports');
SELECT is((SELECT val FROM seen WHERE step = 'inspect'), '1', 'with an empty search_path idem_inspect finds the key');
SELECT is((SELECT val FROM seen WHERE step = 'lost-claim'), 'true', 'with an empty search_path idem_record_lost_claim records');
SELECT is((SELECT val FROM seen WHERE step = 'bad-key'), '22023 Idempotency-Key must be a UUID string',
    'with an empty search_path a malformed key still raises 22023 with the contract''s message');
SELECT is((SELECT val FROM seen WHERE step = 'zombie'), 'IDM01', 'with an empty search_path a lost claim still raises IDM01');
SELECT CASE WHEN pg_temp.distributed()
            THEN skip('idem_cleanup_batch runs per shard in transactions of its own on Citus: see tests/python/sql/test_citus.py', 1)
            ELSE is((SELECT val FROM seen WHERE step = 'cleanup'), '2',
                    'with an empty search_path idem_cleanup_batch deletes the expired rows') END;
-- the user's one key left after the cleanup on a single node; every key of the user on Citus
SELECT is((SELECT val FROM seen WHERE step = 'erase'),
          CASE WHEN pg_temp.distributed() THEN (SELECT val FROM seen WHERE step = 'erase-expected') ELSE '1' END,
          'with an empty search_path idem_erase_user erases');
SELECT is((SELECT val FROM seen WHERE step = 'decrypted'), '{"secretive": false}',
    'with an empty search_path a body is encrypted on completion and decrypted on replay (pgcrypto reached by its schema)');
SELECT is((SELECT val FROM seen WHERE step = 'path-still-empty'), '""',
    'the calls really ran with an empty search_path (the definers'' SET clauses did not leak out)');

-- 2. a hostile schema first on the path ---------------------------------------------------------------
CREATE SCHEMA idem_evil;
CREATE TABLE idem_evil.idempotency_keys (LIKE public.idempotency_keys INCLUDING ALL);
CREATE TABLE idem_evil.idempotency_events (LIKE public.idempotency_events INCLUDING ALL);
CREATE TABLE idem_evil.audit_log (LIKE public.audit_log INCLUDING ALL);
CREATE TABLE idem_evil.users (LIKE public.users INCLUDING ALL);
CREATE FUNCTION idem_evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '2000-01-01 00:00:00+00'::timestamptz $$;
CREATE FUNCTION idem_evil.lower(text) RETURNS text LANGUAGE sql AS $$ SELECT 'pwned' $$;
CREATE FUNCTION idem_evil.sha256(bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT '\x00'::bytea $$;
CREATE FUNCTION idem_evil.never(text, text) RETURNS boolean LANGUAGE sql AS $$ SELECT false $$;
CREATE OPERATOR idem_evil.!~ (LEFTARG = text, RIGHTARG = text, FUNCTION = idem_evil.never);
INSERT INTO users (id, email) VALUES (9952, 'hostile@example.test');

SET LOCAL search_path = idem_evil, pg_catalog, public;
INSERT INTO pg_temp.seen SELECT 'evil-claim', c.request_hash
  FROM public.idem_claim('95000000-0000-4000-8000-0000000000E1', 9952, 'ep', '{"e": 1}') c;
INSERT INTO pg_temp.seen SELECT 'evil-complete', public.idem_complete(c.key_id, 200, '{"e": 1}')::text
  FROM public.idem_claim('95000000-0000-4000-8000-0000000000E2', 9952, 'ep', '{"e": 2}') c;
INSERT INTO pg_temp.seen SELECT 'evil-replay', c.outcome
  FROM public.idem_claim('95000000-0000-4000-8000-0000000000E2', 9952, 'ep', '{"e": 2}') c;
DO $$
BEGIN
    INSERT INTO pg_temp.seen VALUES ('evil-canonical', public.idem_canonical_key('admin'));
EXCEPTION WHEN OTHERS THEN
    INSERT INTO pg_temp.seen VALUES ('evil-canonical', SQLSTATE);
END
$$;
SET LOCAL search_path = public, pg_catalog;

SELECT is((SELECT val FROM seen WHERE step = 'evil-claim'), encode(sha256(convert_to('{"e": 1}', 'UTF8')), 'hex'),
    'with a hostile schema first on the path the request hash is still the real SHA-256');
SELECT results_eq(
    $$SELECT idem_key, status, created_at > '2001-01-01' FROM public.idempotency_keys WHERE scope_user_id = 9952 ORDER BY idem_key$$,
    $$VALUES ('95000000-0000-4000-8000-0000000000e1'::text, 'in_flight'::text, true),
             ('95000000-0000-4000-8000-0000000000e2'::text, 'completed'::text, true)$$,
    'with a hostile schema first on the path the rows land in public''s table, canonical and at the real time');
SELECT is((SELECT val FROM seen WHERE step = 'evil-replay'), 'replay',
    'with a hostile schema first on the path a duplicate replays from public''s table');
SELECT is((SELECT (SELECT count(*) FROM idem_evil.idempotency_keys) + (SELECT count(*) FROM idem_evil.idempotency_events)
                + (SELECT count(*) FROM idem_evil.audit_log)), 0::bigint,
    'the hostile schema''s look-alike tables received nothing');

SELECT is((SELECT val FROM seen WHERE step = 'evil-canonical'), '22023',
    'idem_canonical_key still rejects ''admin'' when a look-alike !~ operator comes first on the path');

SELECT * FROM finish();
ROLLBACK;
