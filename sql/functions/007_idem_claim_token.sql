-- idem_claim_token
-- A keyed hash of the claim, its key_id and the time it was taken, under idem_secret (readable by
-- the owner only), followed by that time: a token is checked with no column and no lookup of its
-- own, still after its row is gone (a lost claim's report), and never fits a later claim that
-- gets the same key_id (a Citus store's key_ids come round again after 2^31 claims), whose time
-- differs. The 'claim:' label keeps it apart from other values derived from the secret.
-- Never granted: only the definers that issue and check tokens call it.
CREATE OR REPLACE FUNCTION public.idem_claim_token(p_key_id bigint, p_claimed_at timestamptz)
RETURNS text
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(
               s.secret || pg_catalog.convert_to('claim:', 'UTF8') || pg_catalog.int8send(p_key_id)
                        || pg_catalog.int8send(t.micros)), 'hex'), 32)
           || pg_catalog.encode(pg_catalog.int8send(t.micros), 'hex')
      FROM public.idem_secret s,
           (SELECT (EXTRACT(epoch FROM p_claimed_at) * 1000000)::bigint AS micros) t;
END;

COMMENT ON FUNCTION public.idem_claim_token IS
    'The claim token of the claim p_key_id taken at p_claimed_at (its created_at): 48 hex digits, a keyed '
    'SHA-256 of both under the secret in idem_secret (which no role but the owner can read), then the time in '
    'microseconds. idem_claim returns it with outcome claimed; idem_complete, idem_fail, idem_heartbeat and '
    'idem_record_lost_claim require it. Internal: no role may execute it. Errors: none (NULL without a secret '
    'or a time).';
