-- 013_idem_claim_token: a claim's token, a keyed hash of its key_id and claim time under idem_secret.
-- Cases:
--   48 hex digits, the last 16 the claim time (idem_token_claimed_at reads it back exactly);
--   the same claim gives the same token, another key_id or another claim time another (a later
--     claim that gets the same key_id does not share it);
--   it is the claim_token idem_claim returns with outcome claimed;
--   it depends on the secret (a new secret voids every token);
--   no role may execute it.
BEGIN;
SELECT plan(8);

INSERT INTO public.users (id) VALUES (701);
CREATE TEMP TABLE c AS SELECT key_id, claim_token FROM public.idem_claim('a0070000-0000-4000-8000-000000000001', 701, 'ep', '{}');
CREATE TEMP TABLE t0 AS SELECT '2026-12-01 12:34:56.789012+00'::timestamptz AS at;

SELECT matches(public.idem_claim_token(42, (SELECT at FROM t0)), '^[0-9a-f]{48}$', 'a token is 48 hex digits');
SELECT is(public.idem_token_claimed_at(public.idem_claim_token(42, (SELECT at FROM t0))), (SELECT at FROM t0),
    'its last 16 digits are the claim time, to the microsecond');
SELECT is(public.idem_claim_token(42, (SELECT at FROM t0)), public.idem_claim_token(42, (SELECT at FROM t0)),
    'the same claim gives the same token');
SELECT ok(public.idem_claim_token(42, (SELECT at FROM t0)) <> public.idem_claim_token(43, (SELECT at FROM t0))
          AND public.idem_claim_token(42, (SELECT at FROM t0))
              <> public.idem_claim_token(42, (SELECT at + interval '1 microsecond' FROM t0)),
    'another key_id, or the same key_id claimed at another time, gives another token');
-- the row's claim time first: on Citus a query on the shard may not read the secret (a reference table)
SELECT key_id AS k FROM c \gset
SELECT created_at AS k_at FROM public.idempotency_keys WHERE id = :k \gset
SELECT is((SELECT claim_token FROM c), public.idem_claim_token(:k, :'k_at'),
    'idem_claim returns exactly this token with its key_id and claim time');
CREATE TEMP TABLE before AS SELECT public.idem_claim_token(42, (SELECT at FROM t0)) AS t;
UPDATE public.idem_secret SET secret = decode(repeat('ab', 32), 'hex');
SELECT isnt(public.idem_claim_token(42, (SELECT at FROM t0)), (SELECT t FROM before),
    'a new secret gives another token (the old ones are void)');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_claim_token(bigint, timestamptz)', 'EXECUTE')
          AND NOT has_function_privilege('idem_admin', 'public.idem_claim_token(bigint, timestamptz)', 'EXECUTE')
          AND NOT has_function_privilege('public', 'public.idem_claim_token(bigint, timestamptz)', 'EXECUTE'),
    'no role may execute it');
SELECT is(public.idem_token_claimed_at(repeat('0', 32)), NULL, 'a token of another form names no claim time');

SELECT * FROM finish();
ROLLBACK;
