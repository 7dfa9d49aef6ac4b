-- idem_new_key_id (Citus)
-- No search_path setting: a SQL-standard body, whose names (all qualified or exactly typed) are bound when it is created (contract §3a).
-- key_id = scope * 2^31 + (sequence mod 2^31): unique per scope as long as one scope does not
-- claim 2^31 keys within the 7-day retention, and positive for every scope >= 0. The sequence is
-- the coordinator's; anywhere else idem_coordinator_key_id (sql/citus/002) raises: a worker's copy of
-- the sequence repeats the coordinator's values.
CREATE OR REPLACE FUNCTION public.idem_new_key_id(p_scope public.idem_user_id)
RETURNS bigint
LANGUAGE sql
VOLATILE
RETURN public.idem_coordinator_key_id(
           'idem_new_key_id',
           p_scope::bigint * 2147483648
           + (pg_catalog.nextval('public.idempotency_keys_id_seq'::pg_catalog.regclass) & 2147483647));

COMMENT ON FUNCTION public.idem_new_key_id IS
    'A new key_id for a claim in scope p_scope. Distributed store (Citus): the scope in the high bits, '
    'so the key_id routes to its shard, made on the coordinator only. Internal to idem_claim. Errors: IDM00 '
    'on a worker (idem_coordinator_key_id).';
-- Internal: called only from the SECURITY DEFINER idem_* functions, never by PUBLIC.
REVOKE ALL ON FUNCTION public.idem_new_key_id FROM PUBLIC;
