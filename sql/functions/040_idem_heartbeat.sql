-- idem_heartbeat
-- Renews a live holder's lease (locked_at), so a slow handler is never taken for a dead
-- one. Call it from a separate autocommit connection every few seconds while the handler
-- runs: inside the handler's transaction the renewal would stay invisible until commit.
CREATE OR REPLACE FUNCTION public.idem_heartbeat(p_key_id bigint)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = ''
AS $$
DECLARE
    v_locked_at timestamptz;
BEGIN
    UPDATE public.idempotency_keys k
       SET locked_at = GREATEST(k.locked_at, pg_catalog.clock_timestamp())
     WHERE k.id = p_key_id AND k.status = 'in_flight'
    RETURNING k.locked_at INTO v_locked_at;

    -- GUARD: the token no longer holds the key: stop working, the claim is gone
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM01',
            MESSAGE = pg_catalog.format('idempotency claim lost: key_id %s is no longer in flight for this holder; %s',
                                        p_key_id, public.idem_lost_claim_state(p_key_id)),
            HINT = 'stop working on this execution: another claim or an erasure decided this key';
    END IF;
    RETURN v_locked_at;
END
$$;

COMMENT ON FUNCTION public.idem_heartbeat(bigint) IS
    'Renews the lease of the in-flight claim p_key_id and returns the new locked_at. '
    'Errors: IDM01 claim lost (healed, completed, failed, erased, unknown: the message says which);'
    ' 42883 when an argument name is misspelt, a required one is missing or a type does not match (no overloads: this signature is the only one).';
