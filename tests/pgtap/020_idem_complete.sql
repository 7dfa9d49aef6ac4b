-- 020_idem_complete: completing a claim, fenced by its token (contract §3).
-- Cases:
--   completes an in_flight claim: status completed, code and body stored, lease and expiry kept;
--     a NULL body is stored as NULL; 100 and 599 are accepted.
--   a lost token raises IDM01 'idem_complete: claim lost: ...' and changes nothing, when the claim was:
--     healed as stale (and the key re-claimed: the winner's row is untouched), already completed
--     (the first response is kept), failed, erased, or never existed.
--   a zombie's business write in the same transaction as its late completion is rolled back with it.
--   a response code outside 100..599 or NULL raises IDM00, a body holding a credential-named key at
--     any depth raises IDM04, and either leaves the claim in flight.
--   with p_response_key the body is stored encrypted (kid, no plaintext); a replay with the key,
--     or with it as the fallback during a rotation, returns the plain body; without it or with
--     another key, IDM03 and no audit row; a weak key is refused with IDM00.
--   the 7-day cap does not depend on the caller's TimeZone: a 7-day claim made in UTC completes
--     from a session that springs forward that week, 168 hours is accepted there, and a 7-day
--     claim made where the clocks fall back is not kept 169 hours.
--   response headers: stored as given and replayed by idem_claim; not kept without a
--     body; encrypted with the body under p_response_key and opened by the replay; refused with
--     IDM04 (response refused), the claim left in flight, when a name is a credential (Set-Cookie,
--     Authorization, WWW-Authenticate, Proxy-Authenticate, X-Api-Key, any case) or a value is over
--     8192 bytes or holds a line break; with IDM00 (misuse) when a name is not a header name, a
--     value is not a string, or the headers are not an object.
--   raw bodies {"idem_raw": "text"|"base64", "data": ...}: stored and replayed as given; a
--     malformed one is refused; a raw JSON text holding a credential-named key is refused, a raw
--     CSV that merely mentions one is not.
BEGIN;
SELECT plan(71);

SET LOCAL client_min_messages = error;  -- the heal below raises a WARNING (asserted in 010)

INSERT INTO public.users (id, email) VALUES (2001, 'carol@example.test'), (2002, 'dave@example.test');
CREATE TEMP TABLE tok (name text PRIMARY KEY, id bigint);
CREATE FUNCTION pg_temp.row_of(p_id bigint) RETURNS TABLE (status text, response_code smallint, response_body jsonb)
-- PL/pgSQL, not SQL: Citus plans no SQL function whose parameters reach a distributed table.
LANGUAGE plpgsql AS $$ BEGIN RETURN QUERY SELECT k.status, k.response_code, k.response_body
                                         FROM public.idempotency_keys k WHERE k.id = p_id; END $$;

-- the happy path -----------------------------------------------------------------------------
INSERT INTO tok SELECT 'ok', key_id FROM public.idem_claim('b0000000-0000-4000-8000-000000000001', 2001, 'ep', '{"amount": 10}');
CREATE TEMP TABLE before_ok AS SELECT created_at, locked_at, expires_at FROM public.idempotency_keys WHERE id = (SELECT id FROM tok WHERE name = 'ok');
SELECT lives_ok(format($$SELECT public.idem_complete(%s, 201, '{"order_id": 7, "note": "ünïcødé"}')$$, (SELECT id FROM tok WHERE name = 'ok')),
    'idem_complete completes an in-flight claim');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', (SELECT id FROM tok WHERE name = 'ok')),
    $$VALUES ('completed'::text, 201::smallint, '{"order_id": 7, "note": "ünïcødé"}'::jsonb)$$,
    'the row is completed with the response code and body to replay');
