-- 060_idem_export_user: GDPR access and portability (contract §3).
-- Cases:
--   returns one row per row of the user (every status, every endpoint, expired rows too),
--     oldest first, each with all twelve columns and the stored body and headers;
--   the rows are exactly the table's rows (less the upgrade's mark legacy_token), and row_to_json
--     of one is the key's JSON object;
--   never includes another user's rows or service-call rows;
--   a user with no rows gets no row;
--   reads only: no row, audit or event is written or changed;
--   an encrypted body and its headers are exported as stored without the key and decrypted with it;
--   a NULL user id raises IDM00.
BEGIN;
SELECT plan(15);

INSERT INTO public.users (id, email) VALUES (6001, 'kim@example.test'), (6002, 'leo@example.test'), (6003, 'max@example.test');

DO $$
BEGIN
    -- Claimed out of chronological order, to see the export sort by created_at.
    PERFORM public.idem_claim('f0000000-0000-4000-8000-000000000001', 6001, 'checkout', '{"q": 1}');
    PERFORM public.idem_complete(key_id, 201, '{"order": {"id": 9, "items": ["a", "b"]}}',
                                 p_response_headers => '{"Location": "/orders/9"}')
       FROM public.idem_claim('f0000000-0000-4000-8000-000000000002', 6001, 'orders', '{"q": 2}',
                              p_now => now() - interval '2 hours');
    PERFORM public.idem_fail(key_id, 503)
       FROM public.idem_claim('f0000000-0000-4000-8000-000000000003', 6001, 'orders', '{"q": 3}',
                              p_now => now() - interval '1 hour');
    PERFORM public.idem_complete(key_id, 200, '{"expired": true}')
       FROM public.idem_claim('f0000000-0000-4000-8000-000000000004', 6001, 'orders', '{"q": 4}',
                              p_ttl => '1 hour', p_now => now() - interval '3 hours');
    -- Someone else's rows with the same keys, and a service call.
    PERFORM public.idem_complete(key_id, 201, '{"not": "kim"}')
       FROM public.idem_claim('f0000000-0000-4000-8000-000000000002', 6002, 'orders', '{"q": 2}');
    PERFORM public.idem_claim('f0000000-0000-4000-8000-000000000001', NULL, 'checkout', '{"q": 1}');
END
$$;
CREATE TEMP TABLE state_before AS
    SELECT (SELECT jsonb_agg(to_jsonb(k) ORDER BY k.id) FROM public.idempotency_keys k) AS keys,
           (SELECT count(*) FROM public.audit_log) AS audits,
           (SELECT count(*) FROM public.idempotency_events) AS events;
CREATE TEMP TABLE export AS
    SELECT e.ordinality AS ord, to_jsonb(e) - 'ordinality' AS doc FROM public.idem_export_user(6001) WITH ORDINALITY AS e;

SELECT is((SELECT count(*) FROM export), 4::bigint,
    'it has one row per row of the user: in flight, completed, failed and expired');
SELECT is((SELECT jsonb_agg(doc ORDER BY ord) FROM export),
    (SELECT jsonb_agg(to_jsonb(k) - 'legacy_token' ORDER BY k.created_at, k.id) FROM public.idempotency_keys k WHERE k.scope_user_id = 6001),
    'each row is exactly the stored row, bodies included, oldest first');
SELECT is((SELECT array_agg(doc->>'idem_key' ORDER BY ord) FROM export),
    ARRAY['f0000000-0000-4000-8000-000000000004', 'f0000000-0000-4000-8000-000000000002',
          'f0000000-0000-4000-8000-000000000003', 'f0000000-0000-4000-8000-000000000001'],
    'the rows come oldest first (by created_at), not in claim order');
SELECT is((SELECT array_agg(a.n ORDER BY a.ord) FROM pg_catalog.pg_proc p,
                  unnest(p.proargnames, p.proargmodes::text[]) WITH ORDINALITY AS a(n, mode, ord)
            WHERE p.oid = 'public.idem_export_user'::regproc AND a.mode = 't'),
    ARRAY['id', 'idem_key', 'scope_user_id', 'scope_endpoint', 'request_hash', 'status', 'response_code',
          'response_body', 'response_headers', 'created_at', 'locked_at', 'expires_at'],
    'every row carries the twelve stored columns, named as the table''s');
