-- 007_idem_token_hash: the one formula of a claim token, under a secret given as its argument.
-- Cases:
--   under idem_secret's secret it is idem_claim_token's token (the same claim, the same 48 digits);
--   another secret, key_id or claim time gives another token;
--   no secret (NULL) or no time gives no token;
--   no role may execute it.
BEGIN;
SELECT plan(5);

CREATE TEMP TABLE t0 AS SELECT '2026-12-01 12:34:56.789012+00'::timestamptz AS at;

SELECT is(public.idem_token_hash((SELECT secret FROM public.idem_secret), 42, (SELECT at FROM t0)),
          public.idem_claim_token(42, (SELECT at FROM t0)),
    'under the store''s secret it is idem_claim_token''s token');
SELECT ok(public.idem_token_hash(decode(repeat('ab', 32), 'hex'), 42, (SELECT at FROM t0))
              <> public.idem_token_hash(decode(repeat('cd', 32), 'hex'), 42, (SELECT at FROM t0))
          AND public.idem_token_hash(decode(repeat('ab', 32), 'hex'), 42, (SELECT at FROM t0))
              <> public.idem_token_hash(decode(repeat('ab', 32), 'hex'), 43, (SELECT at FROM t0))
          AND public.idem_token_hash(decode(repeat('ab', 32), 'hex'), 42, (SELECT at FROM t0))
              <> public.idem_token_hash(decode(repeat('ab', 32), 'hex'), 42, (SELECT at + interval '1 microsecond' FROM t0)),
    'another secret, key_id or claim time gives another token');
SELECT is(public.idem_token_hash(NULL, 42, (SELECT at FROM t0)), NULL, 'no secret, no token');
SELECT is(public.idem_token_hash(decode(repeat('ab', 32), 'hex'), 42, NULL), NULL, 'no claim time, no token');
SELECT ok(NOT has_function_privilege('idem_app', 'public.idem_token_hash(bytea, bigint, timestamptz)', 'EXECUTE')
          AND NOT has_function_privilege('idem_admin', 'public.idem_token_hash(bytea, bigint, timestamptz)', 'EXECUTE')
          AND NOT has_function_privilege('public', 'public.idem_token_hash(bytea, bigint, timestamptz)', 'EXECUTE'),
    'no role may execute it');

SELECT * FROM finish();
ROLLBACK;
