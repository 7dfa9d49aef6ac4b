-- idem_check_token
-- The one fence of every routine that acts on a claim by its key_id: ids are sequential, so
-- knowing one must not be enough to complete, fail, renew or report another request's claim.
-- Reads the one-row secret; locks nothing. Never granted: the definers call it first thing.
CREATE OR REPLACE FUNCTION public.idem_check_token(p_routine text, p_key_id bigint, p_claim_token text)
RETURNS void
LANGUAGE plpgsql
STABLE
AS $$
BEGIN
    -- GUARD: no token: a DBA's named-argument call (owner or idem_admin), or a claim taken
    -- before tokens existed (migration 0008); anyone else must show the claim's token
    IF p_claim_token IS NULL THEN
        IF p_key_id OPERATOR(pg_catalog.<=) (SELECT s.tokenless_through FROM public.idem_secret s)
           OR public.idem_caller_is('admin') THEN
            RETURN;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('%s: p_claim_token is required: pass the claim_token that idem_claim returned with key_id %s',
                                        p_routine, p_key_id),
            HINT = 'only the functions'' owner and members of idem_admin may act on a claim by its key_id alone';
    END IF;
    -- GUARD: a token this claim was never given
    IF p_claim_token IS DISTINCT FROM public.idem_claim_token(p_key_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM01',
            MESSAGE = pg_catalog.format('%s: claim lost: p_claim_token is not the token of key_id %s; nothing was changed',
                                        p_routine, p_key_id),
            HINT = 'pass the claim_token returned with this key_id by idem_claim';
    END IF;
END
$$;

COMMENT ON FUNCTION public.idem_check_token IS
    'Raises unless p_claim_token is the token idem_claim returned for p_key_id. Without a token it passes '
    'for the functions'' owner and members of idem_admin (a DBA in psql), and for claims taken before SQL '
    'API 5; anyone else gets IDM00. Errors: IDM01 a wrong token (as for a lost claim: nothing changed); '
    'IDM00 a missing token. Internal: no role may execute it.';