SELECT is((SELECT doc->'response_headers' FROM export WHERE doc->>'idem_key' = 'f0000000-0000-4000-8000-000000000002'),
    '{"Location": "/orders/9"}'::jsonb,
    'the stored response headers are exported');
SELECT is((SELECT e.response_body FROM public.idem_export_user(6001) e WHERE e.idem_key = 'f0000000-0000-4000-8000-000000000002'),
    '{"order": {"id": 9, "items": ["a", "b"]}}'::jsonb,
    'a stored response body is exported as JSON (jsonb), not as text');
-- The row as stored, read apart first: on Citus one query may not both read a shard and call a
-- function that reads one (a nested distributed query).
CREATE TEMP TABLE stored_row AS
SELECT to_jsonb(k) - 'legacy_token' AS doc FROM public.idempotency_keys k
 WHERE k.scope_user_id = 6001 AND k.idem_key = 'f0000000-0000-4000-8000-000000000002';
SELECT is((SELECT pg_catalog.row_to_json(e)::jsonb FROM public.idem_export_user(6001) e
            WHERE e.idem_key = 'f0000000-0000-4000-8000-000000000002'),
    (SELECT s.doc FROM stored_row s),
    'row_to_json of a row is that key as the JSON object the CLI writes (as json, which has no jsonb size limit)');
SELECT ok((SELECT bool_and((doc->>'scope_user_id')::int = 6001) FROM export)
          AND NOT (SELECT bool_or(doc::text LIKE '%"not": "kim"%') FROM export),
    'no other user''s or service call''s row is in the export');
SELECT is_empty('SELECT * FROM public.idem_export_user(6003)', 'a user without rows gets no row');
SELECT is_empty('SELECT * FROM public.idem_export_user(424242)', 'an unknown user id gets no row');
SELECT results_eq(
    $$SELECT (SELECT jsonb_agg(to_jsonb(k) ORDER BY k.id) FROM public.idempotency_keys k),
             (SELECT count(*) FROM public.audit_log), (SELECT count(*) FROM public.idempotency_events)$$,
    'SELECT keys, audits, events FROM state_before',
    'exporting reads only: no row, audit or event was written or changed');
-- An encrypted body: exported as stored without the key, decrypted with it.
SELECT public.idem_complete(key_id, 201, '{"receipt": "R-9"}', p_response_key => 'k1-Zq8xY2vN4bR7tL0wP5sD3fG6hJ9mK1cV',
                            p_response_headers => '{"Location": "/receipts/9"}')
  FROM public.idem_claim('f0000000-0000-4000-8000-0000000000c1', 6003, 'orders', '{}');
SELECT is((SELECT e.response_body->>'idem_enc' FROM public.idem_export_user(6003) e),
    'pgp-sym-v1', 'without the key an encrypted body is exported as stored (ciphertext)');
SELECT is((SELECT e.response_body FROM public.idem_export_user(6003, p_response_key => 'k1-Zq8xY2vN4bR7tL0wP5sD3fG6hJ9mK1cV') e),
    '{"receipt": "R-9"}'::jsonb, 'with the key an encrypted body is exported decrypted, for the data subject');
SELECT is((SELECT array[e.response_headers->>'idem_enc', e.response_headers->>'Location'] FROM public.idem_export_user(6003) e)
          || (SELECT e.response_headers->>'Location'
                FROM public.idem_export_user(6003, p_response_key => 'k1-Zq8xY2vN4bR7tL0wP5sD3fG6hJ9mK1cV') e),
    ARRAY['pgp-sym-v1', NULL, '/receipts/9'],
    'encrypted headers are exported as ciphertext without the key, in clear with it');
SELECT throws_ok('SELECT * FROM public.idem_export_user(NULL)',
    'IDM00', 'idem_export_user: p_user_id must not be NULL', 'a NULL user id raises IDM00');

SELECT * FROM finish();
ROLLBACK;