SELECT results_eq(
    format('SELECT created_at, locked_at, expires_at FROM public.idempotency_keys WHERE id = %s', (SELECT id FROM tok WHERE name = 'ok')),
    'SELECT created_at, locked_at, expires_at FROM before_ok',
    'completing keeps created_at, locked_at and expires_at (retention runs from the claim)');

INSERT INTO tok SELECT 'nobody', key_id FROM public.idem_claim('b0000000-0000-4000-8000-000000000002', 2001, 'ep', '{}');
SELECT lives_ok(format('SELECT public.idem_complete(%s, 200, NULL)', (SELECT id FROM tok WHERE name = 'nobody')),
    'idem_complete accepts a NULL body (nothing stored for replay)');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', (SELECT id FROM tok WHERE name = 'nobody')),
    $$VALUES ('completed'::text, 200::smallint, NULL::jsonb)$$,
    'a NULL body is stored as NULL');

INSERT INTO tok SELECT 'c100', key_id FROM public.idem_claim('b0000000-0000-4000-8000-000000000003', 2001, 'ep', '{}');
INSERT INTO tok SELECT 'c599', key_id FROM public.idem_claim('b0000000-0000-4000-8000-000000000004', 2001, 'ep', '{}');
SELECT lives_ok(format('SELECT public.idem_complete(%s, 100, %L)', (SELECT id FROM tok WHERE name = 'c100'), '{}'),
    'response code 100 is accepted (lower bound)');
SELECT lives_ok(format('SELECT public.idem_complete(%s, 599, %L)', (SELECT id FROM tok WHERE name = 'c599'), '{}'),
    'response code 599 is accepted (upper bound)');

-- lost tokens: IDM01 and nothing changes ----------------------------------------------------------
-- already completed
SELECT throws_ok(format($$SELECT public.idem_complete(%s, 500, '{"second": true}')$$, (SELECT id FROM tok WHERE name = 'ok')),
    'IDM01', format('idem_complete: claim lost: key_id %s is no longer in flight for this holder; it is completed now', (SELECT id FROM tok WHERE name = 'ok')),
    'completing an already completed claim raises IDM01 naming the key_id');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', (SELECT id FROM tok WHERE name = 'ok')),
    $$VALUES ('completed'::text, 201::smallint, '{"order_id": 7, "note": "ünïcødé"}'::jsonb)$$,
    'the second completion changed nothing: the first response is what replays');

-- failed
INSERT INTO tok SELECT 'failed', key_id FROM public.idem_claim('b0000000-0000-4000-8000-000000000005', 2001, 'ep', '{}');
SELECT public.idem_fail((SELECT id FROM tok WHERE name = 'failed'), 503);
SELECT throws_ok(format('SELECT public.idem_complete(%s, 200, %L)', (SELECT id FROM tok WHERE name = 'failed'), '{}'),
    'IDM01', format('idem_complete: claim lost: key_id %s is no longer in flight for this holder; it is failed now', (SELECT id FROM tok WHERE name = 'failed')),
    'completing a failed claim raises IDM01 saying the row is failed now');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', (SELECT id FROM tok WHERE name = 'failed')),
    $$VALUES ('failed'::text, 503::smallint, NULL::jsonb)$$,
    'the failed row stays failed with its code');

-- healed as stale, then re-claimed by a winner
INSERT INTO tok SELECT 'zombie', key_id FROM public.idem_claim('b0000000-0000-4000-8000-000000000006', 2001, 'ep', '{"z": 1}');
SELECT is((SELECT outcome FROM public.idem_claim('b0000000-0000-4000-8000-000000000006', 2001, 'ep', '{"z": 1}',
                                                 p_now => now() + interval '31 seconds')),
    'stale', 'setup: the holder is healed as stale');
INSERT INTO tok SELECT 'winner', key_id FROM public.idem_claim('b0000000-0000-4000-8000-000000000006', 2001, 'ep', '{"z": 1}',
                                                               p_now => now() + interval '32 seconds');
