-- 010_idem_claim: every outcome of the claim state machine and every argument error (contract §2, §3).
-- Time moves through p_now (now() is frozen inside this transaction). Each section claims its own
-- keys and reads only its own rows and steps, so one failing assertion fails one section.
-- Cases:
--   claimed: first claim inserts one in_flight row (canonical key, scope, hash, 24 h TTL) and
--     returns its id as the token; request_hash is the hex SHA-256 of p_request::text, so key
--     order and white space do not matter; a NULL request hashes as JSON null.
--   canonical keys: the upper-case spelling of a key is the same key.
--   mismatch (checked before status): against in_flight, completed (no replay, no audit row),
--     failed and stale rows (no heal); changes nothing.
--   replay: stored code and body; exactly one audit_log row per replay whose context carries the
--     original request hash and response code; a 4xx completion replays too; the row is untouched.
--   in_flight: 5000 while the lease is long; computed from the lease when shorter (2 s -> ~2000,
--     honouring a custom p_stale_after); changes nothing.
--   stale: outcome stale with a small retry_after_ms; the row is deleted; a stale_heal event is
--     recorded; the next claim is claimed, as attempt 2 (attempt 1 for a first claim). (The WARNING a heal raises is asserted from Python,
--     tests/python/sql/test_warnings.py, through a notice handler.)
--   previous_failed: after idem_fail, with the failure's code; writes nothing.
--   a completion with a NULL body is not replayable: the next claim is claimed.
--   scopes: NULL user scope dedupes (NULLS NOT DISTINCT); user A's key never replays to user B;
--     endpoints are separate scopes; NULL user and a real user are separate scopes.
--   expired keys are absent before cleanup: completed, failed, in_flight and mismatching rows.
--   p_on_stale 'quarantine': a stale holder stays in_flight (no heal, no event), retry_after
--     computed from expiry, claimable after expiry.
--   p_wait_ms: a waiting duplicate still answers in_flight when nobody completes (the real race is
--     tested from Python), a free key is claimed and a completed key replayed without waiting.
--   retention cap: 7 days is accepted; more raises; the CHECK rejects direct INSERTs past the cap,
--     non-positive retention and non-canonical keys; the CHECK does not depend on the
--     session's TimeZone.
--   p_key_format 'opaque': an opaque key is claimed and stored as sent, found again, case-sensitive;
--     a UUID is the same key under either format; refused keys raise 22023 (also an opaque key
--     under the default), an unknown format IDM00; the CHECK refuses a space or an empty key.
--   bad input: malformed keys raise 22023 'Idempotency-Key must be a UUID string' and write
--     nothing; bad TTL, endpoint, p_on_stale, p_wait_ms, p_stale_after, p_now raise IDM00 with
--     clear messages; an unknown user is refused by the foreign key.
BEGIN;
SELECT plan(113);

SET LOCAL client_min_messages = error;  -- the heal's WARNING is asserted in tests/python/sql/test_warnings.py

INSERT INTO public.users (id, email) VALUES (1001, 'alice@example.test'), (1002, 'bob@example.test');

-- Each claim's result, by step name, so a later assertion of the same section can compare it
-- with the table. Steps are named per section and no section reads another's steps or keys.
CREATE TEMP TABLE got (step text PRIMARY KEY, r public.idem_claim_result);
-- The audit_log's row count before a section's replays (each section sets it before use).
CREATE TEMP TABLE audit_before (n bigint);
-- The id of the row holding (key, user, endpoint), NULL when absent.
-- PL/pgSQL, not SQL: Citus plans no SQL function whose parameters reach a distributed table.
CREATE FUNCTION pg_temp.kid(p_key text, p_user integer, p_endpoint text) RETURNS bigint
LANGUAGE plpgsql AS $$ BEGIN RETURN (
    SELECT id FROM public.idempotency_keys
     WHERE idem_key = p_key AND scope_user_id IS NOT DISTINCT FROM public.idem_scope(p_user)
       AND scope_endpoint = p_endpoint); END $$;
