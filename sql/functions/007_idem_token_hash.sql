-- idem_token_hash
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The one formula of a claim token: a keyed hash of the claim's key_id and claim time under the
-- secret, then that time. Pure and a SQL-standard expression, so the routines on the request path
-- inline it beside the secret they read in a statement of their own, where idem_claim_token (a
-- query, planned anew in each transaction) costs a plan per call. The 'claim:' label keeps it apart
-- from other values derived from the secret. Never granted: it is only as secret as its argument.
CREATE OR REPLACE FUNCTION public.idem_token_hash(p_secret bytea, p_key_id bigint, p_claimed_at timestamptz)
RETURNS text
LANGUAGE sql
STABLE
PARALLEL SAFE
RETURN pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(
           p_secret || pg_catalog.convert_to('claim:', 'UTF8') || pg_catalog.int8send(p_key_id)
                    || pg_catalog.int8send((EXTRACT(epoch FROM p_claimed_at) * 1000000)::bigint)), 'hex'), 32)
       || pg_catalog.encode(pg_catalog.int8send((EXTRACT(epoch FROM p_claimed_at) * 1000000)::bigint), 'hex');

COMMENT ON FUNCTION public.idem_token_hash IS
    'The claim token of the claim p_key_id taken at p_claimed_at under the secret p_secret (idem_secret''s): '
    '48 hex digits, a keyed SHA-256 of the key_id and the time, then the time in microseconds. '
    'idem_claim_token reads the secret and calls it; idem_claim and idem_complete inline it. '
    'Internal: no role may execute it. Errors: none (NULL without a secret or a time).';