SELECT throws_ok(format('SELECT public.idem_complete(%s, 200, %L)', (SELECT id FROM tok WHERE name = 'zombie'), '{"zombie": true}'),
    'IDM01', format('idem_complete: claim lost: key_id %s is no longer in flight for this holder; it was healed as stale and the key is in flight under key_id %s now (another claim)',
                     (SELECT id FROM tok WHERE name = 'zombie'), (SELECT id FROM tok WHERE name = 'winner')),
    'a zombie''s idem_complete after a heal raises IDM01 naming the claim that holds the key now');
SELECT results_eq(
    $$SELECT id, status, response_body FROM public.idempotency_keys WHERE idem_key = 'b0000000-0000-4000-8000-000000000006'$$,
    $$SELECT id, 'in_flight'::text, NULL::jsonb FROM tok WHERE name = 'winner'$$,
    'the zombie''s completion did not touch the winner''s row: one row, still in flight under the new token');
SELECT lives_ok(format('SELECT public.idem_complete(%s, 200, %L)', (SELECT id FROM tok WHERE name = 'winner'), '{"winner": true}'),
    'the winner completes normally');

-- a zombie's business write rolls back with its failed completion
CREATE TEMP TABLE audit_count AS SELECT count(*) AS n FROM public.audit_log;
SELECT throws_ok(format($f$DO $do$ BEGIN
        INSERT INTO public.audit_log (user_id, action) VALUES (2001, 'order_filled');
        PERFORM public.idem_complete(%s, 201, '{"zombie": true}');
    END $do$$f$, (SELECT id FROM tok WHERE name = 'zombie')),
    'IDM01', NULL, 'a handler transaction ending in a lost completion fails as a whole');
SELECT is((SELECT count(*) FROM public.audit_log), (SELECT n FROM audit_count),
    'the zombie''s business write did not survive its failed completion');

-- erased
INSERT INTO tok SELECT 'erased', key_id FROM public.idem_claim('b0000000-0000-4000-8000-000000000007', 2002, 'ep', '{}');
SELECT is(public.idem_erase_user(2002), 1::bigint, 'setup: the user''s in-flight claim is erased');
SELECT throws_ok(format('SELECT public.idem_complete(%s, 200, %L)', (SELECT id FROM tok WHERE name = 'erased'), '{}'),
    'IDM01', format('idem_complete: claim lost: key_id %s is no longer in flight for this holder; no row has this key_id (erased, cleaned up after expiry, or never claimed)', (SELECT id FROM tok WHERE name = 'erased')),
    'completing an erased claim raises IDM01 saying no row has the key_id');
SELECT results_eq($$SELECT count(*)::int FROM public.idempotency_keys WHERE scope_user_id = 2002$$, $$VALUES (0)$$,
    'the failed completion did not bring the erased row back');

-- never existed
SELECT throws_ok('SELECT public.idem_complete(-1, 200, ''{}'')',
    'IDM01', 'idem_complete: claim lost: key_id -1 is no longer in flight for this holder; no row has this key_id (erased, cleaned up after expiry, or never claimed)',
    'completing a token that never existed raises IDM01');
SELECT throws_ok('SELECT public.idem_complete(NULL, 200, ''{}'')',
    'IDM01', NULL, 'completing a NULL token raises IDM01');

-- response code validation ------------------------------------------------------------------------
INSERT INTO tok SELECT 'codes', key_id FROM public.idem_claim('b0000000-0000-4000-8000-000000000008', 2001, 'ep', '{}');
SELECT throws_ok(format('SELECT public.idem_complete(%s, 99, %L)', (SELECT id FROM tok WHERE name = 'codes'), '{}'),
    'IDM00', 'idem_complete: p_response_code must be an HTTP status 100..599 (got 99)',
    'a response code below 100 raises IDM00');
