-- idem_record_lost_claim
-- A separate call because IDM01 rolls back the transaction that would have recorded it.
-- Honest by construction: the reason comes from the database (a heal event, the row's
-- state), not the caller; the unique partial index records one token once.
CREATE OR REPLACE FUNCTION public.idem_record_lost_claim(
    p_key_id    bigint,
    p_endpoint     text DEFAULT NULL,
    p_claim_token  text DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- first: a caller's collation would reach every text parameter and variable (idem_refuse_collation)
    v_uncollated  constant boolean := (pg_catalog.pg_collation_for(p_claim_token) COLLATE pg_catalog."C") OPERATOR(pg_catalog.=) '"default"'
                                      OR public.idem_refuse_collation('idem_record_lost_claim', pg_catalog.pg_collation_for(p_claim_token));
    v_status    text;
    v_user_id   public.idem_user_id;
    v_endpoint  text;
    v_reason    text;
    v_hash      text;
    v_id        bigint;
    v_claimed_at  timestamptz := public.idem_token_claimed_at(p_claim_token);
BEGIN
    -- GUARD: a token is a positive id
    IF p_key_id IS NULL OR p_key_id < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_record_lost_claim: p_key_id must be a claim''s key_id (a positive number)';
    END IF;
    -- GUARD: a reported endpoint the shim would never send (idem_refuse_endpoint says the rule)
    IF pg_catalog.length(p_endpoint) > 200
       OR p_endpoint ~ E'[\\x01-\\x1f\\x7f-\\x9f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]' THEN
        PERFORM public.idem_refuse_endpoint('idem_record_lost_claim', p_endpoint);
    END IF;
    -- GUARD: only the holder of the lost claim reports it: no made-up ids in idem_health
    -- (the right token costs one hash; only a missing or wrong one pays for the check's words)
    IF NOT public.idem_token_fits(p_key_id, v_claimed_at, p_claim_token) THEN
        PERFORM public.idem_check_token('idem_record_lost_claim', p_key_id, p_claim_token);
        v_claimed_at := NULL;
    END IF;

    -- The token's own claim: a later claim that got the same key_id is not it.
    SELECT k.status, k.scope_user_id, k.scope_endpoint, k.request_hash
      INTO v_status, v_user_id, v_endpoint, v_hash
      FROM public.idempotency_keys k
     WHERE k.id = p_key_id AND (v_claimed_at IS NULL OR k.created_at = v_claimed_at)
       AND (public.idem_key_scope(p_key_id) IS NULL OR k.scope_user_id = public.idem_key_scope(p_key_id));  -- its shard (idem_complete)

    -- GUARD: the token still holds its key: nothing was lost
    IF v_status = 'in_flight' THEN
        RETURN false;
    END IF;

    IF v_status IS NOT NULL THEN
        v_reason := 'already_' || v_status;          -- finished by someone else (or twice)
    ELSE
        SELECT e.scope_user_id, e.scope_endpoint, e.detail ->> 'request_hash' INTO v_user_id, v_endpoint, v_hash
          FROM public.idempotency_events e
         WHERE e.key_id = p_key_id AND e.event = 'stale_heal' AND (public.idem_key_scope(p_key_id) IS NULL OR e.scope_user_id = public.idem_key_scope(p_key_id))
         ORDER BY e.occurred_at DESC LIMIT 1;
        v_reason := CASE WHEN FOUND THEN 'healed_as_stale' ELSE 'gone' END;  -- gone: erased or cleaned up
    END IF;

    INSERT INTO public.idempotency_events (event, key_id, scope_user_id, scope_endpoint, detail)
    VALUES ('lost_claim', p_key_id, COALESCE(v_user_id, public.idem_key_scope(p_key_id), public.idem_scope(NULL::public.idem_user_id)), COALESCE(v_endpoint, p_endpoint),
            pg_catalog.jsonb_build_object('reason', v_reason, 'reported_endpoint', p_endpoint,
                                          'request_hash', v_hash))
    -- No conflict target: the unique index is (key_id) on one node, (scope_user_id, key_id) on
    -- a distributed store (sql/citus/000_distribute.sql); the primary key never conflicts.
    ON CONFLICT DO NOTHING
    RETURNING id INTO v_id;
    RETURN v_id IS NOT NULL;
END
$$;

COMMENT ON FUNCTION public.idem_record_lost_claim IS
    'Records a lost_claim event for claim token p_key_id after its holder got IDM01 and rolled back; '
    'call it in a new transaction. Writes nothing (returns false) when the token still holds its key '
    'or was already reported; otherwise returns true. detail.reason: healed_as_stale | already_completed '
    '| already_failed | gone (erased or cleaned up); detail.request_hash (NULL when gone) finds it beside the '
    'heal of the same request. p_claim_token is the claim_token idem_claim returned with p_key_id (only the owner and members of idem_admin may leave it out). p_endpoint is kept as reported_endpoint only. '
    'Errors: IDM00 when p_endpoint is over 200 characters or has a control character (idem_refuse_endpoint), when p_key_id is not positive or p_claim_token is missing from a role that needs it; IDM01 a wrong token.';