-- The claim token of the row holding (key, user, endpoint): its key_id and claim time, hashed.
-- (The row first, then the hash: on Citus a query on the shard may not read the secret.)
CREATE FUNCTION pg_temp.token(p_key text, p_user integer, p_endpoint text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE v_id bigint; v_at timestamptz;
BEGIN
    SELECT id, created_at INTO v_id, v_at FROM public.idempotency_keys
     WHERE idem_key = p_key AND scope_user_id IS NOT DISTINCT FROM public.idem_scope(p_user)
       AND scope_endpoint = p_endpoint;
    RETURN public.idem_claim_token(v_id, v_at);
END $$;
CREATE FUNCTION pg_temp.sha(p jsonb) RETURNS text
LANGUAGE sql AS $$ SELECT encode(sha256(convert_to(p::text, 'UTF8')), 'hex') $$;

-- claimed ---------------------------------------------------------------------------------
INSERT INTO got SELECT 'first', c FROM public.idem_claim(
    p_key => 'a0000000-0000-4000-8000-000000000001', p_user_id => 1001,
    p_endpoint => 'POST /api/trading/orders', p_request => '{"b": [1, 2], "a": 1}') c;
SELECT row_eq($$SELECT (r).* FROM got WHERE step = 'first'$$,
    ROW('claimed', pg_temp.kid('a0000000-0000-4000-8000-000000000001', 1001, 'POST /api/trading/orders'),
        'e6f20bdc3757e5e7be4e316deff4196f19cf5954ffc76b1896228680fcdef66c', NULL, NULL, NULL, NULL, pg_temp.token('a0000000-0000-4000-8000-000000000001', 1001, 'POST /api/trading/orders'), 1, NULL)::public.idem_claim_result,
    'a first claim is claimed, returns its row id as the token and the hex SHA-256 of the request');
SELECT results_eq(
    $$SELECT idem_key, scope_user_id::integer, scope_endpoint, status, response_code, response_body,
             locked_at = created_at, expires_at - created_at, created_at - now() < interval '1 second'
        FROM public.idempotency_keys WHERE idem_key = 'a0000000-0000-4000-8000-000000000001'$$,
    $$VALUES ('a0000000-0000-4000-8000-000000000001'::text, 1001, 'POST /api/trading/orders'::text, 'in_flight'::text,
              NULL::smallint, NULL::jsonb, true, interval '24 hours', true)$$,
    'the claim stored one in_flight row for (key, user, endpoint), locked now, expiring after the default 24 hours');
SELECT is((SELECT (r).request_hash FROM got WHERE step = 'first'),
    encode(sha256(convert_to('{"a": 1, "b": [1, 2]}', 'UTF8')), 'hex'),
    'request_hash is the hex SHA-256 of jsonb''s canonical text for the request');

-- canonical keys and hash independence -------------------------------------------------------
INSERT INTO got SELECT 'canon-first', c FROM public.idem_claim(
    'a0000000-0000-4000-8000-000000000101', 1001, 'POST /api/trading/orders', '{"b": [1, 2], "a": 1}') c;
INSERT INTO got SELECT 'canon-upper', c FROM public.idem_claim(
    'A0000000-0000-4000-8000-000000000101', 1001, 'POST /api/trading/orders',
    '{ "a" : 1,   "b" : [1,2] }', p_now => now() + interval '1 second') c;
SELECT is((SELECT (r).outcome FROM got WHERE step = 'canon-upper'), 'in_flight',
    'the upper-case spelling of a key, with the body''s keys reordered and re-spaced, is a duplicate (not a mismatch)');
SELECT is((SELECT (r).key_id FROM got WHERE step = 'canon-upper'), (SELECT (r).key_id FROM got WHERE step = 'canon-first'),
    'the upper-case duplicate points at the very row the first claim inserted');
SELECT is((SELECT (r).request_hash FROM got WHERE step = 'canon-upper'), (SELECT (r).request_hash FROM got WHERE step = 'canon-first'),
    'key order and white space do not change request_hash');
SELECT is((SELECT count(*)::int FROM public.idempotency_keys WHERE idem_key = 'a0000000-0000-4000-8000-000000000101'),
    1, 'upper and lower case spellings left a single row');
SELECT is((SELECT request_hash FROM public.idem_claim('a0000000-0000-4000-8000-00000000000e', NULL, 'null-body', NULL)),
    '74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b',
    'a NULL request hashes as the JSON text null');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-00000000000e', NULL, 'null-body', 'null'::jsonb,
                                                 p_now => now() + interval '1 second')),
    'in_flight', 'a NULL request and a JSON null request are the same body');

-- in_flight -------------------------------------------------------------------------------
INSERT INTO got SELECT 'if-holder', c FROM public.idem_claim(
    'a0000000-0000-4000-8000-000000000201', 1001, 'POST /api/trading/orders', '{"b": [1, 2], "a": 1}') c;
INSERT INTO got SELECT 'if-dup', c FROM public.idem_claim(
    'a0000000-0000-4000-8000-000000000201', 1001, 'POST /api/trading/orders', '{"b": [1, 2], "a": 1}',
    p_now => now() + interval '1 second') c;
SELECT row_eq($$SELECT (r).* FROM got WHERE step = 'if-dup'$$,
    ROW('in_flight', (SELECT (r).key_id FROM got WHERE step = 'if-holder'),
        'e6f20bdc3757e5e7be4e316deff4196f19cf5954ffc76b1896228680fcdef66c', NULL, NULL, 5000, NULL, NULL, NULL,
        (SELECT (r).holder_elapsed_ms FROM got WHERE step = 'if-dup'))::public.idem_claim_result,
    'a duplicate of a live holder with 29 s of lease left is in_flight with retry_after_ms 5000');
SELECT ok((SELECT (r).holder_elapsed_ms BETWEEN 1000 AND 1100 FROM got WHERE step = 'if-dup'),
    'holder_elapsed_ms says how long the holder has held the key (1 s -> about 1000)');
SELECT ok((SELECT holder_elapsed_ms BETWEEN 20000 AND 20100
             FROM public.idem_claim('a0000000-0000-4000-8000-000000000201', 1001, 'POST /api/trading/orders',
                                    '{"a": 1, "b": [1, 2]}', p_now => now() + interval '20 seconds')),
    'holder_elapsed_ms grows with the holder''s time (20 s -> about 20000) while retry_after_ms stays capped');
SELECT ok((SELECT retry_after_ms BETWEEN 1950 AND 2050
             FROM public.idem_claim('a0000000-0000-4000-8000-000000000201', 1001, 'POST /api/trading/orders',
                                    '{"a": 1, "b": [1, 2]}', p_now => now() + interval '28 seconds')),
    'with 2 s left on the holder''s lease, retry_after_ms is computed from it (about 2000)');
SELECT ok((SELECT retry_after_ms BETWEEN 2950 AND 3050
             FROM public.idem_claim('a0000000-0000-4000-8000-000000000201', 1001, 'POST /api/trading/orders',
                                    '{"a": 1, "b": [1, 2]}', p_stale_after => '10 seconds',
                                    p_now => now() + interval '7 seconds')),
    'the lease follows the caller''s p_stale_after: 10 s lease, 7 s in -> about 3000');