SELECT throws_ok(format('SELECT public.idem_complete(%s, 600, %L)', (SELECT id FROM tok WHERE name = 'codes'), '{}'),
    'IDM00', 'idem_complete: p_response_code must be an HTTP status 100..599 (got 600)',
    'a response code above 599 raises IDM00');
SELECT throws_ok(format('SELECT public.idem_complete(%s, NULL, %L)', (SELECT id FROM tok WHERE name = 'codes'), '{}'),
    'IDM00', NULL, 'a NULL response code raises IDM00');
SELECT throws_ok(format('SELECT public.idem_complete(%s, 70000, %L)', (SELECT id FROM tok WHERE name = 'codes'), '{}'),
    'IDM00', NULL, 'a response code that would overflow smallint raises IDM00, not a cast error');
SELECT throws_ok(format('SELECT public.idem_complete(%s, 200, %L)', (SELECT id FROM tok WHERE name = 'codes'), '{"password": "hunter2"}'),
    'IDM04', 'idem_complete: response_body must not contain credentials (found key "password")',
    'a response body holding a password is refused (no credentials are stored for replay)');
SELECT throws_ok(format('SELECT public.idem_complete(%s, 200, %L)', (SELECT id FROM tok WHERE name = 'codes'),
                        '{"data": [{"session": {"API_KEY": "k"}}]}'),
    'IDM04', NULL, 'a credential-named key is refused at any depth and in any case');
SELECT results_eq(format('SELECT * FROM pg_temp.row_of(%s)', (SELECT id FROM tok WHERE name = 'codes')),
    $$VALUES ('in_flight'::text, NULL::smallint, NULL::jsonb)$$,
    'after the refused codes and bodies the claim is still in flight');
SELECT lives_ok(format('SELECT public.idem_complete(%s, 200, %L)', (SELECT id FROM tok WHERE name = 'codes'), '{"token_count": 3}'),
    'then it completes properly (a key merely containing a credential word is fine)');

-- encrypted responses (optional, SQL API v2) --------------------------------------------------------
CREATE TEMP TABLE k AS SELECT 'k1-Zq8xY2vN4bR7tL0wP5sD3fG6hJ9mK1cV' AS k1, 'k2-Ab3Cd4Ef5Gh6Ij7Kl8Mn9Op0Qr1St2Uv' AS k2;
INSERT INTO tok SELECT 'enc', key_id FROM public.idem_claim('b0000000-0000-4000-8000-0000000000c1', 2001, 'ep', '{"card": "4242"}');
SELECT throws_ok(format('SELECT public.idem_complete(%s, 201, %L, %L)', (SELECT id FROM tok WHERE name = 'enc'), '{"ok": 1}', 'short-key'),
    'IDM00', 'idem_response_key_id: a response key must be a generated secret of at least 32 characters',
    'a weak response key is refused before anything is stored');
SELECT lives_ok(format('SELECT public.idem_complete(%s, 201, %L, %L)', (SELECT id FROM tok WHERE name = 'enc'),
                       '{"receipt": "R-77", "last4": "4242"}', (SELECT k1 FROM k)),
    'idem_complete with p_response_key completes the claim');
SELECT results_eq(
    format($$SELECT response_body->>'idem_enc', response_body->>'kid', response_body::text LIKE '%%R-77%%'
               FROM public.idempotency_keys WHERE id = %s$$, (SELECT id FROM tok WHERE name = 'enc')),
    format($$VALUES ('pgp-sym-v1'::text, %L::text, false)$$, public.idem_response_key_id((SELECT k1 FROM k))),
    'the body is stored encrypted, tagged with the key''s id, with no plaintext left in the row');
SELECT is((SELECT c.response_body FROM k, public.idem_claim('b0000000-0000-4000-8000-0000000000c1', 2001, 'ep', '{"card": "4242"}',
                                                            p_response_key => k.k1) c),
    '{"receipt": "R-77", "last4": "4242"}'::jsonb, 'a replay with the key returns the plain body');
