-- 152_idem_reencrypt_range: idem_reencrypt_responses's rewrite of one range (the step sql/citus/
-- replaces; its guards and batches are idem_reencrypt_responses's, tested in 150).
-- Fixture on endpoint 'ep:152': completed P1..P3 in clear (P2 with headers), O under another key.
-- Cases:
--   clear -> K1 over (P1, P2]: P2 alone is rewritten (body and headers), the count returned;
--     P1 and P3 (outside the range) stay clear, O (another key) as it was;
--   K1 -> clear over the whole range: P2 opens to its original body; a range with nothing under
--     the old key rewrites nothing (0);
--   no role may execute it.
BEGIN;
SELECT plan(6);

INSERT INTO public.users (id) VALUES (15201);
CREATE TEMP TABLE tok (name text PRIMARY KEY, id bigint, body jsonb);
INSERT INTO tok SELECT 'P' || g, key_id, jsonb_build_object('n', g)
  FROM generate_series(1, 3) g, public.idem_claim(format('a1520000-0000-4000-8000-00000000000%s', g), 15201, 'ep:152', '{}');
INSERT INTO tok SELECT 'O', key_id, '{"n": "other"}' FROM public.idem_claim('a1520000-0000-4000-8000-000000000004', 15201, 'ep:152', '{}');
SELECT public.idem_complete(id, 201, body, p_response_headers => CASE WHEN name = 'P2' THEN '{"Location": "/o/2"}'::jsonb END)
  FROM tok WHERE name LIKE 'P%';
SELECT public.idem_complete(id, 201, body, 'rotate-key-other-0123456789abcdefghijk') FROM tok WHERE name = 'O';

-- PL/pgSQL, and the store read apart from the temporary table: Citus plans neither an SQL
-- function reaching a distributed table nor that join inside one.
CREATE FUNCTION pg_temp.stored(p_name text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_id     bigint := (SELECT t.id FROM pg_temp.tok t WHERE t.name = p_name);
    v_stored jsonb;
BEGIN
    SELECT jsonb_build_object('body', k.response_body, 'headers', k.response_headers) INTO v_stored
      FROM public.idempotency_keys k WHERE k.id = v_id;
    RETURN v_stored;
END
$$;
-- the key id a row's body is under ('clear' for none), then '+' and its headers' when encrypted
CREATE FUNCTION pg_temp.kid_of(p_name text) RETURNS text LANGUAGE sql AS $$
    SELECT COALESCE(s #>> '{body,kid}', 'clear') || COALESCE('+' || (s #>> '{headers,kid}'), '')
      FROM pg_temp.stored(p_name) s
$$;
CREATE TEMP TABLE kid AS SELECT public.idem_response_key_id('rotate-key-one-0123456789abcdefghijklm') AS k1,
                                public.idem_response_key_id('rotate-key-other-0123456789abcdefghijk') AS ko;

SELECT is(public.idem_reencrypt_range(NULL, 'rotate-key-one-0123456789abcdefghijklm', NULL,
                                      (SELECT id FROM tok WHERE name = 'P1'), (SELECT id FROM tok WHERE name = 'P2')),
    1, 'clear -> K1 over (P1, P2]: one body rewritten, and the count returned');
SELECT is(ARRAY[pg_temp.kid_of('O'), pg_temp.kid_of('P1'), pg_temp.kid_of('P2'), pg_temp.kid_of('P3')],
          (SELECT ARRAY[ko, 'clear', k1 || '+' || k1, 'clear'] FROM kid),
    'P2''s body and headers are under K1; P1 and P3, outside the range, stay clear; O is as it was');
SELECT is(public.idem_reencrypt_range('rotate-key-one-0123456789abcdefghijklm', NULL, (SELECT k1 FROM kid),
                                      0, (SELECT max(id) FROM tok)),
    1, 'K1 -> clear over the whole range: only the body under K1 is rewritten');
SELECT is(pg_temp.stored('P2') -> 'body', '{"n": 2}'::jsonb, 'and it opens to its original body');
SELECT is(public.idem_reencrypt_range('rotate-key-one-0123456789abcdefghijklm', NULL, (SELECT k1 FROM kid),
                                      0, (SELECT max(id) FROM tok)),
    0, 'a range with nothing under the old key rewrites nothing');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_reencrypt_range(text,text,text,bigint,bigint)', 'EXECUTE')
          AND NOT has_function_privilege('idem_admin', 'public.idem_reencrypt_range(text,text,text,bigint,bigint)', 'EXECUTE'),
    'neither idem_app nor idem_admin may execute it: idem_reencrypt_responses''s guards come first');
SELECT * FROM finish();
ROLLBACK;