SELECT results_eq(
    $$SELECT status, locked_at = created_at FROM public.idempotency_keys
       WHERE idem_key = 'a0000000-0000-4000-8000-000000000201'$$,
    $$VALUES ('in_flight'::text, true)$$,
    'in_flight answers change nothing: the holder keeps its status and its lease');

-- mismatch --------------------------------------------------------------------------------
INSERT INTO got SELECT 'mm-holder', c FROM public.idem_claim(
    'a0000000-0000-4000-8000-000000000301', 1001, 'POST /api/trading/orders', '{"b": [1, 2], "a": 1}') c;
SELECT is((SELECT c FROM public.idem_claim('a0000000-0000-4000-8000-000000000301', 1001, 'POST /api/trading/orders',
                                           '{"a": 2}', p_now => now() + interval '2 seconds') c),
    ROW('mismatch', (SELECT (r).key_id FROM got WHERE step = 'mm-holder'),
        pg_temp.sha('{"a": 2}'), NULL, NULL, NULL, NULL, NULL, NULL, NULL)::public.idem_claim_result,
    'the same key with a different body is a mismatch, reporting the new body''s hash');
SELECT results_eq(
    $$SELECT count(*)::int, min(request_hash) FROM public.idempotency_keys
       WHERE idem_key = 'a0000000-0000-4000-8000-000000000301'$$,
    $$VALUES (1, 'e6f20bdc3757e5e7be4e316deff4196f19cf5954ffc76b1896228680fcdef66c'::text)$$,
    'a mismatch changes nothing: one row, still the original hash');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-000000000301', 1001, 'POST /api/trading/orders',
                                                 '{"a": 2}', p_now => now() + interval '5 minutes')),
    'mismatch', 'a different body against a stale holder is a mismatch: body is checked before status');
SELECT isnt(pg_temp.kid('a0000000-0000-4000-8000-000000000301', 1001, 'POST /api/trading/orders'), NULL,
    'a mismatch against a stale holder does not heal it');

-- replay ----------------------------------------------------------------------------------
INSERT INTO got SELECT 'rp-holder', c FROM public.idem_claim(
    'a0000000-0000-4000-8000-000000000401', 1001, 'POST /api/trading/orders', '{"b": [1, 2], "a": 1}') c;
SELECT public.idem_complete(pg_temp.kid('a0000000-0000-4000-8000-000000000401', 1001, 'POST /api/trading/orders'),
                            201, '{"order_id": 42, "filled": true}');
TRUNCATE audit_before; INSERT INTO audit_before SELECT count(*) FROM public.audit_log;
INSERT INTO got SELECT 'replay', c FROM public.idem_claim(
    'a0000000-0000-4000-8000-000000000401', 1001, 'POST /api/trading/orders', '{"a": 1, "b": [1, 2]}',
    p_now => now() + interval '10 seconds') c;
SELECT row_eq($$SELECT (r).* FROM got WHERE step = 'replay'$$,
    ROW('replay', (SELECT (r).key_id FROM got WHERE step = 'rp-holder'),
        'e6f20bdc3757e5e7be4e316deff4196f19cf5954ffc76b1896228680fcdef66c',
        201, '{"order_id": 42, "filled": true}', NULL, NULL, NULL, NULL, NULL)::public.idem_claim_result,
    'a duplicate of a completed key replays the stored response code and body');
SELECT is((SELECT count(*) FROM public.audit_log) - (SELECT n FROM audit_before), 1::bigint,
    'the replay wrote exactly one audit_log row');
SELECT results_eq(
    $$SELECT user_id, action, context->>'request_hash', (context->>'response_code')::int, (context->>'key_id')::bigint
        FROM public.audit_log ORDER BY id DESC LIMIT 1$$,
    $$SELECT 1001, 'idempotency_replay'::text, 'e6f20bdc3757e5e7be4e316deff4196f19cf5954ffc76b1896228680fcdef66c'::text,
             201, (SELECT (r).key_id FROM got WHERE step = 'rp-holder')$$,
    'the replay''s audit row is idempotency_replay for the user, with the original request hash, response code and key');
SELECT is((SELECT outcome FROM public.idem_claim('A0000000-0000-4000-8000-000000000401', 1001, 'POST /api/trading/orders',
                                                 '{"b":[1,2],"a":1}', p_now => now() + interval '11 seconds')),
    'replay', 'an upper-case key with a reordered body replays too');
SELECT is((SELECT count(*) FROM public.audit_log) - (SELECT n FROM audit_before), 2::bigint,
    'each replay writes its own single audit row');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-000000000401', 1001, 'POST /api/trading/orders',
                                                 '{"a": 3}', p_now => now() + interval '12 seconds')),
    'mismatch', 'a different body against a completed key is a mismatch, not a replay');
SELECT is((SELECT count(*) FROM public.audit_log) - (SELECT n FROM audit_before), 2::bigint,
    'a mismatch against a completed key writes no audit row');
SELECT results_eq(
    $$SELECT status, response_code, response_body FROM public.idempotency_keys
       WHERE idem_key = 'a0000000-0000-4000-8000-000000000401'$$,
    $$VALUES ('completed'::text, 201::smallint, '{"order_id": 42, "filled": true}'::jsonb)$$,
    'replays and mismatches leave the completed row as it was');

SELECT public.idem_complete((SELECT key_id FROM public.idem_claim('a0000000-0000-4000-8000-000000000002', 1001, 'ep-4xx', '{}')),
                            409, '{"error": "insufficient_funds"}');
