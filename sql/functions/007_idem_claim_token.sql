-- idem_claim_token
-- A keyed hash of the key_id under idem_secret (readable by the owner only), so a token is
-- checked with no column and no lookup of its own, and still after its row is gone (a lost
-- claim's report). The 'claim:' label keeps it apart from other values derived from the secret.
-- Never granted: only the definers that issue and check tokens call it.
CREATE OR REPLACE FUNCTION public.idem_claim_token(p_key_id bigint)
RETURNS text
LANGUAGE sql
STABLE
AS $$
    SELECT pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(
               s.secret OPERATOR(pg_catalog.||) pg_catalog.convert_to('claim:', 'UTF8')
                        OPERATOR(pg_catalog.||) pg_catalog.int8send(p_key_id)), 'hex'), 32)
      FROM public.idem_secret s
$$;

COMMENT ON FUNCTION public.idem_claim_token IS
    'The claim token of p_key_id: 32 hex digits, a keyed SHA-256 of the key_id under the secret in '
    'idem_secret, which no role but the owner can read. idem_claim returns it with outcome claimed; '
    'idem_complete, idem_fail, idem_heartbeat and idem_record_lost_claim require it. Internal: no role may '
    'execute it. Errors: none (NULL before migration 0008 made the secret).';
