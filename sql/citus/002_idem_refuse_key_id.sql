-- idem_refuse_key_id (Citus only): the error of idem_new_key_id anywhere but on the coordinator.
-- Each worker has a copy of idempotency_keys_id_seq (Citus's), which starts again at 1, so a
-- key_id made there would repeat one the coordinator made in the same scope: a claim that reached
-- a worker (idem_claim made a distributed function, or an app connected to a worker) fails at
-- once instead. A routine of its own because idem_new_key_id keeps the single node's SQL-standard
-- form (which cannot raise); called only on that path, so a claim on the coordinator pays nothing.
CREATE OR REPLACE FUNCTION public.idem_refuse_key_id(p_routine text)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'IDM00',
        MESSAGE = pg_catalog.format('%s: key_ids are made on the coordinator only: a worker''s copy of '
                                    'idempotency_keys_id_seq repeats the coordinator''s values', p_routine),
        HINT = 'send claims to the coordinator: do not make idem_claim a distributed function '
               '(create_distributed_function), and do not connect the app to a worker';
END
$$;

COMMENT ON FUNCTION public.idem_refuse_key_id IS
    'Distributed store (Citus) only: raises IDM00 "<p_routine>: key_ids are made on the coordinator only" for '
    'idem_new_key_id called on a worker. Internal: no role may execute it. Errors: IDM00, always.';
REVOKE ALL ON FUNCTION public.idem_refuse_key_id FROM PUBLIC;