SELECT is((SELECT c.response_body FROM k, public.idem_claim('b0000000-0000-4000-8000-0000000000c1', 2001, 'ep', '{"card": "4242"}',
                                                            p_response_key => k.k2, p_response_key_fallback => k.k1) c),
    '{"receipt": "R-77", "last4": "4242"}'::jsonb, 'during a rotation the fallback key opens a body stored under the old key');
TRUNCATE audit_count; INSERT INTO audit_count SELECT count(*) FROM public.audit_log;
SELECT throws_ok($$SELECT public.idem_claim('b0000000-0000-4000-8000-0000000000c1', 2001, 'ep', '{"card": "4242"}')$$,
    'IDM03', NULL, 'a replay without the key raises IDM03 instead of replaying ciphertext');
SELECT throws_ok(format($$SELECT public.idem_claim('b0000000-0000-4000-8000-0000000000c1', 2001, 'ep', '{"card": "4242"}',
                                                   p_response_key => %L)$$, (SELECT k2 FROM k)),
    'IDM03', NULL, 'a replay with another key raises IDM03');
SELECT is((SELECT count(*) FROM public.audit_log), (SELECT n FROM audit_count),
    'a refused replay leaves no replay audit row behind');

-- the retention CHECK and the caller's TimeZone ------------------------------------------------------
-- A 7-day claim made in UTC spans Europe/Paris's spring-forward (2026-03-29), where
-- created_at + '7 days' is 167 hours. Completing it from a Paris session must not trip the CHECK.
SET LOCAL TimeZone = 'UTC';
INSERT INTO tok SELECT 'dst', key_id FROM public.idem_claim('b0000000-0000-4000-8000-000000000009', 2001, 'ep', '{}',
                                                            p_ttl => '7 days', p_now => '2026-03-25 12:00:00+00');
SET LOCAL TimeZone = 'Europe/Paris';
SELECT lives_ok(format('SELECT public.idem_complete(%s, 200, %L)', (SELECT id FROM tok WHERE name = 'dst'), '{}'),
    'a 7-day claim made in UTC completes from a session whose TimeZone springs forward that week');
SELECT lives_ok($$SELECT public.idem_claim('b0000000-0000-4000-8000-00000000000a', 2001, 'ep', '{}',
                                           p_ttl => '168 hours', p_now => '2026-03-25 12:00:00+00')$$,
    'a TTL of 168 hours (= 7 days) is accepted from a session whose TimeZone springs forward that week');
-- Europe/Paris falls back on 2026-10-25: there '7 days' is 169 hours of calendar arithmetic.
SELECT lives_ok($$SELECT public.idem_claim('b0000000-0000-4000-8000-00000000000b', 2001, 'ep', '{}',
                                           p_ttl => '7 days', p_now => '2026-10-22 12:00:00+00')$$,
    'a 7-day claim is accepted from a session whose TimeZone falls back that week');
SET LOCAL TimeZone = 'UTC';
SELECT ok((SELECT bool_and(expires_at - created_at <= interval '168 hours') FROM public.idempotency_keys),
    'no stored row is retained longer than 168 hours, whatever the session TimeZone was');

-- response headers and raw bodies ---------------------------------------------------------------
CREATE FUNCTION pg_temp.fresh(p_name text, p_n integer) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO tok SELECT p_name, key_id FROM public.idem_claim(
        format('b1000000-0000-4000-8000-%s', lpad(p_n::text, 12, '0')), 2001, 'hdr', '{}')
    RETURNING id $$;
DO $$ BEGIN PERFORM pg_temp.fresh('h-ok', 1); END $$;
SELECT lives_ok(format($$SELECT public.idem_complete(p_key_id => %s, p_response_code => 201,
        p_response_body => '{"order_id": 16}',
        p_response_headers => '{"Location": "/orders/16", "ETag": "\"v1\"", "Content-Type": "application/json"}')$$,
        (SELECT id FROM tok WHERE name = 'h-ok')),
    'idem_complete takes the headers to replay by name');
