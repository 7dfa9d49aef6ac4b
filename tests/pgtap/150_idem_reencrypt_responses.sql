-- 150_idem_reencrypt_responses: one batch of a response-key rotation.
-- Fixture on endpoint 'ep:150' (the table holds only these rows): completed P1..P3 in clear
-- (P1 with headers), O under another key, N completed without a body, I in flight.
-- Cases:
--   clear -> K1 in batches of 2 rows in primary-key order: each call returns the batch's last
--     id and how many bodies it rewrote; (NULL, 0) past the last row; every clear body (and its headers) is now under K1;
--     O, N and I are untouched;
--   K1 -> K2: the same bodies under K2, opening to the original JSON; K2 -> clear: the original;
--   both keys NULL, the same key twice, a batch size of 0, a NULL p_after_id: IDM00; a body
--     under the old kid that does not open: IDM03.
BEGIN;
SELECT plan(13);

INSERT INTO public.users (id) VALUES (15001);
CREATE TEMP TABLE tok (name text PRIMARY KEY, id bigint, body jsonb);
INSERT INTO tok SELECT 'P' || g, key_id, jsonb_build_object('n', g)
  FROM generate_series(1, 3) g, public.idem_claim(format('a1500000-0000-4000-8000-00000000000%s', g), 15001, 'ep:150', '{}');
INSERT INTO tok SELECT 'O', key_id, '{"n": "other"}' FROM public.idem_claim('a1500000-0000-4000-8000-000000000004', 15001, 'ep:150', '{}');
INSERT INTO tok SELECT 'N', key_id, NULL FROM public.idem_claim('a1500000-0000-4000-8000-000000000005', 15001, 'ep:150', '{}');
INSERT INTO tok SELECT 'I', key_id, NULL FROM public.idem_claim('a1500000-0000-4000-8000-000000000006', 15001, 'ep:150', '{}');
SELECT public.idem_complete(id, 201, body, p_response_headers => CASE WHEN name = 'P1' THEN '{"Location": "/o/1"}'::jsonb END)
  FROM tok WHERE name LIKE 'P%' OR name = 'N';
SELECT public.idem_complete(id, 201, body, 'rotate-key-other-0123456789abcdefghijk') FROM tok WHERE name = 'O';

-- PL/pgSQL, not SQL, and the store read apart from the temporary table: Citus plans neither an
-- SQL function reaching a distributed table nor that join inside one.
CREATE FUNCTION pg_temp.kids() RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[] := ARRAY(SELECT t.id FROM pg_temp.tok t);
    v_kid jsonb;
BEGIN
    SELECT jsonb_object_agg(k.id::text, COALESCE(k.response_body ->> 'kid',
                                                 CASE WHEN k.response_body IS NULL THEN 'none' ELSE 'clear' END))
      INTO v_kid FROM public.idempotency_keys k WHERE k.id = ANY (v_ids);
    RETURN ARRAY(SELECT t.name || '=' || (v_kid ->> t.id::text) FROM pg_temp.tok t ORDER BY t.name);
END
$$;
CREATE TEMP TABLE kid AS SELECT public.idem_response_key_id('rotate-key-one-0123456789abcdefghijklm') AS k1,
                                public.idem_response_key_id('rotate-key-two-0123456789abcdefghijklm') AS k2,
                                public.idem_response_key_id('rotate-key-other-0123456789abcdefghijk') AS ko;

SELECT results_eq(
    $$SELECT last_id, rewritten FROM public.idem_reencrypt_responses(NULL, 'rotate-key-one-0123456789abcdefghijklm', 0, 2)$$,
    $$SELECT (SELECT id FROM tok WHERE name = 'P2'), 2$$, 'the first batch: two rows, both clear bodies rewritten');
SELECT results_eq(
    format('SELECT last_id, rewritten FROM public.idem_reencrypt_responses(NULL, %L, %s, 2)',
           'rotate-key-one-0123456789abcdefghijklm', (SELECT id FROM tok WHERE name = 'P2')),
    $$SELECT (SELECT id FROM tok WHERE name = 'O'), 1$$, 'the second (P3, O): P3 rewritten, O is under another key');
