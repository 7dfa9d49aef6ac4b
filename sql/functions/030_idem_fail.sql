-- idem_fail
-- Fenced by the claim token like idem_complete, but runs in its own transaction after the
-- handler's was rolled back (nothing of the handler may commit with it). Locks one row.
-- p_release deletes the row in the same statement instead (on_failure="release"): the next
-- claim inserts a new token, so the released holder's token is lost like a healed one's.
CREATE OR REPLACE FUNCTION public.idem_fail(
    p_key_id         bigint,
    p_response_code  integer DEFAULT NULL,
    p_claim_token    text    DEFAULT NULL,
    p_release        boolean DEFAULT false
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- first: a caller's collation would reach every text parameter and variable (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_claim_token) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_fail', pg_catalog.pg_collation_for(p_claim_token));
    v_row         public.idempotency_keys%ROWTYPE;
    v_claimed_at  timestamptz := public.idem_token_claimed_at(p_claim_token);
BEGIN
    -- GUARD: only the holder of the claim's token fails it (IDM01; IDM00 without one)
    -- (the right token costs one hash, and the statement below matches the claim time it names;
    -- only a missing or wrong one pays for the check's words, and then acts by key_id alone)
    IF NOT public.idem_token_fits(p_key_id, v_claimed_at, p_claim_token) THEN
        PERFORM public.idem_check_token('idem_fail', p_key_id, p_claim_token);
        v_claimed_at := NULL;
    END IF;

    -- GUARD: a response code, when given, must be an HTTP status
    IF p_response_code IS NOT NULL AND p_response_code NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_fail: p_response_code must be an HTTP status 100..599 (got %s)', p_response_code);
    END IF;

    IF p_release IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00', MESSAGE = 'idem_fail: p_release must be true or false';
    END IF;

    IF p_release THEN
        -- One statement frees the key and reads what the event records; the guard below is the same.
        DELETE FROM public.idempotency_keys k
         WHERE k.id = p_key_id AND k.status = 'in_flight' AND (v_claimed_at IS NULL OR k.created_at = v_claimed_at)
           AND (public.idem_key_scope(p_key_id) IS NULL OR k.scope_user_id = public.idem_key_scope(p_key_id))  -- its shard
        RETURNING k.* INTO v_row;
        IF FOUND THEN
            INSERT INTO public.idempotency_events (event, key_id, scope_user_id, scope_endpoint, detail)
            VALUES ('released', v_row.id, v_row.scope_user_id, v_row.scope_endpoint,
                    pg_catalog.jsonb_build_object(
                        'response_code', p_response_code,
                        'request_hash', v_row.request_hash,
                        'idem_key', v_row.idem_key));  -- so a lost claim can say who holds the key now
            RETURN;
        END IF;
    ELSE
        UPDATE public.idempotency_keys k
           SET status = 'failed', response_code = p_response_code
         WHERE k.id = p_key_id AND k.status = 'in_flight' AND (v_claimed_at IS NULL OR k.created_at = v_claimed_at)
           AND (public.idem_key_scope(p_key_id) IS NULL OR k.scope_user_id = public.idem_key_scope(p_key_id));  -- its shard (idem_complete)
    END IF;

    -- GUARD: the token no longer holds the key
    IF NOT FOUND THEN
        PERFORM public.idem_raise_claim_lost('idem_fail', p_key_id, v_claimed_at);
    END IF;
END
$$;

COMMENT ON FUNCTION public.idem_fail IS
    'Fails the claim p_key_id (the handler raised or answered 5xx): later claims with its key answer '
    'previous_failed until it expires. Call it in its own transaction after rolling the handler''s back. '
    'p_claim_token is the claim_token idem_claim returned with p_key_id (only the owner and members of idem_admin may leave it out). '
    'With p_release => true the key is freed instead (the row is deleted and a "released" event recorded): '
    'the next claim with the key runs again (on_failure="release", for work that stayed in the database). '
    'Errors: IDM01 claim lost, or not this claim''s token - nothing changed (the message says what the row is now); IDM00 no p_claim_token from a role that needs one, response code outside 100..599, p_release NULL; '
    '42883 (PostgreSQL) when an argument name is misspelt, a required one is missing or a type does not match (no overloads: this signature is the only one).';
