-- idem_check_token
-- The one fence of every routine that acts on a claim by its key_id: ids are sequential, so
-- knowing one must not be enough to complete, fail, renew or report another request's claim.
-- Called only when the token is missing or idem_token_fits (018, the one test of a token) says
-- it is not the claim's, so the right token costs nothing here. The claims an upgrade left in flight are known by their mark (legacy_token, set by
-- migration 0012 and by nothing else), never by a range of key_ids, which on a distributed store
-- interleave across users. Reads the claim's row and the one-row secret; locks nothing.
CREATE OR REPLACE FUNCTION public.idem_check_token(p_routine text, p_key_id bigint, p_claim_token text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_legacy text;
BEGIN
    SELECT k.legacy_token INTO v_legacy FROM public.idempotency_keys k
     WHERE k.id = p_key_id
       AND (public.idem_key_scope(p_key_id) IS NULL OR k.scope_user_id = public.idem_key_scope(p_key_id));  -- its shard

    -- GUARD: no token: a DBA's named-argument call (owner or idem_admin), or a claim taken
    -- before tokens existed; anyone else must show the claim's token
    IF p_claim_token IS NULL THEN
        IF v_legacy = 'none' OR public.idem_caller_is('admin') THEN
            RETURN;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('%s: p_claim_token is required: pass the claim_token that idem_claim returned with key_id %s',
                                        p_routine, p_key_id),
            HINT = 'only the functions'' owner and members of idem_admin may act on a claim by its key_id alone';
    END IF;
    -- GUARD: the claim's own token (its callers ask idem_token_fits first: only a refused one
    -- gets here, so this costs a hash on that path alone)
    IF public.idem_token_fits(p_key_id, public.idem_token_claimed_at(p_claim_token), p_claim_token) THEN
        RETURN;
    END IF;
    -- GUARD: the older token (the key_id's hash alone), for a claim taken before 0012 and marked so
    IF v_legacy = 'key_id' AND p_claim_token = (
           SELECT pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(
                      s.secret || pg_catalog.convert_to('claim:', 'UTF8') || pg_catalog.int8send(p_key_id)), 'hex'), 32)
             FROM public.idem_secret s) THEN
        RETURN;
    END IF;
    -- GUARD: a token this claim was never given
    RAISE EXCEPTION USING ERRCODE = 'IDM01',
        MESSAGE = pg_catalog.format('%s: claim lost: p_claim_token is not the token of key_id %s; nothing was changed',
                                    p_routine, p_key_id),
        HINT = 'pass the claim_token returned with this key_id by idem_claim';
END
$$;

COMMENT ON FUNCTION public.idem_check_token IS
    'Raises unless p_claim_token may act on the claim p_key_id: called by the routines that act on a claim when '
    'the token is missing or its hash is not idem_claim_token''s. Without a token it passes for the functions'' '
    'owner and members of idem_admin (a DBA in psql), and for a claim taken before claim tokens existed (marked by '
    'migration 0012); the older token (the key_id''s hash alone) passes for a claim taken while it was '
    'issued (marked too); anyone else gets IDM00. '
    'Errors: IDM01 a wrong token (as for a lost claim: nothing changed); IDM00 a missing token. '
    'Internal: no role may execute it.';
