-- idem_fail
-- Fenced by the claim token like idem_complete, but runs in its own transaction after the
-- handler's was rolled back (nothing of the handler may commit with it). Locks one row.
CREATE OR REPLACE FUNCTION public.idem_fail(
    p_key_id         bigint,
    p_response_code  integer DEFAULT NULL,
    p_claim_token    text    DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- GUARD: only the holder of the claim's token fails it (IDM01; IDM00 without one)
    -- (the right token costs one hash; only a missing or wrong one pays for the check's words)
    IF p_claim_token IS NULL OR p_claim_token IS DISTINCT FROM public.idem_claim_token(p_key_id) THEN
        PERFORM public.idem_check_token('idem_fail', p_key_id, p_claim_token);
    END IF;

    -- GUARD: a response code, when given, must be an HTTP status
    IF p_response_code IS NOT NULL AND p_response_code NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_fail: p_response_code must be an HTTP status 100..599 (got %s)', p_response_code);
    END IF;

    UPDATE public.idempotency_keys k
       SET status = 'failed', response_code = p_response_code
     WHERE k.id = p_key_id AND k.status = 'in_flight';

    -- GUARD: the token no longer holds the key
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM01',
            MESSAGE = pg_catalog.format('idem_fail: claim lost: key_id %s is no longer in flight for this holder; %s',
                                        p_key_id, public.idem_lost_claim_state(p_key_id)),
            HINT = 'stop working on this execution: another claim or an erasure decided this key';
    END IF;
END
$$;

COMMENT ON FUNCTION public.idem_fail IS
    'Fails the claim p_key_id (the handler raised or answered 5xx): later claims with its key answer '
    'previous_failed until it expires. Call it in its own transaction after rolling the handler''s back. '
    'p_claim_token is the claim_token idem_claim returned with p_key_id (only the owner and members of idem_admin may leave it out). '
    'Errors: IDM01 claim lost, or not this claim''s token - nothing changed (the message says what the row is now); IDM00 no p_claim_token from a role that needs one, response code outside 100..599; '
    '42883 (PostgreSQL) when an argument name is misspelt, a required one is missing or a type does not match (no overloads: this signature is the only one).';