SELECT is((SELECT response_headers FROM public.idempotency_keys WHERE id = (SELECT id FROM tok WHERE name = 'h-ok')),
    '{"Location": "/orders/16", "ETag": "\"v1\"", "Content-Type": "application/json"}'::jsonb,
    'the headers are stored as given');
SELECT is((SELECT response_headers FROM public.idem_claim('b1000000-0000-4000-8000-000000000001', 2001, 'hdr', '{}')),
    '{"Location": "/orders/16", "ETag": "\"v1\"", "Content-Type": "application/json"}'::jsonb,
    'a replay returns the stored headers in response_headers');
DO $$ BEGIN PERFORM pg_temp.fresh('h-json', 90); END $$;
SELECT public.idem_complete(p_key_id => (SELECT id FROM tok WHERE name = 'h-json'), p_response_code => 201,
                            p_response_body => '{"order_id": 18}', p_response_headers => '{"Content-Type": "application/json"}');
SELECT is((SELECT response_headers FROM public.idempotency_keys WHERE id = (SELECT id FROM tok WHERE name = 'h-json')),
    '{"Content-Type": "application/json"}'::jsonb,
    'a JSON answer''s one header (compared, not screened) is stored as given');

DO $$ BEGIN PERFORM pg_temp.fresh('h-nobody', 2); END $$;
SELECT public.idem_complete(p_key_id => (SELECT id FROM tok WHERE name = 'h-nobody'), p_response_code => 201,
                            p_response_body => NULL, p_response_headers => '{"Location": "/orders/17"}');
SELECT is((SELECT response_headers FROM public.idempotency_keys WHERE id = (SELECT id FROM tok WHERE name = 'h-nobody')),
    NULL, 'without a body (not replayable) no headers are kept either');

DO $$ BEGIN PERFORM pg_temp.fresh('h-enc', 3); END $$;
SELECT public.idem_complete(p_key_id => (SELECT id FROM tok WHERE name = 'h-enc'), p_response_code => 201,
                            p_response_body => '{"ok": true}', p_response_key => (SELECT k1 FROM k),
                            p_response_headers => '{"Location": "/secret/place"}');
SELECT ok((SELECT response_headers ? 'idem_enc' AND response_headers::text NOT LIKE '%secret/place%'
             FROM public.idempotency_keys WHERE id = (SELECT id FROM tok WHERE name = 'h-enc')),
    'with p_response_key the headers are stored encrypted (no plaintext)');
SELECT is((SELECT response_headers FROM public.idem_claim('b1000000-0000-4000-8000-000000000003', 2001, 'hdr', '{}',
                                                          p_response_key => (SELECT k1 FROM k))),
    '{"Location": "/secret/place"}'::jsonb, 'a replay with the key returns the headers in clear');

DO $$ BEGIN PERFORM pg_temp.fresh('h-bad', 4); END $$;
SELECT throws_ok(format($$SELECT public.idem_complete(p_key_id => %s, p_response_code => 201,
                          p_response_body => '{}', p_response_headers => %L)$$, (SELECT id FROM tok WHERE name = 'h-bad'), h),
    code, NULL, why)
  FROM (VALUES ('{"Set-Cookie": "sess=1"}', 'a Set-Cookie header is refused', 'IDM04'),
               ('{"set-cookie": "sess=1"}', 'a set-cookie header in lower case is refused', 'IDM04'),
               ('{"Authorization": "Bearer x"}', 'an Authorization header is refused', 'IDM04'),
               ('{"WWW-Authenticate": "Bearer"}', 'a WWW-Authenticate header is refused', 'IDM04'),
               ('{"Proxy-Authenticate": "Basic"}', 'a Proxy-Authenticate header is refused', 'IDM04'),
               ('{"X-Api-Key": "k"}', 'a credential-named header (X-Api-Key) is refused', 'IDM04'),
               ('{"X-Auth-Token": "t"}', 'a credential-named header (X-Auth-Token) is refused', 'IDM04'),
               ('{"Bad Name": "x"}', 'a name that is not an HTTP header token is refused', 'IDM00'),
               ('{"Location": 16}', 'a value that is not a string is refused', 'IDM00'),
               ('{"Location": "/a\nSet-Cookie: x"}', 'a value holding a line break is refused', 'IDM04'),
               ('{"ETag": "\u0001v1"}', 'a value holding another control character is refused', 'IDM04'),
               ('["Location", "/a"]', 'headers that are not a JSON object are refused', 'IDM00')) AS t(h, why, code);
