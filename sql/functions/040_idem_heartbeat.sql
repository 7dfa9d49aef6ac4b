-- idem_heartbeat
-- A separate autocommit connection, because inside the handler's transaction the renewal
-- would stay invisible to detectors until commit. Locks the one row for a moment.
CREATE OR REPLACE FUNCTION public.idem_heartbeat(p_key_id bigint, p_claim_token text DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- first: a caller's collation would reach every text parameter and variable (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_claim_token) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_heartbeat', pg_catalog.pg_collation_for(p_claim_token));
    v_locked_at timestamptz;
    -- Taken before the UPDATE: Citus refuses a VOLATILE function (clock_timestamp) inside one.
    v_now       timestamptz := pg_catalog.clock_timestamp();
    v_claimed_at  timestamptz := public.idem_token_claimed_at(p_claim_token);
BEGIN
    -- GUARD: only the holder of the claim's token renews it (IDM01; IDM00 without one)
    -- (the right token costs one hash, and the statement below matches the claim time it names;
    -- only a missing or wrong one pays for the check's words, and then acts by key_id alone)
    IF NOT public.idem_token_fits(p_key_id, v_claimed_at, p_claim_token) THEN
        PERFORM public.idem_check_token('idem_heartbeat', p_key_id, p_claim_token);
        v_claimed_at := NULL;
    END IF;

    UPDATE public.idempotency_keys k
       SET locked_at = GREATEST(k.locked_at, v_now)
     WHERE k.id = p_key_id AND k.status = 'in_flight' AND (v_claimed_at IS NULL OR k.created_at = v_claimed_at)
       AND (public.idem_key_scope(p_key_id) IS NULL OR k.scope_user_id = public.idem_key_scope(p_key_id))  -- its shard (idem_complete)
    RETURNING k.locked_at INTO v_locked_at;

    -- GUARD: the token no longer holds the key: stop working, the claim is gone
    IF NOT FOUND THEN
        PERFORM public.idem_raise_claim_lost('idem_heartbeat', p_key_id, v_claimed_at);
    END IF;
    RETURN v_locked_at;
END
$$;

COMMENT ON FUNCTION public.idem_heartbeat IS
    'Renews the lease (locked_at) of the in-flight claim p_key_id, so a slow but live handler is never '
    'taken for a dead one, and returns the new locked_at. Call it every few seconds from a separate '
    'autocommit connection while the handler runs. '
    'p_claim_token is the claim_token idem_claim returned with p_key_id (only the owner and members of idem_admin may leave it out). '
    'Errors: IDM01 claim lost (healed, completed, failed, erased, unknown, or not this claim''s token: the message says which): stop working; IDM00 no p_claim_token from a role that needs one; '
    '42883 (PostgreSQL) when an argument name is misspelt, a required one is missing or a type does not match (no overloads: this signature is the only one).';
