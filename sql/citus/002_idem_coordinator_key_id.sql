-- idem_coordinator_key_id (Citus only): idem_new_key_id's key_id, on the coordinator only.
-- Each worker has a copy of idempotency_keys_id_seq (Citus's), which starts again at 1, so a
-- key_id made there would repeat one the coordinator made in the same scope: a claim that reached
-- a worker (idem_claim made a distributed function, or an app connected to a worker) fails at
-- once instead. A routine of its own because idem_new_key_id keeps the single node's SQL-standard
-- form, which cannot raise; and a pass-through rather than a branch of it because Citus evaluates
-- every function call of an INSERT's values on the coordinator before routing, both arms of a CASE
-- included.
CREATE OR REPLACE FUNCTION public.idem_coordinator_key_id(
    p_routine  text,    -- whose key_id: the message speaks in its name
    p_key_id   bigint   -- made from this node's copy of the sequence
)
RETURNS bigint
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- GUARD: only the coordinator's sequence makes key_ids
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('%s: key_ids are made on the coordinator only: a worker''s copy of '
                                        'idempotency_keys_id_seq repeats the coordinator''s values', p_routine),
            HINT = 'send claims to the coordinator: do not make idem_claim a distributed function '
                   '(create_distributed_function), and do not connect the app to a worker';
    END IF;
    RETURN p_key_id;
END
$$;

COMMENT ON FUNCTION public.idem_coordinator_key_id IS
    'Distributed store (Citus) only: p_key_id on the coordinator; elsewhere IDM00 "<p_routine>: key_ids are '
    'made on the coordinator only" (idem_new_key_id called on a worker). Internal: no role may execute it. '
    'Errors: IDM00 on a worker.';
REVOKE ALL ON FUNCTION public.idem_coordinator_key_id FROM PUBLIC;
