-- idem_new_key_id (Citus)
-- key_id = scope * 2^31 + (sequence mod 2^31): unique per scope as long as one scope does not
-- claim 2^31 keys within the 7-day retention, and positive for every scope >= 0. The sequence is
-- the coordinator's: each worker has a copy of it (Citus's), which starts again at 1, so a key_id
-- made there repeats one the coordinator made in the same scope. A claim sent to a worker (idem_claim
-- made a distributed function, or an app connected to a worker) therefore fails here, at once.
CREATE OR REPLACE FUNCTION public.idem_new_key_id(p_scope integer)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- GUARD: only the coordinator's sequence makes key_ids
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = 'idem_new_key_id: key_ids are made on the coordinator only: a worker''s copy of '
                      'idempotency_keys_id_seq repeats the coordinator''s values',
            HINT = 'send claims to the coordinator: do not make idem_claim a distributed function '
                   '(create_distributed_function), and do not connect the app to a worker';
    END IF;
    RETURN p_scope::bigint * 2147483648
           + (pg_catalog.nextval('public.idempotency_keys_id_seq'::pg_catalog.regclass) & 2147483647);
END
$$;

COMMENT ON FUNCTION public.idem_new_key_id IS
    'A new key_id for a claim in scope p_scope. Distributed store (Citus): the scope in the high bits, '
    'so the key_id routes to its shard, from the coordinator''s sequence. Internal to idem_claim. Errors: '
    'IDM00 anywhere but on the coordinator (a claim delegated to a worker would repeat key_ids).';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_new_key_id FROM PUBLIC;
