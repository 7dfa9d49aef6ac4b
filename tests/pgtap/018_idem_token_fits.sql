-- 018_idem_token_fits: the one test of a claim's token.
-- Cases:
--   the claim's own token fits its key_id and claim time;
--   another key_id's, another claim time's, a token of another length or none does not, and the
--     answer is false, never NULL (a caller's IF NOT refuses it);
--   where the claim has no token (no claim time) nothing fits;
--   no role may execute it.
BEGIN;
SELECT plan(7);

INSERT INTO public.users (id) VALUES (1801);
CREATE TEMP TABLE c AS SELECT key_id, claim_token FROM public.idem_claim('a0180000-0000-4000-8000-000000000001', 1801, 'ep', '{}');
SELECT key_id AS k, claim_token AS tok FROM c \gset
SELECT created_at AS k_at FROM public.idempotency_keys WHERE id = :k \gset

SELECT ok(public.idem_token_fits(:k, :'k_at', :'tok'), 'the claim''s own token fits');
SELECT is(public.idem_token_fits(:k + 1, :'k_at', :'tok'), false, 'it does not fit another key_id');
SELECT is(public.idem_token_fits(:k, :'k_at'::timestamptz + interval '1 microsecond', :'tok'), false,
    'it does not fit the same key_id claimed at another time');
SELECT is(public.idem_token_fits(:k, :'k_at', pg_catalog.left(:'tok', 47)), false, 'a shortened token does not fit');
SELECT is(public.idem_token_fits(:k, :'k_at', NULL), false, 'no token is false, not NULL');
SELECT is(public.idem_token_fits(:k, NULL, :'tok'), false, 'without a claim time nothing fits, and the answer is false');
SELECT ok(NOT pg_catalog.has_function_privilege('idem_app', 'public.idem_token_fits(bigint, timestamptz, text)', 'EXECUTE')
          AND NOT pg_catalog.has_function_privilege('idem_admin', 'public.idem_token_fits(bigint, timestamptz, text)', 'EXECUTE'),
    'no role may execute it');

SELECT * FROM finish();
ROLLBACK;
