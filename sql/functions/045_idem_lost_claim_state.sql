-- idem_lost_claim_state
-- What became of the row a lost claim token named, in words, for the IDM01 message of
-- idem_complete, idem_fail and idem_heartbeat: "it is completed now", "it was healed as stale
-- and the key is in flight under key_id N now (another claim)", "no row has this key_id (…)"; a
-- key freed by idem_fail(p_release) reads "it was released after a failure and …".
-- Only read on the error path, so the happy path pays nothing. Reads, locks nothing.
CREATE OR REPLACE FUNCTION public.idem_lost_claim_state(p_key_id bigint, p_claimed_at timestamptz DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_status  text;
    v_heal    public.idempotency_events%ROWTYPE;
    v_next    record;
BEGIN
    -- On a distributed store the key_id names its shard (idem_key_scope); NULL on one node.
    SELECT k.status INTO v_status FROM public.idempotency_keys k
     WHERE k.id = p_key_id AND (p_claimed_at IS NULL OR k.created_at = p_claimed_at)
       AND (public.idem_key_scope(p_key_id) IS NULL OR k.scope_user_id = public.idem_key_scope(p_key_id));
    -- GUARD: the row is there, finished by someone else (or twice)
    IF FOUND THEN
        RETURN pg_catalog.format('it is %s now', v_status);
    END IF;

    SELECT e.* INTO v_heal FROM public.idempotency_events e
     WHERE e.key_id = p_key_id AND e.event IN ('stale_heal', 'released')
       AND (public.idem_key_scope(p_key_id) IS NULL OR e.scope_user_id = public.idem_key_scope(p_key_id))
     ORDER BY e.occurred_at DESC LIMIT 1;
    -- GUARD: no heal (or release) on record: erased, cleaned up, or a token that never was
    IF NOT FOUND THEN
        RETURN 'no row has this key_id (erased, cleaned up after expiry, or never claimed)';
    END IF;

    -- An equality on the scope wherever there is one: on a distributed store (never a NULL scope)
    -- it keeps the lookup on the key's own shard, where idem_complete runs it inside the delegated
    -- idem_complete_in_scope (sql/citus/021), and a query across shards would be refused.
    IF v_heal.scope_user_id IS NULL THEN
        SELECT k.id, k.status INTO v_next FROM public.idempotency_keys k
         WHERE k.idem_key = v_heal.detail ->> 'idem_key' AND k.scope_user_id IS NULL
           AND k.scope_endpoint = v_heal.scope_endpoint;
    ELSE
        SELECT k.id, k.status INTO v_next FROM public.idempotency_keys k
         WHERE k.idem_key = v_heal.detail ->> 'idem_key' AND k.scope_user_id = v_heal.scope_user_id
           AND k.scope_endpoint = v_heal.scope_endpoint;
    END IF;
    IF NOT FOUND THEN
        RETURN pg_catalog.format('it was %s and the key has no row now (free for the next claim)',
            CASE v_heal.event WHEN 'released' THEN 'released after a failure' ELSE 'healed as stale' END);
    END IF;
    RETURN pg_catalog.format('it was %s and the key is %s under key_id %s now%s',
        CASE v_heal.event WHEN 'released' THEN 'released after a failure' ELSE 'healed as stale' END,
        CASE v_next.status WHEN 'in_flight' THEN 'in flight' ELSE v_next.status END, v_next.id,
        CASE v_next.status WHEN 'in_flight' THEN ' (another claim)' ELSE '' END);
END
$$;

COMMENT ON FUNCTION public.idem_lost_claim_state IS
    'What became of the row of claim token p_key_id (taken at p_claimed_at, when known: a later claim that got '
    'the same key_id is not it), in words (it is completed/failed now; it was '
    'healed as stale (or released after a failure) and the key is in flight under key_id N now; no row has this key_id): the tail '
    'of the IDM01 message of idem_complete, idem_fail and idem_heartbeat. Reads only. Errors: none.';
