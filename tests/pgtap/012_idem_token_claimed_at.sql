-- 012_idem_token_claimed_at: the claim time a claim token names.
-- Cases:
--   a token of idem_claim_token gives back its claim time exactly, before and after 1970 and
--     at a whole second;
--   NULL, a 32-digit token (SQL API 5 to 8), upper-case or non-hex digits give NULL;
--   the token idem_claim returns names the claim's created_at.
BEGIN;
SELECT plan(6);

INSERT INTO public.users (id) VALUES (1201);
SELECT is(public.idem_token_claimed_at(public.idem_claim_token(1, '2026-12-01 08:00:00.000001+00')),
    '2026-12-01 08:00:00.000001+00'::timestamptz, 'a claim time comes back to the microsecond');
SELECT is(public.idem_token_claimed_at(public.idem_claim_token(1, '2026-12-01 08:00:00+00')),
    '2026-12-01 08:00:00+00'::timestamptz, 'a whole second comes back as it was');
SELECT is(public.idem_token_claimed_at(public.idem_claim_token(1, '1969-07-20 20:17:40.5+00')),
    '1969-07-20 20:17:40.5+00'::timestamptz, 'so does a time before 1970');
SELECT ok(public.idem_token_claimed_at(NULL) IS NULL AND public.idem_token_claimed_at(repeat('a', 32)) IS NULL
          AND public.idem_token_claimed_at(repeat('A', 48)) IS NULL AND public.idem_token_claimed_at(repeat('g', 48)) IS NULL,
    'anything but 48 lower-case hex digits names no time');
CREATE TEMP TABLE c AS SELECT key_id, claim_token FROM public.idem_claim('a0120000-0000-4000-8000-000000000001', 1201, 'ep', '{}');
SELECT key_id AS k, claim_token AS t FROM c \gset
SELECT is(public.idem_token_claimed_at(:'t'), (SELECT k.created_at FROM public.idempotency_keys k WHERE k.id = :k),
    'the token idem_claim returns names the claim''s created_at');
SELECT ok((SELECT p.prosqlbody IS NOT NULL FROM pg_catalog.pg_proc p WHERE p.oid = 'public.idem_token_claimed_at'::regproc),
    'it is a SQL-standard body (inlined, nothing resolved at call time)');

SELECT * FROM finish();
ROLLBACK;