SELECT results_eq(
    format('SELECT last_id, rewritten FROM public.idem_reencrypt_responses(NULL, %L, %s, 2)',
           'rotate-key-one-0123456789abcdefghijklm', (SELECT id FROM tok WHERE name = 'O')),
    $$SELECT (SELECT id FROM tok WHERE name = 'I'), 0$$, 'the third (N, I): nothing to rewrite, no body and in flight');
SELECT results_eq(
    format('SELECT last_id, rewritten FROM public.idem_reencrypt_responses(NULL, %L, %s, 2)',
           'rotate-key-one-0123456789abcdefghijklm', (SELECT id FROM tok WHERE name = 'I')),
    $$VALUES (NULL::bigint, 0)$$, 'past the last row: (NULL, 0), the rotation is done');
SELECT is(pg_temp.kids(), (SELECT ARRAY['I=none', 'N=none', 'O=' || ko, 'P1=' || k1, 'P2=' || k1, 'P3=' || k1] FROM kid),
    'every clear body is under K1 now; O, N and I are as they were');
SELECT is((SELECT response_headers ->> 'kid' FROM public.idempotency_keys WHERE id = (SELECT id FROM tok WHERE name = 'P1')),
    (SELECT k1 FROM kid), 'the headers were encrypted with their body');

SELECT public.idem_reencrypt_responses('rotate-key-one-0123456789abcdefghijklm', 'rotate-key-two-0123456789abcdefghijklm', 0, 100);
SELECT is((SELECT array_agg(public.idem_decrypt_response(k.response_body, 'rotate-key-two-0123456789abcdefghijklm') = t.body)
             FROM tok t JOIN public.idempotency_keys k USING (id) WHERE t.name LIKE 'P%'),
    ARRAY[true, true, true], 'K1 -> K2: the bodies open under K2 to what was stored');
SELECT is(pg_temp.kids(), (SELECT ARRAY['I=none', 'N=none', 'O=' || ko, 'P1=' || k2, 'P2=' || k2, 'P3=' || k2] FROM kid),
    'and only K1''s bodies moved');

SELECT public.idem_reencrypt_responses('rotate-key-two-0123456789abcdefghijklm', NULL, 0, 100);
SELECT results_eq(
    $$SELECT k.response_body, k.response_headers FROM tok t JOIN public.idempotency_keys k USING (id) WHERE t.name = 'P1'$$,
    $$VALUES ('{"n": 1}'::jsonb, '{"Location": "/o/1"}'::jsonb)$$, 'K2 -> clear: the original body and headers');

SELECT throws_ok($$SELECT * FROM public.idem_reencrypt_responses(NULL, NULL)$$, 'IDM00',
    'idem_reencrypt_responses: give p_old_key, p_new_key or both', 'no key at all raises IDM00');
SELECT throws_ok($$SELECT * FROM public.idem_reencrypt_responses('rotate-key-one-0123456789abcdefghijklm', 'rotate-key-one-0123456789abcdefghijklm')$$,
    'IDM00', 'idem_reencrypt_responses: p_old_key and p_new_key are the same key', 'the same key twice raises IDM00');
SELECT throws_ok($$SELECT * FROM public.idem_reencrypt_responses(NULL, 'rotate-key-one-0123456789abcdefghijklm', NULL, 0)$$,
    'IDM00', NULL, 'a NULL p_after_id or a batch size of 0 raises IDM00');

UPDATE public.idempotency_keys SET response_body = jsonb_set(response_body, '{data}', to_jsonb(armor('garbage'::bytea)))
 WHERE id = (SELECT id FROM tok WHERE name = 'O');
SELECT throws_ok($$SELECT * FROM public.idem_reencrypt_responses('rotate-key-other-0123456789abcdefghijk', NULL)$$,
    'IDM03', NULL, 'a body under the old kid that does not open raises IDM03 (nothing is half-rotated)');

SELECT * FROM finish();
ROLLBACK;