SELECT is((SELECT c FROM public.idem_claim('a0000000-0000-4000-8000-000000000002', 1001, 'ep-4xx', '{}') c),
    ROW('replay', pg_temp.kid('a0000000-0000-4000-8000-000000000002', 1001, 'ep-4xx'), pg_temp.sha('{}'),
        409, '{"error": "insufficient_funds"}', NULL, NULL, NULL, NULL, NULL)::public.idem_claim_result,
    'a completed 4xx answer replays like any other (Stripe semantics)');

-- a completion without a body is not replayable --------------------------------------------------
INSERT INTO got SELECT 'nobody-1', c FROM public.idem_claim('a0000000-0000-4000-8000-000000000003', 1001, 'ep-pii', '{"card": "4242"}') c;
SELECT public.idem_complete((SELECT (r).key_id FROM got WHERE step = 'nobody-1'), 200, NULL);
INSERT INTO got SELECT 'nobody-2', c FROM public.idem_claim('a0000000-0000-4000-8000-000000000003', 1001, 'ep-pii', '{"card": "4242"}',
                                                            p_now => now() + interval '1 second') c;
SELECT is((SELECT (r).outcome FROM got WHERE step = 'nobody-2'), 'claimed',
    'a key completed with a NULL body is not replayable: the next claim is claimed and runs again');
SELECT results_eq(
    $$SELECT id, status FROM public.idempotency_keys WHERE idem_key = 'a0000000-0000-4000-8000-000000000003'$$,
    $$SELECT (r).key_id, 'in_flight'::text FROM got WHERE step = 'nobody-2'$$,
    'the body-less completion was replaced by the new claim''s single in_flight row');
SELECT isnt((SELECT (r).key_id FROM got WHERE step = 'nobody-2'), (SELECT (r).key_id FROM got WHERE step = 'nobody-1'),
    'the new claim has a new token');

-- previous_failed -----------------------------------------------------------------------------
INSERT INTO got SELECT 'fail-1', c FROM public.idem_claim('a0000000-0000-4000-8000-000000000004', 1001, 'ep-fail', '{"x": 1}') c;
SELECT public.idem_fail((SELECT (r).key_id FROM got WHERE step = 'fail-1'), 502);
TRUNCATE audit_before; INSERT INTO audit_before SELECT count(*) FROM public.audit_log;
SELECT is((SELECT c FROM public.idem_claim('a0000000-0000-4000-8000-000000000004', 1001, 'ep-fail', '{"x": 1}',
                                           p_now => now() + interval '1 minute') c),
    ROW('previous_failed', (SELECT (r).key_id FROM got WHERE step = 'fail-1'), pg_temp.sha('{"x": 1}'),
        502, NULL, NULL, NULL, NULL, NULL, NULL)::public.idem_claim_result,
    'a duplicate of a failed key is previous_failed, with the failure''s response code');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-000000000004', 1001, 'ep-fail', '{"x": 2}',
                                                 p_now => now() + interval '1 minute')),
    'mismatch', 'a different body against a failed key is a mismatch: body is checked before status');
SELECT results_eq(
    $$SELECT k.n, k.status, a.n - (SELECT n FROM audit_before)
        FROM (SELECT count(*)::int AS n, min(status) AS status FROM public.idempotency_keys
               WHERE idem_key = 'a0000000-0000-4000-8000-000000000004') k,
             (SELECT count(*) AS n FROM public.audit_log) a$$,
    $$VALUES (1, 'failed'::text, 0::bigint)$$,
    'previous_failed writes nothing: the failed row stays, no audit row');

-- stale -----------------------------------------------------------------------------------------
INSERT INTO got SELECT 'stale-holder', c FROM public.idem_claim('a0000000-0000-4000-8000-000000000005', 1001, 'ep-stale', '{"s": 1}') c;
INSERT INTO got SELECT 'stale', c FROM public.idem_claim('a0000000-0000-4000-8000-000000000005', 1001, 'ep-stale', '{"s": 1}',
                                                         p_now => now() + interval '31 seconds') c;
SELECT row_eq($$SELECT (r).* FROM got WHERE step = 'stale'$$,
    ROW('stale', (SELECT (r).key_id FROM got WHERE step = 'stale-holder'), pg_temp.sha('{"s": 1}'),
        NULL, NULL, 100, NULL, NULL, NULL, NULL)::public.idem_claim_result,
    'a duplicate of a holder older than p_stale_after is stale, naming the dead holder, with a small retry_after_ms');
SELECT is(pg_temp.kid('a0000000-0000-4000-8000-000000000005', 1001, 'ep-stale'), NULL,
    'the stale holder''s row was deleted: the key is free');
SELECT results_eq(
    $$SELECT event, key_id, scope_user_id::integer, scope_endpoint, detail->>'request_hash', detail ? 'locked_at'
        FROM public.idempotency_events WHERE event = 'stale_heal'$$,
    $$SELECT 'stale_heal'::text, (r).key_id, 1001, 'ep-stale'::text, pg_temp.sha('{"s": 1}'), true
        FROM got WHERE step = 'stale-holder'$$,
    'the heal recorded one stale_heal event with the dead holder''s id, scope, request hash and lease');
INSERT INTO got SELECT 'after-stale', c FROM public.idem_claim('a0000000-0000-4000-8000-000000000005', 1001, 'ep-stale', '{"s": 1}',
                                                               p_now => now() + interval '32 seconds') c;
