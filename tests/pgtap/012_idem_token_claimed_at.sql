-- 012_idem_token_claimed_at: the claim time a claim token names.
-- Cases:
--   a token of idem_claim_token gives back its claim time exactly, to the microsecond and at a
--     whole second;
--   a forged token naming a time out of range, NULL, a 32-digit token (the older, key_id-only form), upper-case
--     or non-hex digits give NULL, never an error;
--   the token idem_claim returns names the claim's created_at.
BEGIN;
SELECT plan(6);

INSERT INTO public.users (id) VALUES (1201);
SELECT is(public.idem_token_claimed_at(public.idem_claim_token(1, '2026-12-01 08:00:00.000001+00')),
    '2026-12-01 08:00:00.000001+00'::timestamptz, 'a claim time comes back to the microsecond');
SELECT is(public.idem_token_claimed_at(public.idem_claim_token(1, '2026-12-01 08:00:00+00')),
    '2026-12-01 08:00:00+00'::timestamptz, 'a whole second comes back as it was');
CREATE TEMP TABLE forged (t text);
INSERT INTO forged VALUES (repeat('a', 48)), (repeat('f', 48)), (repeat('0', 32) || '7' || repeat('f', 15));
SELECT is((SELECT count(*)::int FROM forged WHERE public.idem_token_claimed_at(t) IS NULL), 3,
    'a forged token naming a time out of range (before 1970, or past 2^60 microseconds) names none: NULL, never an error');
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