SELECT throws_ok(format($$SELECT public.idem_complete(p_key_id => %s, p_response_code => 201,
                          p_response_body => '{}', p_response_headers => %L)$$, (SELECT id FROM tok WHERE name = 'h-bad'),
                        jsonb_build_object('Link', repeat('x', 8193))),
    'IDM04', 'idem_complete: the value of response header Link is 8193 bytes, over the 8192 allowed',
    'a header value over 8 KiB is refused');
SELECT lives_ok(format($$SELECT public.idem_complete(p_key_id => %s, p_response_code => 201,
                          p_response_body => '{}', p_response_headers => %L)$$, (SELECT id FROM tok WHERE name = 'h-bad'),
                        jsonb_build_object('Link', repeat('x', 8192))),
    'a header value of exactly 8 KiB is stored');
DO $$ BEGIN PERFORM pg_temp.fresh('h-words', 7); END $$;
SELECT lives_ok(format($$SELECT public.idem_complete(p_key_id => %s, p_response_code => 201, p_response_body => '{}',
                          p_response_headers => '{"Location": "/api/auth/session-token/help", "Link": "<C:\\new>"}')$$,
                       (SELECT id FROM tok WHERE name = 'h-words')),
    'credential words or escapes in a value (not a name) are stored: only names are credentials');

DO $$ BEGIN PERFORM pg_temp.fresh('raw-csv', 5); END $$;
SELECT lives_ok(format($$SELECT public.idem_complete(%s, 200, '{"idem_raw": "text", "data": "name,\"token\": x\n"}')$$,
                       (SELECT id FROM tok WHERE name = 'raw-csv')),
    'a raw text that is not JSON is stored even if it mentions a credential-looking word');
SELECT is((SELECT response_body FROM public.idem_claim('b1000000-0000-4000-8000-000000000005', 2001, 'hdr', '{}')),
    '{"idem_raw": "text", "data": "name,\"token\": x\n"}'::jsonb, 'a raw body replays as stored');
DO $$ BEGIN PERFORM pg_temp.fresh('raw-bad', 6); END $$;
SELECT throws_ok(format($$SELECT public.idem_complete(%s, 200, %L)$$, (SELECT id FROM tok WHERE name = 'raw-bad'), b),
    code, NULL, why)
  FROM (VALUES ('{"idem_raw": "text", "data": "[{\"api_key\": \"k\"}]"}', 'a raw JSON array holding a credential-named key is refused (IDM04)', 'IDM04'),
               ('{"idem_raw": "hex", "data": "00"}', 'an unknown raw form is refused (IDM00)', 'IDM00'),
               ('{"idem_raw": "text", "data": 5}', 'raw data that is not a string is refused (IDM00)', 'IDM00'),
               ('{"idem_raw": "text", "data": "x", "more": 1}', 'a raw body with other members is refused (IDM00)', 'IDM00')) AS t(b, why, code);
SELECT is((SELECT status FROM public.idempotency_keys WHERE id = (SELECT id FROM tok WHERE name = 'raw-bad')),
    'in_flight', 'refused completions leave the claim in flight');

SELECT * FROM finish();
ROLLBACK;