SELECT is((SELECT (r).outcome FROM got WHERE step = 'after-stale'), 'claimed',
    'the claim after a heal is claimed');
SELECT is((SELECT (r).attempt FROM got WHERE step = 'after-stale'), 2,
    'the claim after one heal is attempt 2 (SQL API 6): the heal''s event remembers the first execution');
SELECT isnt((SELECT (r).key_id FROM got WHERE step = 'after-stale'), (SELECT (r).key_id FROM got WHERE step = 'stale-holder'),
    'the new claim holds a new token, so the dead holder''s token is fenced off');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-000000000005', 1001, 'ep-stale', '{"s": 1}',
                                                 p_now => now() + interval '33 seconds')),
    'in_flight', 'exactly one claim wins after a heal: the next duplicate is in_flight again');
SELECT throws_ok(
    format('SELECT public.idem_complete(%s, 200, %L)', (SELECT (r).key_id FROM got WHERE step = 'stale-holder'), '{"late": true}'),
    'IDM01', NULL, 'the healed holder''s late idem_complete raises IDM01 (zombie fenced)');

-- scopes ------------------------------------------------------------------------------------
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-000000000006', NULL, 'svc', '{"n": 1}')),
    'claimed', 'a service call with no user scope is claimed');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-000000000006', NULL, 'svc', '{"n": 1}',
                                                 p_now => now() + interval '1 second')),
    'in_flight', 'a second service call with the same key dedupes: NULL user scopes are not distinct');
SELECT is((SELECT count(*)::int FROM public.idempotency_keys WHERE idem_key = 'a0000000-0000-4000-8000-000000000006'),
    1, 'the NULL-scoped key has a single row');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-000000000006', 1001, 'svc', '{"n": 1}')),
    'claimed', 'a user''s claim of the same key is a separate scope from the service call''s');

SELECT public.idem_complete((SELECT key_id FROM public.idem_claim('a0000000-0000-4000-8000-000000000007', 1001, 'ep-ab', '{"q": 1}')),
                            200, '{"note": "alice''s order"}');
TRUNCATE audit_before; INSERT INTO audit_before SELECT count(*) FROM public.audit_log;
INSERT INTO got SELECT 'user-b', c FROM public.idem_claim('a0000000-0000-4000-8000-000000000007', 1002, 'ep-ab', '{"q": 1}',
                                                          p_now => now() + interval '1 second') c;
SELECT row_eq($$SELECT (r).* FROM got WHERE step = 'user-b'$$,
    ROW('claimed', pg_temp.kid('a0000000-0000-4000-8000-000000000007', 1002, 'ep-ab'), pg_temp.sha('{"q": 1}'),
        NULL, NULL, NULL, NULL, pg_temp.token('a0000000-0000-4000-8000-000000000007', 1002, 'ep-ab'), 1, NULL)::public.idem_claim_result,
    'user B presenting user A''s key and body is claimed: A''s stored response never replays to B');
SELECT is((SELECT count(*) FROM public.audit_log) - (SELECT n FROM audit_before), 0::bigint,
    'user B''s claim wrote no replay audit row');
SELECT isnt((SELECT (r).key_id FROM got WHERE step = 'user-b'), pg_temp.kid('a0000000-0000-4000-8000-000000000007', 1001, 'ep-ab'),
    'user B got a row of their own');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-000000000007', 1001, 'ep-other', '{"q": 1}')),
    'claimed', 'the same key and user on another endpoint is a separate scope');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-000000000007', 1001, 'ep-ab', '{"q": 1}',
                                                 p_now => now() + interval '2 seconds')),
    'replay', 'user A still replays their own completed key');

-- expired keys are absent before cleanup ----------------------------------------------------------
SELECT public.idem_complete((SELECT key_id FROM public.idem_claim('a0000000-0000-4000-8000-000000000008', 1001, 'ep-exp', '{}',
                                                                  p_ttl => '1 hour')), 200, '{"ok": true}');
INSERT INTO got SELECT 'expired-completed', c FROM public.idem_claim('a0000000-0000-4000-8000-000000000008', 1001, 'ep-exp', '{}',
                                                                     p_now => now() + interval '1 hour 1 second') c;
SELECT is((SELECT (r).outcome FROM got WHERE step = 'expired-completed'), 'claimed',
    'a completed key past its expiry is absent: claimed, not replayed, before any cleanup');
SELECT results_eq(
    $$SELECT id, status FROM public.idempotency_keys WHERE idem_key = 'a0000000-0000-4000-8000-000000000008'$$,
    $$SELECT (r).key_id, 'in_flight'::text FROM got WHERE step = 'expired-completed'$$,
    'the expired row was replaced by the new claim''s row');

SELECT public.idem_fail((SELECT key_id FROM public.idem_claim('a0000000-0000-4000-8000-000000000009', 1001, 'ep-exp', '{}',
                                                              p_ttl => '1 hour')));
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-000000000009', 1001, 'ep-exp', '{}',
                                                 p_now => now() + interval '1 hour 1 second')),
    'claimed', 'a failed key past its expiry is absent: claimed, not previous_failed');

SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-00000000000a', 1001, 'ep-exp', '{}',
                                                 p_ttl => '1 minute', p_stale_after => '1 hour')),
    'claimed', 'a short-lived claim with a long lease is claimed');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-00000000000a', 1001, 'ep-exp', '{}',
                                                 p_stale_after => '1 hour', p_now => now() + interval '2 minutes')),
    'claimed', 'an in_flight key past its expiry is absent even while its lease would still run');

