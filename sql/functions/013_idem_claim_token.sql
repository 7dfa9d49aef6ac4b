-- idem_claim_token
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- A claim's token under idem_secret (readable by the owner only; the formula is idem_token_hash's):
-- a token is checked with no column and no lookup of its own, still after its row is gone (a lost
-- claim's report), and never fits a later claim that gets the same key_id (a Citus store's key_ids
-- come round again after 2^31 claims), whose time differs.
-- Never granted: only the definers that issue and check tokens call it.
CREATE OR REPLACE FUNCTION public.idem_claim_token(p_key_id bigint, p_claimed_at timestamptz)
RETURNS text
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT public.idem_token_hash(s.secret, p_key_id, p_claimed_at) FROM public.idem_secret s;
END;

COMMENT ON FUNCTION public.idem_claim_token IS
    'The claim token of the claim p_key_id taken at p_claimed_at (its created_at): 48 hex digits, a keyed '
    'SHA-256 of both under the secret in idem_secret (which no role but the owner can read), then the time in '
    'microseconds. idem_claim returns it with outcome claimed; idem_complete, idem_fail, idem_heartbeat and '
    'idem_record_lost_claim require it. Internal: no role may execute it. Errors: none (NULL without a secret '
    'or a time).';
