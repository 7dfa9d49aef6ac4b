-- idem_token_fits
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- The one test of a claim's token: whether p_claim_token is the token of the claim p_key_id
-- taken at p_claimed_at (the time the token names: idem_token_claimed_at). False, never NULL,
-- for a missing token and for one whose claim has no token (no secret, no time): a caller's
-- IF NOT ... THEN refuse must refuse those too. A SQL-standard expression, so it is inlined
-- where it is called: the right token costs idem_claim_token's hash and nothing more. The routines
-- that act on a claim ask it first and idem_check_token (008) only when it says false;
-- idem_complete compares against the token it hashed in a statement of its own, which keeps its
-- plan across calls (bench/HISTORY.md: the token without a plan per call).
CREATE OR REPLACE FUNCTION public.idem_token_fits(p_key_id bigint, p_claimed_at timestamptz, p_claim_token text)
RETURNS boolean
LANGUAGE sql
STABLE
RETURN p_claim_token IS NOT NULL
       AND p_claim_token IS NOT DISTINCT FROM public.idem_claim_token(p_key_id, p_claimed_at);

COMMENT ON FUNCTION public.idem_token_fits IS
    'Whether p_claim_token is the token of the claim p_key_id taken at p_claimed_at (idem_claim_token''s): '
    'false for a missing token and where the claim has none (never NULL). idem_fail, idem_heartbeat, '
    'idem_record_lost_claim and idem_check_token ask it. Internal: no role may execute it. Errors: none.';
