-- idem_raise_claim_lost
-- The one lost-claim guard of idem_complete, idem_fail and idem_heartbeat: their guarded
-- statement found no row in flight for the token, so the claim is lost (IDM01), and the message
-- says what became of the row. Called only on that path, so the happy path pays nothing. The
-- hint depends on where the caller runs: idem_complete inside the handler's transaction (roll
-- it back), the others beside it (stop working). Reads, locks nothing.
CREATE OR REPLACE FUNCTION public.idem_raise_claim_lost(p_routine text, p_key_id bigint, p_claimed_at timestamptz)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'IDM01',
        MESSAGE = pg_catalog.format('%s: claim lost: key_id %s is no longer in flight for this holder; %s',
                                    p_routine, p_key_id, public.idem_lost_claim_state(p_key_id, p_claimed_at)),
        HINT = CASE WHEN p_routine = 'idem_complete' THEN 'roll this execution back'
                    ELSE 'stop working on this execution' END
               || ': another claim or an erasure decided this key';
END
$$;

COMMENT ON FUNCTION public.idem_raise_claim_lost IS
    'Raises IDM01 "<p_routine>: claim lost: key_id <p_key_id> is no longer in flight for this holder; <what '
    'the row is now (idem_lost_claim_state)>", for idem_complete, idem_fail and idem_heartbeat when their '
    'statement found no row in flight for the token (taken at p_claimed_at, when known). '
    'Internal: no role may execute it. Errors: IDM01, always.';