SELECT public.idem_complete((SELECT key_id FROM public.idem_claim('a0000000-0000-4000-8000-00000000000b', 1001, 'ep-exp', '{"v": 1}',
                                                                  p_ttl => '1 hour')), 200, '{}');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-00000000000b', 1001, 'ep-exp', '{"v": 2}',
                                                 p_now => now() + interval '2 hours')),
    'claimed', 'an expired key is absent before its body is compared: a new body is claimed, not a mismatch');

-- p_on_stale => 'quarantine' -----------------------------------------------------------------
INSERT INTO got SELECT 'q-holder', c FROM public.idem_claim('a0000000-0000-4000-8000-00000000000c', 1001, 'ep-q', '{}',
                                                            p_ttl => '60 seconds') c;
CREATE TEMP TABLE events_before AS SELECT count(*) AS n FROM public.idempotency_events;
INSERT INTO got SELECT 'q-dup', c FROM public.idem_claim('a0000000-0000-4000-8000-00000000000c', 1001, 'ep-q', '{}',
                                                         p_on_stale => 'quarantine', p_now => now() + interval '40 seconds') c;
SELECT is((SELECT r FROM got WHERE step = 'q-dup'),
    ROW('in_flight', (SELECT (r).key_id FROM got WHERE step = 'q-holder'), pg_temp.sha('{}'), NULL, NULL, 5000, NULL, NULL, NULL,
        (SELECT (r).holder_elapsed_ms FROM got WHERE step = 'q-dup'))::public.idem_claim_result,
    'quarantine answers in_flight for a stale holder (retry_after 5000 while expiry is far)');
SELECT ok((SELECT (r).holder_elapsed_ms BETWEEN 39900 AND 40100 FROM got WHERE step = 'q-dup'),
    'a quarantined holder''s holder_elapsed_ms is its whole time (40 s -> about 40000)');
SELECT ok((SELECT retry_after_ms BETWEEN 1950 AND 2050
             FROM public.idem_claim('a0000000-0000-4000-8000-00000000000c', 1001, 'ep-q', '{}', p_on_stale => 'quarantine',
                                    p_now => now() + interval '58 seconds')),
    'under quarantine retry_after_ms is computed from the time left to expiry (2 s -> about 2000)');
SELECT results_eq(
    $$SELECT k.id, k.status, (SELECT count(*) FROM public.idempotency_events) - (SELECT n FROM events_before)
        FROM public.idempotency_keys k WHERE k.idem_key = 'a0000000-0000-4000-8000-00000000000c'$$,
    $$SELECT (r).key_id, 'in_flight'::text, 0::bigint FROM got WHERE step = 'q-holder'$$,
    'quarantine keeps the stale holder''s row and records no heal');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-00000000000c', 1001, 'ep-q', '{}', p_on_stale => 'quarantine',
                                                 p_now => now() + interval '61 seconds')),
    'claimed', 'a quarantined key becomes claimable once it expires');

-- p_wait_ms (validation and the paths that must not wait; the completing race is in Python) -----
INSERT INTO got SELECT 'w-holder', c FROM public.idem_claim('a0000000-0000-4000-8000-00000000000d', 1001, 'ep-wait', '{}') c;
CREATE TEMP TABLE wait_clock AS SELECT clock_timestamp() AS t0;
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-00000000000d', 1001, 'ep-wait', '{}', p_wait_ms => 150)),
    'in_flight', 'a duplicate that waits for a holder that does not finish still answers in_flight');
SELECT cmp_ok(clock_timestamp() - (SELECT t0 FROM wait_clock), '>=', interval '150 milliseconds',
    'the waiting duplicate waited at least p_wait_ms before answering');
TRUNCATE wait_clock; INSERT INTO wait_clock SELECT clock_timestamp();
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-0000000000d1', 1001, 'ep-wait', '{}', p_wait_ms => 5000)),
    'claimed', 'a free key is claimed at once even with p_wait_ms');
SELECT public.idem_complete((SELECT (r).key_id FROM got WHERE step = 'w-holder'), 200, '{"done": 1}');
SELECT is((SELECT outcome FROM public.idem_claim('a0000000-0000-4000-8000-00000000000d', 1001, 'ep-wait', '{}', p_wait_ms => 5000)),
    'replay', 'a completed key replays at once even with p_wait_ms');
SELECT cmp_ok(clock_timestamp() - (SELECT t0 FROM wait_clock), '<', interval '1 second',
    'neither a free key nor a completed key waited');

-- retention cap ---------------------------------------------------------------------------------
INSERT INTO got SELECT 'ttl-7d', c FROM public.idem_claim('a0000000-0000-4000-8000-000000000010', 1001, 'ep-ttl', '{}',
                                                          p_ttl => '7 days') c;
SELECT is((SELECT expires_at - created_at FROM public.idempotency_keys WHERE id = (SELECT (r).key_id FROM got WHERE step = 'ttl-7d')),
    interval '7 days', 'a TTL of exactly 7 days is accepted and stored');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000011', 1001, 'ep-ttl', '{}', p_ttl => '7 days 1 second')$$,
    'IDM00', 'idem_claim: p_ttl must be positive and at most 7 days (got 7 days 00:00:01)',
    'a TTL one second over 7 days raises IDM00 naming the cap');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000011', 1001, 'ep-ttl', '{}', p_ttl => '1 mon')$$,
    'IDM00', 'idem_claim: p_ttl must be positive and at most 7 days (got 1 mon)',
    'a TTL of a month raises IDM00');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000011', 1001, 'ep-ttl', '{}', p_ttl => '0')$$,
    'IDM00', 'idem_claim: p_ttl must be positive and at most 7 days (got 00:00:00)',
    'a zero TTL raises IDM00');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000011', 1001, 'ep-ttl', '{}', p_ttl => '-1 hour')$$,
    'IDM00', 'idem_claim: p_ttl must be positive and at most 7 days (got -01:00:00)',
    'a negative TTL raises IDM00');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000011', 1001, 'ep-ttl', '{}', p_ttl => NULL)$$,
    'IDM00', NULL, 'a NULL TTL raises IDM00');
