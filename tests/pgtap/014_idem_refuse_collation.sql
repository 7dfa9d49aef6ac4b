-- idem_refuse_collation: what every SECURITY DEFINER routine with a text parameter raises first
-- when its call carries a collation other than the database's default.
BEGIN;
SELECT plan(6);

SELECT throws_ok($$SELECT public.idem_refuse_collation('idem_claim', '"C"')$$, 'IDM00',
    'idem_claim: text arguments must not carry a collation (got "C")', 'it raises IDM00 naming the routine and the collation');

SELECT throws_ok($$SELECT * FROM public.idem_claim('7c9e6679-7425-40de-944b-e07fc1f90ae7' COLLATE "C", NULL, 'ep', '{}')$$, 'IDM00',
    'idem_claim: text arguments must not carry a collation (got "C")', 'idem_claim refuses a collated key before it reads it');
SELECT throws_ok($$SELECT * FROM public.idem_claim('7c9e6679-7425-40de-944b-e07fc1f90ae7', NULL, 'ep' COLLATE "C", '{}')$$, 'IDM00',
    'idem_claim: text arguments must not carry a collation (got "C")', 'a collation on any text argument is the call''s, and refused');
SELECT is((SELECT count(*)::integer FROM public.idempotency_keys WHERE idem_key = '7c9e6679-7425-40de-944b-e07fc1f90ae7'), 0,
    'nothing was claimed');
SELECT is((SELECT outcome FROM public.idem_claim('7c9e6679-7425-40de-944b-e07fc1f90ae7' COLLATE "default", NULL, 'ep', '{}')), 'claimed',
    'the default collation, spelt out, is the call without one');
SELECT throws_ok($$SELECT public.idem_complete(1, 200, '{}', p_claim_token => 'x' COLLATE "POSIX")$$, 'IDM00',
    'idem_complete: text arguments must not carry a collation (got "POSIX")', 'idem_complete refuses it before the token');

SELECT * FROM finish();
ROLLBACK;
