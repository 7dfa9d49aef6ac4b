-- 007_idem_claim_token: a claim's token, a keyed hash of its key_id under idem_secret.
-- Cases:
--   32 hex digits; the same key_id gives the same token, another key_id another;
--   it is the claim_token idem_claim returns with outcome claimed;
--   it depends on the secret (a new secret voids every token);
--   no role may execute it.
BEGIN;
SELECT plan(6);

INSERT INTO public.users (id) VALUES (701);
CREATE TEMP TABLE c AS SELECT key_id, claim_token FROM public.idem_claim('a0070000-0000-4000-8000-000000000001', 701, 'ep', '{}');

SELECT matches(public.idem_claim_token(42), '^[0-9a-f]{32}$', 'a token is 32 hex digits');
SELECT is(public.idem_claim_token(42), public.idem_claim_token(42), 'the same key_id gives the same token');
SELECT isnt(public.idem_claim_token(42), public.idem_claim_token(43), 'another key_id another');
SELECT is((SELECT claim_token FROM c), public.idem_claim_token((SELECT key_id FROM c)),
    'idem_claim returns exactly this token with its key_id');
CREATE TEMP TABLE before AS SELECT public.idem_claim_token(42) AS t;
UPDATE public.idem_secret SET secret = decode(repeat('ab', 32), 'hex');
SELECT isnt(public.idem_claim_token(42), (SELECT t FROM before), 'a new secret gives another token (the old ones are void)');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_claim_token(bigint)', 'EXECUTE')
          AND NOT has_function_privilege('idem_admin', 'public.idem_claim_token(bigint)', 'EXECUTE')
          AND NOT has_function_privilege('public', 'public.idem_claim_token(bigint)', 'EXECUTE'),
    'no role may execute it');

SELECT * FROM finish();
ROLLBACK;