SELECT throws_like($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000011', 1001, 'ep-ttl', '{}', p_ttl => NULL)$$,
    'idem_claim: p_ttl must be positive and at most 7 days%', 'a NULL TTL''s error names the accepted range');
SELECT throws_ok($$INSERT INTO public.idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, created_at, expires_at)
                   VALUES ('a0000000-0000-4000-8000-000000000012', 1001, 'ep-direct', 'h', now(), now() + interval '8 days')$$,
    '23514', NULL, 'a direct INSERT keeping a row past 7 days is rejected by the retention CHECK');
SELECT throws_ok($$INSERT INTO public.idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, created_at, expires_at)
                   VALUES ('a0000000-0000-4000-8000-000000000012', 1001, 'ep-direct', 'h', now(), now())$$,
    '23514', NULL, 'a direct INSERT that expires when it is created is rejected by the CHECK');
SELECT throws_ok($$INSERT INTO public.idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, created_at, expires_at)
                   VALUES ('A0000000-0000-4000-8000-000000000012', 1001, 'ep-direct', 'h', now(), now() + interval '1 day')$$,
    '23514', NULL, 'a direct INSERT of a non-canonical (upper-case) key is rejected by the CHECK');
-- The CHECK is stated in hours, so a row kept the full 168 h across a spring-forward still
-- passes it on any UPDATE (or pg_restore's COPY) made in that zone.
SET LOCAL TimeZone = 'UTC';
INSERT INTO got SELECT 'ttl-dst', c FROM public.idem_claim('a0000000-0000-4000-8000-000000000014', NULL, 'ep-ttl', '{}',
                                                           p_ttl => '7 days', p_now => '2026-03-25 12:00:00+00') c;
SET LOCAL TimeZone = 'Europe/Paris';
SELECT lives_ok(format('UPDATE public.idempotency_keys SET response_code = 200 WHERE id = %s',
                       (SELECT (r).key_id FROM got WHERE step = 'ttl-dst')),
    'a stored 7-day row can be updated (or restored) from a session whose TimeZone springs forward that week');
SET LOCAL TimeZone = 'UTC';
SELECT is((SELECT count(*)::int FROM public.idempotency_keys WHERE idem_key IN ('a0000000-0000-4000-8000-000000000011',
                                                                               'a0000000-0000-4000-8000-000000000012')),
    0, 'none of the refused TTLs or INSERTs left a row');

-- p_key_format => 'opaque' ------------------------------------------------------------------
INSERT INTO got SELECT 'op-first', c FROM public.idem_claim('Order-2026-0001-ABCD', 1001, 'ep-op', '{"o": 1}',
                                                            p_key_format => 'opaque') c;
SELECT is((SELECT (r).outcome FROM got WHERE step = 'op-first'), 'claimed', 'an opaque key is claimed under ''opaque''');
SELECT is((SELECT idem_key FROM public.idempotency_keys WHERE id = (SELECT (r).key_id FROM got WHERE step = 'op-first')),
    'Order-2026-0001-ABCD', 'the opaque key is stored as sent (the CHECK admits it)');
SELECT is((SELECT outcome FROM public.idem_claim('Order-2026-0001-ABCD', 1001, 'ep-op', '{"o": 1}', p_key_format => 'opaque',
                                                 p_now => now() + interval '1 second')),
    'in_flight', 'the same opaque key again finds its holder');
SELECT is((SELECT outcome FROM public.idem_claim('order-2026-0001-abcd', 1001, 'ep-op', '{"o": 1}', p_key_format => 'opaque')),
    'claimed', 'another spelling of an opaque key is another key (case-sensitive)');
INSERT INTO got SELECT 'op-uuid', c FROM public.idem_claim('a0000000-0000-4000-8000-0000000000f1', 1001, 'ep-op', '{"o": 2}') c;
SELECT is((SELECT (r).key_id FROM public.idem_claim('A0000000-0000-4000-8000-0000000000F1', 1001, 'ep-op', '{"o": 2}',
                                                    p_key_format => 'opaque', p_now => now() + interval '1 second') r),
    (SELECT (r).key_id FROM got WHERE step = 'op-uuid'),
    'a UUID claimed under ''uuid'' is the same key under ''opaque'', in either case: switching formats keeps keys');
SELECT throws_ok($$SELECT public.idem_claim('Order-2026-0001-ABCD', 1001, 'ep-op', '{"o": 1}')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'an opaque key is malformed under the default format');
SELECT throws_ok($$SELECT public.idem_claim('order-1', 1001, 'ep-op', '{}', p_key_format => 'opaque')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'an opaque key under 16 characters is malformed');
SELECT throws_ok($$SELECT public.idem_claim('Order-2026-0001-ABCD', 1001, 'ep-op', '{}', p_key_format => 'ulid')$$,
    'IDM00', NULL, 'an unknown p_key_format raises IDM00');
SELECT throws_ok($$INSERT INTO public.idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, created_at, expires_at)
                   VALUES ('short key here, 20', 1001, 'ep-direct', 'h', now(), now() + interval '1 day')$$,
    '23514', NULL, 'a direct INSERT of a key with a space is rejected by the CHECK');
SELECT throws_ok($$INSERT INTO public.idempotency_keys (idem_key, scope_user_id, scope_endpoint, request_hash, created_at, expires_at)
                   VALUES ('', 1001, 'ep-direct', 'h', now(), now() + interval '1 day')$$,
    '23514', NULL, 'a direct INSERT of an empty key is rejected by the CHECK (opaque keys start at 1 character: ''opaque_short'')');

-- bad input: malformed keys write nothing --------------------------------------------------------
CREATE TEMP TABLE before_bad AS
    SELECT (SELECT count(*) FROM public.idempotency_keys) AS keys,
           (SELECT count(*) FROM public.audit_log) AS audits,
           (SELECT count(*) FROM public.idempotency_events) AS events;
SELECT throws_ok($$SELECT public.idem_claim('', 1001, 'ep', '{}')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'idem_claim rejects an empty key');
SELECT throws_ok($$SELECT public.idem_claim(NULL, 1001, 'ep', '{}')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'idem_claim rejects a NULL key');
SELECT throws_ok($$SELECT public.idem_claim('all', 1001, 'ep', '{}')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'idem_claim rejects the key ''all''');
SELECT throws_ok($$SELECT public.idem_claim('admin', 1001, 'ep', '{}')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'idem_claim rejects the key ''admin''');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-0000000000001', 1001, 'ep', '{}')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'idem_claim rejects a 37-character key');
SELECT throws_ok($q$SELECT public.idem_claim($$'; DROP TABLE idempotency_keys; --$$, 1001, 'ep', '{}')$q$,
    '22023', 'Idempotency-Key must be a UUID string', 'idem_claim rejects a SQL fragment as a key');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-00000000000é', 1001, 'ep', '{}')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'idem_claim rejects a non-ASCII key');
SELECT throws_ok($$SELECT public.idem_claim('{a0000000-0000-4000-8000-000000000001}', 1001, 'ep', '{}')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'idem_claim rejects a UUID in braces');
SELECT throws_ok($$SELECT public.idem_claim('all', NULL, NULL, NULL, p_ttl => '1 year')$$,
    '22023', 'Idempotency-Key must be a UUID string', 'a malformed key is reported first, whatever else is wrong');
SELECT has_table('public', 'idempotency_keys', 'the SQL fragment did not drop the table');
SELECT results_eq(
    $$SELECT (SELECT count(*) FROM public.idempotency_keys), (SELECT count(*) FROM public.audit_log),
             (SELECT count(*) FROM public.idempotency_events)$$,
    $$SELECT keys, audits, events FROM before_bad$$,
    'malformed keys wrote nothing: no key, audit or event rows');

-- bad input: other arguments ------------------------------------------------------------------
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 1001, NULL, '{}')$$,
    'IDM00', 'idem_claim: p_endpoint must be a non-empty route name', 'a NULL endpoint raises IDM00');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 1001, '', '{}')$$,
    'IDM00', 'idem_claim: p_endpoint must be a non-empty route name', 'an empty endpoint raises IDM00');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 1001, 'ep', '{}', p_on_stale => 'ignore')$$,
    'IDM00', 'idem_claim: p_on_stale must be ''heal'' or ''quarantine'' (got ''ignore'')',
    'an unknown p_on_stale raises IDM00 listing the accepted values');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 1001, 'ep', '{}', p_on_stale => NULL)$$,
    'IDM00', 'idem_claim: p_on_stale must be ''heal'' or ''quarantine'' (got NULL)', 'a NULL p_on_stale raises IDM00');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 1001, 'ep', '{}', p_wait_ms => -1)$$,
    'IDM00', 'idem_claim: p_wait_ms must be between 0 and 60000 (got -1)', 'a negative wait raises IDM00');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 1001, 'ep', '{}', p_wait_ms => 60001)$$,
    'IDM00', 'idem_claim: p_wait_ms must be between 0 and 60000 (got 60001)', 'a wait over a minute raises IDM00');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 1001, 'ep', '{}', p_wait_ms => NULL)$$,
    'IDM00', NULL, 'a NULL wait raises IDM00');
SELECT throws_like($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 1001, 'ep', '{}', p_wait_ms => NULL)$$,
    'idem_claim: p_wait_ms must be between 0 and 60000%', 'a NULL wait''s error names the accepted range');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 1001, 'ep', '{}', p_stale_after => NULL)$$,
    'IDM00', 'idem_claim: p_stale_after must be a positive interval', 'a NULL p_stale_after raises IDM00');
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 1001, 'ep', '{}', p_stale_after => '0')$$,
    'IDM00', 'idem_claim: p_stale_after must be a positive interval', 'a zero p_stale_after raises IDM00');
SET LOCAL ROLE idem_app;
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 1001, 'ep', '{}', p_now => now() + interval '50 years')$$,
    'IDM00', 'idem_claim: p_now is for tests: only the functions'' owner may pass it',
    'p_now from a role that does not own the store (the app) raises IDM00');
RESET ROLE;
SELECT throws_ok($$SELECT public.idem_claim('a0000000-0000-4000-8000-000000000013', 999999, 'ep', '{}')$$,
    '23503', NULL, 'a claim for a user the host does not know is refused by the foreign key');
SELECT is(pg_temp.kid('a0000000-0000-4000-8000-000000000013', 1001, 'ep'), NULL,
    'none of the refused arguments left a row');

SELECT * FROM finish();
ROLLBACK;
